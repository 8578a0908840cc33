"""Collectors, one module per metric family, and the sampling loop that runs them."""

from __future__ import annotations

from ..nvml import Session
from .base import Family, Sample, Snapshot
from .clock_events import ClockEvents
from .clocks import Clocks
from .ecc import Ecc
from .gpm import Gpm
from .identity import Identity
from .memory import Memory
from .mig import Mig
from .nvlink import Nvlink
from .pcie import Pcie
from .power import Power
from .processes import Processes
from .sampler import Sampler
from .thermal import Thermal
from .utilization import Utilization
from .xid import Xid, XidWatcher

__all__ = ["Family", "Sample", "Sampler", "Snapshot", "build_families"]


def build_families(enabled: set[str], watcher: XidWatcher | None = None, process_cap: int = 32) -> list[Family]:
    """Family instances for the enabled names (catalog.FAMILIES), in catalog order.

    gpm must run before mig (mig reuses its support probe); xid needs a running XidWatcher.
    """
    makers = {"identity": Identity, "utilization": Utilization, "gpm": Gpm, "memory": Memory, "power": Power,
              "thermal": Thermal, "clocks": Clocks, "clock_events": ClockEvents, "ecc": Ecc, "pcie": Pcie,
              "nvlink": Nvlink, "mig": Mig, "processes": lambda: Processes(process_cap),
              "xid": lambda: Xid(watcher) if watcher else None}
    unknown = enabled - set(makers)
    if unknown:
        raise ValueError(f"unknown metric families: {', '.join(sorted(unknown))}")
    return [f for name, make in makers.items() if name in enabled and (f := make()) is not None]


__all__ += ["Session", "XidWatcher"]
