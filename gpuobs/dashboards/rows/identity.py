"""Node dashboard, row "GPUs": how many answer NVML, their identity, health and modes (identity
family, with the exporter's expected-GPU count and NVML status)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import sel, target
from .selectors import GPU, C, N, m

UP_MAP = [{"type": "value", "options": {"0": {"text": "lost", "color": "red", "index": 0},
                                        "1": {"text": "up", "color": "green", "index": 1}}}]


def row(L: k.Layout) -> None:
    """Append the 'GPUs' row and its panels to the Node dashboard's layout L."""
    L.row("GPUs")
    L.add(k.stat("GPUs up", [target(f"sum({sel(c.GPU_UP, C, N)})")], "short", "GPUs answering NVML."), 3, 4)
    L.add(k.stat("GPUs expected", [target(f"sum({sel(c.GPUS_EXPECTED, C, N)})")], "short",
                 "GPUs this node should have."), 3, 4)
    L.add(k.stat("NVML up", [target(f"min({sel(c.NVML_UP, C, N)})")], "short", "1 if NVML answers.",
                 thresholds=k.UP_THRESHOLDS, graph=False), 3, 4)
    L.add(k.stat("Power draw", [target(f"sum({m(c.POWER_USAGE)})")], "watt", "Board power of the node's GPUs."),
          3, 4)
    L.add(k.state_timeline("GPU up", [target(m(c.GPU_UP), GPU)], "short",
                           "Up: answered NVML in the last pass. Down: lost, needs a reset, hung or unreadable "
                           "(see GPUs unhealthy); its other series stop.",
                           thresholds=k.UP_THRESHOLDS,
                           mappings=UP_MAP), 12, 4)
    L.add(k.table("GPU identity", [target(m(c.GPU_INFO))], "short",
                  "Name, UUID, PCI bus, serial, VBIOS, driver, CUDA and architecture of each GPU.",
                  hide=("Value", "cluster", "node")), 18, 6)
    L.add(k.table("GPUs unhealthy", [target(f"{m(c.GPU_UNHEALTHY)} == 1")], "short",
                  "Why a GPU reads down: lost (off the bus), reset_required, timeout (its NVML calls hang or are "
                  "slow) or unreadable. Empty while every GPU is healthy.",
                  hide=("Value", "cluster", "node", "instance", "job")), 6, 6)
    L.add(k.table("GPU modes", [target(m(c.PERSISTENCE_MODE)), target(f"{m(c.COMPUTE_MODE)} == 1"),
                                target(m(c.ECC_PENDING)), target(m(c.MIG_PENDING))], "short",
                  "Persistence mode, compute mode, and the ECC and MIG modes pending for the next reset (a pending "
                  "mode that differs from the current one takes effect then).", merge=True,
                  hide=("cluster", "node", "uuid", "Value #B"),
                  rename={"Value #A": "persistence", "Value #C": "ECC pending", "Value #D": "MIG pending"}), 24, 6)
