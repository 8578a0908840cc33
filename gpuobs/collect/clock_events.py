"""Clock-event (throttle) reasons: the bitmask, one 0/1 series per reason (unknown bits as bit_N),
and how long each reason has held clocks down (counters)."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx, register


def reason_names(mask: int) -> dict[str, int]:
    """Every known reason as 0/1, plus `bit_N` = 1 for each set bit gpuobs does not know."""
    out = {name: int(bool(mask & bit)) for bit, name in c.CLOCK_EVENT_REASONS.items()}
    for n in range(64):
        if mask & (1 << n) and (1 << n) not in c.CLOCK_EVENT_REASONS:
            out[f"bit_{n}"] = 1
    return out


@register("clock_events")
class ClockEvents(Family):
    """Reasons from one call per sample; duration counters batched in the field-values call."""
    FIELDS = [FieldSpec(fid, c.CLOCK_EVENT_DURATION, extra=(reason,), per=1e9)
              for fid, reason in c.CLOCK_EVENT_COUNTER_FIELDS.items()]
    THERMAL_POLICY = [FieldSpec(c.THERMAL_POLICY_FIELD, c.THERMAL_POLICY_VIOLATION, per=1e9)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        """The clock-event duration counters (NVML's cumulative ns per reason, c.CLOCK_EVENT_COUNTER_FIELDS)
        when the profile serves c.CLOCK_EVENT_DURATION, and the thermal perf-policy counter (ns,
        c.THERMAL_POLICY_FIELD) when it serves c.THERMAL_POLICY_VIOLATION; a field not served is not read."""
        out = self.FIELDS if gpu.serves(c.CLOCK_EVENT_DURATION) else []
        return out + self.THERMAL_POLICY if gpu.serves(c.THERMAL_POLICY_VIOLATION) else out

    def collect(self, gpu: GpuCtx) -> None:
        """The current clock-event reasons bitmask (nvmlDeviceGetCurrentClocksEventReasons, or the
        pre-R535 throttle-reasons call) as c.CLOCK_EVENT_REASONS_MASK and one 0/1 c.CLOCK_EVENT_ACTIVE per named
        reason; nothing when the call fails or answers the all-ones "unknown" mask."""
        # R535 renamed throttle reasons to clock events; older drivers and bindings have the old call
        mask = gpu.first(N.nvmlDeviceGetCurrentClocksEventReasons, N.nvmlDeviceGetCurrentClocksThrottleReasons)
        if mask is not None and mask != 0xFFFFFFFFFFFFFFFF:
            gpu.emit(c.CLOCK_EVENT_REASONS_MASK, mask)
            for reason, active in reason_names(mask).items():
                gpu.emit(c.CLOCK_EVENT_ACTIVE, active, reason)
