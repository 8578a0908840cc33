"""The thermal family: GPU and memory temperatures, their thresholds, the fan."""

from __future__ import annotations

from .metric import _m, detail

TEMPERATURE = _m("gpu_temperature_celsius", "gauge", "celsius", "GPU core temperature.", "thermal",
                 "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", dcgm={(): "DCGM_FI_DEV_GPU_TEMP"},
                 max_value=200)
MEMORY_TEMPERATURE = _m("gpu_memory_temperature_celsius", "gauge", "celsius", "HBM/GDDR temperature.", "thermal",
                        "NVML_FI_DEV_MEMORY_TEMP", dcgm={(): "DCGM_FI_DEV_MEMORY_TEMP"}, max_value=200)
SLOWDOWN_TEMPERATURE = _m("gpu_slowdown_temperature_celsius", "gauge", "celsius",
                          "GPU temperature at which the hardware slows its clocks.", "thermal",
                          "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)",
                          dcgm={(): "DCGM_FI_DEV_SLOWDOWN_TEMP"}, max_value=200)
SHUTDOWN_TEMPERATURE = _m("gpu_shutdown_temperature_celsius", "gauge", "celsius",
                          "GPU temperature at which the hardware shuts down.", "thermal",
                          "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)",
                          dcgm={(): "DCGM_FI_DEV_SHUTDOWN_TEMP"}, max_value=200)
MAX_OPERATING_TEMPERATURE = _m("gpu_max_operating_temperature_celsius", "gauge", "celsius",
                               "Highest GPU temperature for normal operation.", "thermal",
                               "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_GPU_MAX)", max_value=200)
MEMORY_MAX_TEMPERATURE = _m("gpu_memory_max_operating_temperature_celsius", "gauge", "celsius",
                            "Highest memory temperature for normal operation.", "thermal",
                            "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX)", max_value=200)
TEMPERATURE_MARGIN = _m("gpu_temperature_margin_celsius", "gauge", "celsius", "Degrees the GPU core is below its "
                        "T.Limit (the temperature at which it starts slowing its clocks); negative above it.",
                        "thermal", "nvmlDeviceGetMarginTemperature .marginTemperature (signed), read every slow pass",
                        min_value=-200, max_value=200)
FAN_SPEED = _m("gpu_fan_speed_ratio", "gauge", "ratio", "Fan speed as a fraction of its maximum.", "thermal",
               "nvmlDeviceGetFanSpeed (percent) / 100", dcgm={(): "DCGM_FI_DEV_FAN_SPEED"}, dcgm_scale=100,
               max_value=1.0)

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(SHUTDOWN_TEMPERATURE, MAX_OPERATING_TEMPERATURE, TEMPERATURE_MARGIN, FAN_SPEED)
