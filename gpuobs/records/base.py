"""The record type, its naming and the helpers and windows every family's records are built with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Union

from .. import catalog as c

GPU_BY = "cluster, node, instance, gpu, uuid"  # one GPU, whatever labels the scrape adds
# The labels attribution adds to every per-GPU series (gpuobs.exporter.render.ATTRIBUTION_LABELS,
# native naming). A GPU's series change identity when the pod or job holding it changes, so a
# per-GPU step record drops them: a GPU that changed hands within a step is still one GPU.
ATTRIBUTION = ("k8s_namespace", "k8s_pod", "k8s_container", "hpc_job")
# One GPU's series at one time: for comparing two series of a GPU (its temperature with its
# threshold), which carry the same attribution labels. Matching on GPU_BY alone finds two series of a
# GPU where a store keeps the old pod's series for its lookback after a pod change (VictoriaMetrics;
# any backfilled history), and one-to-one matching then fails for the whole expression.
SAME_SERIES = GPU_BY + ", " + ", ".join(ATTRIBUTION)

LEVEL_NAMES = {"gen_ai_request_model": "model", "name": "model", "k8s_namespace": "namespace",
               "k8s_pod": "pod"}  # levels named shorter than their label
# the labels a record keeps: its level
CLUSTER = ("cluster",)
NODE = ("cluster", "node")
GPU = ("uuid",)  # per GPU: every label of the series it reads, the GPU's UUID first
JOB = ("job_id",)
RANK = ("job_id", "rank")
MODEL = ("gen_ai_request_model",)
UNCORRECTED = '{error_type="uncorrected",counter_type="volatile"}'  # uncorrected ECC errors since the last reset
CORRECTED = '{error_type="corrected",counter_type="volatile"}'  # corrected ECC errors since the last reset


class Windows(Protocol):
    """What a record's expression reads besides catalog names (gpuobs.alerts.Thresholds has it all):
    durations are Prometheus duration strings, utilization a ratio 0-1, memory in bytes. Read-only
    properties, so a frozen dataclass (Thresholds) satisfies it. One protocol for every record family
    (the weekly and allocation records read theirs too), since every caller passes the one Thresholds."""

    @property
    def rate_window(self) -> str:
        """Window of rate() over counters (a Prometheus duration)."""

    @property
    def long_window(self) -> str:
        """Window of the slower averages and of presence checks (a Prometheus duration)."""

    @property
    def for_idle(self) -> str:
        """How long a GPU stays below idle_utilization to count as idle (a Prometheus duration)."""

    @property
    def idle_utilization(self) -> float:
        """Utilization (ratio 0-1) below which a GPU is idle."""

    @property
    def allocated_memory_bytes(self) -> float:
        """Device memory (bytes) above which an idle-looking GPU is still in use."""

    @property
    def trend_step(self) -> str:
        """The rate window of the per-GPU error-rate trends (a Prometheus duration)."""

    @property
    def weekly_window(self) -> str:
        """The weekly group's review window (a Prometheus duration)."""

    @property
    def weekly_interval(self) -> str:
        """The weekly group's evaluation interval, the step of its step records."""

    @property
    def mig_headroom(self) -> float:
        """Ratio added to a GPU's peaks before they must fit a MIG profile (0.2 = 20 %)."""

    @property
    def eval_interval(self) -> str:
        """Evaluation interval of the other groups, whose records the weekly group averages."""

    @property
    def team_label(self) -> str:
        """The kube_namespace_labels label that names a namespace's team."""

    @property
    def gpu_hour_costs(self) -> tuple[tuple[str, float], ...]:
        """(gpuobs_gpu_info `name` regex, cost per GPU-hour) pairs; the first match wins."""

    @property
    def gpu_hour_cost_default(self) -> float:
        """Cost per GPU-hour of a GPU no regex of gpu_hour_costs matches."""

    @property
    def cause_min_share(self) -> float:
        """Share of rate_window (0-1) over which a clock-event reason holding the clocks down is a slowdown cause."""

    @property
    def ecc_corrected_per_s(self) -> float:
        """Corrected ECC errors per second above which ECC is a slowdown cause."""

    @property
    def nvlink_errors_per_s(self) -> float:
        """NVLink data-link errors per second (all of a GPU's links) above which NVLink is a slowdown cause."""

    @property
    def pcie_replays_per_s(self) -> float:
        """PCIe replays per second above which PCIe is a slowdown cause."""

    @property
    def pcie_busy_utilization(self) -> float:
        """Utilization (0-1) above which a PCIe link below its maximum is a fault, not power saving."""

    @property
    def data_wait_straggler(self) -> float:
        """A rank's data-wait share over the mean of its job's other ranks' that names its data loader."""

    @property
    def data_wait_straggler_share(self) -> float:
        """The least data-wait share (0-1) of a rank whose data loader is named."""

    @property
    def grid_intensities(self) -> tuple[tuple[str, str, float], ...]:
        """(label, regex, gCO2e per kWh) overrides of the grid's carbon intensity; the first match wins.
        label: one of a GPU series' own labels (cluster, node) or a kube_node_labels label (label_...)."""

    @property
    def grid_intensity_default(self) -> float:
        """Carbon intensity (gCO2e per kWh) of a GPU no override of grid_intensities matches."""


Source = Union[c.Metric, "Record", str]


@dataclass(frozen=True, eq=False)  # a singleton like a catalog Metric: identity is equality
class Record:
    """One recording rule.

    by: the labels its series keep, which name its level (`cluster_node`; gen_ai_request_model reads
    `model`). source: what its name is about: a catalog metric (the record's metric part is its name),
    the record it aggregates further (that record's metric part), or the full name of a quantity the
    record defines. operation: the last part of the name (sum, rate, p99, ratio_to_others, ...).
    build: its PromQL for a set of windows, reading catalog names when called.
    """
    by: tuple[str, ...]
    source: Source
    operation: str
    build: Callable[[Windows], str]

    @property
    def level(self) -> str:
        """The first part of the name: the labels kept, joined by `_`."""
        return "_".join(LEVEL_NAMES.get(label, label) for label in self.by)

    @property
    def metric(self) -> str:
        """The middle part of the name. A rate of a counter of seconds is a share of time, a ratio:
        its unit cancels out and leaves the name."""
        source = self.source
        if isinstance(source, Record):
            return source.metric
        if isinstance(source, c.Metric):
            if self.operation == "ratio" and source.unit == "seconds":
                return source.name.removesuffix("_seconds")
            return source.name
        return source

    @property
    def name(self) -> str:
        """`level:metric:operation`, computed from the catalog now."""
        return f"{self.level}:{self.metric}:{self.operation}"

    def expr(self, t: Windows) -> str:
        """The rule's PromQL for windows t."""
        return self.build(t)


def _by(by: tuple[str, ...]) -> str:
    return ", ".join(by)


def _series(source: c.Metric | Record) -> str:
    """The name a selector uses: a record's name, or a catalog metric's sample name."""
    return source.name if isinstance(source, Record) else source.exposed_name


def _sum_rate(by: tuple[str, ...], sample: str, t: Windows, matchers: str = "") -> str:
    return f"sum by ({_by(by)}) (rate({sample}{matchers}[{t.rate_window}]))"


def aggregate(op: str, by: tuple[str, ...], source: c.Metric | Record, matchers: str = "") -> Record:
    """`op by (by) (source{matchers})` over a gauge, named after it and op; or over a record, named
    after it and its operation: a sum of sums is a sum, an average of ratios a ratio."""
    operation = source.operation if isinstance(source, Record) else op
    return Record(by, source, operation, lambda t: f"{op} by ({_by(by)}) ({_series(source)}{matchers})")


def rate_of(by: tuple[str, ...], counter: c.Metric) -> Record:
    """A counter's per-second rate over rate_window, summed by `by`, named after it."""
    return Record(by, counter, "rate", lambda t: _sum_rate(by, counter.exposed_name, t))


def count_of(by: tuple[str, ...], quantity: str, condition: Callable[[Windows], str]) -> Record:
    """The series for which condition holds, counted by `by`: a quantity of its own (e.g. lost GPUs)."""
    return Record(by, quantity, "count", lambda t: f"count by ({_by(by)}) ({condition(t)})")


def windowed_quantile(by: tuple[str, ...], duration: c.Metric, q: int) -> Record:
    """The worst of a duration histogram's exact in-process quantile gauges (catalog.QUANTILES) by
    `by`, named after the histogram: quantiles of different processes cannot be combined exactly."""
    return Record(by, duration, f"p{q}",
                  lambda t: f'max by ({_by(by)}) ({c.QUANTILES[duration].name}{{quantile="{q / 100:g}"}})')


# -------------------------------------------------------------- conditions shared with the alert pack
def pcie_below_max() -> str:
    """Per GPU: its PCIe link runs below its maximum generation or width (1 series per such GPU)."""
    return (f"{c.PCIE_GENERATION.name} < on ({SAME_SERIES}) {c.PCIE_MAX_GENERATION.name}"
            f" or {c.PCIE_WIDTH.name} < on ({SAME_SERIES}) {c.PCIE_MAX_WIDTH.name}")


def idle(t: Windows) -> str:
    """Per GPU: no more than idle_utilization at any sample over for_idle."""
    return f"max_over_time({c.UTILIZATION.name}[{t.for_idle}]) <= {t.idle_utilization:g}"
