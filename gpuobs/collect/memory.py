"""Memory: device memory (v2: reserved kept apart from used) and the BAR1 aperture."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx


def memory_v2(handle):
    """nvmlDeviceGetMemoryInfo_v2 for a GPU or MIG handle: total, reserved, used, free in bytes."""
    return N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)


class Memory(Family):
    name = "memory"

    def collect(self, gpu: GpuCtx) -> None:
        mem = gpu.get("nvmlDeviceGetMemoryInfo_v2", memory_v2)
        if mem is not None:
            gpu.emit(c.MEMORY_TOTAL, mem.total)
            gpu.emit(c.MEMORY_USED, mem.used)
            gpu.emit(c.MEMORY_RESERVED, mem.reserved)
            gpu.emit(c.MEMORY_FREE, mem.free)
        if gpu.slow or "bar1" not in gpu.cache:
            gpu.cache["bar1"] = gpu.get("nvmlDeviceGetBAR1MemoryInfo", N.nvmlDeviceGetBAR1MemoryInfo)
        bar1 = gpu.cache["bar1"]
        if bar1 is not None:
            gpu.emit(c.BAR1_TOTAL, bar1.bar1Total)
            gpu.emit(c.BAR1_USED, bar1.bar1Used)
