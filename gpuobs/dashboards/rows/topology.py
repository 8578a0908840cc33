"""Node dashboard, row "Topology": GPU pairs' NVLink and PCIe paths, NUMA nodes, CPU affinity (topology family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import m


def row(L: k.Layout) -> None:
    """Append the 'Topology' row and its panels to the Node dashboard's layout L."""
    L.row("Topology")
    L.add(k.table("GPU topology", [target(m(c.TOPOLOGY_NVLINK))], "short",
                  "Per pair of GPUs (nvidia-smi topo -m as a table): the NVLink links between them (0: none), the "
                  "closest path (nvlink, nvswitch, or the PCIe path) and the PCIe path itself: pcie_switch (PIX), "
                  "pcie_switches (PXB), host_bridge (PHB), numa_node (same socket), system (across sockets).",
                  hide=("cluster", "node", "uuid", "peer_uuid"), rename={"Value": "NVLink links"}), 16, 8)
    L.add(k.table("NUMA node and NVLink domain", [target(m(c.NUMA_NODE)), target(m(c.NVLINK_DOMAIN))], "short",
                  "Each GPU's NUMA node (CPU socket) and NVLink domain (the lowest GPU index it shares NVLink "
                  "with): a multi-GPU job wants GPUs of one domain, and its data loaders on their socket.",
                  merge=True, hide=("cluster", "node", "uuid"),
                  rename={"Value #A": "NUMA node", "Value #B": "NVLink domain"}), 8, 8)
    L.add(k.table("CPU affinity", [target(m(c.CPU_AFFINITY))], "short",
                  "The CPUs closest to each GPU: pin a GPU's data loaders there.",
                  hide=("cluster", "node", "uuid", "Value")), 24, 6)
