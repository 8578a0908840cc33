"""Collectors, one module per metric family, and the sampling loop that runs them.

Each family registers itself next to its class (`@register` in .base: name, default on or off,
the families whose state it uses, whether it needs the XID watcher); `REGISTRY` is the one list
of families, which the CLI, the exporter's configuration and the docs read. The modules are
imported below in the order the families run in a pass and are listed (a family's `uses` must
come before it; register() checks).
"""

from __future__ import annotations

from ..nvml import Session

# isort: off
from . import identity, utilization, gpm, memory, power, thermal, clocks, clock_events, ecc, pcie  # noqa: F401
from . import nvlink, fabric, topology, mig, processes, xid  # noqa: F401
# isort: on
from .base import REGISTRY, Family, FamilySpec, Needs, Sample, Snapshot
from .kernel_log import KernelLogWatcher
from .sampler import Sampler
from .xid import XidWatcher

__all__ = ["REGISTRY", "Family", "FamilySpec", "KernelLogWatcher", "Sample", "Sampler", "Session", "Snapshot",
           "XidWatcher", "build_families", "default_families", "needs_watcher"]


def default_families() -> set[str]:
    """The families collected when the operator names none (FamilySpec.default)."""
    return {name for name, spec in REGISTRY.items() if spec.default}


def needs_watcher(enabled: set[str]) -> bool:
    """True when one of the enabled families needs an XidWatcher."""
    return any(REGISTRY[name].needs_watcher for name in enabled if name in REGISTRY)


def build_families(enabled: set[str], *, process_cap: int, watcher: XidWatcher | None = None,
                   kernel_log: KernelLogWatcher | None = None) -> list[Family]:
    """Instances of the enabled families, in registry order, each built with the enabled families
    it uses (FamilySpec.uses). A family that needs a watcher (the XID watcher, the kernel-log
    watcher) is left out without one. Raises ValueError for a name not in REGISTRY."""
    unknown = enabled - set(REGISTRY)
    if unknown:
        raise ValueError(f"unknown metric families: {', '.join(sorted(unknown))}")
    built: dict[str, Family] = {}
    for name, spec in REGISTRY.items():
        if name in enabled:
            family = spec.cls.build(Needs(built=dict(built), watcher=watcher, kernel_log=kernel_log,
                                          process_cap=process_cap))
            if family is not None:
                built[name] = family
    return list(built.values())
