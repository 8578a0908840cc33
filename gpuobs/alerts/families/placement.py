"""Alerts of the topology family: where multi-GPU workloads landed on a node's GPU topology."""

from __future__ import annotations

from ... import records
from ..common import Alert, Thresholds


def placement(t: Thresholds) -> list[Alert]:
    """Where multi-GPU workloads landed on a node's GPU topology (the topology family)."""
    return [
        Alert(name="GpuPodPlacementWithoutNvlink",
              # only on nodes with NVLink at all: on a PCIe-only node no placement is better
              expr=f"({records.POD_NVLINK_DOMAINS.name} > 1) "
                   f"and on (cluster, node) ({records.NODE_NVLINK_DOMAIN_MAX.name} > 1)",
              for_=t.for_medium, severity="warning", scope="node", family="placement",
              summary="A multi-GPU pod got GPUs without NVLink between them.",
              description="Pod {{ $labels.k8s_namespace }}/{{ $labels.k8s_pod }} on {{ $labels.node }} holds GPUs "
                          "of {{ $value }} NVLink domains, on a node where other GPUs share NVLink: its "
                          "GPU-to-GPU traffic between them crosses PCIe or the CPU interconnect."),
    ]
