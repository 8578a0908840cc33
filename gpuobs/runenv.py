"""Where a training process runs: rank, local rank, world size, job, node and pod, detected from
torchrun, Slurm and Kubernetes environments. Used as OTel resource attributes and metric attributes
by gpuobs.instrument (so stragglers show per rank) and as fields of structured log records by
gpuobs.logs; it lives at package level so that neither of the two imports the other for it."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return value
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class RunEnv:
    """The process's place in a distributed job; None where the environment does not say."""
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    node: str | None = None
    pod: str | None = None
    namespace: str | None = None
    launcher: str = "none"  # torchrun | slurm | none

    @classmethod
    def detect(cls, env: Mapping[str, str] | None = None) -> "RunEnv":
        """Read torchrun (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID), Slurm (SLURM_PROCID,
        SLURM_LOCALID, SLURM_NTASKS, SLURM_JOB_ID, SLURMD_NODENAME) and Kubernetes (POD_NAME or
        HOSTNAME with KUBERNETES_SERVICE_HOST, POD_NAMESPACE, NODE_NAME) variables; torchrun wins."""
        env = os.environ if env is None else env
        torchrun = "RANK" in env and "WORLD_SIZE" in env
        slurm = "SLURM_JOB_ID" in env
        in_k8s = "KUBERNETES_SERVICE_HOST" in env
        return cls(
            rank=_int(_first(env, "RANK", "SLURM_PROCID")),
            local_rank=_int(_first(env, "LOCAL_RANK", "SLURM_LOCALID")),
            world_size=_int(_first(env, "WORLD_SIZE", "SLURM_NTASKS")),
            job_id=_first(env, "GPUOBS_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "JOB_ID"),
            node=_first(env, "NODE_NAME", "SLURMD_NODENAME") or socket.gethostname(),
            pod=_first(env, "POD_NAME", *(("HOSTNAME",) if in_k8s else ())),
            namespace=_first(env, "POD_NAMESPACE") if in_k8s or "POD_NAMESPACE" in env else None,
            launcher="torchrun" if torchrun else "slurm" if slurm else "none",
        )

    def resource_attributes(self) -> dict[str, str | int]:
        """OTel resource attributes (semantic conventions where they exist, gpuobs.* otherwise)."""
        attrs: dict[str, str | int] = {"host.name": self.node or ""}
        for key, value in (("gpuobs.rank", self.rank), ("gpuobs.local_rank", self.local_rank),
                           ("gpuobs.world_size", self.world_size), ("gpuobs.job.id", self.job_id),
                           ("k8s.pod.name", self.pod), ("k8s.namespace.name", self.namespace),
                           ("k8s.node.name", self.node if self.pod else None)):
            if value is not None:
                attrs[key] = value
        return attrs

    def metric_attributes(self) -> dict[str, str]:
        """Attributes put on every training metric point: rank (so stragglers show) and job_id
        (not `job`, which Prometheus sets on every scraped series and would rename ours)."""
        return {"rank": str(self.rank if self.rank is not None else 0), "job_id": self.job_id or ""}

    def log_fields(self) -> dict[str, str | int | None]:
        """Fields added to every structured log record (`job_id`, the same name as the metric label)."""
        return {"rank": self.rank, "local_rank": self.local_rank, "job_id": self.job_id, "node": self.node,
                "pod": self.pod}
