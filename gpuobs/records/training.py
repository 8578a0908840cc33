"""Records of training jobs: step-time quantiles, throughput, stragglers, data waits, goodput, MFU."""

from __future__ import annotations

from .. import catalog as c
from .base import (
    JOB,
    RANK,
    Record,
    Windows,
    _by,
    _sum_rate,
    born_counted,
    born_watched,
    rate_of,
    windowed_quantile,
)


def _to_others(rank: Record) -> str:
    """A per-rank record over the mean of the *other* ranks of its job: the job's median is the
    mean with 2 ranks, which hides a 1.3x skew (2 * 1.3 / 2.3 = 1.13); leaving the rank out is exact
    for 2 ranks and robust for 64. Jobs of one rank have no others and no ratio."""
    x = rank.name
    return (f"{x} / ((sum by (job_id) ({x}) - on (job_id) group_right {x}) / on (job_id) "
            f"group_left () ((count by (job_id) ({x}) > 1) - 1))")


def _failed_share(t: Windows) -> str:
    # failed steps counted from a series' birth (records.born_counted): a rank's first failure of an
    # exception type creates its series, at the number of steps that failed before the next scrape
    sel, by = c.STEPS_FAILED.exposed_name, _by(RANK)
    failed = born_counted(sel, t.rate_window, by, born_watched(sel, t.rate_window, "exception"))
    # a rank whose steps all fail has no step counter (it appears at the first completed step): 0 then
    steps = f"sum by ({by}) (increase({c.STEPS.exposed_name}[{t.rate_window}]))"
    return f"{failed} / ({failed} + ({steps} or {failed} * 0))"


# ------------------------------------------------------------------------------------------ training
# Step-time quantiles are computed exactly in each rank's process over its recent steps
# (gpuobs.instrument.quantiles): histogram_quantile over coarse buckets missed a 1.8x regression
# and doubled on an 8 % one. One series per rank: max by only drops scrape labels.
RANK_STEP_P50 = windowed_quantile(RANK, c.STEP_DURATION, 50)
JOB_STEP_P50 = Record(JOB, RANK_STEP_P50, RANK_STEP_P50.operation,  # the median of the ranks' medians
                      lambda t: f"quantile by (job_id) (0.5, {RANK_STEP_P50.name})")
JOB_TOKENS = rate_of(JOB, c.TOKENS_TRAINED)
# Straggler: in a synchronous job every rank's step takes as long as the slowest rank's, so compare
# what differs, the compute time per step (step less data and collective waits)...
COMPUTE_PER_STEP = Record(RANK, c.COMPUTE, "per_step",
                          lambda t: f"{_sum_rate(RANK, c.COMPUTE.exposed_name, t)} / "
                                    f"{_sum_rate(RANK, c.STEPS.exposed_name, t)}")
STRAGGLER_RATIO = Record(RANK, COMPUTE_PER_STEP, "ratio_to_others", lambda t: _to_others(COMPUTE_PER_STEP))
# Shares of wall time from counters over the window, not the last step's ratio
DATA_WAIT_RATIO = Record(RANK, "gpuobs_training_data_wait", "ratio",
                         lambda t: _sum_rate(RANK, c.BADPUT.exposed_name, t, '{cause="data_wait"}'))
# A rank slowed only in its data loader: its data-wait share against the other ranks' (in a
# synchronous job they wait for it in their collectives, not for data, and its compute is unchanged)
DATA_WAIT_TO_OTHERS = Record(RANK, DATA_WAIT_RATIO, "ratio_to_others", lambda t: _to_others(DATA_WAIT_RATIO))
# Steps that raised, as a share of the steps a rank ran (completed or failed) over the window
FAILED_STEP_RATIO = Record(RANK, c.STEPS_FAILED, "ratio", _failed_share)
# A job slowed in its collectives: the share of wall time its ranks spend blocked in them (their
# mean), against the slowest rank's compute per step (steady when the network, not compute, changed)
JOB_COLLECTIVE_WAIT_RATIO = Record(JOB, c.COLLECTIVE_WAIT, "ratio",
                                   lambda t: f"avg by (job_id) ({_sum_rate(RANK, c.COLLECTIVE_WAIT.exposed_name, t)})")
JOB_COMPUTE_PER_STEP_MAX = Record(JOB, COMPUTE_PER_STEP, "per_step_max",
                                  lambda t: f"max by (job_id) ({COMPUTE_PER_STEP.name})")
MFU_RATIO = Record(RANK, "gpuobs_training_mfu", "ratio",
                   lambda t: f"{_sum_rate(RANK, c.FLOPS.exposed_name, t)} / "
                             f"max by (job_id, rank) ({c.PEAK_FLOPS.name})")


def _dead_target(t: Windows) -> str:
    # A latch: a rank seen stepping within long_window whose last scrape did not mark a normal end
    # (instrument/ending.py), or one this record already holds, while its target is down. Reading its
    # own previous evaluation keeps a crashed rank dead for as long as its target stays down, past
    # the window that lost its last step; it lets go when the target answers again (a restart) or
    # leaves service discovery (its `up` is gone).
    seen = f"last_over_time({c.LAST_STEP.name}[{t.long_window}])"
    ended = f"last_over_time({c.RUN_END.name}[{t.long_window}]) > 0"
    return f"({seen} unless on (job, instance) {ended} or {DEAD_TARGET.name}) and on (job, instance) up == 0"


# Training targets down since their rank crashed: one series per rank, with its target's labels
DEAD_TARGET = Record(RANK, "gpuobs_training_target", "dead", _dead_target)
LATCHES = (DEAD_TARGET,)  # the records that read their own previous value (and only those may)

