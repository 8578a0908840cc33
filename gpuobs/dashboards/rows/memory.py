"""Node dashboard, row "Memory": device memory and BAR1 aperture (memory family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'Memory' row and its panels to the Node dashboard's layout L."""
    L.row("Memory")
    L.add(k.timeseries("Memory used", [target(m(c.MEMORY_USED), GPU + " used"),
                                       target(m(c.MEMORY_TOTAL), GPU + " total")], "bytes",
                       "Device memory allocated, against the GPU's total.", min=0), 8, 8)
    L.add(k.timeseries("Memory reserved and free", [target(m(c.MEMORY_RESERVED), GPU + " reserved"),
                                                    target(m(c.MEMORY_FREE), GPU + " free")], "bytes",
                       "Memory reserved by driver and firmware, and memory free.", min=0), 8, 8)
    L.add(k.timeseries("BAR1", [target(m(c.BAR1_USED), GPU + " used"), target(m(c.BAR1_TOTAL), GPU + " total")],
                       "bytes", "BAR1 aperture in use and in total.", min=0), 8, 8)
