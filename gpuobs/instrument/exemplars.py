"""Exemplars for slow observations: the trace id and span id of a slow step's (or request's) span,
served on the histogram bucket the observation fell in, so a dashboard can jump from a slow bucket
to the trace that explains it.

Which observations: those at or above their series' slow threshold (quantiles.slow_threshold(): the
larger of the rolling p90 and twice the rolling median, and GPUOBS_EXEMPLAR_MIN_S), as of the last
metric collection. A fast observation costs one float comparison; a slow one builds one exemplar
(a few µs). GPUOBS_EXEMPLARS=false turns them off.

Where: the Prometheus endpoint. opentelemetry-exporter-prometheus's reader translates no
exemplars, so `serve()` wraps the collector it registers with ExemplarCollector, which adds the
stored exemplars to the bucket samples (prometheus_client's Sample/Exemplar types). They appear
only in the OpenMetrics format, which Prometheus asks for when its exemplar storage is on; the
classic text format is unchanged. The SDK's own exemplars (OTLP) stay off, see providers.py.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
from typing import Any, Iterable

log = logging.getLogger("gpuobs.instrument")

_SCOPE_LABEL_PREFIX = "otel_scope_"  # labels the OTel exporter adds to every series: not attributes


def _label_value(value: Any) -> str:
    """An attribute value as the OTel Prometheus exporter writes it as a label value."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _series_key(labels: dict[str, str]) -> frozenset:
    """A series' identity across OTel attributes and exported labels: its non-empty labels, without
    the exporter's scope labels and `le` (the exporter writes a missing attribute as "")."""
    return frozenset((k, v) for k, v in labels.items()
                     if v != "" and k != "le" and not k.startswith(_SCOPE_LABEL_PREFIX))


class ExemplarStore:
    """The latest exemplar per (metric, series, bucket). offer() is called by the recording thread
    (slow observations only), exemplars() by the scrape thread: single dict assignments and copies
    under the GIL, no lock.

    bounds: the histogram's bucket upper bounds (seconds; providers.DURATION_BUCKETS), used to keep
    one exemplar per bucket; sanitize: the exporter's attribute-to-label-name function."""

    def __init__(self, bounds: Iterable[float], sanitize: Any = None):
        self.bounds = tuple(bounds)
        self.sanitize = sanitize or (lambda name: name)
        self.latest: dict[str, dict[tuple, tuple]] = {}  # metric name -> {(series, bucket): exemplar}

    def offer(self, metric_name: str, attrs: dict, value: float, span: Any) -> bool:
        """Keep an exemplar {trace_id, span_id} of span (32 and 16 lowercase hex digits, what
        Grafana's trace links read) for an observation of value seconds with these OTel attributes;
        the latest one per bucket wins. Returns False (keeps nothing) for a span that is not
        recording a sampled trace (tracing off, or sampled out): its trace id would lead nowhere."""
        ctx = span.get_span_context()
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return False
        labels = {self.sanitize(k): _label_value(v) for k, v in attrs.items()}
        bucket = bisect.bisect_left(self.bounds, value)  # the first bound >= value: Prometheus's `le`
        exemplar = ({"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")},
                    value, time.time())
        self.latest.setdefault(metric_name, {})[(_series_key(labels), bucket)] = exemplar
        return True

    def exemplars(self, metric_name: str) -> dict[frozenset, list[tuple]]:
        """The stored exemplars of a metric by series key: [(labels, value, unix time), ...]."""
        out: dict[frozenset, list[tuple]] = {}
        for (series, _bucket), exemplar in list(self.latest.get(metric_name, {}).items()):
            out.setdefault(series, []).append(exemplar)
        return out


class ExemplarCollector:
    """A prometheus_client collector in place of the OTel reader's: yields the reader's metric
    families, with the stored exemplars on the bucket samples of the histograms in metric_names
    (Prometheus names, e.g. gpuobs_training_step_duration_seconds). Each exemplar goes on the
    bucket its value falls in (previous bound < value <= le)."""

    def __init__(self, inner: Any, store: ExemplarStore, metric_names: Iterable[str]):
        self.inner, self.store, self.metric_names = inner, store, frozenset(metric_names)

    def add_metrics_data(self, metrics_data: Any) -> None:
        """What the reader hands its collector after each collection: passed on."""
        self.inner.add_metrics_data(metrics_data)

    def describe(self) -> list:
        """No families: prometheus_client calls it when the collector is registered, before the reader
        is on a MeterProvider, so it must not collect."""
        # registering must not collect (the reader is not on a MeterProvider yet): no names to check
        return []

    def collect(self) -> Iterable[Any]:
        """The reader's families (collecting runs the SDK's collection), exemplars added."""
        for family in self.inner.collect():
            if family.type == "histogram" and family.name in self.metric_names:
                found = self.store.exemplars(family.name)
                if found:
                    family.samples = with_exemplars(family.samples, found)
            yield family


def with_exemplars(samples: list, found: dict[frozenset, list[tuple]]) -> list:
    """samples (prometheus_client Samples of one histogram family, buckets of a series in ascending
    `le` order as families list them) with each series' exemplars put on their buckets."""
    from prometheus_client.samples import Exemplar

    out: list[Any] = []
    previous: dict[frozenset, float] = {}  # series -> upper bound of its last bucket
    for sample in samples:
        le = sample.labels.get("le") if sample.name.endswith("_bucket") else None
        series = _series_key(sample.labels) if le is not None else None
        if le is None or series is None or series not in found:
            out.append(sample)
            continue
        upper, lower = float(le), previous.get(series, -math.inf)
        previous[series] = upper
        hits = [e for e in found[series] if lower < e[1] <= upper]
        if hits:
            labels, value, at = max(hits, key=lambda e: e[2])  # the latest one of the bucket
            sample = sample._replace(exemplar=Exemplar(labels, value, at))
        out.append(sample)
    return out


def serve(reader: Any, store: ExemplarStore, metric_names: Iterable[str]) -> bool:
    """Serve the store's exemplars through a PrometheusMetricReader: its collector is replaced, in
    the registry it registered in and on the reader (so its shutdown unregisters ours), by an
    ExemplarCollector around it. Uses the reader's private `_collector` and `_registry` (checked by
    tests/test_exemplars.py); returns False, logged, where they are missing (metrics are then
    served without exemplars)."""
    inner, registry = getattr(reader, "_collector", None), getattr(reader, "_registry", None)
    if inner is None or registry is None or not hasattr(inner, "collect"):
        log.warning("the OTel Prometheus reader has no _collector/_registry: serving no exemplars")
        return False
    wrapper = ExemplarCollector(inner, store, metric_names)
    registry.unregister(inner)
    registry.register(wrapper)
    reader._collector = wrapper
    return True


def label_sanitizer() -> Any:
    """The OTel Prometheus exporter's attribute-to-label-name function (a private module of it,
    checked by tests/test_exemplars.py), else the same rule written here: characters other than
    letters, digits and `_` become `_`."""
    try:
        from opentelemetry.exporter.prometheus._mapping import sanitize_attribute
        return sanitize_attribute
    except ImportError:  # pragma: no cover - an exporter release that moved it
        import re

        return lambda name: re.sub(r"[^a-zA-Z0-9_]", "_", name)
