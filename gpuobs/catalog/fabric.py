"""The fabric family: NVSwitch fabric registration and health."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, detail

FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")  # nvmlGpuFabricState_t order
FABRIC_STATE = _m("gpu_fabric_state", "gauge", "", "1 for the NVSwitch fabric registration state the GPU is in "
                  "(not_supported, not_started, in_progress, completed), 0 for the others.", "fabric",
                  "nvmlDeviceGetGpuFabricInfoV (else nvmlDeviceGetGpuFabricInfo) .state",
                  labels=GPU_LABELS + ("state",), max_value=1)
FABRIC_STATUS = _m("gpu_fabric_status", "gauge", "", "NVML return code of the fabric registration (0: success); "
                   "set once the state is completed.", "fabric",
                   "nvmlDeviceGetGpuFabricInfoV (else nvmlDeviceGetGpuFabricInfo) .status",
                   dcgm={(): "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"})
FABRIC_CLIQUE = _m("gpu_fabric_clique_id", "gauge", "", "Fabric clique the GPU belongs to (GPUs of one clique "
                   "reach each other over NVLink); set once the state is completed.", "fabric",
                   "nvmlDeviceGetGpuFabricInfoV (else nvmlDeviceGetGpuFabricInfo) .cliqueId",
                   dcgm={(): "DCGM_FI_DEV_FABRIC_CLIQUE_ID"})
FABRIC_HEALTH = _m("gpu_fabric_health_mask", "gauge", "", "Fabric health bitmask (NVML_GPU_FABRIC_HEALTH_MASK_*: "
                   "degraded bandwidth, route recovery, route unhealthy, access timeout recovery, incorrect "
                   "configuration, ...); absent where the driver does not report it.", "fabric",
                   "nvmlDeviceGetGpuFabricInfoV .healthMask (nvmlGpuFabricInfo_v2)",
                   dcgm={(): "DCGM_FI_DEV_FABRIC_HEALTH_MASK"})

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(FABRIC_STATE, FABRIC_STATUS, FABRIC_CLIQUE, FABRIC_HEALTH)
