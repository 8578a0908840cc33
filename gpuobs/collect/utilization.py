"""Utilization: GPU and memory (one call), encoder and decoder, and encoder and frame buffer capture
session stats (each re-read on slow samples while idle)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx, register

VIDEO = ((c.ENCODER_UTILIZATION, N.nvmlDeviceGetEncoderUtilization),
         (c.DECODER_UTILIZATION, N.nvmlDeviceGetDecoderUtilization))


MICRO = 1_000_000  # NVML reports session latencies in microseconds


def _encoder_stats(gpu: GpuCtx) -> tuple[int, int, int] | None:
    """(sessions, average FPS, average latency in µs) of the encoder, or None."""
    stats: tuple[int, int, int] | None = gpu.get(N.nvmlDeviceGetEncoderStats)
    return stats


def _fbc_stats(gpu: GpuCtx) -> tuple[int, int, int] | None:
    """(sessions, average FPS, average latency in µs) of frame buffer capture, or None."""
    st = gpu.get(N.nvmlDeviceGetFBCStats)
    return None if st is None else (st.sessionsCount, st.averageFPS, st.averageLatency)


# (read, (sessions, fps, latency) metrics)
SESSIONS = ((_encoder_stats, (c.ENCODER_SESSIONS, c.ENCODER_FPS, c.ENCODER_LATENCY)),
            (_fbc_stats, (c.FBC_SESSIONS, c.FBC_FPS, c.FBC_LATENCY)))


@dataclass
class UtilizationState:
    """Per-GPU video readings: the last encoder and decoder percent read and the last session stats
    (sessions, FPS, latency in µs) per session kind."""
    video: dict[c.Metric, int | None] = field(default_factory=dict)  # last encoder/decoder percent read (None: failed)
    # last session stats, by sessions metric
    sessions: dict[c.Metric, tuple[int, int, int] | None] = field(default_factory=dict)


@register("utilization")
class Utilization(Family):
    """GPU and memory-controller utilization every pass (nvmlDeviceGetUtilizationRates, percent, exported as
    ratios 0-1); encoder and decoder utilization and session stats where served, read every pass while busy."""
    State = UtilizationState

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.UTILIZATION and c.MEMORY_UTILIZATION, the video engines' utilization (re-read on slow
        samples only while idle) and the encoder and frame-buffer-capture session stats (latency in seconds)."""
        util = gpu.get(N.nvmlDeviceGetUtilizationRates)
        if util is not None:
            gpu.emit(c.UTILIZATION, util.gpu, scale=0.01)
            gpu.emit(c.MEMORY_UTILIZATION, util.memory, scale=0.01)
        video = self.state(gpu).video
        for metric, fn in VIDEO:
            if not gpu.serves(metric):  # detail the profile leaves out: no call
                continue
            # Video engines idle on most compute nodes: while one reads 0 it is re-read on slow
            # samples only (as after a failed read); once busy it is read every sample.
            if metric not in video or video[metric] or gpu.slow:
                video[metric] = (gpu.get(fn) or (None,))[0]
            gpu.emit(metric, video[metric], scale=0.01)
        self._sessions(gpu)

    def _sessions(self, gpu: GpuCtx) -> None:
        """Encoder and frame buffer capture session stats: read every sample while sessions run, else
        on slow samples (as the video engines); absent where the GPU or driver does not answer."""
        last = self.state(gpu).sessions
        for read, (sessions, fps, latency) in SESSIONS:
            if not gpu.serves(sessions):
                continue
            if sessions not in last or (last[sessions] or (0,))[0] or gpu.slow:
                last[sessions] = read(gpu)
            stats = last[sessions]
            if stats is not None:
                gpu.emit(sessions, stats[0])
                gpu.emit(fps, stats[1])
                gpu.emit(latency, stats[2], per=MICRO)
