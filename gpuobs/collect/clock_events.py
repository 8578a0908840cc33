"""Clock-event (throttle) reasons: one 0/1 series per reason, unknown bits as bit_N, and the
violation-time counters per policy."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx

NS = 1e-9


def reason_names(mask: int) -> dict[str, int]:
    """Every known reason as 0/1, plus `bit_N` = 1 for each set bit gpuobs does not know."""
    out = {name: int(bool(mask & bit)) for bit, name in c.CLOCK_EVENT_REASONS.items()}
    for n in range(64):
        if mask & (1 << n) and (1 << n) not in c.CLOCK_EVENT_REASONS:
            out[f"bit_{n}"] = 1
    return out


class ClockEvents(Family):
    name = "clock_events"

    def collect(self, gpu: GpuCtx) -> None:
        mask = gpu.get("nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksEventReasons)
        if mask is not None and mask != 0xFFFFFFFFFFFFFFFF:
            for reason, active in reason_names(mask).items():
                gpu.emit(c.CLOCK_EVENT_ACTIVE, active, reason)
        if gpu.slow or "violations" not in gpu.cache:  # slow-moving counters: refreshed on slow samples
            violations = {}
            for policy, reason in c.VIOLATION_POLICIES.items():
                v = gpu.get("nvmlDeviceGetViolationStatus", N.nvmlDeviceGetViolationStatus, policy, variant=reason)
                if v is not None:
                    violations[reason] = v.violationTime
            gpu.cache["violations"] = violations
        for reason, ns in gpu.cache["violations"].items():
            gpu.emit(c.CLOCK_EVENT_DURATION, ns, reason, scale=NS)
