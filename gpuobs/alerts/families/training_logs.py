"""Alerts of the training jobs' logs: the lines that explain a failure (gpuobs.logpatterns, counted by each
process)."""

from __future__ import annotations

from functools import partial

from ... import logpatterns as lp
from ..common import JOB_BY, Alert, Thresholds, _job_lines

RANK_BY = "cluster, job_id, rank, node"  # one rank of a job where it runs, whatever its targets and restarts


def training_logs(t: Thresholds) -> list[Alert]:
    """Training jobs' log lines that explain a failure (gpuobs.logpatterns, counted by each process): a
    collective timeout, a crashed peer, an illegal address, NCCL errors that keep coming (per rank and node), repeated
    CUDA OOM (per job). Each sums its series' targets and restarts."""
    alert = partial(Alert, family="training", scope="job")
    oom, oom_by_rank = _job_lines("cuda_oom", t.for_long), _job_lines("cuda_oom", t.for_long, f"{JOB_BY}, rank")
    return [
        _rank_line(t, "collective_timeout", "A collective of a training job timed out.",
                   f"a collective operation timeout in the last {t.rate_window}: a rank stopped taking part in its "
                   "collectives."),
        _rank_line(t, "collective_peer_crash", "A peer of a training job's collectives crashed.",
                   f"in the last {t.rate_window} that a peer of its collectives closed its connection: that rank "
                   "crashed, was killed or gave up after its own timeout."),
        alert(name=lp.BY_NAME["cuda_oom"].alert,
              expr=f"{oom} >= {t.oom_repeats_job} or max by ({JOB_BY}) ({oom_by_rank}) >= {t.oom_repeats_rank}",
              for_="0s", severity="critical", keep_firing_for=t.keep_firing,
              summary="A training job keeps running out of GPU memory.",
              description="Job {{ $labels.job_id }} logged {{ $value | printf \"%.0f\" }} CUDA out-of-memory "
                          f"errors in the last {t.for_long} (an alert from {t.oom_repeats_job} in the job, or "
                          f"{t.oom_repeats_rank} on one rank): it is not recovering."),
        _rank_line(t, "cuda_illegal_address", "A training job hit a CUDA illegal memory access.",
                   f"a CUDA illegal memory access in the last {t.rate_window}: its CUDA context is lost."),
        alert(name=lp.BY_NAME["nccl_error"].alert, expr=f'{_job_lines("nccl_error", t.rate_window, RANK_BY)} > 0',
              for_=t.for_medium, severity="warning", summary="A training job keeps logging NCCL errors.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} has logged NCCL "
                          f"warnings or errors in every {t.rate_window} for {t.for_medium}."),
    ]


def _rank_line(t: Thresholds, pattern: str, summary: str, logged: str) -> Alert:
    """The critical alert of one rank whose log matched `pattern` within rate_window (a process that
    died of it included: _job_lines), kept keep_firing after; `logged` says what the rank logged."""
    return Alert(name=lp.BY_NAME[pattern].alert, family="training", scope="job",
                 expr=f"{_job_lines(pattern, t.rate_window, RANK_BY)} > 0", for_="0s", severity="critical",
                 keep_firing_for=t.keep_firing, summary=summary,
                 description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} logged "
                             + logged)
