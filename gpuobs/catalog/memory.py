"""The memory family: device memory and the BAR1 aperture."""

from __future__ import annotations

from .metric import MIB, _m, detail

MEMORY_TOTAL = _m("gpu_memory_total_bytes", "gauge", "bytes", "Device memory in total.", "memory",
                  "nvmlDeviceGetMemoryInfo_v2 .total", dcgm={(): "DCGM_FI_DEV_FB_TOTAL"}, dcgm_scale=MIB)
MEMORY_USED = _m("gpu_memory_used_bytes", "gauge", "bytes", "Device memory allocated, reserved memory excluded.",
                 "memory", "nvmlDeviceGetMemoryInfo_v2 .used", dcgm={(): "DCGM_FI_DEV_FB_USED"}, dcgm_scale=MIB)
MEMORY_RESERVED = _m("gpu_memory_reserved_bytes", "gauge", "bytes",
                     "Device memory reserved by the driver and firmware.", "memory",
                     "nvmlDeviceGetMemoryInfo_v2 .reserved", dcgm={(): "DCGM_FI_DEV_FB_RESERVED"}, dcgm_scale=MIB)
MEMORY_FREE = _m("gpu_memory_free_bytes", "gauge", "bytes", "Device memory free.", "memory",
                 "nvmlDeviceGetMemoryInfo_v2 .free", dcgm={(): "DCGM_FI_DEV_FB_FREE"}, dcgm_scale=MIB)
BAR1_TOTAL = _m("gpu_bar1_total_bytes", "gauge", "bytes", "BAR1 aperture size.", "memory",
                "nvmlDeviceGetBAR1MemoryInfo .bar1Total", dcgm={(): "DCGM_FI_DEV_BAR1_TOTAL"}, dcgm_scale=MIB)
BAR1_USED = _m("gpu_bar1_used_bytes", "gauge", "bytes", "BAR1 aperture in use.", "memory",
               "nvmlDeviceGetBAR1MemoryInfo .bar1Used", dcgm={(): "DCGM_FI_DEV_BAR1_USED"}, dcgm_scale=MIB)

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(MEMORY_RESERVED, MEMORY_FREE, BAR1_TOTAL, BAR1_USED)
