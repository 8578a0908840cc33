"""Node dashboard, row "PCIe": throughput, replays and link state (pcie family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import rate, target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'PCIe' row and its panels to the Node dashboard's layout L."""
    L.row("PCIe")
    L.add(k.timeseries("PCIe throughput", [target(rate(m(c.PCIE_TX)), GPU + " transmit"),
                                           target(rate(m(c.PCIE_RX)), GPU + " receive")], "Bps",
                       "Bytes per second over PCIe.", min=0), 8, 8)
    L.add(k.timeseries("PCIe replays", [target(rate(m(c.PCIE_REPLAYS)), GPU)], "cps",
                       "Link-level retransmissions per second.", min=0), 8, 8)
    L.add(k.timeseries("PCIe and NVLink throughput per pass", [
        target(m(c.PCIE_THROUGHPUT), GPU + " PCIe {{direction}}"), target(m(c.NVLINK_THROUGHPUT), GPU + " NVLink")],
        "Bps", "Bytes per second between the exporter's last two passes (what DCGM's PCIe and NVLink bandwidth "
        "fields show); NVLink is sent plus received over all links.", min=0), 24, 7)
    L.add(k.table("PCIe link", [target(m(c.PCIE_GENERATION)), target(m(c.PCIE_MAX_GENERATION)),
                                target(m(c.PCIE_WIDTH)), target(m(c.PCIE_MAX_WIDTH))], "short",
                  "Generation and width now and at most. Idle GPUs downshift to save power.", merge=True,
                  hide=("cluster", "node", "uuid"),
                  rename={"Value #A": "generation", "Value #B": "max generation", "Value #C": "width",
                          "Value #D": "max width"}), 8, 8)
