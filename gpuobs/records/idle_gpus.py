"""Records of idle GPUs: allocated (memory in use) and idle ones, per cluster."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CLUSTER,
                   GPU,
                   GPU_BY,
                   Record,
                   count_of,
                   idle,
)

# ------------------------------------------------------------------------------------------- idle
GPU_ALLOCATED = Record(GPU, "gpuobs_gpu_allocated", "bool",
                       lambda t: f"{c.MEMORY_USED.name} > bool {t.allocated_memory_bytes:g}")
CLUSTER_GPUS_IDLE = count_of(CLUSTER, "gpuobs_gpus_idle", idle)
CLUSTER_GPUS_ALLOCATED_IDLE = count_of(CLUSTER, "gpuobs_gpus_allocated_idle",
                                       lambda t: f"({idle(t)}) and on ({GPU_BY}) {GPU_ALLOCATED.name} == 1")
