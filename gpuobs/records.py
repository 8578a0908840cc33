"""The recording rules as named objects: the PromQL contract between the metric catalog and what reads
it (the alert pack, the dashboards, the runbooks).

Every record is named `level:metric:operations`, Prometheus's convention, and the name is computed
each time it is read, never typed: the level from the labels its series keep, the metric from what it
reads (the catalog metric, or the record it aggregates further) and the operation. A record that
defines a quantity of its own (lost GPUs, the share of time spent waiting for data) names that
quantity instead. Expressions are built for a set of windows (`Windows`; gpuobs.alerts.Thresholds is
one); names never depend on them. Nothing here reads a catalog name at import: rename a catalog
metric and every record, rule, panel query and runbook that reads it follows.

The dashboards import this module without the alert pack; `recording_rules` gives the rules of one
profile, in the order of their definitions here (RECORDS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Protocol, Union

from . import catalog as c

GPU_BY = "cluster, node, instance, gpu, uuid"  # one GPU, whatever labels the scrape adds
LEVEL_NAMES = {"gen_ai_request_model": "model"}  # levels named shorter than their label
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
    durations are Prometheus duration strings, utilization a ratio 0-1, memory in bytes."""
    rate_window: str
    long_window: str
    for_idle: str
    idle_utilization: float
    allocated_memory_bytes: float
    trend_step: str  # the rate window of the per-GPU error-rate trends


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
    return (f"{c.PCIE_GENERATION.name} < on ({GPU_BY}) {c.PCIE_MAX_GENERATION.name}"
            f" or {c.PCIE_WIDTH.name} < on ({GPU_BY}) {c.PCIE_MAX_WIDTH.name}")


def idle(t: Windows) -> str:
    """Per GPU: no more than idle_utilization at any sample over for_idle."""
    return f"max_over_time({c.UTILIZATION.name}[{t.for_idle}]) <= {t.idle_utilization:g}"


def _straggler(t: Windows) -> str:
    # ...with the mean of the *other* ranks: the job's median is the mean with 2 ranks, which hides
    # a 1.3x skew (2 * 1.3 / 2.3 = 1.13); leaving the rank out is exact for 2 ranks and robust for
    # 64. Jobs of one rank have no others and no ratio.
    per_step = COMPUTE_PER_STEP.name
    return (f"{per_step} / ((sum by (job_id) ({per_step}) - on (job_id) group_right {per_step}) / on (job_id) "
            f"group_left () ((count by (job_id) ({per_step}) > 1) - 1))")


# -------------------------------------------------------------------------------- inventory, health
NODE_GPUS_EXPECTED = aggregate("sum", NODE, c.GPUS_EXPECTED)
NODE_GPUS_PRESENT = aggregate("sum", NODE, c.GPUS_PRESENT)
CLUSTER_GPUS_EXPECTED = aggregate("sum", CLUSTER, NODE_GPUS_EXPECTED)
CLUSTER_GPUS_PRESENT = aggregate("sum", CLUSTER, NODE_GPUS_PRESENT)
CLUSTER_GPUS_LOST = count_of(CLUSTER, "gpuobs_gpus_lost", lambda t: f"{c.GPU_UP.name} == 0")
# ---------------------------------------------------------------------------- utilization and power
NODE_UTILIZATION = aggregate("avg", NODE, c.UTILIZATION)
CLUSTER_UTILIZATION = aggregate("avg", CLUSTER, c.UTILIZATION)
CLUSTER_SM_ACTIVE = aggregate("avg", CLUSTER, c.GPM_METRICS[2])  # 2: NVML_GPM_METRIC_SM_UTIL
NODE_POWER = aggregate("sum", NODE, c.POWER_USAGE)
CLUSTER_POWER = aggregate("sum", CLUSTER, c.POWER_USAGE)
CLUSTER_POWER_LIMIT = aggregate("sum", CLUSTER, c.POWER_LIMIT)
CLUSTER_THROTTLED = aggregate("sum", ("cluster", "reason"), c.CLOCK_EVENT_ACTIVE, '{reason!="gpu_idle"}')
CLUSTER_MAX_TEMPERATURE = aggregate("max", CLUSTER, c.TEMPERATURE)
NODE_MAX_TEMPERATURE = aggregate("max", NODE, c.TEMPERATURE)
# ------------------------------------------------------------------------------------ interconnects
# Per node, so the fleet dashboard's node filter still applies: per-link NVLink series are 108 per
# H100, and over 6 h on thousands of GPUs their raw rates take seconds to query.
NODE_NVLINK_TX = rate_of(NODE, c.NVLINK_TX)
NODE_NVLINK_RX = rate_of(NODE, c.NVLINK_RX)
NODE_PCIE_TX = rate_of(NODE, c.PCIE_TX)
NODE_PCIE_RX = rate_of(NODE, c.PCIE_RX)
NODE_PCIE_REPLAYS = rate_of(NODE, c.PCIE_REPLAYS)
NODE_NVLINK_ERRORS = rate_of(NODE + ("error_type",), c.NVLINK_ERRORS)
NODE_NVLINK_LINKS_DOWN = count_of(NODE, "gpuobs_gpu_nvlink_links_down", lambda t: f"{c.NVLINK_UP.name} == 0")
# ----------------------------------------------------------------------------------- memory repairs
NODE_REMAP_PENDING = aggregate("sum", NODE, c.REMAP_PENDING)
NODE_REMAP_FAILURE = aggregate("sum", NODE, c.REMAP_FAILURE)
NODE_PCIE_DEGRADED = count_of(NODE, "gpuobs_gpus_pcie_degraded", lambda t: pcie_below_max())
# ------------------------------------------------------------------------------ degradation trends
# Per GPU, the error rates over trend_step (an hour by default: corrected ECC errors come tens an hour,
# so rate_window's rates are 0 or 1 error and all noise) that the degradation alerts compare with their own earlier
# values, and the banks low on spare rows: every label of the series kept, so the alerts and the
# "GPUs most at risk" panel match them to the GPU.
GPU_ECC_CORRECTED_RATE = Record(GPU, c.ECC_ERRORS, "corrected_rate",
                                lambda t: f"rate({c.ECC_ERRORS.exposed_name}{CORRECTED}[{t.trend_step}])")
GPU_PCIE_REPLAYS_RATE = Record(GPU, c.PCIE_REPLAYS, "rate",
                               lambda t: f"rate({c.PCIE_REPLAYS.exposed_name}[{t.trend_step}])")
# CRC and replay errors of all of a GPU's links, by type: one flaky link is the GPU's (or its
# baseboard's) problem, and a GPU's 18 links would make 18 trends to judge
GPU_NVLINK_ERRORS_RATE = Record(
    GPU, c.NVLINK_ERRORS, "rate",
    lambda t: f'sum without (link) (rate({c.NVLINK_ERRORS.exposed_name}{{error_type=~"crc|replay"}}[{t.trend_step}]))')
GPU_REMAP_BANKS_LOW = Record(GPU, c.REMAP_BANKS, "low_or_none",
                             lambda t: f'sum without (availability) ({c.REMAP_BANKS.name}{{availability=~"low|none"}})')
# ------------------------------------------------------------------------------------------- idle
GPU_ALLOCATED = Record(GPU, "gpuobs_gpu_allocated", "bool",
                       lambda t: f"{c.MEMORY_USED.name} > bool {t.allocated_memory_bytes:g}")
CLUSTER_GPUS_IDLE = count_of(CLUSTER, "gpuobs_gpus_idle", idle)
CLUSTER_GPUS_ALLOCATED_IDLE = count_of(CLUSTER, "gpuobs_gpus_allocated_idle",
                                       lambda t: f"({idle(t)}) and on ({GPU_BY}) {GPU_ALLOCATED.name} == 1")
# ---------------------------------------------------------------------------------------- errors
# a series born within the window (its first XID) counts with its value: increase() misses it
CLUSTER_XID_ERRORS = Record(
    ("cluster", "xid"), c.XID_ERRORS, "increase",
    lambda t: f"sum by (cluster, xid) (increase({c.XID_ERRORS.exposed_name}[{t.long_window}]) or "
              f"({c.XID_ERRORS.exposed_name} unless {c.XID_ERRORS.exposed_name} offset {t.long_window}))")
CLUSTER_ECC_UNCORRECTED = Record(
    CLUSTER, "gpuobs_gpu_ecc_uncorrected", "increase",
    lambda t: f"sum by (cluster) (increase({c.ECC_ERRORS.exposed_name}{UNCORRECTED}[{t.long_window}]))")
# ------------------------------------------------------------------------------------------ training
# Step-time quantiles are computed exactly in each rank's process over its recent steps
# (gpuobs.instrument.quantiles): histogram_quantile over coarse buckets missed a 1.8x regression
# and doubled on an 8 % one. One series per rank: max by only drops scrape labels.
RANK_STEP_P50 = windowed_quantile(RANK, c.STEP_DURATION, 50)
RANK_STEP_P99 = windowed_quantile(RANK, c.STEP_DURATION, 99)
JOB_STEP_P50 = Record(JOB, RANK_STEP_P50, RANK_STEP_P50.operation,  # the median of the ranks' medians
                      lambda t: f"quantile by (job_id) (0.5, {RANK_STEP_P50.name})")
JOB_TOKENS = rate_of(JOB, c.TOKENS_TRAINED)
JOB_SAMPLES = rate_of(JOB, c.SAMPLES_TRAINED)
# Straggler: in a synchronous job every rank's step takes as long as the slowest rank's, so compare
# what differs, the compute time per step (step less data and collective waits)...
COMPUTE_PER_STEP = Record(RANK, c.COMPUTE, "per_step",
                          lambda t: f"{_sum_rate(RANK, c.COMPUTE.exposed_name, t)} / "
                                    f"{_sum_rate(RANK, c.STEPS.exposed_name, t)}")
STRAGGLER_RATIO = Record(RANK, COMPUTE_PER_STEP, "ratio_to_others", _straggler)
# Shares of wall time from counters over the window, not the last step's ratio
DATA_WAIT_RATIO = Record(RANK, "gpuobs_training_data_wait", "ratio",
                         lambda t: _sum_rate(RANK, c.BADPUT.exposed_name, t, '{cause="data_wait"}'))
JOB_DATA_WAIT_RATIO = aggregate("avg", JOB, DATA_WAIT_RATIO)
GOODPUT_RATIO = Record(RANK, c.GOODPUT, "ratio", lambda t: _sum_rate(RANK, c.GOODPUT.exposed_name, t))
MFU_RATIO = Record(RANK, "gpuobs_training_mfu", "ratio",
                   lambda t: f"{_sum_rate(RANK, c.FLOPS.exposed_name, t)} / "
                             f"max by (job_id, rank) ({c.PEAK_FLOPS.name})")
# ----------------------------------------------------------------------------------------- inference
MODEL_REQUEST_P99 = windowed_quantile(MODEL, c.REQUEST_DURATION, 99)
MODEL_TTFT_P99 = windowed_quantile(MODEL, c.TIME_TO_FIRST_TOKEN, 99)
MODEL_REQUESTS = Record(MODEL, "gen_ai_server_requests", "rate",
                        lambda t: _sum_rate(MODEL, f"{c.REQUEST_DURATION.name}_count", t))

RECORDS: tuple[Record, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Record))
NAMES: dict[str, Record] = {k: v for k, v in list(globals().items()) if isinstance(v, Record)}  # by Python name

# ------------------------------------------------------------------------------------------- rules
TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")  # a PromQL identifier: metric, record, label or function


def metrics_read(expr: str) -> set[c.Metric]:
    """The catalog metrics whose samples a PromQL expression names (by their names now)."""
    tokens = set(TOKEN.findall(expr))
    return {m for m in c.ALL if tokens.intersection({m.exposed_name, *m.prometheus_samples})}


def per_link(expr: str) -> bool:
    """Whether expr reads per-link NVLink series (a `link` label: 72 to 108 series per GPU), which
    rule groups of their own keep from delaying the others on a big fleet."""
    return any("link" in m.labels for m in metrics_read(expr))


@dataclass(frozen=True)
class Rule:
    """One recording rule of one profile, as a rule file holds it; group is "recording", or
    "recording-links" for those that read per-link series."""
    record: str
    expr: str
    group: str


def recording_rules(t: Windows) -> list[Rule]:
    """The fleet aggregates dashboards and alerts read (cheap to query on thousands of GPUs), for windows t."""
    rules = []
    for r in RECORDS:
        expr = r.expr(t)
        rules.append(Rule(r.name, expr, "recording-links" if per_link(expr) else "recording"))
    return rules
