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
        alert(name=lp.BY_NAME["collective_timeout"].alert,
              expr=f'{_job_lines("collective_timeout", t.rate_window, RANK_BY)} > 0',
              for_="0s", severity="critical", keep_firing_for=t.keep_firing,
              summary="A collective of a training job timed out.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} logged a "
                          f"collective operation timeout in the last {t.rate_window}: a rank stopped taking part in "
                          "its collectives."),
        alert(name=lp.BY_NAME["collective_peer_crash"].alert,
              expr=f'{_job_lines("collective_peer_crash", t.rate_window, RANK_BY)} > 0',
              for_="0s", severity="critical", keep_firing_for=t.keep_firing,
              summary="A peer of a training job's collectives crashed.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} logged in the "
                          f"last {t.rate_window} that a peer of its collectives closed its connection: that rank "
                          "crashed, was killed or gave up after its own timeout."),
        alert(name=lp.BY_NAME["cuda_oom"].alert,
              expr=f"{oom} >= {t.oom_repeats_job} or max by ({JOB_BY}) ({oom_by_rank}) >= {t.oom_repeats_rank}",
              for_="0s", severity="critical", keep_firing_for=t.keep_firing,
              summary="A training job keeps running out of GPU memory.",
              description="Job {{ $labels.job_id }} logged {{ $value | printf \"%.0f\" }} CUDA out-of-memory "
                          f"errors in the last {t.for_long} (an alert from {t.oom_repeats_job} in the job, or "
                          f"{t.oom_repeats_rank} on one rank): it is not recovering."),
        alert(name=lp.BY_NAME["cuda_illegal_address"].alert,
              expr=f'{_job_lines("cuda_illegal_address", t.rate_window, RANK_BY)} > 0', for_="0s", severity="critical",
              keep_firing_for=t.keep_firing, summary="A training job hit a CUDA illegal memory access.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} logged a CUDA "
                          f"illegal memory access in the last {t.rate_window}: its CUDA context is lost."),
        alert(name=lp.BY_NAME["nccl_error"].alert, expr=f'{_job_lines("nccl_error", t.rate_window, RANK_BY)} > 0',
              for_=t.for_medium, severity="warning", summary="A training job keeps logging NCCL errors.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} has logged NCCL "
                          f"warnings or errors in every {t.rate_window} for {t.for_medium}."),
    ]
