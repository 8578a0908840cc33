"""Node dashboard, row "Thermal": GPU and memory temperatures against their thresholds, fans, the
margin to T.Limit (thermal family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'Thermal' row and its panels to the Node dashboard's layout L."""
    L.row("Thermal")
    L.add(k.timeseries("GPU temperature and thresholds", [
        target(m(c.TEMPERATURE), GPU), target(m(c.SLOWDOWN_TEMPERATURE), GPU + " slowdown"),
        target(m(c.SHUTDOWN_TEMPERATURE), GPU + " shutdown"),
        target(m(c.MAX_OPERATING_TEMPERATURE), GPU + " max operating")], "celsius",
        "Core temperature against the GPU's own slowdown, shutdown and maximum operating thresholds."), 10, 8)
    L.add(k.timeseries("Memory temperature", [
        target(m(c.MEMORY_TEMPERATURE), GPU), target(m(c.MEMORY_MAX_TEMPERATURE), GPU + " max operating")],
        "celsius", "HBM/GDDR temperature against its maximum operating temperature."), 8, 8)
    L.add(k.timeseries("Fan speed", [target(m(c.FAN_SPEED), GPU)], "percentunit",
                       "Fan speed as a share of its maximum (boards with fans only).", min=0, max=1), 6, 8)
    L.add(k.timeseries("Margin to T.Limit", [target(m(c.TEMPERATURE_MARGIN), GPU)], "celsius",
                       "Degrees the core is below T.Limit, where the GPU starts slowing its clocks: the "
                       "headroom before thermal slowdown, negative past it (detail: --detail thermal)."), 24, 6)
