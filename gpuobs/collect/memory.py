"""Memory: device memory (v2: reserved kept apart from used) and the BAR1 aperture."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx


def memory_v2(handle):
    """nvmlDeviceGetMemoryInfo_v2 for a GPU or MIG handle: total, reserved, used, free in bytes.
    Raises NVMLError(FUNCTION_NOT_FOUND) when the binding predates it (pynvml < 11.5), as pynvml
    does when the driver predates it (R510)."""
    version = getattr(N, "nvmlMemory_v2", None)
    if version is None:
        raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
    return N.nvmlDeviceGetMemoryInfo(handle, version=version)


def memory_any(gpu: GpuCtx, handle=None, variant: str = ""):
    """Memory info of the GPU (or of one of its MIG devices: its handle and a variant): v2, else v1
    on drivers and bindings without it (v1 has no `reserved`, and its `used` includes the reserved
    memory); None if neither answers. Raises GpuUnusable as GpuCtx.get does."""
    return gpu.first(("nvmlDeviceGetMemoryInfo_v2", memory_v2), ("nvmlDeviceGetMemoryInfo", N.nvmlDeviceGetMemoryInfo),
                     handle=handle, variant=variant)


class Memory(Family):
    name = "memory"

    def collect(self, gpu: GpuCtx) -> None:
        mem = memory_any(gpu)
        gpu.cache["memory_total"] = None if mem is None else mem.total  # the processes family checks against it
        if mem is not None:
            gpu.emit(c.MEMORY_TOTAL, mem.total)
            gpu.emit(c.MEMORY_USED, mem.used)
            gpu.emit(c.MEMORY_RESERVED, getattr(mem, "reserved", None))
            gpu.emit(c.MEMORY_FREE, mem.free)
        if gpu.slow or "bar1" not in gpu.cache:
            gpu.cache["bar1"] = gpu.get("nvmlDeviceGetBAR1MemoryInfo", N.nvmlDeviceGetBAR1MemoryInfo)
        bar1 = gpu.cache["bar1"]
        if bar1 is not None:
            gpu.emit(c.BAR1_TOTAL, bar1.bar1Total)
            gpu.emit(c.BAR1_USED, bar1.bar1Used)
