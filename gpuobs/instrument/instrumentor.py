"""OpenTelemetry auto-instrumentation entry point for gpuobs.

Registered under the ``opentelemetry_instrumentor`` entry-point group as ``gpuobs``, so
``opentelemetry-instrument python train.py`` configures gpuobs telemetry from the OTEL_*
variables before the program runs (skip it with OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=gpuobs).
It can also be used directly::

    GpuobsInstrumentor().instrument(endpoint="http://collector:4318")   # = instrument.configure(...)
    ...
    GpuobsInstrumentor().uninstrument()                                 # flush and shut down

Like every BaseInstrumentor it is a singleton, and instrument() is a no-op while instrumented.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Collection

# mypy 2.4 does not see the class this typed module defines (attr-defined): a checker gap
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from . import telemetry

log = logging.getLogger("gpuobs.instrument")

__all__ = ["GpuobsInstrumentor"]


class GpuobsInstrumentor(BaseInstrumentor):
    """Configures gpuobs telemetry (gpuobs.instrument.configure) on instrument() and shuts it down on
    uninstrument(). A tracer_provider / meter_provider passed by a distro or the application is
    used as it is (flushed at uninstrument, never shut down); other keyword arguments that
    configure() does not take are ignored."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """No package requirements (the OTel instrumentor API asks): gpuobs instruments its own APIs."""
        return ()  # instruments gpuobs's own TrainingRun/request APIs: no third-party library required

    def _instrument(self, **kwargs: Any) -> telemetry.Telemetry:
        accepted = inspect.signature(telemetry.configure).parameters
        ignored = sorted(k for k in kwargs if k not in accepted)
        if ignored:
            log.debug("GpuobsInstrumentor ignores arguments", extra={"arguments": ignored})
        return telemetry.configure(**{k: v for k, v in kwargs.items() if k in accepted})

    def _uninstrument(self, **kwargs: Any) -> None:
        timeout_s = float(kwargs.get("timeout_s", 5.0))
        telemetry.current().shutdown(timeout_s=timeout_s)
        telemetry._current = None  # current() builds a no-op Telemetry again; no second shutdown
