"""Optional OTLP push of the same catalog as OpenTelemetry metrics, for sites that run an
OpenTelemetry Collector instead of scraping. Uses the OTel SDK: one observable instrument per
metric the exporter emits (catalog.EXPORTED: not the training and inference instruments, which
their own processes send), observed from the latest snapshot at each export; the snapshot's
samples are grouped by metric once per export, not scanned once per instrument.

The SDK stamps each observation with the time of the export, so the values of a stale snapshot
(the rule of /metrics: older than two intervals) are not observed at all: only self-health is,
less what is then unknown (NVML and GPU state), with gpuobs_exporter_snapshot_stale 1, as the
self-health-only /metrics body has it."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from .. import __version__
from .. import catalog as c
from ..collect.base import Sample, Snapshot
from .render import SELF_FAMILIES, UNKNOWN_WHEN_STALE

UNITS = {"bytes": "By", "watts": "W", "joules": "J", "celsius": "Cel", "hertz": "Hz", "seconds": "s", "ratio": "1"}


def _exporter(endpoint: str) -> MetricExporter:
    """OTLP metric exporter: HTTP/protobuf for http(s)://…/v1/metrics URLs, else gRPC."""
    if endpoint.rstrip("/").endswith("/v1/metrics"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        return HttpExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))


class OtlpPush:
    """Pushes every catalog metric of the latest snapshot every `interval` seconds."""

    def __init__(self, endpoint: str, latest: Callable[[], Snapshot | None], interval: float,
                 fresh: Callable[[Snapshot], bool] | None = None):
        """fresh(snapshot): whether its values may still be sent (None: always)."""
        self._latest = latest
        self._fresh = fresh or (lambda _snap: True)
        self._grouped: tuple[Snapshot | None, dict[c.Metric, list[Sample]]] = (None, {})
        reader = PeriodicExportingMetricReader(_exporter(endpoint), export_interval_millis=interval * 1000)
        self.provider = MeterProvider(metric_readers=[reader],
                                      resource=Resource.create({"service.name": "gpuobs-exporter"}))
        meter = self.provider.get_meter("gpuobs.exporter", __version__)
        for metric in c.EXPORTED:
            make = meter.create_observable_counter if metric.kind == "counter" else meter.create_observable_gauge
            make(metric.exposed_name if metric.kind == "info" else metric.name,
                 callbacks=[self._callback(metric)], unit=UNITS.get(metric.unit, "1"), description=metric.help)

    def _callback(self, metric: c.Metric) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> list[Observation]:
            snap = self._latest()
            stale = snap is None or not self._fresh(snap)
            if metric is c.SNAPSHOT_STALE:  # as /metrics: 1 before the first pass too
                return [Observation(float(stale))]
            if snap is None or (stale and (metric.family not in SELF_FAMILIES or metric in UNKNOWN_WHEN_STALE)):
                return []  # never an old value under the export's fresh timestamp
            return [Observation(s.value, dict(zip(metric.labels, s.labels))) for s in self._samples(snap, metric)]
        return observe

    def _samples(self, snap: Snapshot, metric: c.Metric) -> list[Sample]:
        """The snapshot's samples of one metric; the snapshot is grouped by metric on the first call of an
        export (the SDK runs an export's callbacks one after another on its reader thread)."""
        grouped_snap, groups = self._grouped
        if grouped_snap is not snap:
            groups = defaultdict(list)
            for sample in snap.samples:
                groups[sample.metric].append(sample)
            self._grouped = (snap, groups)
        return groups.get(metric, [])

    def start(self) -> None:
        """Exports run on the SDK's own thread; nothing to start."""

    def stop(self) -> None:
        """Final export, bounded: after 2 s the exporter is shut down, which ends its retries
        (an unreachable collector would otherwise hold the exit for twice the OTLP timeout)."""
        self.provider.shutdown(timeout_millis=2000)
