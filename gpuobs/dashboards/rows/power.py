"""Node dashboard, row "Power": draw, limits, energy (power family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import rate, target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'Power' row and its panels to the Node dashboard's layout L."""
    L.row("Power")
    L.add(k.timeseries("Power draw and limits", [
        target(m(c.POWER_USAGE), GPU + " draw"), target(m(c.POWER_LIMIT), GPU + " enforced limit"),
        target(m(c.POWER_DEFAULT_LIMIT), GPU + " default limit"), target(m(c.POWER_MIN_LIMIT), GPU + " min limit"),
        target(m(c.POWER_MAX_LIMIT), GPU + " max limit")], "watt",
        "Board power against the enforced, default and settable limits.", min=0), 16, 8)
    L.add(k.timeseries("Energy rate", [target(rate(m(c.ENERGY)), GPU)], "watt",
                       "Power derived from the energy counter: joules per second.", min=0), 8, 8)
    L.add(k.timeseries("Average power, memory power and requested limit", [
        target(m(c.POWER_AVERAGE), GPU + " average"), target(m(c.MEMORY_POWER), GPU + " memory average"),
        target(m(c.POWER_REQUESTED_LIMIT), GPU + " requested limit")], "watt",
        "The driver's 1 s average board power, the memory's share where the GPU reports it, and the limit "
        "last requested (the enforced one can be lower).", min=0), 24, 8)
