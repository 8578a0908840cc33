"""Processes (opt-in): device memory and SM utilization per process, capped per GPU. Series of
ended processes vanish with the next snapshot, since every snapshot is built afresh.

Process records are checked before they are served: pid 0, a process the host's process table
does not have (when the exporter sees the host's PIDs), a used-memory sentinel, and per-process
totals above the GPU's memory are dropped and counted (gpuobs_exporter_dropped_values_total).
In MIG mode the processes are read per MIG device, whose handles give per-instance memory."""

from __future__ import annotations

import os
import time

import pynvml as N

from .. import catalog as c
from .base import COUNTER_SENTINELS, Family, GpuCtx

# Newest first: _v3 (R510+), then _v2 for older drivers and bindings. The versioned functions, not
# pynvml's unversioned ones: on a driver without _v3 those raise NVMLLibraryMismatchError, which
# is not an NVMLError.
COMPUTE = (("nvmlDeviceGetComputeRunningProcesses_v3", N.nvmlDeviceGetComputeRunningProcesses_v3),
           ("nvmlDeviceGetComputeRunningProcesses_v2", N.nvmlDeviceGetComputeRunningProcesses_v2))
GRAPHICS = (("nvmlDeviceGetGraphicsRunningProcesses_v3", N.nvmlDeviceGetGraphicsRunningProcesses_v3),
            ("nvmlDeviceGetGraphicsRunningProcesses_v2", N.nvmlDeviceGetGraphicsRunningProcesses_v2))


def _running(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def host_view(pids: list[int]) -> bool:
    """True when this exporter sees the host's PID namespace, judged by evidence: one of the PIDs
    NVML reports (always host PIDs) exists here. In a container without hostPID none does (short
    of a coincidence), and then absence from /proc proves nothing."""
    return any(_running(pid) for pid in pids if pid > 0)


def _read(gpu: GpuCtx, mig: tuple | None) -> dict[int, int | None]:
    """{pid: used bytes or None} of compute and graphics processes on the GPU or one MIG device."""
    procs: dict[int, int | None] = {}
    for calls in (COMPUTE, GRAPHICS):
        # a MIG device's handle gives per-instance records (the parent GPU's may lack memory)
        found = gpu.first(*calls) if mig is None else gpu.first(*calls, handle=mig[0], variant="mig")
        for p in found or []:
            # a compute+graphics process is in both lists with the same memory: count it once;
            # None is NVML's "not available" (pynvml maps the sentinel to None)
            known = procs.get(p.pid)
            procs[p.pid] = p.usedGpuMemory if known is None else max(known, p.usedGpuMemory or 0)
    return procs


class Processes(Family):
    name = "processes"

    def __init__(self, cap: int = 32):
        self.cap = cap

    def collect(self, gpu: GpuCtx) -> None:
        migs = gpu.cache.get("migs") if gpu.cache.get("mig_mode") == 1 else None
        # [(pid, used, (gpu instance, compute instance))]
        records: list[tuple[int, int | None, tuple[str, str]]] = []
        if migs:
            for mig in migs:
                records += [(pid, used, mig[1]) for pid, used in _read(gpu, mig).items()]
        else:
            records = [(pid, used, ("", "")) for pid, used in _read(gpu, None).items()]
        records = self._valid(gpu, records)
        names = gpu.cache.setdefault("names", {})
        live = {pid for pid, _, _ in records}
        for pid in list(names):
            if pid not in live:
                del names[pid]  # forget ended processes
        top = sorted(records, key=lambda r: -(r[1] or 0))[: self.cap]  # the biggest users over the cap
        for pid, used, ids in top:
            if pid not in names:
                try:  # NOT_FOUND: the process ended since the list was read, an answer, not an error
                    names[pid] = gpu.session.call("nvmlSystemGetProcessName", N.nvmlSystemGetProcessName, pid,
                                                  expected=(N.NVML_ERROR_NOT_FOUND,))
                except (N.NVMLError, UnicodeDecodeError):
                    names[pid] = ""
            if used is None:
                gpu.dropped(c.PROCESS_MEMORY, "not_available")
            gpu.emit(c.PROCESS_MEMORY, used, str(pid), str(names[pid])[:128], *ids)
        if top and not migs:  # per-process utilization is not available in MIG mode
            since = int((time.time() - 10) * 1e6)
            # NOT_FOUND: no utilization samples in the window (e.g. only graphics processes): no values
            samples = gpu.get("nvmlDeviceGetProcessUtilization", N.nvmlDeviceGetProcessUtilization, since,
                              expected=(N.NVML_ERROR_NOT_FOUND,))
            kept = {pid for pid, _, _ in top}
            for s in samples or []:
                if s.pid in kept:
                    gpu.emit(c.PROCESS_SM, s.smUtil, str(s.pid), scale=0.01)

    @staticmethod
    def _valid(gpu: GpuCtx, records: list) -> list:
        """The records that can be true; each one dropped is counted with its reason."""
        out = []
        host = host_view([pid for pid, _, _ in records])
        for rec in records:
            pid = rec[0]
            if pid <= 0:
                gpu.dropped(c.PROCESS_MEMORY, "invalid_pid")
            elif host and not _running(pid):
                gpu.dropped(c.PROCESS_MEMORY, "not_running")
            else:
                out.append(rec)
        total = gpu.cache.get("memory_total")
        used = sum(u for _, u, _ in out if isinstance(u, int) and u not in COUNTER_SENTINELS)
        if total and used > total:  # the records cannot all be true: serve none of them
            for _ in out:
                gpu.dropped(c.PROCESS_MEMORY, "out_of_range")
            return []
        return out
