"""The mig family: MIG mode, MIG devices, their memory and their GPM ratios."""

from __future__ import annotations

from .gpm import _GPM
from .metric import MIB, MIG_LABELS, Metric, _m, detail

MIG_MODE = _m("gpu_mig_enabled", "gauge", "", "1 if MIG mode is enabled now.", "mig", "nvmlDeviceGetMigMode current")
MIG_INFO = _m("mig", "info", "", "One MIG device (GPU instance and compute instance) of a GPU.", "mig",
              "nvmlDeviceGetMigDeviceHandleByIndex, GetGpuInstanceId, GetComputeInstanceId, GetName, GetUUID",
              labels=MIG_LABELS + ("mig_uuid", "profile"))
MIG_MEMORY_TOTAL = _m("mig_memory_total_bytes", "gauge", "bytes", "Memory of the MIG device.", "mig",
                      "nvmlDeviceGetMemoryInfo_v2(MIG handle) .total", labels=MIG_LABELS,
                      dcgm={(): "DCGM_FI_DEV_FB_TOTAL"}, dcgm_scale=MIB)
MIG_MEMORY_USED = _m("mig_memory_used_bytes", "gauge", "bytes", "Memory used on the MIG device.", "mig",
                     "nvmlDeviceGetMemoryInfo_v2(MIG handle) .used", labels=MIG_LABELS,
                     dcgm={(): "DCGM_FI_DEV_FB_USED"}, dcgm_scale=MIB)
MIG_PENDING = _m("gpu_mig_pending_enabled", "gauge", "", "1 if MIG mode will be enabled after the next GPU reset "
                 "(differs from gpuobs_gpu_mig_enabled while a change waits).", "mig", "nvmlDeviceGetMigMode pending",
                 max_value=1)
MIG_BAR1_TOTAL = _m("mig_bar1_total_bytes", "gauge", "bytes", "BAR1 aperture of the MIG device.", "mig",
                    "nvmlDeviceGetBAR1MemoryInfo(MIG handle) .bar1Total", labels=MIG_LABELS)
MIG_BAR1_USED = _m("mig_bar1_used_bytes", "gauge", "bytes", "BAR1 aperture in use on the MIG device.", "mig",
                   "nvmlDeviceGetBAR1MemoryInfo(MIG handle) .bar1Used", labels=MIG_LABELS)
MIG_SMS = _m("mig_multiprocessors", "gauge", "", "Streaming multiprocessors (SMs) of the MIG device.", "mig",
             "nvmlDeviceGetAttributes_v2(MIG handle) .multiprocessorCount", labels=MIG_LABELS)
MIG_GPM_METRICS: dict[int, Metric] = {
    gid: _m(f"mig_{name}_ratio", "gauge", "ratio", f"{help} Per MIG GPU instance.", "mig",
            f"nvmlGpmMetricsGet metric {gid} (percent) / 100 over two nvmlGpmMigSampleGet samples",
            labels=MIG_LABELS, dcgm={(): dcgm}, max_value=1.0)
    for name, gid, dcgm, help in _GPM}

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(MIG_PENDING, MIG_BAR1_TOTAL, MIG_BAR1_USED, MIG_SMS, *MIG_GPM_METRICS.values())
