"""Thermal: GPU and memory temperature, the margin to T.Limit, the GPU's own slowdown/shutdown
thresholds, fan speed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx, register

THRESHOLDS = [(c.SLOWDOWN_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, "slowdown"),
              (c.SHUTDOWN_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, "shutdown"),
              (c.MAX_OPERATING_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, "gpu_max"),
              (c.MEMORY_MAX_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, "mem_max")]


_UNREAD = object()  # fan speed not read yet for this GPU


@dataclass
class ThermalState:
    """The GPU's absolute temperature thresholds (probed; fixed per GPU) and the last fan speed read
    (percent; None: failed; _UNREAD before the first read)."""
    thresholds: list[tuple[c.Metric, int | None]] = field(default_factory=list)  # probed: fixed per GPU
    fan: Any = _UNREAD  # last fan speed read, percent (None: failed)
    margin: Any = _UNREAD  # last margin to T.Limit read, degrees C, signed (None: failed)


@register("thermal")
class Thermal(Family):
    """Absolute thresholds come from nvmlDeviceGetTemperatureThreshold: the *_TLIMIT fields are
    relative to T.Limit (nvidia-smi's "Slowdown T.Limit Temp: -2 C"), not temperatures."""
    State = ThermalState
    FIELDS = [FieldSpec(N.NVML_FI_DEV_MEMORY_TEMP, c.MEMORY_TEMPERATURE)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        """The memory temperature field (NVML_FI_DEV_MEMORY_TEMP, °C), the same on every GPU."""
        return self.FIELDS

    def probe(self, gpu: GpuCtx) -> None:
        """Reads each threshold of THRESHOLDS (nvmlDeviceGetTemperatureThreshold, °C; None where not answered)."""
        self.state(gpu).thresholds = [(metric, gpu.get(N.nvmlDeviceGetTemperatureThreshold, kind, variant=label))
                                      for metric, kind, label in THRESHOLDS]

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.TEMPERATURE (nvmlDeviceGetTemperature, °C) every pass, the probed thresholds, and
        c.FAN_SPEED as a ratio 0-1 (read on slow samples, only where served)."""
        st = self.state(gpu)
        gpu.emit(c.TEMPERATURE, gpu.get(N.nvmlDeviceGetTemperature, N.NVML_TEMPERATURE_GPU))
        # the margin (a detail series) is read on slow passes, like the fan: one more call every pass
        # would take a MIG-split GPU past its NVML call budget (tests/test_exporter_calls.py)
        if (gpu.slow or st.margin is _UNREAD) and gpu.serves(c.TEMPERATURE_MARGIN):
            st.margin = gpu.get(N.nvmlDeviceGetMarginTemperature)
        if (gpu.slow or st.fan is _UNREAD) and gpu.serves(c.FAN_SPEED):  # fans follow temperature slowly
            st.fan = gpu.get(N.nvmlDeviceGetFanSpeed)
        for metric, value in st.thresholds:
            gpu.emit(metric, value)
        if st.fan is not _UNREAD:
            gpu.emit(c.FAN_SPEED, st.fan, scale=0.01)
        if st.margin is not _UNREAD:
            gpu.emit(c.TEMPERATURE_MARGIN, st.margin)  # signed: negative above T.Limit
