"""Clocks: current SM and memory clocks every sample, graphics/video on slow samples, maxima once
per GPU, and the performance state."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx

MHZ = 1e6
FAST = (N.NVML_CLOCK_SM, N.NVML_CLOCK_MEM)


class Clocks(Family):
    name = "clocks"

    def collect(self, gpu: GpuCtx) -> None:
        for clock, label in enumerate(c.CLOCKS):
            key = f"clock:{label}"
            if clock in FAST or gpu.slow or key not in gpu.cache:
                gpu.cache[key] = gpu.get("nvmlDeviceGetClockInfo", N.nvmlDeviceGetClockInfo, clock, variant=label)
            gpu.emit(c.CLOCK, gpu.cache[key], label, scale=MHZ)
            if f"max:{label}" not in gpu.cache:  # fixed per GPU: read once
                gpu.cache[f"max:{label}"] = gpu.get("nvmlDeviceGetMaxClockInfo", N.nvmlDeviceGetMaxClockInfo,
                                                    clock, variant=label)
            gpu.emit(c.MAX_CLOCK, gpu.cache[f"max:{label}"], label, scale=MHZ)
        gpu.emit(c.PSTATE, gpu.get("nvmlDeviceGetPerformanceState", N.nvmlDeviceGetPerformanceState))
