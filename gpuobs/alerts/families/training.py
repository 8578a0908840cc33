"""Alerts of the training family: jobs stalled, slower than their baseline, input bound, ranks lost, slow
checkpoints, failing steps, stragglers in compute or data loading, collectives slowing a job."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import records
from ..common import Alert, Thresholds, _seconds

# The cause the slowdown records name (gpuobs.records.slowdown), as it reads in a description
_RANK_CAUSE_TEXT = ('{{ if eq $labels.cause "none" }} No cause found on its GPUs: look at the host (CPU, memory, '
                    "NIC, other jobs).{{ else if $labels.cause }} Likely cause: {{ $labels.cause }}{{ if "
                    "$labels.cause_gpu }} on GPU {{ $labels.cause_gpu }}{{ end }}.{{ end }}")
_JOB_CAUSE_TEXT = ('{{ if eq $labels.cause "none" }} No cause found on its GPUs: look at the hosts.{{ else if '
                   "$labels.cause }} Likely cause: {{ $labels.cause }}{{ if $labels.cause_rank }} on rank "
                   "{{ $labels.cause_rank }}{{ end }}{{ if $labels.cause_gpu }} (GPU {{ $labels.cause_gpu }})"
                   "{{ end }}.{{ end }}")


def _with_cause(expr: str, on: tuple[str, ...], cause: records.Record, base: records.Record) -> str:
    """expr (one series per `on`, a condition on the record base, whose series are one per `on`)
    with the cause record's labels other than `on` added (cause, cause_gpu and for a job
    cause_rank), its value unchanged; where the record has no series for it (no rank info, no
    steps), with none: base stands in for the cause, so that expr is evaluated once."""
    labels = records.CAUSE_BY if cause is records.RANK_CAUSE else records.JOB_CAUSE_BY
    added = ", ".join(label for label in labels if label not in on)
    keys = ", ".join(on)
    return f"({expr}) + on ({keys}) group_left ({added}) (0 * {cause.name} or on ({keys}) 0 * {base.name})"


RANK = ("job_id", "rank")


def slowdown_conditions(t: Thresholds) -> dict[str, str]:
    """{alert name: its condition without the cause labels} of the four alerts that name a slowdown's
    cause (the dcgm flavour, which cannot record the causes, runs these)."""
    p50 = records.JOB_STEP_P50.name
    share, base = records.JOB_COLLECTIVE_WAIT_RATIO.name, records.JOB_COMPUTE_PER_STEP_MAX.name
    share_base = f"quantile_over_time(0.5, {share}[{t.baseline_window}])"
    compute_base = f"quantile_over_time(0.5, {base}[{t.baseline_window}])"
    return {
        "TrainingStepTimeRegression":
            f"{p50} > {t.step_regression:g} * quantile_over_time(0.5, {p50}[{t.baseline_window}])",
        "TrainingStragglerRank": f"{records.STRAGGLER_RATIO.name} > {t.straggler:g}",
        "TrainingDataLoaderStraggler":
            f"{records.DATA_WAIT_TO_OTHERS.name} > {t.data_wait_straggler:g} and on (job_id, rank) "
            f"{records.DATA_WAIT_RATIO.name} > {t.data_wait_straggler_share:g}",
        "TrainingCollectivesSlowing":
            f"{share} > {t.collective_rise:g} * {share_base} and {share} > {share_base} + {t.collective_rise_share:g}"
            f" and on (job_id) {base} < {t.compute_steady:g} * {compute_base} and on (job_id) {base} > "
            f"{compute_base} / {t.compute_steady:g}",
    }


def training(t: Thresholds) -> list[Alert]:
    """Training jobs: stalled, slower than their baseline, input bound, ranks lost, checkpoints, stragglers."""
    alert = partial(Alert, family="training", scope="job")
    last_step = c.LAST_STEP.name
    last_seen = f"last_over_time({last_step}[{t.long_window}])"
    plain = slowdown_conditions(t)
    checkpoint = c.CHECKPOINT_DURATION.name
    ended = f"last_over_time({c.RUN_END.name}[{t.long_window}]) > 0"  # the last scrape marked a normal end
    return [
        alert(name="TrainingStalled", expr=f"time() - {last_step} > {_seconds(t.training_stall):g}", for_="0s",
              severity="critical", summary="A training rank has made no step progress.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} has not finished a step for "
                          + t.training_stall + "."),
        alert(name="TrainingStepTimeRegression",
              expr=_with_cause(plain["TrainingStepTimeRegression"], ("job_id",), records.JOB_CAUSE,
                               records.JOB_STEP_P50),
              for_=t.for_medium, severity="warning", summary="Training steps are slower than their own baseline.",
              description="Job {{ $labels.job_id }} steps take {{ $value | humanize }} s, over "
                          + f"{t.step_regression:g}" + "x its median of the last " + t.baseline_window + "."
                          + _JOB_CAUSE_TEXT),
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
        *_failing_and_slow(t),
        alert(name="TrainingStragglerRank",
              expr=_with_cause(plain["TrainingStragglerRank"], RANK, records.RANK_CAUSE, records.STRAGGLER_RATIO),
              for_=t.for_medium, severity="warning", summary="One rank computes slower than the rest of its job.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} computes {{ $value | printf \"%.2f\" "
                          "}}x as long per step as the job's other ranks, which wait for it in their collectives."
                          + _RANK_CAUSE_TEXT),
    ]


def _failing_and_slow(t: Thresholds) -> list[Alert]:
    """Steps failing on a rank, a rank slowed in its data loader, a job slowed in its collectives."""
    alert = partial(Alert, family="training", scope="job")
    plain = slowdown_conditions(t)
    return [
        alert(name="TrainingStepsFailing", expr=f"{records.FAILED_STEP_RATIO.name} > {t.failed_step_share:g}",
              for_=t.for_medium, severity="warning", summary="A training rank's steps keep failing.",
              description="{{ $value | humanizePercentage }} of the steps of rank {{ $labels.rank }} of job "
                          "{{ $labels.job_id }} raised an exception over the last " + t.rate_window
                          + ": the loop catches it and goes on, but those steps train nothing."),
        alert(name="TrainingDataLoaderStraggler",
              expr=_with_cause(plain["TrainingDataLoaderStraggler"], RANK, records.RANK_CAUSE,
                               records.DATA_WAIT_TO_OTHERS),
              for_=t.for_medium, severity="warning", summary="One rank waits for its data longer than the rest "
                                                             "of its job.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} waits {{ $value | printf \"%.1f\" }}x "
                          "as long for its batches as the job's other ranks, which wait for it in their "
                          "collectives: its data loader (storage, workers, host) is slow." + _RANK_CAUSE_TEXT),
        alert(name="TrainingCollectivesSlowing",
              expr=_with_cause(plain["TrainingCollectivesSlowing"], ("job_id",), records.JOB_CAUSE,
                               records.JOB_COLLECTIVE_WAIT_RATIO),
              for_=t.for_medium, severity="warning", summary="A training job spends more of its time in "
                                                             "collectives than it used to.",
              description="The ranks of job {{ $labels.job_id }} spend {{ $value | humanizePercentage }} of their "
                          "time blocked in collectives, over " + f"{t.collective_rise:g}" + "x their median of the "
                          "last " + t.baseline_window + ", while their compute per step is unchanged: the "
                          "network (or a collective's algorithm or peers) slowed down." + _JOB_CAUSE_TEXT),
    ]
