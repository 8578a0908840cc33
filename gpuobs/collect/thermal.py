"""Thermal: GPU and memory temperature, the GPU's own slowdown/shutdown thresholds, fan speed."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx


THRESHOLDS = [(c.SLOWDOWN_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, "slowdown"),
              (c.SHUTDOWN_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, "shutdown"),
              (c.MAX_OPERATING_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, "gpu_max"),
              (c.MEMORY_MAX_TEMPERATURE, N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, "mem_max")]


class Thermal(Family):
    """Absolute thresholds come from nvmlDeviceGetTemperatureThreshold: the *_TLIMIT fields are
    relative to T.Limit (nvidia-smi's "Slowdown T.Limit Temp: -2 C"), not temperatures."""
    name = "thermal"
    FIELDS = [FieldSpec(N.NVML_FI_DEV_MEMORY_TEMP, c.MEMORY_TEMPERATURE)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        return self.FIELDS

    def collect(self, gpu: GpuCtx) -> None:
        gpu.emit(c.TEMPERATURE, gpu.get("nvmlDeviceGetTemperature", N.nvmlDeviceGetTemperature,
                                        N.NVML_TEMPERATURE_GPU))
        if "thresholds" not in gpu.cache:  # fixed per GPU: read once
            gpu.cache["thresholds"] = [(metric, gpu.get("nvmlDeviceGetTemperatureThreshold",
                                                        N.nvmlDeviceGetTemperatureThreshold, kind, variant=label))
                                       for metric, kind, label in THRESHOLDS]
        if gpu.slow or "fan" not in gpu.cache:  # fans follow temperature slowly
            gpu.cache["fan"] = gpu.get("nvmlDeviceGetFanSpeed", N.nvmlDeviceGetFanSpeed)
        for metric, value in gpu.cache["thresholds"]:
            gpu.emit(metric, value)
        gpu.emit(c.FAN_SPEED, gpu.cache["fan"], scale=0.01)
