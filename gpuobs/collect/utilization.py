"""Utilization: GPU and memory (one call), encoder and decoder (re-read on slow samples while idle)."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx


class Utilization(Family):
    name = "utilization"

    def collect(self, gpu: GpuCtx) -> None:
        util = gpu.get("nvmlDeviceGetUtilizationRates", N.nvmlDeviceGetUtilizationRates)
        if util is not None:
            gpu.emit(c.UTILIZATION, util.gpu, scale=0.01)
            gpu.emit(c.MEMORY_UTILIZATION, util.memory, scale=0.01)
        for metric, call, fn in ((c.ENCODER_UTILIZATION, "nvmlDeviceGetEncoderUtilization", N.nvmlDeviceGetEncoderUtilization),
                                 (c.DECODER_UTILIZATION, "nvmlDeviceGetDecoderUtilization", N.nvmlDeviceGetDecoderUtilization)):
            # Video engines idle on most compute nodes: while one reads 0 it is re-read on slow
            # samples only; once busy it is read every sample.
            last = gpu.cache.get(call)
            if last is None or last[0] or gpu.slow:
                gpu.cache[call] = last = gpu.get(call, fn) or (None,)
            gpu.emit(metric, last[0], scale=0.01)
