"""Records of NVLink and PCIe traffic, replays, errors and links down, per node."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   NODE,
                   aggregate,
                   rate_of,
)

# ------------------------------------------------------------------------------------ interconnects
# Per node, so the fleet dashboard's node filter still applies; NVLink from the per-GPU totals over
# the GPU's links, which the default profile serves (the per-link series are detail).
NODE_NVLINK_TX = rate_of(NODE, c.NVLINKS_TX)
NODE_NVLINK_RX = rate_of(NODE, c.NVLINKS_RX)
NODE_PCIE_TX = rate_of(NODE, c.PCIE_TX)
NODE_PCIE_RX = rate_of(NODE, c.PCIE_RX)
NODE_PCIE_REPLAYS = rate_of(NODE, c.PCIE_REPLAYS)
NODE_NVLINK_ERRORS = rate_of(NODE, c.NVLINKS_ERRORS)
NODE_NVLINK_LINKS_DOWN = aggregate("sum", NODE, c.NVLINKS_DOWN)
