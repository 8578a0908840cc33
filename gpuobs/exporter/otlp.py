"""Optional OTLP push of the same catalog as OpenTelemetry metrics, for sites that run an
OpenTelemetry Collector instead of scraping. Uses the OTel SDK: one observable instrument per
catalog metric, observed from the latest snapshot at each export."""

from __future__ import annotations

from typing import Callable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from .. import __version__, catalog as c
from ..collect.base import Snapshot

UNITS = {"bytes": "By", "watts": "W", "joules": "J", "celsius": "Cel", "hertz": "Hz", "seconds": "s", "ratio": "1"}


def _exporter(endpoint: str):
    """OTLP metric exporter: HTTP/protobuf for http(s)://…/v1/metrics URLs, else gRPC."""
    if endpoint.rstrip("/").endswith("/v1/metrics"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))


class OtlpPush:
    """Pushes every catalog metric of the latest snapshot every `interval` seconds."""

    def __init__(self, endpoint: str, latest: Callable[[], Snapshot | None], interval: float):
        self._latest = latest
        reader = PeriodicExportingMetricReader(_exporter(endpoint), export_interval_millis=interval * 1000)
        self.provider = MeterProvider(metric_readers=[reader],
                                      resource=Resource.create({"service.name": "gpuobs-exporter"}))
        meter = self.provider.get_meter("gpuobs.exporter", __version__)
        for metric in c.ALL:
            make = meter.create_observable_counter if metric.kind == "counter" else meter.create_observable_gauge
            make(metric.exposed_name if metric.kind == "info" else metric.name,
                 callbacks=[self._callback(metric)], unit=UNITS.get(metric.unit, "1"), description=metric.help)

    def _callback(self, metric: c.Metric):
        def observe(_options: CallbackOptions):
            snap = self._latest()
            if snap is None:
                return []
            return [Observation(s.value, dict(zip(metric.labels, s.labels)))
                    for s in snap.samples if s.metric is metric]
        return observe

    def start(self) -> None:
        """Exports run on the SDK's own thread; nothing to start."""

    def stop(self) -> None:
        """Final export, bounded: after 2 s the exporter is shut down, which ends its retries
        (an unreachable collector would otherwise hold the exit for twice the OTLP timeout)."""
        self.provider.shutdown(timeout_millis=2000)
