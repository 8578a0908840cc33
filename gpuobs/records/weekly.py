"""The weekly review group: MIG right-sizing and fleet reliability (GPU-hours, failures, MTBF,
training goodput), from per-GPU step records."""

from __future__ import annotations

import re
from typing import Callable

from .. import catalog as c
from .. import mig
from .base import (
    ATTRIBUTION,
    CLUSTER,
    GPU,
    GPU_BY,
    NODE,
    UNCORRECTED,
    Record,
    Windows,
    _by,
)
from .errors import new_first
from .power import CLUSTER_SM_ACTIVE

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


WeeklyWindows = Windows  # the weekly records' windows: part of the one protocol (records.base.Windows)


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


def _integral(step: Record, unit_s: float = 1) -> Callable[[WeeklyWindows], str]:
    """A step record's integral over weekly_window (each step's value standing for one weekly_interval),
    per unit_s seconds: watts give joules with unit_s 1, GPUs give GPU-hours with 3600."""
    def expr(t: WeeklyWindows) -> str:
        total = f"sum_over_time({step.name}[{t.weekly_window}]) * {duration_seconds(t.weekly_interval):g}"
        return total if unit_s == 1 else f"{total} / {unit_s:g}"
    return expr


def _hours(step: Record) -> Callable[[WeeklyWindows], str]:
    """GPU-hours over weekly_window of a record of GPUs (counted once per step of the group)."""
    return _integral(step, 3600)


def _counted(step: Record, t: WeeklyWindows, matchers: str = "") -> str:
    # a series born within the window (a GPU's first XID) counts with its value: increase() misses it
    return new_first(f"{step.name}{matchers}", t.weekly_window)


GPU_MEMORY_STEP = _step("max", c.MEMORY_USED)


def _sm_step(t: WeeklyWindows) -> str:
    # SM activity (GPM, Hopper+); a GPU without any over long_window (an A100) gets the share of time a
    # kernel ran, never below it: a conservative stand-in (not for a GPM sample late for one step)
    source = CLUSTER_SM_ACTIVE.source
    assert isinstance(source, c.Metric)  # an aggregate of the GPM metric itself
    sm, step = source.name, t.weekly_interval
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
# this family's records of the weekly group (records.WEEKLY adds allocation's GPU-hours)
REVIEW = (GPU_MEMORY_STEP, GPU_SM_STEP, GPU_UP_STEP, GPU_UP_STEP_MIN, GPU_REMAP_FAILURE_STEP, GPU_XID_STEP,
          GPU_ECC_UNCORRECTED_STEP, GPU_MEMORY_PEAK, GPU_SM_PEAK, GPU_MIG_ADVICE, NODE_MODEL_GPUS_UP,
          NODE_MODEL_GPUS_DOWN, NODE_MODEL_GPU_HOURS, NODE_MODEL_GPU_HOURS_LOST, NODE_MODEL_FAILURES,
          CLUSTER_FAILURE_RATE, NODE_MTBF, MODEL_MTBF, CLUSTER_RESTART_HOURS, CLUSTER_GOODPUT)
