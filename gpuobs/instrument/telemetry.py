"""OpenTelemetry set-up for training and inference processes, from the standard OTEL_* variables.

`configure()` builds a TracerProvider and a MeterProvider (or leaves OTel's no-op API in place
when disabled), adds the run's rank/job/node as resource attributes, and creates every
instrument of the catalog's training and inference families once. Exporting runs on the SDK's
own threads with bounded queues and timeouts, so no telemetry sink can block a training step.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace

from .. import __version__, catalog as c
from .env import RunEnv
from .quantiles import DEFAULT_MAX_SAMPLES, DEFAULT_WINDOW_S, WindowedQuantiles

log = logging.getLogger("gpuobs.instrument")

# Seconds: from a millisecond data wait to a half-hour checkpoint.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0, 1800.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SPAN_QUEUE = 8192  # spans waiting for export (~3 s of 500 steps/s); beyond it spans are dropped, never waited for


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Telemetry:
    """What instrumentation records into. When disabled, tracer and meter are OTel's no-ops and
    every instrument call costs a method call on a no-op object."""
    enabled: bool
    tracer: Any
    meter: Any
    env: RunEnv
    instruments: dict[str, Any] = field(default_factory=dict)  # catalog metric name -> instrument
    tracer_provider: Any = None
    meter_provider: Any = None
    span_processor: Any = None
    http_server: Any = None  # the Prometheus scrape server, closed on shutdown
    readers: list = field(default_factory=list)  # metric readers (stopped in forked children)
    local: dict[str, list] = field(default_factory=dict)  # metric name -> LocalValues handed out
    windows: dict[str, WindowedQuantiles] = field(default_factory=dict)  # duration metric name -> its window
    quantile_window_s: float = DEFAULT_WINDOW_S
    owns_providers: bool = True  # False when configure() was given the providers: flush, never shut down
    on_shutdown: list = field(default_factory=list)  # callables run first at shutdown (runs end their spans)
    _closed: bool = False

    def quantiles(self, metric: c.Metric) -> WindowedQuantiles:
        """The windowed quantiles kept for a duration histogram of catalog.QUANTILES (one per
        Telemetry, shared by every recorder); observed as the metric's `..._quantile_seconds` gauge."""
        found = self.windows.get(metric.name)
        if found is None:
            found = self.windows[metric.name] = WindowedQuantiles(
                self.quantile_window_s if self.enabled else 0.0, DEFAULT_MAX_SAMPLES if self.enabled else 1)
        return found

    def instrument(self, metric: c.Metric) -> Any:
        """What to record a catalog metric into: for training counters and gauges a LocalValues
        (one per call, observed at collection), else the OTel instrument created in configure."""
        if _observed(metric):
            if not self.enabled:
                return _NO_VALUES
            values = LocalValues(metric.kind)
            self.local.setdefault(metric.name, []).append(values)
            return values
        return self.instruments[metric.name]

    def _observer(self, metric: c.Metric):
        from opentelemetry.metrics import Observation

        def observe(_options):
            merged: dict[tuple, float] = {}
            for values in list(self.local.get(metric.name, ())):
                for key, cell in list(values.cells.items()):  # one C-level copy: safe against the trainer
                    value = cell.value
                    if value is not None:
                        merged[key] = merged.get(key, 0) + value if metric.kind == "counter" else value
            return [Observation(value, dict(key)) for key, value in merged.items()]
        return observe

    def _quantile_observer(self, duration: c.Metric):
        from opentelemetry.metrics import Observation

        def observe(_options):
            window = self.windows.get(duration.name)
            if window is None:
                return []
            return [Observation(value, {**attrs, "quantile": f"{q:g}"}) for attrs, q, value in window.quantiles()]
        return observe

    def _drops_observer(self, metric: c.Metric):
        from opentelemetry.metrics import Observation

        def observe(_options):
            if metric is c.SPANS_DROPPED:
                return [Observation(self.spans_dropped)]
            from ..logs.fluentd import records_dropped_total  # no logs import at module level

            return [Observation(records_dropped_total())]
        return observe

    @property
    def spans_dropped(self) -> int:
        """Spans dropped because the export queue was full (the exporter was slow or down)."""
        return getattr(self.span_processor, "dropped", 0)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush and stop exporting within timeout_s, whatever state the endpoint is in: the SDK's
        own shutdown can wait 30 s on a stuck exporter, so it runs on a daemon thread we stop
        waiting for. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        for hook in list(self.on_shutdown):
            try:
                hook()
            except Exception:  # noqa: BLE001 - shutting down must not raise into training code
                log.exception("telemetry shutdown hook failed")

        def close(provider) -> None:
            try:
                provider.shutdown()
            except Exception:  # noqa: BLE001 - shutting down must not raise into training code
                log.exception("telemetry shutdown failed")

        if not self.owns_providers:  # someone else's providers: send what we recorded, leave them running
            self._flush_only(timeout_s)
            return
        # One thread per provider: a stuck span export must not leave the MeterProvider unclosed,
        # or its atexit handler would wait on the stuck endpoint when the process exits.
        deadline = time.monotonic() + timeout_s
        workers = [threading.Thread(target=close, args=(p,), name="gpuobs-telemetry-shutdown", daemon=True)
                   for p in (self.tracer_provider, self.meter_provider) if p is not None]
        for worker in workers:
            worker.start()
        if self.http_server is not None:  # free the port for the next configure()
            self.http_server.shutdown()
            self.http_server.server_close()
            self.http_server = None
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        if any(worker.is_alive() for worker in workers):
            log.warning("telemetry shutdown timed out; unsent data dropped", extra={"timeout_s": timeout_s})


    def _flush_only(self, timeout_s: float) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                try:
                    flush(int(timeout_s * 1000))
                except Exception:  # noqa: BLE001 - shutting down must not raise into training code
                    log.exception("telemetry flush failed")


class Cell:
    """The value of one attribute set of a LocalValues; None until first added to or set.
    The training thread holds its cells and updates `value` directly: no lookup per step."""
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, amount: float) -> None:
        self.value = amount if self.value is None else self.value + amount  # ints stay ints (step counts)

    def set(self, value: float) -> None:
        self.value = value


class LocalValues:
    """Counter or gauge values kept by the training thread and handed to OTel by an observable
    instrument when metrics are collected: a synchronous instrument call costs several µs each, and
    a step updates about ten of them; a held Cell costs about 0.1 µs."""

    def __init__(self, kind: str):
        self.kind = kind
        self.cells: dict[tuple, Cell] = {}

    def cell(self, attrs: dict) -> Cell:
        """The Cell of these attributes, made on first use; keep it to update without a lookup."""
        key = tuple(attrs.items())
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = Cell()
        return found

    def add(self, value: float, attrs: dict) -> None:
        self.cell(attrs).add(value)

    def set(self, value: float, attrs: dict) -> None:
        self.cell(attrs).set(value)


class _NoValues:
    """LocalValues of disabled telemetry: keeps nothing (its cells are never read)."""

    def cell(self, attrs: dict) -> Cell:
        return Cell()

    def add(self, value: float, attrs: dict) -> None:
        pass

    def set(self, value: float, attrs: dict) -> None:
        pass


_NO_VALUES = _NoValues()


def _observed(metric: c.Metric) -> bool:
    """Training counters and gauges are kept locally and observed; histograms are recorded."""
    return metric.family == "training" and metric.kind in ("counter", "gauge")


_QUANTILE_OF = {q.name: d for d, q in c.QUANTILES.items()}  # quantile gauge -> its duration histogram


def _make_instruments(meter, tel: "Telemetry") -> dict[str, Any]:
    out = {}
    for m in c.OTEL:
        if m.name in _QUANTILE_OF:
            out[m.name] = meter.create_observable_gauge(m.otel_name, callbacks=[tel._quantile_observer(
                _QUANTILE_OF[m.name])], unit=m.otel_unit, description=m.help)
        elif m.family == "telemetry":
            out[m.name] = meter.create_observable_counter(m.otel_name, callbacks=[tel._drops_observer(m)],
                                                          unit=m.otel_unit, description=m.help)
        elif m is c.ACTIVE_REQUESTS:
            out[m.name] = meter.create_up_down_counter(m.otel_name, unit=m.otel_unit, description=m.help)
        elif _observed(m):
            make = meter.create_observable_counter if m.kind == "counter" else meter.create_observable_gauge
            out[m.name] = make(m.otel_name, callbacks=[tel._observer(m)], unit=m.otel_unit, description=m.help)
        elif m.kind == "histogram":
            out[m.name] = meter.create_histogram(m.otel_name, unit=m.otel_unit, description=m.help)
        elif m.kind == "counter":
            out[m.name] = meter.create_counter(m.otel_name, unit=m.otel_unit, description=m.help)
        else:
            out[m.name] = meter.create_gauge(m.otel_name, unit=m.otel_unit, description=m.help)
    return out


def _views():
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    views = []
    for m in c.OTEL:
        if m.kind == "histogram":
            buckets = DURATION_BUCKETS if m.otel_unit == "s" else BATCH_BUCKETS
            views.append(View(instrument_name=m.otel_name, aggregation=ExplicitBucketHistogramAggregation(buckets)))
    return views


def _span_processor(exporter, queue: int):
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    class CountingBatchSpanProcessor(BatchSpanProcessor):
        """BatchSpanProcessor that counts the spans it drops when its queue is full."""
        dropped = 0

        def on_end(self, span) -> None:
            worker = getattr(self, "_batch_processor", None)
            pending = getattr(worker, "_queue", None)
            if pending is not None and len(pending) >= queue:
                try:  # push out the oldest span as the SDK would, without its per-span log record
                    pending.pop()
                except IndexError:  # the worker took the batch meanwhile
                    pass
                self.dropped += 1
            super().on_end(span)

    return CountingBatchSpanProcessor(exporter, max_queue_size=queue, schedule_delay_millis=1000,
                                      max_export_batch_size=512, export_timeout_millis=5000)


def _exemplar_filter():
    """OTEL_METRICS_EXEMPLAR_FILTER (always_on, always_off, trace_based), else always_off: with the
    SDK's trace_based default, every step-duration point inside a step span stored an exemplar, which
    cost more than the point itself (about 11 µs a step), and the step span already has the duration."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, AlwaysOnExemplarFilter, TraceBasedExemplarFilter

    choice = os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER", "always_off").strip().lower()
    filters = {"always_on": AlwaysOnExemplarFilter, "always_off": AlwaysOffExemplarFilter,
               "trace_based": TraceBasedExemplarFilter}
    if choice not in filters:
        log.warning("OTEL_METRICS_EXEMPLAR_FILTER is not always_on, always_off or trace_based; exemplars off",
                    extra={"value": choice})
    return filters.get(choice, AlwaysOffExemplarFilter)()


def _otlp_exporters(endpoint: str, protocol: str, timeout_s: float):
    """(span exporter, metric exporter) for an OTLP endpoint over http/protobuf (default) or grpc."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = not endpoint.startswith("https://")
        return (OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s),
                OTLPMetricExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    base = endpoint.rstrip("/")
    return (OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=timeout_s),
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics", timeout=timeout_s))


_current: Telemetry | None = None


def _env_float(name: str, default: float | None, what: str) -> float | None:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        log.warning(f"{name} is not {what}; using the default", extra={"value": raw})
        return default


def configure(service_name: str | None = None, endpoint: str | None = None, protocol: str | None = None,
              prometheus_port: int | None = None, enabled: bool | None = None, export_interval_s: float = 10.0,
              export_timeout_s: float = 5.0, span_exporters: Sequence[Any] = (), metric_readers: Sequence[Any] = (),
              env: RunEnv | None = None, spans: bool = True, prometheus_addr: str | None = None,
              quantile_window_s: float | None = None, tracer_provider: Any = None, meter_provider: Any = None,
              set_global: bool = True) -> Telemetry:
    """Set up tracing and metrics for this process and make it the current Telemetry.

    Defaults come from the standard variables: OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf or grpc),
    OTEL_METRIC_EXPORT_INTERVAL (ms), OTEL_METRICS_EXEMPLAR_FILTER (default here: always_off) and
    OTEL_SDK_DISABLED; GPUOBS_PROMETHEUS_PORT (plus the local rank) and GPUOBS_PROMETHEUS_ADDR
    (default 0.0.0.0) serve the metrics for scraping; GPUOBS_QUANTILE_WINDOW_S (default 300) is
    the window of the exact step/request quantiles. With nothing to export to (no endpoint, port,
    exporter, reader or provider), or OTEL_SDK_DISABLED=true, everything stays a no-op.
    spans=False records metrics only.

    tracer_provider / meter_provider: use these SDK providers (an OTel distro's, or the
    instrumentor's arguments) instead of building ours; they are flushed, never shut down, and a
    given MeterProvider keeps its own readers and histogram buckets (no Prometheus port is added).
    set_global=True (the default) installs our providers as OTel's global ones when none is set
    yet, so user spans and other instrumentations nest under `train.step` and export with them.
    """
    global _current
    if _current is not None:
        _current.shutdown(timeout_s=1.0)
    run_env = env or RunEnv.detect()
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    protocol = (protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").lower()
    if prometheus_port is None and os.environ.get("GPUOBS_PROMETHEUS_PORT"):
        # Every rank of a node inherits the variable: each serves on base + its local rank.
        try:
            prometheus_port = int(os.environ["GPUOBS_PROMETHEUS_PORT"]) + (run_env.local_rank or 0)
        except ValueError:
            log.warning("GPUOBS_PROMETHEUS_PORT is not a port number; not serving metrics",
                        extra={"value": os.environ["GPUOBS_PROMETHEUS_PORT"]})
    prometheus_addr = prometheus_addr or os.environ.get("GPUOBS_PROMETHEUS_ADDR") or "0.0.0.0"
    ms = _env_float("OTEL_METRIC_EXPORT_INTERVAL", None, "a number of milliseconds")
    export_interval_s = ms / 1000 if ms else export_interval_s
    if quantile_window_s is None:
        quantile_window_s = _env_float("GPUOBS_QUANTILE_WINDOW_S", DEFAULT_WINDOW_S, "a number of seconds")
    if enabled is None:
        enabled = not _truthy(os.environ.get("OTEL_SDK_DISABLED")) and bool(
            endpoint or prometheus_port is not None or span_exporters or metric_readers or tracer_provider
            or meter_provider)
    if not enabled:
        tel = Telemetry(False, otel_trace.NoOpTracer(), otel_metrics.NoOpMeter("gpuobs"), run_env)
        tel.instruments = _make_instruments(tel.meter, tel)
        _current = tel
        return tel

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    attrs: dict[str, Any] = dict(run_env.resource_attributes())
    if service_name:
        attrs["service.name"] = service_name
    resource = Resource.create(attrs)  # merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):  # neither sets it
        resource = resource.merge(Resource({"service.name": "training"}))
    span_list, readers = list(span_exporters), list(metric_readers)
    if endpoint:
        span_exp, metric_exp = _otlp_exporters(endpoint, protocol, export_timeout_s)
        span_list.append(span_exp)
        readers.append(PeriodicExportingMetricReader(metric_exp, export_interval_millis=export_interval_s * 1000,
                                                     export_timeout_millis=export_timeout_s * 1000))
    http_server = None
    if prometheus_port is not None and meter_provider is None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        try:
            http_server, _ = start_http_server(prometheus_port, addr=prometheus_addr)
            readers.append(PrometheusMetricReader())
        except OSError as e:  # a taken port must not stop training: carry on without the endpoint
            log.warning("cannot serve metrics for Prometheus", extra={"port": prometheus_port,
                                                                      "addr": prometheus_addr, "error": str(e)})
    elif prometheus_port is not None:
        log.warning("a MeterProvider was given: its own readers export; no Prometheus endpoint added")
    owns = tracer_provider is None and meter_provider is None
    processor = None
    if spans:
        if tracer_provider is None:
            # The SDK's own exit hooks can wait 30 s on a stuck endpoint: ours (_at_exit) is bounded.
            tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for exp in span_list:
            processor = _span_processor(exp, SPAN_QUEUE)
            tracer_provider.add_span_processor(processor)
        tracer = tracer_provider.get_tracer("gpuobs.instrument", __version__)
    else:
        tracer, tracer_provider = otel_trace.NoOpTracer(), None
    if meter_provider is None:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, views=_views(),
                                       shutdown_on_exit=False, exemplar_filter=_exemplar_filter())
    elif readers:
        log.warning("a MeterProvider was given: the metric readers and endpoint passed along are not added")
    meter = meter_provider.get_meter("gpuobs.instrument", __version__)
    tel = Telemetry(True, tracer, meter, run_env, {}, tracer_provider, meter_provider, processor, http_server,
                    readers, quantile_window_s=quantile_window_s, owns_providers=owns)
    tel.instruments = _make_instruments(meter, tel)
    if set_global:
        _install_global(tracer_provider, meter_provider)
    _current = tel
    log.info("telemetry configured", extra={"endpoint": endpoint, "protocol": protocol,
                                           "prometheus_port": prometheus_port, "rank": run_env.rank})
    return tel


def _install_global(tracer_provider: Any, meter_provider: Any) -> None:
    """Make these OTel's global providers where none is set yet. OTel allows setting each once per
    process: an earlier configure() or the application's own SDK set-up keeps its place (spans
    still nest by context: a user span started inside a step is its child, whichever provider)."""
    from opentelemetry.sdk.metrics import MeterProvider

    if tracer_provider is not None and isinstance(otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider):
        otel_trace.set_tracer_provider(tracer_provider)
    if not isinstance(otel_metrics.get_meter_provider(), MeterProvider):
        otel_metrics.set_meter_provider(meter_provider)


class _NullMetricExporter:
    """Swallows exports: what a forked child's copy of the metric readers sends to."""

    def export(self, *args, **kwargs):
        from opentelemetry.sdk.metrics.export import MetricExportResult

        return MetricExportResult.SUCCESS

    def force_flush(self, *args, **kwargs) -> bool:
        return True

    def shutdown(self, *args, **kwargs) -> None:
        pass


def _after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker), stop the inherited periodic exports: the SDK restarts
    them in the child, which would then report the parent's frozen cumulative values under the same
    rank and look like counter resets."""
    tel = _current
    if tel is None or not tel.enabled or tel.meter_provider is None:
        return
    for reader in tel.readers:
        if hasattr(reader, "_shutdown_event"):  # PeriodicExportingMetricReader
            reader._exporter = _NullMetricExporter()
            reader._shutdown_event.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _at_exit() -> None:
    """Flush the current telemetry when the process exits, for at most EXIT_TIMEOUT_S."""
    if _current is not None and _current.enabled:
        _current.shutdown(timeout_s=EXIT_TIMEOUT_S)


EXIT_TIMEOUT_S = 3.0
atexit.register(_at_exit)


def current() -> Telemetry:
    """The Telemetry set by the last configure(); a disabled one if configure was never called."""
    global _current
    if _current is None:
        _current = configure(enabled=False)
    return _current
