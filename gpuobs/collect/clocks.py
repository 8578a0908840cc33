"""Clocks: the performance state and current SM clock every sample; the memory clock on slow samples
and whenever the P-state changed (it moves with the P-state: fixed on HBM parts, stepped by P-state on
GDDR); graphics/video on slow samples; maxima per probe (fixed per GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx, register

MHZ = 1e6
FAST = (N.NVML_CLOCK_SM,)


@dataclass
class ClocksState:
    """Per-GPU clock readings kept between passes: current and maximum MHz by nvmlClockType_t, and the
    last P-state (the memory clock is read again when it moves)."""
    current: dict[int, int | None] = field(default_factory=dict)  # clock type -> last MHz read (None: failed)
    maximum: dict[int, int | None] = field(default_factory=dict)  # clock type -> MHz, probed
    pstate: int | None = None  # the P-state last read


@register("clocks")
class Clocks(Family):
    """Current and maximum clocks (per c.CLOCKS type) in Hz and the P-state. The SM clock is read every
    pass; the others on slow samples or after a failed read, the memory clock also when the P-state moves."""
    State = ClocksState

    def probe(self, gpu: GpuCtx) -> None:
        """Reads the maximum clock of each type (nvmlDeviceGetMaxClockInfo, MHz; fixed for the GPU's life),
        only when the profile serves c.MAX_CLOCK (detail)."""
        served = gpu.serves(c.MAX_CLOCK)  # detail: no call by default
        self.state(gpu).maximum = {clock: gpu.get(N.nvmlDeviceGetMaxClockInfo, clock, variant=label)
                                   for clock, label in enumerate(c.CLOCKS) if served}

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.CLOCK and c.MAX_CLOCK per clock type (MHz from NVML, exported in Hz) and c.PSTATE
        (nvmlDeviceGetPerformanceState, 0 fastest to 15); a failed read emits nothing for that series."""
        st = self.state(gpu)
        served = [(clock, label) for clock, label in enumerate(c.CLOCKS)
                  if gpu.profile.keeps(c.CLOCK, gpu.labels + (label,)) or gpu.serves(c.MAX_CLOCK)]
        # the P-state says when to re-read the memory clock; without either served, no call
        memory = any(clock == N.NVML_CLOCK_MEM for clock, _ in served)
        pstate = gpu.get(N.nvmlDeviceGetPerformanceState) if memory or gpu.serves(c.PSTATE) else None
        moved, st.pstate = pstate != st.pstate, pstate
        for clock, label in served:
            if (clock in FAST or gpu.slow or clock not in st.current or st.current[clock] is None
                    or (moved and clock == N.NVML_CLOCK_MEM)):
                st.current[clock] = gpu.get(N.nvmlDeviceGetClockInfo, clock, variant=label)
            gpu.emit(c.CLOCK, st.current[clock], label, scale=MHZ)
            gpu.emit(c.MAX_CLOCK, st.maximum.get(clock), label, scale=MHZ)
        gpu.emit(c.PSTATE, pstate)
