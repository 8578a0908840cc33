"""Processes (opt-in): device memory and SM utilization per process, capped per GPU. Series of
ended processes vanish with the next snapshot, since every snapshot is built afresh."""

from __future__ import annotations

import time

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx


class Processes(Family):
    name = "processes"

    def __init__(self, cap: int = 32):
        self.cap = cap

    def collect(self, gpu: GpuCtx) -> None:
        procs: dict[int, int | None] = {}
        for call, fn in (("nvmlDeviceGetComputeRunningProcesses_v3", N.nvmlDeviceGetComputeRunningProcesses),
                         ("nvmlDeviceGetGraphicsRunningProcesses_v3", N.nvmlDeviceGetGraphicsRunningProcesses)):
            for p in gpu.get(call, fn) or []:
                # a compute+graphics process is in both lists with the same memory: count it once;
                # None is NVML's "not available" (pynvml maps the sentinel to None)
                known = procs.get(p.pid)
                procs[p.pid] = p.usedGpuMemory if known is None else max(known, p.usedGpuMemory or 0)
        names = gpu.cache.setdefault("names", {})
        for pid in list(names):
            if pid not in procs:
                del names[pid]  # forget ended processes
        top = sorted(procs.items(), key=lambda kv: -(kv[1] or 0))[: self.cap]  # the biggest users over the cap
        for pid, used in top:
            if pid not in names:
                try:  # NOT_FOUND: the process ended since the list was read, an answer, not an error
                    names[pid] = gpu.session.call("nvmlSystemGetProcessName", N.nvmlSystemGetProcessName, pid,
                                                  expected=(N.NVML_ERROR_NOT_FOUND,))
                except (N.NVMLError, UnicodeDecodeError):
                    names[pid] = ""
            if used is None:
                gpu.dropped(c.PROCESS_MEMORY, "not_available")
            gpu.emit(c.PROCESS_MEMORY, used, str(pid), str(names[pid])[:128])
        if top:
            since = int((time.time() - 10) * 1e6)
            # NOT_FOUND: no utilization samples in the window (e.g. only graphics processes): no values
            samples = gpu.get("nvmlDeviceGetProcessUtilization", N.nvmlDeviceGetProcessUtilization, since,
                              expected=(N.NVML_ERROR_NOT_FOUND,))
            kept = {pid for pid, _ in top}
            for s in samples or []:
                if s.pid in kept:
                    gpu.emit(c.PROCESS_SM, s.smUtil, str(s.pid), scale=0.01)
