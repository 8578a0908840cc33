"""Power: draw (instant, averaged, memory's), limits (enforced, requested, default, range) and total
energy, all from one batched field-values call."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx, register

MILLI = 1000  # NVML reports mW and mJ: divided (72600 mW is 72.6 W; times 0.001 it was 72.60000000000001)
SCOPE_GPU, SCOPE_MEMORY = 0, 2  # nvmlPowerScopeType_t (NVML_POWER_SCOPE_GPU, _MEMORY): literal, older pynvml lacks them
POWER_SANITY = 2.0  # a draw above twice the enforced limit is a bad reading, not a real one


@register("power")
class Power(Family):
    """Power draw, limits, average power (GPU and memory scopes) and energy from the batch (NVML's mW and
    mJ, exported as W and J); the draw is checked against the limit before it is emitted."""
    # Draw is checked against the limit in collect, so it is not emitted from a FieldSpec.
    FIELDS = [FieldSpec(N.NVML_FI_DEV_POWER_CURRENT_LIMIT, c.POWER_LIMIT, per=MILLI),
              FieldSpec(N.NVML_FI_DEV_POWER_DEFAULT_LIMIT, c.POWER_DEFAULT_LIMIT, per=MILLI),
              FieldSpec(N.NVML_FI_DEV_POWER_MIN_LIMIT, c.POWER_MIN_LIMIT, per=MILLI),
              FieldSpec(N.NVML_FI_DEV_POWER_MAX_LIMIT, c.POWER_MAX_LIMIT, per=MILLI),
              FieldSpec(N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, c.ENERGY, per=MILLI),
              FieldSpec(N.NVML_FI_DEV_POWER_REQUESTED_LIMIT, c.POWER_REQUESTED_LIMIT, per=MILLI),
              FieldSpec(N.NVML_FI_DEV_POWER_AVERAGE, c.POWER_AVERAGE, per=MILLI, scope=SCOPE_GPU),
              # the scope of a power field is an nvmlPowerScopeType_t: the memory's own draw
              FieldSpec(N.NVML_FI_DEV_POWER_AVERAGE, c.MEMORY_POWER, per=MILLI, scope=SCOPE_MEMORY)]
    DRAW = FieldSpec(N.NVML_FI_DEV_POWER_INSTANT, None)  # read here, emitted by collect

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        """The limits, energy and average-power fields (FIELDS) and the instant draw (DRAW, emitted by collect)."""
        return [*self.FIELDS, self.DRAW]

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.POWER_USAGE in watts: the batched instant draw, else nvmlDeviceGetPowerUsage (older drivers).
        A draw above POWER_SANITY times the current limit is dropped as "above_limit" (a garbage read, not a spike)."""
        draw = gpu.fields.get((N.NVML_FI_DEV_POWER_INSTANT, 0))
        if draw is None:  # older drivers: the classic getter
            draw = gpu.get(N.nvmlDeviceGetPowerUsage)
        limit = gpu.fields.get((N.NVML_FI_DEV_POWER_CURRENT_LIMIT, 0))
        if draw is not None and limit and draw > POWER_SANITY * limit:
            gpu.dropped(c.POWER_USAGE, "above_limit")
            return
        gpu.emit(c.POWER_USAGE, draw, per=MILLI)
