"""Alerts of the utilization family: GPUs held but idle, idle capacity in the fleet."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import records
from ...records import GPU_BY
from ..common import GPU, Alert, Thresholds


def utilization(t: Thresholds) -> list[Alert]:
    """GPUs held but idle, and idle capacity in the fleet."""
    alert = partial(Alert, family="utilization")
    return [
        alert(name="GpuAllocatedIdle",
              expr=f"{records.idle(t)} and on ({GPU_BY}) {c.MEMORY_USED.name} > {t.allocated_memory_bytes:g}",
              for_=t.for_short, severity="warning", scope="gpu", summary="GPU allocated but idle.",
              description=f"{GPU} holds memory (a process, pod or job has it) but has done no work for "
                          f"{t.for_idle}."),
        alert(name="GpuFleetIdleCapacity", expr=f"{records.CLUSTER_GPUS_IDLE.name} > 0", for_=t.for_idle,
              severity="info", scope="cluster", summary="GPUs in the fleet are idle.",
              description="{{ $value }} GPUs of cluster {{ $labels.cluster }} have been idle for " + t.for_idle + "."),
    ]
