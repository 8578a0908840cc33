"""Alerts of the training family: jobs stalled, slower than their baseline, input bound, ranks lost, slow
checkpoints, stragglers."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import records
from ..common import Alert, Thresholds, _seconds


def training(t: Thresholds) -> list[Alert]:
    """Training jobs: stalled, slower than their baseline, input bound, ranks lost, checkpoints, stragglers."""
    alert = partial(Alert, family="training", scope="job")
    last_step = c.LAST_STEP.name
    last_seen = f"last_over_time({last_step}[{t.long_window}])"
    p50 = records.JOB_STEP_P50.name
    checkpoint = c.CHECKPOINT_DURATION.name
    ended = f"last_over_time({c.RUN_END.name}[{t.long_window}]) > 0"  # the last scrape marked a normal end
    return [
        alert(name="TrainingStalled", expr=f"time() - {last_step} > {_seconds(t.training_stall):g}", for_="0s",
              severity="critical", summary="A training rank has made no step progress.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} has not finished a step for "
                          + t.training_stall + "."),
        alert(name="TrainingStepTimeRegression",
              expr=f"{p50} > {t.step_regression:g} * quantile_over_time(0.5, {p50}[{t.baseline_window}])",
              for_=t.for_medium, severity="warning", summary="Training steps are slower than their own baseline.",
              description="Job {{ $labels.job_id }} steps take {{ $value | humanize }} s, over "
                          + f"{t.step_regression:g}" + "x its median of the last " + t.baseline_window + "."),
        alert(name="TrainingDataLoaderBound", expr=f"{records.DATA_WAIT_RATIO.name} > {t.data_wait_share:g}",
              for_=t.for_medium, severity="warning", summary="Training waits on its data loader.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} spent {{ $value | humanizePercentage "
                          f"}}}} of the last {t.rate_window} waiting for data."),
        alert(name="TrainingRankLost",
              expr=f"{last_seen} unless on (job_id, rank) {last_step} and on (job_id) {last_step} "
                   f"unless on (job, instance) up == 0 unless on (job_id, rank) {ended}",
              for_=t.for_now, severity="critical", summary="A rank of a running training job disappeared.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} stopped reporting while other ranks "
                          "of the job still run: its process exited or its target was removed."),
        alert(name="TrainingTargetDown", expr=records.DEAD_TARGET.name, for_=t.for_now,
              severity="critical", summary="A training target cannot be scraped.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} ({{ $labels.instance }}) is still a "
                          "scrape target but does not answer: the process crashed or hangs."),
        alert(name="TrainingSlowCheckpoint",
              expr=f"rate({checkpoint}_sum[{t.long_window}]) / rate({checkpoint}_count[{t.long_window}]) > "
                   f"{t.checkpoint_seconds:g}",
              for_="0s", severity="warning", summary="Checkpoints take long.",
              description="Job {{ $labels.job_id }} rank {{ $labels.rank }} checkpoints take {{ $value | humanize }} "
                          "s on average."),
        alert(name="TrainingStragglerRank", expr=f"{records.STRAGGLER_RATIO.name} > {t.straggler:g}",
              for_=t.for_medium, severity="warning", summary="One rank computes slower than the rest of its job.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} computes {{ $value | printf \"%.2f\" "
                          "}}x as long per step as the job's other ranks, which wait for it in their collectives."),
    ]
