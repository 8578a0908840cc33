"""Node: every exporter metric family of one node, per GPU, plus its MIG devices, its processes and
the jobs and models running on it (linked to their dashboards).

Each row is built by its family's module in gpuobs/dashboards/rows/ (ROWS, in dashboard order): a
panel for a metric is added in its family's module, not here."""

from __future__ import annotations

from .. import catalog as c
from . import common as k
from .common import sel
from .rows import (
    clocks,
    ecc,
    fabric,
    gpm,
    identity,
    memory,
    mig,
    nvlink,
    pcie,
    power,
    processes,
    thermal,
    topology,
    utilization,
    workloads,
    xid,
)
from .rows.selectors import C, N

ROWS = [identity, workloads, utilization, gpm, memory, power, thermal, clocks, ecc, pcie, nvlink, fabric,
        topology, mig, processes, xid]


def build():
    """The Node dashboard: the rows of ROWS in order, variables cluster, node (one) and gpu, and links
    to the other dashboards."""
    L = k.Layout()
    for family in ROWS:
        family.row(L)
    variables = [
        k.variable("cluster", f"label_values({c.GPUS_EXPECTED.name}, cluster)", "Cluster"),
        k.variable("node", f"label_values({c.GPUS_EXPECTED.name}{{{C}}}, node)", "Node", multi=False),
        k.variable("gpu", f"label_values({sel(c.GPU_INFO, C, N)}, gpu)", "GPU"),
    ]
    links = [k.dashboard_link("Fleet overview", "fleet"), k.dashboard_link("Training job", "training"),
             k.dashboard_link("Inference service", "inference"), k.dashboard_link("Exporter health", "exporter")]
    return k.dashboard("gpuobs / Node", "node",
                       "Every metric family of one node's GPUs: utilization, profiling, memory, power, thermal, "
                       "clocks and throttling, ECC, PCIe, NVLink, MIG, processes and XID errors.",
                       L, variables, links)
