"""Alerts of the thermal family: thermal clock-event reasons, GPU and memory temperatures near their limits,
and a temperature trending towards slowdown."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import records
from ...records import GPU_BY
from ..common import DEGRADING, GPU, Alert, Thresholds, _reason, _seconds


def _temperature_trend(t: Thresholds) -> str:
    """Temperature heading for the GPU's own slowdown threshold within temp_trend_horizon at its pace
    over temp_trend_window and over the last for_medium (a job's start, a step up then flat, has no
    pace of its own after for_medium), while not yet within temp_margin_c of it
    (GpuTemperatureNearSlowdown's case). The value is the predicted temperature, °C."""
    temp, slowdown = c.TEMPERATURE.name, c.SLOWDOWN_TEMPERATURE.name
    horizon = f"{_seconds(t.temp_trend_horizon):g}"
    # per GPU across attribution changes: after a pod change the window holds two series of the GPU
    # (the old pod's and the new), which one-to-one matching refuses for the whole rule
    pace = [records.per_gpu("max", f"predict_linear({temp}[{w}], {horizon})")
            for w in (t.temp_trend_window, t.for_medium)]
    limit = records.per_gpu("max", slowdown)
    return (f"{pace[0]} >= on ({GPU_BY}) {limit} and on ({GPU_BY}) {pace[1]} >= on ({GPU_BY}) {limit} "
            f"and on ({GPU_BY}) {temp} < on ({records.SAME_SERIES}) ({slowdown} - {t.temp_margin_c:g})")


# ---------------------------------------------------------------------------------------------- families
# One function per family, in the pack's order; each returns its alerts for thresholds t.
def thermal(t: Thresholds) -> list[Alert]:
    """Clock-event reasons and temperatures of the GPU and its memory."""
    alert = partial(Alert, family="thermal")
    return [
        alert(name="GpuHwThermalSlowdown", expr=_reason("hw_thermal_slowdown"), for_=t.for_now, severity="critical",
              scope="gpu", summary="GPU clocks cut by the hardware thermal slowdown.",
              description=f"{GPU} is in HW thermal slowdown: its clocks are held down to protect it.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuSwThermalSlowdown", expr=_reason("sw_thermal_slowdown"), for_=t.for_short, severity="warning",
              scope="gpu", summary="GPU clocks reduced by the driver to stay under its thermal limit.",
              description=f"{GPU} has been in SW thermal slowdown for {t.for_short}.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuTemperatureNearSlowdown",
              expr=f"{c.TEMPERATURE.name} >= on ({records.SAME_SERIES}) "
                   f"({c.SLOWDOWN_TEMPERATURE.name} - {t.temp_margin_c:g})",
              for_=t.for_short, severity="warning", scope="gpu",
              summary="GPU temperature close to its slowdown threshold.",
              description=f"{GPU} is at {{{{ $value }}}} °C, within {t.temp_margin_c:g} °C of its own slowdown "
                          "threshold."),
        alert(name="GpuMemoryTemperatureNearMax",
              expr=f"{c.MEMORY_TEMPERATURE.name} >= on ({records.SAME_SERIES}) ({c.MEMORY_MAX_TEMPERATURE.name} - "
                   f"{t.temp_margin_c:g})",
              for_=t.for_short, severity="warning", scope="gpu",
              summary="GPU memory temperature close to its maximum.",
              description=f"{GPU} memory is at {{{{ $value }}}} °C, within {t.temp_margin_c:g} °C of its maximum "
                          "operating temperature."),
        alert(name="GpuTemperatureTrendingToSlowdown", expr=_temperature_trend(t), for_=t.for_long,
              severity="warning", scope="gpu",
              summary="GPU temperature climbing towards its slowdown threshold. " + DEGRADING,
              description=f"{GPU} keeps heating up: at its pace over the last {t.temp_trend_window} it reaches "
                          f"{{{{ $value | printf \"%.0f\" }}}} °C within {t.temp_trend_horizon}, at or over its "
                          "own slowdown threshold."),
    ]
