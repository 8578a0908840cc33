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
from . import mig

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
    return (f"{c.PCIE_GENERATION.name} < on ({SAME_SERIES}) {c.PCIE_MAX_GENERATION.name}"
            f" or {c.PCIE_WIDTH.name} < on ({SAME_SERIES}) {c.PCIE_MAX_WIDTH.name}")


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
# Per node, so the fleet dashboard's node filter still applies; NVLink from the per-GPU totals over
# the GPU's links, which the default profile serves (the per-link series are detail).
NODE_NVLINK_TX = rate_of(NODE, c.NVLINKS_TX)
NODE_NVLINK_RX = rate_of(NODE, c.NVLINKS_RX)
NODE_PCIE_TX = rate_of(NODE, c.PCIE_TX)
NODE_PCIE_RX = rate_of(NODE, c.PCIE_RX)
NODE_PCIE_REPLAYS = rate_of(NODE, c.PCIE_REPLAYS)
NODE_NVLINK_ERRORS = rate_of(NODE, c.NVLINKS_ERRORS)
NODE_NVLINK_LINKS_DOWN = aggregate("sum", NODE, c.NVLINKS_DOWN)
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
# Data-link errors of all of a GPU's links: one flaky link is the GPU's (or its baseboard's)
# problem, and a GPU's 18 links would make 18 trends to judge
GPU_NVLINK_ERRORS_RATE = Record(GPU, c.NVLINKS_ERRORS, "rate",
                                lambda t: f"rate({c.NVLINKS_ERRORS.exposed_name}[{t.trend_step}])")
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

# ------------------------------------------------- weekly review: MIG right-sizing and fleet reliability
# One slow rule group (WEEKLY_GROUP, evaluated every weekly_interval: 5m by default) over weekly_window
# (7d). No rule reads 7 days of raw scrapes: per-GPU step records first sample each step's raw series
# once (max, min or average over weekly_interval: 10 samples of a 30 s scrape), and the weekly records
# read those, 2016 samples a week per series; rules of a group run in order, so each step record is
# fresh when the weekly ones read it. Only the training goodput/badput counters (one series per rank)
# are read raw over the week (GPU info and GPM presence over long_window). That is about 12,000
# samples per GPU per evaluation, 120 million every 5 minutes on 10,000 GPUs (seconds of one core);
# weekly_interval 1h cuts it twelvefold, at an hour's resolution for GPUs lost and back.
WEEKLY_GROUP = "recording-weekly"
MODEL_BY = ("cluster", "node", "name")  # name: gpuobs_gpu_info's NVML device name, the GPU model
XID_TIERS = {  # failure classes of XIDs, by the action they need (the XID alerts' tiers)
    "xid_reboot": "79", "xid_reset": "48|62|63|64|95|119|120", "xid_application": "94|13|31|43|45", "xid_nvlink": "74"}
NOT_HARDWARE = ("xid_application",)  # contained application errors: no GPU failure, out of MTBF


class WeeklyWindows(Windows, Protocol):
    """Windows of the weekly group (gpuobs.alerts.Thresholds has them): weekly_window the review
    window, weekly_interval the group's evaluation interval (the step of its step records),
    mig_headroom the ratio added to a GPU's peaks before they must fit a MIG profile (0.2 = 20 %)."""
    weekly_window: str
    weekly_interval: str
    mig_headroom: float
    eval_interval: str  # of the other recording groups, whose records the weekly group averages


DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(duration: str) -> float:
    """A Prometheus duration ("5m", "1h30m") in seconds; ValueError on anything else."""
    parts = DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * UNIT_S[u] for n, u in parts)


def with_model(expr: str, t: Windows) -> str:
    """A per-GPU expression with the GPU's model (label `name`) from gpuobs_gpu_info seen within
    long_window; series of a GPU without info that long keep no model (still counted per node)."""
    info = f"max by ({GPU_BY}, name) (last_over_time({c.GPU_INFO.exposed_name}[{t.long_window}]))"
    return f"({expr}) * on ({GPU_BY}) group_left (name) {info} or ignoring (name) ({expr})"


def per_gpu(op: str, expr: str) -> str:
    """expr's series combined per GPU across attribution changes with `op` (max, min or sum)."""
    return f"{op} without ({', '.join(ATTRIBUTION)}) ({expr})"


def _step(op: str, source: c.Metric, matchers: str = "") -> Record:
    """Per GPU, `op` (max, min or avg) over one step of the weekly group of a catalog series, across
    the series attribution splits it into (an average as sum over count of every sample)."""
    def expr(t: WeeklyWindows) -> str:
        sel = f"{source.exposed_name}{matchers}[{t.weekly_interval}]"
        if op == "avg":
            return f"{per_gpu('sum', f'sum_over_time({sel})')} / {per_gpu('sum', f'count_over_time({sel})')}"
        return per_gpu(op, f"{op}_over_time({sel})")
    return Record(GPU, source, op, expr)


def _peak(step: Record) -> Record:
    """Per GPU, the largest of a step record over weekly_window."""
    return Record(GPU, step, "peak", lambda t: f"max_over_time({step.name}[{t.weekly_window}])")


def _by_model(expr: str, t: Windows) -> str:
    return f"sum by ({_by(MODEL_BY)}) ({with_model(expr, t)})"


def _hours(step: Record) -> Callable[[WeeklyWindows], str]:
    """GPU-hours over weekly_window of a record of GPUs (counted once per step of the group)."""
    return lambda t: f"sum_over_time({step.name}[{t.weekly_window}]) * {duration_seconds(t.weekly_interval):g} / 3600"


def _counted(step: Record, t: WeeklyWindows, matchers: str = "") -> str:
    # a series born within the window (a GPU's first XID) counts with its value: increase() misses it
    w, sel = t.weekly_window, f"{step.name}{matchers}"
    return f"increase({sel}[{w}]) or ({sel} unless {sel} offset {w})"


GPU_MEMORY_STEP = _step("max", c.MEMORY_USED)


def _sm_step(t: WeeklyWindows) -> str:
    # SM activity (GPM, Hopper+); a GPU without any over long_window (an A100) gets the share of time a
    # kernel ran, never below it: a conservative stand-in (not for a GPM sample late for one step)
    sm, step = CLUSTER_SM_ACTIVE.source.name, t.weekly_interval
    return per_gpu("max", f"max_over_time({sm}[{step}]) or on ({GPU_BY}) (max_over_time({c.UTILIZATION.name}[{step}]) "
                          f"unless on ({GPU_BY}) present_over_time({sm}[{t.long_window}]))")


GPU_SM_STEP = Record(GPU, CLUSTER_SM_ACTIVE.source, "max", _sm_step)
GPU_UP_STEP = _step("avg", c.GPU_UP)  # the share of the step the GPU answered
GPU_UP_STEP_MIN = _step("min", c.GPU_UP)  # 0 if it was lost at any time in the step
GPU_REMAP_FAILURE_STEP = _step("max", c.REMAP_FAILURE)
GPU_XID_STEP = _step("max", c.XID_ERRORS)
GPU_ECC_UNCORRECTED_STEP = Record(
    GPU, "gpuobs_gpu_ecc_uncorrected", "max",
    lambda t: per_gpu("max", f"max_over_time({c.ECC_ERRORS.exposed_name}{UNCORRECTED}[{t.weekly_interval}])"))
GPU_MEMORY_PEAK = _peak(GPU_MEMORY_STEP)
GPU_SM_PEAK = _peak(GPU_SM_STEP)


def _fits(p: mig.Profile, t: WeeklyWindows) -> str:
    """GPUs whose peaks with headroom fit profile p: value its compute slices, label `profile`."""
    grow = 1 + t.mig_headroom
    fit = (f"{GPU_MEMORY_PEAK.name} * {grow:g} <= {p.memory_bytes:g} and on ({GPU_BY}) "
           f"{GPU_SM_PEAK.name} * {grow:g} <= {p.sm_share!r}")  # repr: the very float gpuobs.mig compares
    return f'label_replace({p.compute_slices} + 0 * ({fit}), "profile", "{p.name}", "", "")'


def _mig_advice(t: WeeklyWindows) -> str:
    # per model, its profiles smallest first: `or ignoring (profile)` keeps a GPU's first fit only
    models = [f"(({' or ignoring (profile) '.join(_fits(p, t) for p in m.profiles)}) "
              f'and on ({GPU_BY}) {c.GPU_INFO.exposed_name}{{name=~"{m.name_regex}"}})' for m in mig.MODELS]
    return f"({' or '.join(models)}) unless on ({GPU_BY}) {c.MIG_MODE.name} == 1"


# Per GPU not in MIG mode, the smallest MIG profile of its model (gpuobs.mig) that its week's peak
# memory and SM activity fit with mig_headroom: label `profile`, value the profile's compute slices of 7
GPU_MIG_ADVICE = Record(GPU, "gpuobs_gpu_mig_profile", "smallest_fit", _mig_advice)
# GPUs up (and down: lost, unusable, timed out) per node and model, each step: GPU-hours when summed
NODE_MODEL_GPUS_UP = Record(MODEL_BY, "gpuobs_gpus_up", "sum", lambda t: _by_model(GPU_UP_STEP.name, t))
NODE_MODEL_GPUS_DOWN = Record(MODEL_BY, "gpuobs_gpus_down", "sum", lambda t: _by_model(f"1 - {GPU_UP_STEP.name}", t))
NODE_MODEL_GPU_HOURS = Record(MODEL_BY, "gpuobs_gpu_hours_up", "sum", _hours(NODE_MODEL_GPUS_UP))
NODE_MODEL_GPU_HOURS_LOST = Record(MODEL_BY, "gpuobs_gpu_hours_down", "sum", _hours(NODE_MODEL_GPUS_DOWN))


def _failure_terms(t: WeeklyWindows) -> dict[str, str]:
    """Per failure class, its events per node and model over weekly_window."""
    terms = {tier: _by_model(_counted(GPU_XID_STEP, t, f'{{xid=~"{x}"}}'), t) for tier, x in XID_TIERS.items()}
    w = t.weekly_window
    terms["gpu_lost"] = _by_model(f"resets({GPU_UP_STEP_MIN.name}[{w}])", t)  # falls of 1 to 0
    terms["remap_failure"] = _by_model(  # rises of 0 to 1
        f"changes({GPU_REMAP_FAILURE_STEP.name}[{w}]) - resets({GPU_REMAP_FAILURE_STEP.name}[{w}])", t)
    terms["ecc_uncorrected"] = _by_model(_counted(GPU_ECC_UNCORRECTED_STEP, t), t)
    return terms


def _failures(t: WeeklyWindows) -> str:
    # 0, not nothing, for a class without events on a node that had GPU-hours: rates of 0 are data
    zero = f"0 * {NODE_MODEL_GPU_HOURS.name}"
    return " or ".join(f'label_replace(({term}) or {zero}, "class", "{cls}", "", "")'
                       for cls, term in _failure_terms(t).items())


NODE_MODEL_FAILURES = Record(MODEL_BY + ("class",), "gpuobs_gpu_failures", "increase", _failures)
CLUSTER_FAILURE_RATE = Record(
    ("cluster", "class"), "gpuobs_gpu_failures", "per_1000_gpu_hours",
    lambda t: f"1000 * sum by (cluster, class) ({NODE_MODEL_FAILURES.name}) / on (cluster) group_left () "
              f"(sum by (cluster) ({NODE_MODEL_GPU_HOURS.name}) > 0)")


def _mtbf(by: tuple[str, ...]) -> Record:
    """GPU-hours up per hardware failure (every class but NOT_HARDWARE) over weekly_window, by `by`;
    no series without failures."""
    hardware = f'{{class!~"{"|".join(NOT_HARDWARE)}"}}'
    return Record(by, "gpuobs_gpu_mtbf_hours", "ratio",
                  lambda t: f"sum by ({_by(by)}) ({NODE_MODEL_GPU_HOURS.name}) / "
                            f"(sum by ({_by(by)}) ({NODE_MODEL_FAILURES.name}{hardware}) > 0)")


NODE_MTBF = _mtbf(NODE)
MODEL_MTBF = _mtbf(("cluster", "name"))


def _training_seconds(metric: c.Metric, matchers: str = "") -> Callable[[WeeklyWindows], str]:
    return lambda t: f"sum by (cluster) (increase({metric.exposed_name}{matchers}[{t.weekly_window}]))"


RESTART_CAUSES = '{cause=~"checkpoint|startup"}'
# Training: rank-seconds (one rank, one GPU) over weekly_window, in hours: lost to checkpoint saves and
# to restarts (a restarted rank's startup: process start to first step, the checkpoint load included)
CLUSTER_RESTART_HOURS = Record(
    CLUSTER, "gpuobs_training_checkpoint_restart_hours", "sum",
    lambda t: f"{_training_seconds(c.BADPUT, RESTART_CAUSES)(t)} / 3600")
# ...and the fleet's goodput: time in steps over all time of the training ranks
CLUSTER_GOODPUT = Record(
    CLUSTER, c.GOODPUT, "ratio",
    lambda t: f"{_training_seconds(c.GOODPUT)(t)} / ({_training_seconds(c.GOODPUT)(t)} + "
              f"({_training_seconds(c.BADPUT)(t)} or 0 * {_training_seconds(c.GOODPUT)(t)}))")
WEEKLY = (GPU_MEMORY_STEP, GPU_SM_STEP, GPU_UP_STEP, GPU_UP_STEP_MIN, GPU_REMAP_FAILURE_STEP, GPU_XID_STEP,
          GPU_ECC_UNCORRECTED_STEP, GPU_MEMORY_PEAK, GPU_SM_PEAK, GPU_MIG_ADVICE, NODE_MODEL_GPUS_UP,
          NODE_MODEL_GPUS_DOWN, NODE_MODEL_GPU_HOURS, NODE_MODEL_GPU_HOURS_LOST, NODE_MODEL_FAILURES,
          CLUSTER_FAILURE_RATE, NODE_MTBF, MODEL_MTBF, CLUSTER_RESTART_HOURS, CLUSTER_GOODPUT)

# ------------------------------------------------------------------------ placement (topology family)
# Per pod (Kubernetes attribution) and per Slurm job: GPUs held, the NVLink domains its GPUs span on
# one node (1 for a pod whose GPUs all share NVLink, so a good placement is a value too; a Slurm job's
# worst node) and the NUMA nodes (CPU sockets) its GPUs span. The domain of a GPU is the lowest index
# it shares NVLink with (gpuobs_gpu_topology_nvlink_domain): one series per GPU, where the GPU pairs
# are n - 1 per GPU and detail.
POD = ("cluster", "node", "k8s_namespace", "k8s_pod")
HPC_JOB = ("cluster", "hpc_job")


def _held(by: tuple[str, ...]) -> str:
    return f'count by ({_by(by)}) ({c.GPU_INFO.exposed_name}{{{by[-1]}!=""}})'


def _nvlink_domains(by: tuple[str, ...]) -> str:
    per_node = by if "node" in by else by + ("node",)  # domain 0 of two hosts is two domains, never shared
    per_node_count = (f'count by ({_by(per_node)}) (count_values by ({_by(per_node)}) ("domain", '
                      f'{c.NVLINK_DOMAIN.name}{{{by[-1]}!=""}}))')
    return per_node_count if per_node == by else f"max by ({_by(by)}) ({per_node_count})"


def _numa_nodes(by: tuple[str, ...]) -> str:
    per_node = by if "node" in by else by + ("node",)  # NUMA node 0 of two hosts is two sockets
    return (f'count by ({_by(by)}) (count_values by ({_by(per_node)}) ("numa_node", '
            f'{c.NUMA_NODE.name}{{{by[-1]}!=""}}))')


# GPUs in the node's largest NVLink domain: > 1 when the node has NVLink between some GPUs
NODE_NVLINK_DOMAIN_MAX = Record(NODE, "gpuobs_gpu_nvlink_domain_gpus", "max",
                                lambda t: f'max by ({_by(NODE)}) (count_values by ({_by(NODE)}) ("domain", '
                                          f'{c.NVLINK_DOMAIN.name}))')
POD_GPUS_HELD = Record(POD, "gpuobs_gpus_held", "count", lambda t: _held(POD))
POD_NVLINK_DOMAINS = Record(POD, "gpuobs_gpu_nvlink_domains", "count", lambda t: _nvlink_domains(POD))
POD_NUMA_NODES = Record(POD, "gpuobs_gpu_numa_nodes", "count", lambda t: _numa_nodes(POD))
JOB_GPUS_HELD = Record(HPC_JOB, "gpuobs_gpus_held", "count", lambda t: _held(HPC_JOB))
JOB_NVLINK_DOMAINS = Record(HPC_JOB, "gpuobs_gpu_nvlink_domains", "max", lambda t: _nvlink_domains(HPC_JOB))
JOB_NUMA_NODES = Record(HPC_JOB, "gpuobs_gpu_numa_nodes", "count", lambda t: _numa_nodes(HPC_JOB))

# ------------------------------------------------------------------- allocation, use and cost (fleet efficiency)
# Per namespace, per team and per Slurm job: GPUs allocated (carrying the attribution label: a pod or a
# job holds them), used (the sum of their utilisation, the share of time a kernel ran: every model has
# it, where SM activity needs GPM, Hopper and later, and would price an A100 and an H100 of the same
# job differently), wasted (allocated at or under idle_utilization now: the same test, sample by
# sample, as gpuobs.report's idle GPU-hours) and what they cost an hour in the settings' currency
# (Thresholds.gpu_hour_costs by GPU model). The weekly group turns each into GPU-hours (money for the
# cost) over weekly_window, sampling the record once a step as the weekly section does. Teams come
# from kube-state-metrics' namespace labels (Thresholds.team_label); a namespace without one is its
# own team, as in the report; one kube-state-metrics per Prometheus: namespaces match by name only.
# Pending demand and quota come from kube-state-metrics and Kueue, whose names are theirs (below).
KSM_REQUESTS = "kube_pod_container_resource_requests"
KSM_GPU = 'resource="nvidia_com_gpu"'  # kube-state-metrics writes nvidia.com/gpu with an underscore
KSM_PHASE = "kube_pod_status_phase"
KSM_NAMESPACE_LABELS = "kube_namespace_labels"
KUEUE_PENDING = "kueue_pending_workloads"
KUEUE_USAGE = "kueue_cluster_queue_resource_usage"
KUEUE_QUOTA = "kueue_cluster_queue_nominal_quota"
KUEUE_GPU = 'resource="nvidia.com/gpu"'  # Kueue keeps the resource's own name
NAMESPACE = ("cluster", "k8s_namespace")
TEAM = ("cluster", "team")
CLUSTER_QUEUE = ("cluster", "cluster_queue")


class CostWindows(Windows, Protocol):
    """Settings of the allocation records (gpuobs.alerts.Thresholds has them): team_label the
    kube_namespace_labels label naming a namespace's team; gpu_hour_costs (gpuobs_gpu_info `name`
    regex, cost per GPU-hour) pairs, the first match wins, else gpu_hour_cost_default."""
    team_label: str
    gpu_hour_costs: tuple[tuple[str, float], ...]
    gpu_hour_cost_default: float


def gpu_hour_cost(t: CostWindows) -> str:
    """Per GPU (GPU_BY labels), its cost per GPU-hour: the first pair of t.gpu_hour_costs whose regex
    matches its model, else the default (`or` keeps the left operand's series)."""
    info = c.GPU_INFO.exposed_name
    terms = [f'({cost:g} * group by ({GPU_BY}) ({info}{{name=~"{regex}"}}))' for regex, cost in t.gpu_hour_costs]
    return " or ".join(terms + [f"({t.gpu_hour_cost_default:g} * group by ({GPU_BY}) ({info}))"])


def _allocated(by: tuple[str, ...], condition: str = "") -> str:
    """Utilization of the GPUs a holder (`by`) has, filtered by condition."""
    return f'{c.UTILIZATION.name}{{{by[-1]}!=""}}{condition}'


def _holdings(by: tuple[str, ...]) -> str:
    """The GPUs a holder has: gpuobs_gpu_up, which every GPU reports (a GPU in MIG mode has no
    utilization rate: NVML does not give one), lost or timed out ones too (they are still held)."""
    return f'{c.GPU_UP.name}{{{by[-1]}!=""}}'


def _wasted(t: Windows) -> str:
    return f" <= {t.idle_utilization:g}"


def _priced(by: tuple[str, ...], condition: Callable[[Windows], str] | None = None) -> Callable[[CostWindows], str]:
    """Cost per hour of the GPUs held (condition None) or of the held GPUs whose utilization meets
    condition, summed by `by`."""
    def expr(t: CostWindows) -> str:
        gpus = _holdings(by) if condition is None else _allocated(by, condition(t))
        return f"sum by ({_by(by)}) (({gpus}) * 0 + on ({GPU_BY}) group_left () ({gpu_hour_cost(t)}))"
    return expr


def _usage(by: tuple[str, ...]) -> tuple[Record, ...]:
    """GPUs allocated, used and wasted, and the cost per hour of the allocated and wasted ones, by `by`."""
    return (Record(by, "gpuobs_gpus_allocated", "count", lambda t: f"count by ({_by(by)}) ({_holdings(by)})"),
            Record(by, "gpuobs_gpus_used", "sum", lambda t: f"sum by ({_by(by)}) ({_allocated(by)})"),
            Record(by, "gpuobs_gpus_wasted", "count",
                   lambda t: f"count by ({_by(by)}) ({_allocated(by, _wasted(t))}) or {_none(by)}"),
            Record(by, "gpuobs_gpus_allocated_cost_per_hour", "sum", _priced(by)),
            Record(by, "gpuobs_gpus_wasted_cost_per_hour", "sum",
                   lambda t: f"{_priced(by, _wasted)(t)} or {_none(by)}"))


def _none(by: tuple[str, ...]) -> str:
    # 0, not nothing, where GPUs are allocated and none is wasted: a holder without waste is data too
    return f"0 * count by ({_by(by)}) ({_holdings(by)})"


def _teams(t: CostWindows) -> str:
    """Per namespace with a team label, k8s_namespace and team (kube-state-metrics' namespace is renamed)."""
    team = t.team_label
    named = f'max by (namespace, {team}) ({KSM_NAMESPACE_LABELS}{{{team}!=""}})'
    return (f'label_replace(label_replace({named}, "k8s_namespace", "$1", "namespace", "(.*)"), '
            f'"team", "$1", "{team}", "(.*)")')


def _by_team(source: Record) -> Record:
    """A namespace record summed by team; a namespace without a team label is its own team."""
    own = f'label_replace({source.name}, "team", "$1", "k8s_namespace", "(.*)")'
    return Record(TEAM, source, source.operation,
                  lambda t: f"sum by ({_by(TEAM)}) (({source.name} * on (k8s_namespace) group_left (team) "
                            f"{_teams(t)}) or on (k8s_namespace) {own})")


def _weekly(now: Record, hours_of: str) -> tuple[Record, Record]:
    """A step record of `now` (its average over weekly_interval, an evaluation without a series
    counting as 0: a pod or job present for part of the step counts for that part, where
    avg_over_time would count it for the whole step) and its sum over weekly_window in hours."""
    def average(t: WeeklyWindows) -> str:
        step = duration_seconds(t.weekly_interval)
        # (t - step, t]: a 1 ms shorter range, so that Prometheus 2 (which includes a sample exactly at
        # t - step) and 3 (which does not) both see one step's evaluations when the groups tick together
        return f"sum_over_time({now.name}[{round(step * 1000) - 1}ms]) / {step / duration_seconds(t.eval_interval):g}"
    step = Record(now.by, now, "avg", average)
    return step, Record(now.by, hours_of, "sum", _hours(step))


(NAMESPACE_GPUS_ALLOCATED, NAMESPACE_GPUS_USED, NAMESPACE_GPUS_WASTED, NAMESPACE_ALLOCATED_COST,
 NAMESPACE_WASTED_COST) = _usage(NAMESPACE)
(JOB_GPUS_ALLOCATED, JOB_GPUS_USED, JOB_GPUS_WASTED, JOB_ALLOCATED_COST, JOB_WASTED_COST) = _usage(HPC_JOB)
(TEAM_GPUS_ALLOCATED, TEAM_GPUS_USED, TEAM_GPUS_WASTED, TEAM_ALLOCATED_COST, TEAM_WASTED_COST) = (
    _by_team(r) for r in (NAMESPACE_GPUS_ALLOCATED, NAMESPACE_GPUS_USED, NAMESPACE_GPUS_WASTED,
                          NAMESPACE_ALLOCATED_COST, NAMESPACE_WASTED_COST))
HOURS_OF = {"gpuobs_gpus_allocated": "gpuobs_gpu_hours_allocated", "gpuobs_gpus_used": "gpuobs_gpu_hours_used",
            "gpuobs_gpus_wasted": "gpuobs_gpu_hours_wasted",
            "gpuobs_gpus_wasted_cost_per_hour": "gpuobs_gpus_wasted_cost"}
WEEKLY_USAGE = {level: tuple(x for now in (allocated, used, wasted, cost) for x in _weekly(now, HOURS_OF[now.metric]))
                for level, allocated, used, wasted, cost in (
                    ("namespace", NAMESPACE_GPUS_ALLOCATED, NAMESPACE_GPUS_USED, NAMESPACE_GPUS_WASTED,
                     NAMESPACE_WASTED_COST),
                    ("team", TEAM_GPUS_ALLOCATED, TEAM_GPUS_USED, TEAM_GPUS_WASTED, TEAM_WASTED_COST),
                    ("job", JOB_GPUS_ALLOCATED, JOB_GPUS_USED, JOB_GPUS_WASTED, JOB_WASTED_COST))}
(NAMESPACE_ALLOCATED_STEP, NAMESPACE_GPU_HOURS_ALLOCATED, NAMESPACE_USED_STEP, NAMESPACE_GPU_HOURS_USED,
 NAMESPACE_WASTED_STEP, NAMESPACE_GPU_HOURS_WASTED, NAMESPACE_WASTED_COST_STEP,
 NAMESPACE_WASTED_COST_WEEK) = WEEKLY_USAGE["namespace"]
(TEAM_ALLOCATED_STEP, TEAM_GPU_HOURS_ALLOCATED, TEAM_USED_STEP, TEAM_GPU_HOURS_USED,
 TEAM_WASTED_STEP, TEAM_GPU_HOURS_WASTED, TEAM_WASTED_COST_STEP, TEAM_WASTED_COST_WEEK) = WEEKLY_USAGE["team"]
(JOB_ALLOCATED_STEP, JOB_GPU_HOURS_ALLOCATED, JOB_USED_STEP, JOB_GPU_HOURS_USED,
 JOB_WASTED_STEP, JOB_GPU_HOURS_WASTED, JOB_WASTED_COST_STEP, JOB_WASTED_COST_WEEK) = WEEKLY_USAGE["job"]
WEEKLY = WEEKLY + tuple(x for records in WEEKLY_USAGE.values() for x in records)  # in the weekly group too


def _pending(t: Windows) -> str:
    # GPUs requested by the containers of pods Pending now (kube_pod_status_phase is 1 for the phase
    # a pod is in), kube-state-metrics' namespace renamed as attribution names it
    pending = f'{KSM_PHASE}{{phase="Pending"}} == 1'
    demand = (f"sum by (cluster, namespace) ({KSM_REQUESTS}{{{KSM_GPU}}} * on (cluster, namespace, pod) "
              f"group_left () ({pending}))")
    return f'sum by ({_by(NAMESPACE)}) (label_replace({demand}, "k8s_namespace", "$1", "namespace", "(.*)"))'


NAMESPACE_GPUS_PENDING = Record(NAMESPACE, "gpuobs_gpus_requested_pending", "sum", _pending)
QUEUE_PENDING_WORKLOADS = Record(CLUSTER_QUEUE, KUEUE_PENDING, "sum",
                                 lambda t: f"sum by ({_by(CLUSTER_QUEUE)}) ({KUEUE_PENDING})")
QUEUE_GPU_USAGE = Record(CLUSTER_QUEUE, "gpuobs_kueue_gpus_used", "sum",
                         lambda t: f"sum by ({_by(CLUSTER_QUEUE)}) ({KUEUE_USAGE}{{{KUEUE_GPU}}})")
QUEUE_GPU_QUOTA = Record(CLUSTER_QUEUE, "gpuobs_kueue_gpus_nominal_quota", "sum",
                         lambda t: f"sum by ({_by(CLUSTER_QUEUE)}) ({KUEUE_QUOTA}{{{KUEUE_GPU}}})")
# GPUs in use over the nominal quota (the queue's fair share), every flavor together; over 1: borrowing
QUEUE_GPU_QUOTA_USED = Record(CLUSTER_QUEUE, "gpuobs_kueue_gpu_quota_used", "ratio",
                              lambda t: f"{QUEUE_GPU_USAGE.name} / ({QUEUE_GPU_QUOTA.name} > 0)")

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
    """One recording rule of one profile, as a rule file holds it; group is "recording",
    "recording-links" for those that read per-link series, or WEEKLY_GROUP for the weekly records."""
    record: str
    expr: str
    group: str


def recording_rules(t: Windows) -> list[Rule]:
    """The fleet aggregates dashboards and alerts read (cheap to query on thousands of GPUs), for windows t."""
    rules = []
    for r in RECORDS:
        expr = r.expr(t)
        group = WEEKLY_GROUP if r in WEEKLY else "recording-links" if per_link(expr) else "recording"
        rules.append(Rule(r.name, expr, group))
    return rules
