"""Where a training process runs: rank, local rank, world size, job, node and pod, detected from
torchrun, Slurm and Kubernetes environments. Used as OTel resource attributes and metric attributes
by gpuobs.instrument (so stragglers show per rank) and as fields of structured log records by
gpuobs.logs; it lives at package level so that neither of the two imports the other for it."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Mapping

UUID_PREFIXES = ("GPU-", "MIG-")  # how NVML (and CUDA_VISIBLE_DEVICES) spell a device's UUID


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


def _visible_uuid(env: Mapping[str, str], local_rank: int | None) -> str | None:
    """The UUID CUDA_VISIBLE_DEVICES gives this rank: the only entry, or the local_rank'th of several
    (one process per GPU, each seeing every GPU of its node); None when that entry is an index."""
    entries = [e.strip() for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if len(entries) == 1:
        entry = entries[0]
    elif entries and local_rank is not None and 0 <= local_rank < len(entries):
        entry = entries[local_rank]
    else:
        return None
    return entry if entry.startswith(UUID_PREFIXES) else None


def _torch_uuid(local_rank: int | None) -> str | None:
    """The UUID of the CUDA device this rank drives, from torch (only where the process imported it:
    detecting never imports torch), formatted as NVML does (`GPU-<uuid>`); None without CUDA. The
    device is local_rank's where there are that many, else the current one."""
    torch: Any = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        count = torch.cuda.device_count()
        device = local_rank if local_rank is not None and 0 <= local_rank < count else torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 - an old torch without .uuid, a CUDA error: the UUID stays unknown
        return None
    return uuid if uuid.startswith(UUID_PREFIXES) else f"GPU-{uuid}"


def gpu_uuid(env: Mapping[str, str], local_rank: int | None) -> str | None:
    """The GPU this rank drives, as NVML's UUID (what gpuobs_gpu_info's `uuid` label holds):
    GPUOBS_GPU_UUID when set (an explicit mapping wins: a simulated GPU, a wrapper that knows
    better), else a UUID entry of CUDA_VISIBLE_DEVICES (_visible_uuid), else torch's device
    properties (_torch_uuid); None when none says."""
    return _first(env, "GPUOBS_GPU_UUID") or _visible_uuid(env, local_rank) or _torch_uuid(local_rank)


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
    gpu_uuid: str | None = None  # the GPU the rank drives (NVML's UUID), gpu_uuid()

    @classmethod
    def detect(cls, env: Mapping[str, str] | None = None) -> "RunEnv":
        """Read torchrun (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID), Slurm (SLURM_PROCID,
        SLURM_LOCALID, SLURM_NTASKS, SLURM_JOB_ID, SLURMD_NODENAME) and Kubernetes (POD_NAME or
        HOSTNAME with KUBERNETES_SERVICE_HOST, POD_NAMESPACE, NODE_NAME) variables; torchrun wins.
        The GPU's UUID comes from gpu_uuid()."""
        env = os.environ if env is None else env
        torchrun = "RANK" in env and "WORLD_SIZE" in env
        slurm = "SLURM_JOB_ID" in env
        in_k8s = "KUBERNETES_SERVICE_HOST" in env
        local_rank = _int(_first(env, "LOCAL_RANK", "SLURM_LOCALID"))
        return cls(
            rank=_int(_first(env, "RANK", "SLURM_PROCID")),
            local_rank=local_rank,
            world_size=_int(_first(env, "WORLD_SIZE", "SLURM_NTASKS")),
            job_id=_first(env, "GPUOBS_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "JOB_ID"),
            node=_first(env, "NODE_NAME", "SLURMD_NODENAME") or socket.gethostname(),
            pod=_first(env, "POD_NAME", *(("HOSTNAME",) if in_k8s else ())),
            namespace=_first(env, "POD_NAMESPACE") if in_k8s or "POD_NAMESPACE" in env else None,
            launcher="torchrun" if torchrun else "slurm" if slurm else "none",
            gpu_uuid=gpu_uuid(env, local_rank),
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

    def rank_info_attributes(self) -> dict[str, str]:
        """The attributes of the rank's info gauge (catalog.RANK_INFO): its metric attributes and
        where it runs, host (host.name), k8s_namespace and k8s_pod (empty off Kubernetes) and uuid
        (the GPU it drives, empty when unknown), which the slowdown records join to the GPUs' series."""
        return {**self.metric_attributes(), "host": self.node or "", "k8s_namespace": self.namespace or "",
                "k8s_pod": self.pod or "", "uuid": self.gpu_uuid or ""}

    def log_fields(self) -> dict[str, str | int | None]:
        """Fields added to every structured log record (`job_id`, the same name as the metric label)."""
        return {"rank": self.rank, "local_rank": self.local_rank, "job_id": self.job_id, "node": self.node,
                "pod": self.pod}
