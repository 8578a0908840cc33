"""Alerts of the power family: the hardware power brake, hardware slowdowns, the power cap."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ..common import DEGRADING, GPU, Alert, Thresholds, _reason


def power(t: Thresholds) -> list[Alert]:
    """Clock-event reasons of power: the brake, hardware slowdowns, the power cap."""
    alert = partial(Alert, family="power")
    return [
        alert(name="GpuHwPowerBrake", expr=_reason("hw_power_brake_slowdown"), for_=t.for_now, severity="critical",
              scope="gpu", summary="GPU clocks cut by the hardware power brake (external power signal).",
              description=f"{GPU} is in HW power brake slowdown: the node's power supply asked it to slow down.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuHwSlowdown", expr=_reason("hw_slowdown"), for_=t.for_short, severity="warning", scope="gpu",
              summary="GPU clocks cut by a hardware slowdown.",
              description=f"{GPU} has been in HW slowdown for {t.for_short}.", keep_firing_for=t.keep_firing),
        alert(name="GpuSwPowerCapSustained", expr=_reason("sw_power_cap"), for_=t.for_medium, severity="warning",
              scope="gpu", summary="GPU held at its power limit for a long time.",
              description=f"{GPU} has been capped at its power limit for {t.for_medium}: work runs slower than it "
                          "could.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuPowerBrakeRepeated",
              expr=f'changes({c.CLOCK_EVENT_ACTIVE.name}{{reason="hw_power_brake_slowdown"}}'
                   f"[{t.power_brake_window}]) >= {2 * t.power_brake_episodes - 1}",
              for_="0s", severity="warning", scope="gpu",
              summary="GPU keeps entering the HW power brake. " + DEGRADING,
              description=f"{GPU} entered or left the HW power brake {{{{ $value }}}} times in the last "
                          f"{t.power_brake_window} (at least {t.power_brake_episodes} times in it)."),
    ]
