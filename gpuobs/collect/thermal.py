"""Thermal: GPU and memory temperature, the GPU's own slowdown/shutdown thresholds, fan speed."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx


class Thermal(Family):
    name = "thermal"
    FIELDS = [FieldSpec(N.NVML_FI_DEV_MEMORY_TEMP, c.MEMORY_TEMPERATURE),
              FieldSpec(N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT, c.SLOWDOWN_TEMPERATURE),
              FieldSpec(N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT, c.SHUTDOWN_TEMPERATURE),
              FieldSpec(N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT, c.MAX_OPERATING_TEMPERATURE),
              FieldSpec(N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT, c.MEMORY_MAX_TEMPERATURE)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        return self.FIELDS

    def collect(self, gpu: GpuCtx) -> None:
        gpu.emit(c.TEMPERATURE, gpu.get("nvmlDeviceGetTemperature", N.nvmlDeviceGetTemperature,
                                        N.NVML_TEMPERATURE_GPU))
        if (N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT, 0) not in gpu.fields:  # drivers without the field
            if gpu.slow or "slowdown" not in gpu.cache:
                gpu.cache["slowdown"] = gpu.get("nvmlDeviceGetTemperatureThreshold", N.nvmlDeviceGetTemperatureThreshold,
                                                N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, variant="slowdown")
            gpu.emit(c.SLOWDOWN_TEMPERATURE, gpu.cache["slowdown"])
        if gpu.slow or "fan" not in gpu.cache:
            gpu.cache["fan"] = gpu.get("nvmlDeviceGetFanSpeed", N.nvmlDeviceGetFanSpeed)
        gpu.emit(c.FAN_SPEED, gpu.cache["fan"], scale=0.01)
