"""Memory: device memory (v2: reserved kept apart from used) and the BAR1 aperture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml as N

from .. import catalog as c
from ..nvml import named
from .base import Family, GpuCtx, register


@named("nvmlDeviceGetMemoryInfo_v2")
def memory_v2(handle: Any) -> Any:
    """nvmlDeviceGetMemoryInfo_v2 for a GPU or MIG handle: total, reserved, used, free in bytes.
    Raises NVMLError(FUNCTION_NOT_FOUND) when the binding predates it (pynvml < 11.5), as pynvml
    does when the driver predates it (R510)."""
    version = getattr(N, "nvmlMemory_v2", None)
    if version is None:
        raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
    return N.nvmlDeviceGetMemoryInfo(handle, version=version)


def memory_any(gpu: GpuCtx, handle: Any = None, variant: str = "") -> Any:
    """Memory info of the GPU (or of one of its MIG devices: its handle and a variant): v2, else v1
    on drivers and bindings without it (v1 has no `reserved`, and its `used` includes the reserved
    memory); None if neither answers. Raises GpuUnusable as GpuCtx.get does."""
    return gpu.first(memory_v2, N.nvmlDeviceGetMemoryInfo, handle=handle, variant=variant)


_UNREAD = object()  # BAR1 not read yet for this GPU


@dataclass
class MemoryState:
    """The GPU's total memory in bytes as of this pass, and the last BAR1 answer (read on slow samples)."""
    total: int | None = None  # bytes, as of this pass (None: not read); the processes family checks against it
    bar1: Any = _UNREAD  # last nvmlDeviceGetBAR1MemoryInfo answer (None: failed)


@register("memory")
class Memory(Family):
    """Framebuffer memory (total, used, reserved, free; bytes, nvmlDeviceGetMemoryInfo v2 else v1) every
    pass, BAR1 total and used on slow samples where served. Other families read the total (total())."""
    State = MemoryState

    def total(self, gpu: GpuCtx) -> int | None:
        """The GPU's memory in bytes as read in this pass (None: not read)."""
        st: MemoryState = self.state(gpu)
        return st.total

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.MEMORY_TOTAL, c.MEMORY_USED, c.MEMORY_RESERVED (v2 only) and c.MEMORY_FREE in bytes, and
        c.BAR1_TOTAL and c.BAR1_USED from the last BAR1 read; nothing for a call that failed."""
        st = self.state(gpu)
        mem = memory_any(gpu)
        st.total = None if mem is None else mem.total
        if mem is not None:
            gpu.emit(c.MEMORY_TOTAL, mem.total)
            gpu.emit(c.MEMORY_USED, mem.used)
            gpu.emit(c.MEMORY_RESERVED, getattr(mem, "reserved", None))
            gpu.emit(c.MEMORY_FREE, mem.free)
        if (gpu.slow or st.bar1 is _UNREAD) and gpu.serves(c.BAR1_USED):
            st.bar1 = gpu.get(N.nvmlDeviceGetBAR1MemoryInfo)
        if st.bar1 is not None and st.bar1 is not _UNREAD:
            gpu.emit(c.BAR1_TOTAL, st.bar1.bar1Total)
            gpu.emit(c.BAR1_USED, st.bar1.bar1Used)
