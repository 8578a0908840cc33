"""Records of training jobs: step-time quantiles, throughput, stragglers, data waits, goodput, MFU."""

from __future__ import annotations

from .. import catalog as c
from .base import (
    JOB,
    RANK,
    Record,
    Windows,
    _sum_rate,
    rate_of,
    windowed_quantile,
)


def _straggler(t: Windows) -> str:
    # ...with the mean of the *other* ranks: the job's median is the mean with 2 ranks, which hides
    # a 1.3x skew (2 * 1.3 / 2.3 = 1.13); leaving the rank out is exact for 2 ranks and robust for
    # 64. Jobs of one rank have no others and no ratio.
    per_step = COMPUTE_PER_STEP.name
    return (f"{per_step} / ((sum by (job_id) ({per_step}) - on (job_id) group_right {per_step}) / on (job_id) "
            f"group_left () ((count by (job_id) ({per_step}) > 1) - 1))")


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
STRAGGLER_RATIO = Record(RANK, COMPUTE_PER_STEP, "ratio_to_others", _straggler)
# Shares of wall time from counters over the window, not the last step's ratio
DATA_WAIT_RATIO = Record(RANK, "gpuobs_training_data_wait", "ratio",
                         lambda t: _sum_rate(RANK, c.BADPUT.exposed_name, t, '{cause="data_wait"}'))
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

