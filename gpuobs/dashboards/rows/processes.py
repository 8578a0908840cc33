"""Node dashboard, row "Processes": processes on the GPUs and their use (processes family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'Processes' row and its panels to the Node dashboard's layout L."""
    L.row("Processes")
    L.add(k.table("Processes", [target(m(c.PROCESS_MEMORY))], "bytes",
                  "Processes on the GPUs and their device memory (opt-in family: --processes).",
                  hide=("cluster", "node", "uuid"), rename={"Value": "memory"}), 12, 8)
    L.add(k.timeseries("Process SM utilization", [target(m(c.PROCESS_SM), GPU + " pid {{pid}}")], "percentunit",
                       "SM utilization per process.", min=0, max=1), 12, 8)
    L.add(k.table("Processes listed", [target(m(c.PROCESS_INFO))], "short",
                  "Every process NVML lists on the GPUs, with its type and name: also those without a memory "
                  "figure (Windows WDDM) that the table above cannot show (detail: the full profile).",
                  hide=("Value", "cluster", "node", "uuid")), 24, 6)
