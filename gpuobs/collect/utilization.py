"""Utilization: GPU and memory (one call), encoder and decoder (re-read on slow samples while idle)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx, register

VIDEO = ((c.ENCODER_UTILIZATION, N.nvmlDeviceGetEncoderUtilization),
         (c.DECODER_UTILIZATION, N.nvmlDeviceGetDecoderUtilization))


@dataclass
class UtilizationState:
    video: dict[c.Metric, int | None] = field(default_factory=dict)  # last encoder/decoder percent read (None: failed)


@register("utilization")
class Utilization(Family):
    State = UtilizationState

    def collect(self, gpu: GpuCtx) -> None:
        util = gpu.get(N.nvmlDeviceGetUtilizationRates)
        if util is not None:
            gpu.emit(c.UTILIZATION, util.gpu, scale=0.01)
            gpu.emit(c.MEMORY_UTILIZATION, util.memory, scale=0.01)
        video = self.state(gpu).video
        for metric, fn in VIDEO:
            # Video engines idle on most compute nodes: while one reads 0 it is re-read on slow
            # samples only (as after a failed read); once busy it is read every sample.
            if metric not in video or video[metric] or gpu.slow:
                video[metric] = (gpu.get(fn) or (None,))[0]
            gpu.emit(metric, video[metric], scale=0.01)
