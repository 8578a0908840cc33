"""The power family: power draw, limits and energy."""

from __future__ import annotations

from .metric import _m, detail

POWER_USAGE = _m("gpu_power_usage_watts", "gauge", "watts", "Power draw of the GPU board.", "power",
                 "NVML_FI_DEV_POWER_INSTANT (milliwatts) / 1000, else nvmlDeviceGetPowerUsage",
                 dcgm={(): "DCGM_FI_DEV_POWER_USAGE"})
POWER_LIMIT = _m("gpu_power_limit_watts", "gauge", "watts", "Power limit the driver enforces now.", "power",
                 "NVML_FI_DEV_POWER_CURRENT_LIMIT (milliwatts) / 1000",
                 dcgm={(): "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"})
POWER_DEFAULT_LIMIT = _m("gpu_power_default_limit_watts", "gauge", "watts", "Default power limit.", "power",
                         "NVML_FI_DEV_POWER_DEFAULT_LIMIT (milliwatts) / 1000")
POWER_MIN_LIMIT = _m("gpu_power_min_limit_watts", "gauge", "watts", "Lowest settable power limit.", "power",
                     "NVML_FI_DEV_POWER_MIN_LIMIT (milliwatts) / 1000",
                     dcgm={(): "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN"})
POWER_MAX_LIMIT = _m("gpu_power_max_limit_watts", "gauge", "watts", "Highest settable power limit.", "power",
                     "NVML_FI_DEV_POWER_MAX_LIMIT (milliwatts) / 1000",
                     dcgm={(): "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX"})
ENERGY = _m("gpu_energy_consumption_joules", "counter", "joules", "Energy used since the driver was loaded.",
            "power", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (millijoules) / 1000",
            dcgm={(): "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}, dcgm_scale=1000)
POWER_AVERAGE = _m("gpu_power_average_watts", "gauge", "watts", "Power draw of the GPU averaged over one second "
                   "(Ampere and newer, GA100 excepted).", "power",
                   "NVML_FI_DEV_POWER_AVERAGE, scope NVML_POWER_SCOPE_GPU (milliwatts) / 1000")
MEMORY_POWER = _m("gpu_memory_power_average_watts", "gauge", "watts", "Power draw of the GPU's memory averaged over "
                  "one second (nvidia-smi's GPU Memory Power Readings).", "power",
                  "NVML_FI_DEV_POWER_AVERAGE, scope NVML_POWER_SCOPE_MEMORY (milliwatts) / 1000")
POWER_REQUESTED_LIMIT = _m("gpu_power_requested_limit_watts", "gauge", "watts", "Power limit requested (set with "
                           "nvidia-smi -pl or the default); the enforced limit may be lower.", "power",
                           "NVML_FI_DEV_POWER_REQUESTED_LIMIT (milliwatts) / 1000",
                           dcgm={(): "DCGM_FI_DEV_POWER_MGMT_LIMIT"})

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(POWER_DEFAULT_LIMIT, POWER_MIN_LIMIT, POWER_MAX_LIMIT, POWER_AVERAGE, MEMORY_POWER,
       POWER_REQUESTED_LIMIT)
