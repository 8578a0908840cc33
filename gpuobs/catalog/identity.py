"""The identity family: which GPU this is, whether it answers NVML, its modes."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, detail

GPU_INFO = _m("gpu", "info", "", "GPU identity; value 1, identity in the labels.", "identity",
              "nvmlDeviceGetName/GetUUID/GetPciInfo_v3/GetSerial/GetVbiosVersion/GetCudaComputeCapability/"
              "GetBrand/GetArchitecture, nvmlSystemGetDriverVersion/GetCudaDriverVersion",
              labels=GPU_LABELS + ("name", "pci_bus_id", "serial", "vbios_version", "driver_version",
                                   "cuda_version", "compute_capability", "brand", "architecture"))
GPU_UP = _m("gpu_up", "gauge", "", "1 if the GPU answered NVML in the last pass, 0 if it is lost, missing, "
            "unusable or timed out (see gpuobs_gpu_unhealthy); its value series are absent while 0.", "identity",
            "nvmlDeviceGetHandleByIndex_v2 / GPU_IS_LOST / RESET_REQUIRED / the pass deadline")
GPU_UNHEALTHY = _m("gpu_unhealthy", "gauge", "", "1 with the reason while the GPU is not usable: lost (GPU_IS_LOST), "
                   "reset_required (RESET_REQUIRED), timeout (its reads missed the pass deadline) or "
                   "unreadable (its handle or UUID cannot be read). Absent while the GPU is healthy.", "identity",
                   "NVML return codes of the GPU's calls; the sampler's pass deadline",
                   labels=GPU_LABELS + ("reason",))
PERSISTENCE_MODE = _m("gpu_persistence_mode_enabled", "gauge", "", "1 if persistence mode is enabled (the driver "
                      "stays loaded without clients), else 0.", "identity", "nvmlDeviceGetPersistenceMode",
                      dcgm={(): "DCGM_FI_DEV_PERSISTENCE_MODE"}, max_value=1)
COMPUTE_MODES = ("default", "exclusive_thread", "prohibited", "exclusive_process")  # nvmlComputeMode_t order
COMPUTE_MODE = _m("gpu_compute_mode", "gauge", "", "1 for the compute mode the GPU is in, 0 for each other mode "
                  "(default, exclusive_thread, prohibited, exclusive_process), one series per mode.", "identity",
                  "nvmlDeviceGetComputeMode", labels=GPU_LABELS + ("mode",), max_value=1)

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(PERSISTENCE_MODE, COMPUTE_MODE)
