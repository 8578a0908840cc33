"""Node dashboard, row "Clocks and throttling": clocks, performance state and clock-event (throttle) reasons (clocks and
clock_events families)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import rate, target
from .selectors import GPU, m

SM = 'clock="sm"'
NOT_IDLE = 'reason!="gpu_idle"'  # idle is no throttling


def row(L: k.Layout) -> None:
    """Append the 'Clocks and throttling' row and its panels to the Node dashboard's layout L."""
    L.row("Clocks and throttling")
    L.add(k.timeseries("Clocks", [target(m(c.CLOCK), GPU + " {{clock}}")], "hertz",
                       "Current clock per domain."), 8, 8)
    L.add(k.timeseries("SM clock headroom",
                       [target(f"{m(c.CLOCK, SM)} / on ({k.GPU_BY}, clock) {m(c.MAX_CLOCK, SM)}", GPU)],
        "percentunit", "SM clock as a share of its maximum.", min=0, max=1), 8, 8)
    L.add(k.timeseries("Max clocks", [target(m(c.MAX_CLOCK), GPU + " {{clock}}")], "hertz",
                       "Maximum clock per domain."), 8, 8)
    L.add(k.state_timeline("Performance state", [target(m(c.PSTATE), GPU)], "short",
                           "P0 is the maximum performance state, P15 the minimum.",
                           thresholds=[{"color": "green", "value": None}, {"color": "yellow", "value": 2},
                                       {"color": "blue", "value": 8}]), 8, 8)
    L.add(k.state_timeline("Throttle reasons active", [target(
        f"sum by (gpu) ({m(c.CLOCK_EVENT_ACTIVE, NOT_IDLE)})", GPU)], "short",
        "Clock-event reasons holding each GPU's clocks down (idle excluded); see the next panel for which.",
        thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]), 8, 8)
    L.add(k.timeseries("Throttle time by reason", [target(
        f"sum by (gpu, reason) ({rate(m(c.CLOCK_EVENT_DURATION))})", GPU + " {{reason}}"),
        target(f"sum by (gpu) ({rate(m(c.THERMAL_POLICY_VIOLATION))})", GPU + " thermal policy")], "percentunit",
        "Share of time clocks were held down, per reason (nvidia-smi's clock event reason counters), and "
        "under the thermal policy (NVML's violation counter that DCGM_FI_DEV_THERMAL_VIOLATION reads).",
        min=0, stack=True), 8, 8)
    L.add(k.table("Active clock-event reasons", [target(f"{m(c.CLOCK_EVENT_ACTIVE, NOT_IDLE)} == 1")], "short",
                  "Every clock-event reason holding clocks down now (gpu_idle left out). The default profile "
                  "serves the reasons the alerts read; the others with the exporter's --detail clock_events.",
                  hide=("Value", "cluster", "node")),
          18, 5)
    L.add(k.table("Clock-event reason mask", [target(m(c.CLOCK_EVENT_REASONS_MASK))], "short",
                  "nvmlClocksEventReasons bitmask, as nvidia-smi and DCGM show it (0x4: power cap, 0x40: HW "
                  "thermal slowdown, 0x1: idle).", hide=("cluster", "node", "uuid"), rename={"Value": "mask"}), 6, 5)
