"""The Metric definition and what every family module of the catalog shares: the namespace, the
identity labels, the constructors `_m` (an NVML metric, `gpuobs_` prefixed) and `_otel` (an
OpenTelemetry instrument), and the registries the family modules fill as they are imported (the
duration histograms' quantile gauges, the detail tier). gpuobs.catalog re-exports all of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

NAMESPACE = "gpuobs"
GPU_LABELS = ("gpu", "uuid")  # identity on every per-GPU series: NVML index and UUID
MIG_LABELS = GPU_LABELS + ("gpu_instance_id", "compute_instance_id")


Kind = Literal["gauge", "counter", "info", "histogram"]


@dataclass(frozen=True, eq=False)  # each Metric is a singleton: identity is equality
class Metric:
    """One exported metric.

    name: exposition name without `_total` (counters get it at exposition).
    kind: "gauge", "counter", "info" (a gauge of 1 whose labels carry the data) or "histogram" (OTel only).
    labels: every label, identity first. source: where NVML gives the value, with its unit.
    dcgm: dcgm-exporter field names, keyed by the values of the labels after the identity
    ones (() for a metric without such labels); dcgm_scale converts our unit to DCGM's.
    dcgm_int: DCGM's field is an INT64, so dcgm naming serves the scaled value as DCGM's integer
    (truncated, as DCGM's cast truncates). dcgm_zero: where the GPU has no value (no NVLink, or no
    rate yet), DCGM's field reads 0 and dcgm naming serves 0 (when the profile serves the metric).
    """
    name: str
    kind: Kind
    unit: str
    help: str
    family: str
    source: str
    labels: tuple[str, ...] = GPU_LABELS
    dcgm: dict[tuple[str, ...], str] = field(default_factory=dict)
    dcgm_scale: float = 1.0
    dcgm_int: bool = False
    dcgm_zero: bool = False
    max_value: float | None = None  # values above this are impossible and dropped
    min_value: float = 0.0  # values below this are impossible and dropped; signed NVML values declare theirs
    otel_name: str | None = None  # instrument name, for metrics recorded through OpenTelemetry
    otel_unit: str = ""  # UCUM unit of the instrument (its Prometheus name carries the converted unit)

    @property
    def valid(self) -> tuple[float, float]:
        """The declared valid range (lowest, highest; inf when unbounded) in base units: a collected
        value outside it is impossible, dropped and counted (gpuobs.collect.base.checked)."""
        return (self.min_value, math.inf if self.max_value is None else self.max_value)

    @property
    def identity(self) -> tuple[str, ...]:
        """The identity labels this metric starts with: MIG_LABELS, GPU_LABELS or none."""
        for base in (MIG_LABELS, GPU_LABELS):
            if self.labels[: len(base)] == base:
                return base
        return ()

    @property
    def extra_labels(self) -> tuple[str, ...]:
        """Labels after the identity labels."""
        return self.labels[len(self.identity):]

    @property
    def exposed_name(self) -> str:
        """The name as it appears in /metrics (counters with `_total`, info with `_info`)."""
        return self.name + {"counter": "_total", "info": "_info"}.get(self.kind, "")

    @property
    def prometheus_samples(self) -> tuple[str, ...]:
        """Sample names in a scrape: a histogram's _bucket/_sum/_count, else the exposed name."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        return (self.exposed_name,)


def _m(name: str, kind: Kind, unit: str, help: str, family: str, source: str, **kw) -> Metric:
    return Metric(f"{NAMESPACE}_{name}", kind, unit, help, family, source, **kw)


MIB = 1 / (1024 * 1024)


# ------------------------------------------------------------- training and inference (OpenTelemetry)
# Recorded by gpuobs.instrument through the OTel SDK; `name` is what OTel's Prometheus conversion
# makes of `otel_name` and `otel_unit` (dots to underscores, "s" to _seconds, _total on counters;
# unit "1" adds nothing, so ratios carry _ratio in the instrument name).
RUN_LABELS = ("rank", "job_id")  # not "job": Prometheus's target label


def _otel(otel_name: str, kind: Kind, otel_unit: str, prom_name: str, help: str, family: str,
          labels: tuple[str, ...] = RUN_LABELS, unit: str = "") -> Metric:
    return Metric(prom_name, kind, unit, help, family, f"OpenTelemetry instrument {otel_name}", labels=labels,
                  otel_name=otel_name, otel_unit=otel_unit, max_value=1.0 if unit == "ratio" else None)


# duration histogram -> its in-process windowed quantiles (what rules and alerts read)
QUANTILES: dict[Metric, Metric] = {}


def _quantile(duration: Metric, otel_name: str, what: str) -> Metric:
    """The exact quantiles of a duration histogram's recent observations (gpuobs.instrument.quantiles),
    a gauge with a `quantile` label, registered in QUANTILES."""
    labels = tuple(label for label in duration.labels if label != "error_type") + ("quantile",)
    metric = _otel(otel_name, "gauge", "s", otel_name.replace(".", "_") + "_seconds",
                   f"Exact quantiles (0.5, 0.9, 0.99) of {what} in the last quantile window (default 5 min, at "
                   "most 4096 observations), computed in the process.", duration.family, labels=labels,
                   unit="seconds")
    QUANTILES[duration] = metric
    return metric



# ------------------------------------------------------------------------------------------ tiers
# What the default profile leaves out (docs/cardinality.md): every series an alert, a recording rule
# or a default panel reads is served; the rest is detail, served with --profile full or per family
# with --detail FAMILY. A per-GPU total stands in for per-link NVLink series, the NVLink domain for
# the GPU pairs. The budget (tests/test_cardinality.py): at most 40 series per H100 SXM GPU. Each
# family module declares its own, below its metrics; gpuobs.catalog reads them as DETAIL and
# DEFAULT_VALUES.
DETAIL_DECLARED: list[Metric] = []
DEFAULT_VALUES_DECLARED: dict[Metric, tuple[str, frozenset[str]]] = {}


def detail(*metrics: Metric) -> None:
    """Declare metrics detail: left out of the default profile (gpuobs.catalog.DETAIL)."""
    DETAIL_DECLARED.extend(metrics)


def default_values(metric: Metric, label: str, values: set[str]) -> None:
    """Declare that the default profile serves only these values of the metric's label (the others
    are detail): gpuobs.catalog.DEFAULT_VALUES[metric] == (label, values)."""
    DEFAULT_VALUES_DECLARED[metric] = (label, frozenset(values))
