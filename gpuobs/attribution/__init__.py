"""Workload attribution: which pod (kubelet PodResources API) or Slurm job (a job-mapping directory,
as dcgm-exporter reads it) uses each GPU or MIG device.

Each source refreshes in a daemon thread and keeps an immutable mapping; `lookup()` only reads it,
so rendering a snapshot never waits on the kubelet or the file system. Every source has
`lookup(uuid, index=None, gpu_instance=None) -> dict | None` with generic keys (`pod`, `namespace`,
`container`; `hpc_job`) that the renderer turns into label names for its naming.
"""

from __future__ import annotations

from .podresources import DEFAULT_SOCKET, PodResourcesWatcher
from .slurm import SlurmJobMap

__all__ = ["DEFAULT_SOCKET", "PodResourcesWatcher", "SlurmJobMap"]
