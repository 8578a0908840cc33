"""Utilization: GPU and memory (one call), encoder and decoder."""

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
            value = gpu.get(call, fn)
            gpu.emit(metric, value[0] if value else None, scale=0.01)
