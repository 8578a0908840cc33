"""The clocks family: clock frequencies and the performance state."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, default_values, detail

CLOCKS = ("graphics", "sm", "memory", "video")  # nvmlClockType_t order
CLOCK = _m("gpu_clock_hertz", "gauge", "hertz", "Current clock frequency per clock domain.", "clocks",
           "nvmlDeviceGetClockInfo (MHz) * 1e6", labels=GPU_LABELS + ("clock",),
           dcgm={("sm",): "DCGM_FI_DEV_SM_CLOCK", ("memory",): "DCGM_FI_DEV_MEM_CLOCK",
                 ("video",): "DCGM_FI_DEV_VIDEO_CLOCK"}, dcgm_scale=1e-6, max_value=20e9)
MAX_CLOCK = _m("gpu_max_clock_hertz", "gauge", "hertz", "Maximum clock frequency per clock domain.", "clocks",
               "nvmlDeviceGetMaxClockInfo (MHz) * 1e6", labels=GPU_LABELS + ("clock",),
               dcgm={("sm",): "DCGM_FI_DEV_MAX_SM_CLOCK", ("memory",): "DCGM_FI_DEV_MAX_MEM_CLOCK",
                     ("video",): "DCGM_FI_DEV_MAX_VIDEO_CLOCK"}, dcgm_scale=1e-6, max_value=20e9)
PSTATE = _m("gpu_performance_state", "gauge", "", "Performance state: 0 (P0, maximum) to 15 (minimum).", "clocks",
            "nvmlDeviceGetPerformanceState", dcgm={(): "DCGM_FI_DEV_PSTATE"}, max_value=15)

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY); of a default_values metric the default profile serves only those label values
detail(MAX_CLOCK, PSTATE)
default_values(CLOCK, "clock", {"sm"})
