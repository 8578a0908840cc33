"""Records of placement (the topology family): GPUs held, NVLink domains and NUMA nodes per pod and
per Slurm job."""

from __future__ import annotations

from .. import catalog as c
from .base import (
    NODE,
    Record,
    _by,
)

# ------------------------------------------------------------------------ placement (topology family)
# Per pod (Kubernetes attribution) and per Slurm job: GPUs held, the NVLink domains its GPUs span on
# one node (1 for a pod whose GPUs all share NVLink, so a good placement is a value too; a Slurm job's
# worst node) and the NUMA nodes (CPU sockets) its GPUs span. The domain of a GPU is the lowest index
# it shares NVLink with (gpuobs_gpu_topology_nvlink_domain): one series per GPU, where the GPU pairs
# are n - 1 per GPU and detail.
POD = ("cluster", "node", "k8s_namespace", "k8s_pod")
HPC_JOB = ("cluster", "hpc_job")


def _held(by: tuple[str, ...]) -> str:
    return f'count by ({_by(by)}) ({c.GPU_INFO.exposed_name}{{{by[-1]}!=""}})'


def _nvlink_domains(by: tuple[str, ...]) -> str:
    per_node = by if "node" in by else by + ("node",)  # domain 0 of two hosts is two domains, never shared
    per_node_count = (f'count by ({_by(per_node)}) (count_values by ({_by(per_node)}) ("domain", '
                      f'{c.NVLINK_DOMAIN.name}{{{by[-1]}!=""}}))')
    return per_node_count if per_node == by else f"max by ({_by(by)}) ({per_node_count})"


def _numa_nodes(by: tuple[str, ...]) -> str:
    per_node = by if "node" in by else by + ("node",)  # NUMA node 0 of two hosts is two sockets
    return (f'count by ({_by(by)}) (count_values by ({_by(per_node)}) ("numa_node", '
            f'{c.NUMA_NODE.name}{{{by[-1]}!=""}}))')


# GPUs in the node's largest NVLink domain: > 1 when the node has NVLink between some GPUs
NODE_NVLINK_DOMAIN_MAX = Record(NODE, "gpuobs_gpu_nvlink_domain_gpus", "max",
                                lambda t: f'max by ({_by(NODE)}) (count_values by ({_by(NODE)}) ("domain", '
                                          f'{c.NVLINK_DOMAIN.name}))')
POD_NVLINK_DOMAINS = Record(POD, "gpuobs_gpu_nvlink_domains", "count", lambda t: _nvlink_domains(POD))
POD_NUMA_NODES = Record(POD, "gpuobs_gpu_numa_nodes", "count", lambda t: _numa_nodes(POD))
JOB_NVLINK_DOMAINS = Record(HPC_JOB, "gpuobs_gpu_nvlink_domains", "max", lambda t: _nvlink_domains(HPC_JOB))
