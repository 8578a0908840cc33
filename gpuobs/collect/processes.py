"""Processes (opt-in): device memory and SM utilization per process, capped per GPU. Series of
ended processes vanish with the next snapshot, since every snapshot is built afresh.

Process records are checked before they are served: pid 0, a PID at or above the kernel's
pid_max (impossible, whatever the exporter sees of the host's PIDs), a process the host's process table
does not have (when the exporter sees the host's PIDs), a used-memory sentinel, and per-process
totals above the GPU's memory are dropped and counted (gpuobs_exporter_dropped_values_total).
In MIG mode the processes are read per MIG device, whose handles give per-instance memory."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import COUNTER_SENTINELS, Family, GpuCtx, Needs, register
from .memory import Memory
from .mig import GONE, Mig, MigDevice

# Newest first: _v3 (R510+), then _v2 for older drivers and bindings. The versioned functions, not
# pynvml's unversioned ones: on a driver without _v3 those raise NVMLLibraryMismatchError, which
# is not an NVMLError.
COMPUTE = (N.nvmlDeviceGetComputeRunningProcesses_v3, N.nvmlDeviceGetComputeRunningProcesses_v2)
GRAPHICS = (N.nvmlDeviceGetGraphicsRunningProcesses_v3, N.nvmlDeviceGetGraphicsRunningProcesses_v2)
NO_MIG = ("", "")  # the (GPU instance, compute instance) labels of a process outside MIG
UTILIZATION_WINDOW_S = 10  # per-process SM utilization: samples of the last this many seconds

# (pid, used bytes or None, (GPU instance id, compute instance id), process type)
Record = tuple[int, "int | None", tuple[str, str], str]


PID_MAX_PATH = "/proc/sys/kernel/pid_max"
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's own ceiling on 64-bit (PID_MAX_LIMIT): used when pid_max is unreadable
PID_MAX_REREAD_S = 60.0
_pid_max: tuple[float, int] = (float("-inf"), PID_MAX_LIMIT)  # (monotonic time read, value)


def pid_max(path: str = PID_MAX_PATH) -> int:
    """The kernel's pid_max (PIDs are below it), read from `path` at most once a minute; pid_max is
    not namespaced, so a container reads the host's. PID_MAX_LIMIT when unreadable or absurd."""
    global _pid_max
    now = time.monotonic()
    if now - _pid_max[0] < PID_MAX_REREAD_S and path == PID_MAX_PATH:
        return _pid_max[1]
    try:
        with open(path) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        value = PID_MAX_LIMIT
    value = value if 0 < value <= PID_MAX_LIMIT else PID_MAX_LIMIT
    if path == PID_MAX_PATH:
        _pid_max = (now, value)
    return value


def _running(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def host_view(pids: list[int]) -> bool:
    """True when this exporter sees the host's PID namespace, judged by evidence: one of the PIDs
    NVML reports (always host PIDs) exists here. In a container without hostPID none does (short
    of a coincidence), and then absence from /proc proves nothing."""
    limit = pid_max()
    return any(_running(pid) for pid in pids if 0 < pid < limit)


def _read(gpu: GpuCtx, mig: MigDevice | None) -> dict[int, tuple[int | None, str]]:
    """{pid: (used bytes or None, type)} of compute and graphics processes on the GPU or one MIG device;
    the type names the lists the pid is in: compute, graphics or compute_graphics."""
    procs: dict[int, int | None] = {}
    kinds: dict[int, list[str]] = {}
    for kind, calls in (("compute", COMPUTE), ("graphics", GRAPHICS)):
        # a MIG device's handle gives per-instance records (the parent GPU's may lack memory)
        found = gpu.first(*calls) if mig is None else gpu.first(*calls, handle=mig[0], variant="mig")
        if mig is not None and found is None and gpu.last_error in GONE:
            break  # the MIG device is gone: no second call with its handle
        for p in found or []:
            # a compute+graphics process is in both lists with the same memory: count it once;
            # None is NVML's "not available" (pynvml maps the sentinel to None)
            known = procs.get(p.pid)
            procs[p.pid] = p.usedGpuMemory if known is None else max(known, p.usedGpuMemory or 0)
            if kind not in kinds.setdefault(p.pid, []):
                kinds[p.pid].append(kind)
    return {pid: (used, "_".join(kinds[pid])) for pid, used in procs.items()}


@dataclass
class ProcessesState:
    """The names of the GPU's processes (pid -> name from /proc), kept while each process runs."""
    names: dict[int, str] = field(default_factory=dict)  # pid -> process name, while the process runs


@register("processes", default=False, uses=("memory", "mig"), summary="per-process series")
class Processes(Family):
    """At most `cap` processes per GPU (the largest memory users). With the mig family on, a GPU in
    MIG mode is read per MIG device; with the memory family on, records whose memory adds up to
    more than the GPU's are dropped."""
    State = ProcessesState

    def __init__(self, cap: int, memory: Memory | None = None, mig: Mig | None = None):
        super().__init__()
        self.cap, self.memory, self.mig = cap, memory, mig

    @classmethod
    def build(cls, needs: Needs) -> "Processes":
        """The family for the exporter: `needs.process_cap` processes per GPU, with the memory and mig
        families when they are built."""
        memory, mig = needs.built.get("memory"), needs.built.get("mig")
        return cls(needs.process_cap, memory=memory if isinstance(memory, Memory) else None,
                   mig=mig if isinstance(mig, Mig) else None)

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.PROCESS_INFO (1) and c.PROCESS_MEMORY (bytes, where NVML gives it; per MIG device on a GPU in
        MIG mode) for the `cap` largest users,
        and their SM utilization over the last UTILIZATION_WINDOW_S seconds outside MIG mode; a process NVML gives no
        memory for is counted as dropped ("not_available")."""
        migs = self.mig.devices(gpu) if self.mig is not None else None
        if migs:
            records = self._mig_records(gpu, migs)
        else:
            records = [(pid, used, NO_MIG, kind) for pid, (used, kind) in _read(gpu, None).items()]
        records = self._valid(gpu, records)
        names = self.state(gpu).names
        live = {rec[0] for rec in records}
        for pid in [pid for pid in names if pid not in live]:
            del names[pid]  # forget ended processes
        top = sorted(records, key=lambda r: -(r[1] or 0))[: self.cap]  # the biggest users over the cap
        for pid, used, ids, kind in top:
            if pid not in names:
                names[pid] = _name(gpu, pid)
            labels = (str(pid), names[pid][:128], *ids, kind)
            gpu.emit(c.PROCESS_INFO, 1, *labels)  # the process is listed, whether or not its memory is known
            if used is None:
                gpu.dropped(c.PROCESS_MEMORY, "not_available")
            gpu.emit(c.PROCESS_MEMORY, used, *labels)
        if top and not migs:  # per-process utilization is not available in MIG mode
            self._utilization(gpu, {rec[0] for rec in top})

    def _mig_records(self, gpu: GpuCtx, migs: list[MigDevice]) -> list[tuple[int, int | None, tuple[str, str], str]]:
        """(pid, used, MIG instance ids, type) per process of each MIG device, stopping at a device
        whose handle is gone (destroyed since the listing): the mig family lists again at once, and
        no later call uses a handle of the old listing."""
        records: list[tuple[int, int | None, tuple[str, str], str]] = []
        family = self.mig
        if family is None:  # not reached: migs came from the mig family
            return records
        for mig in migs:
            gpu.last_error = None
            found = _read(gpu, mig)
            if not found and family.gone(gpu) and mig[2] not in family.state(gpu).trusted:
                family.relist(gpu)
                break
            records += [(pid, used, mig[1], kind) for pid, (used, kind) in found.items()]
        return records

    @staticmethod
    def _utilization(gpu: GpuCtx, pids: set[int]) -> None:
        """SM utilization of these processes over the last UTILIZATION_WINDOW_S seconds."""
        since = int((time.time() - UTILIZATION_WINDOW_S) * 1e6)
        # NOT_FOUND: no utilization samples in the window (e.g. only graphics processes): no values
        samples = gpu.get(N.nvmlDeviceGetProcessUtilization, since, expected=(N.NVML_ERROR_NOT_FOUND,))
        for s in samples or []:
            if s.pid in pids:
                gpu.emit(c.PROCESS_SM, s.smUtil, str(s.pid), scale=0.01)

    def _valid(self, gpu: GpuCtx, records: list[Record]) -> list[Record]:
        """The records that can be true; each one dropped is counted with its reason."""
        out = []
        host = host_view([rec[0] for rec in records])
        limit = pid_max()
        for rec in records:
            pid = rec[0]
            if pid <= 0 or pid >= limit:
                gpu.dropped(c.PROCESS_MEMORY, "invalid_pid")
            elif host and not _running(pid):
                gpu.dropped(c.PROCESS_MEMORY, "not_running")
            else:
                out.append(rec)
        total = self.memory.total(gpu) if self.memory is not None else None
        used = sum(rec[1] for rec in out if isinstance(rec[1], int) and rec[1] not in COUNTER_SENTINELS)
        if total and used > total:  # the records cannot all be true: serve none of them
            for _ in out:
                gpu.dropped(c.PROCESS_MEMORY, "out_of_range")
            return []
        return out


def _name(gpu: GpuCtx, pid: int) -> str:
    """The process's name ('' when NVML cannot tell)."""
    try:  # NOT_FOUND: the process ended since the list was read, an answer, not an error
        return str(gpu.session.call(N.nvmlSystemGetProcessName, pid, expected=(N.NVML_ERROR_NOT_FOUND,)))
    except (N.NVMLError, UnicodeDecodeError):
        return ""
