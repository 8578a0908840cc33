"""Node dashboard, row "NVLink": throughput, errors and link states (nvlink family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import rate, target
from .selectors import BAD, GPU, m


def row(L: k.Layout) -> None:
    """Append the 'NVLink' row and its panels to the Node dashboard's layout L."""
    L.row("NVLink")
    L.add(k.timeseries("NVLink throughput", [
        target(f"sum by (gpu) ({rate(m(c.NVLINKS_TX))})", GPU + " transmit"),
        target(f"sum by (gpu) ({rate(m(c.NVLINKS_RX))})", GPU + " receive")], "Bps",
        "Data bytes per second over all of a GPU's links.", min=0), 8, 8)
    L.add(k.timeseries("NVLink errors", [target(
        f"sum by (gpu) ({rate(m(c.NVLINKS_ERRORS))})", GPU)], "cps",
        "Data-link errors per second over all of a GPU's links: CRC, replay, recovery.", min=0), 8, 8)
    L.add(k.state_timeline("NVLink links down", [target(f"sum by (gpu) ({m(c.NVLINKS_DOWN)})", GPU)], "short",
                           "Inactive links per GPU (GPUs with NVLink only).", thresholds=BAD), 8, 8)
    L.add(k.timeseries("NVLink errors by link", [target(
        f"topk(10, sum by (gpu, link, error_type) ({rate(m(c.NVLINK_ERRORS))}))",
        GPU + " link {{link}} {{error_type}}")],
        "cps", "The ten links with the most errors, by kind (CRC, replay, recovery).", min=0), 8, 8)
    L.add(k.timeseries("NVLink throughput by link", [target(
        f"topk(10, sum by (gpu, link) ({rate(m(c.NVLINK_TX))} + {rate(m(c.NVLINK_RX))}))", GPU + " link {{link}}")],
        "Bps", "The ten busiest links: data bytes per second sent plus received.", min=0), 8, 8)
    L.add(k.table("NVLink link states", [target(m(c.NVLINK_UP))], "short",
                  "Each link's state: 1 active, 0 down.", hide=("cluster", "node", "uuid"),
                  rename={"Value": "up"}), 8, 8)
