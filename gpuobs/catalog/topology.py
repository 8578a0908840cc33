"""The topology family: GPU pairs and their paths, NUMA node, NVLink domain, CPU affinity."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, detail

# One series per ordered pair of GPUs on a node: n * (n - 1), 56 on an 8-GPU node, read at probe.
# link_type: the closest path between the two (nvlink: NVLink links straight to the peer, an NVLink
# bridge or mesh; nvswitch: through NVSwitches; else the PCIe path); pcie_path: the PCIe common
# ancestor (nvmlGpuTopologyLevel_t) whatever the NVLink path, as `nvidia-smi topo -m` names them.
TOPOLOGY_PCIE_PATHS = {0: "internal", 10: "pcie_switch", 20: "pcie_switches", 30: "host_bridge", 40: "numa_node",
                       50: "system"}  # NVML_TOPOLOGY_INTERNAL/SINGLE/MULTIPLE/HOSTBRIDGE/NODE/SYSTEM
TOPOLOGY_NVLINK = _m("gpu_topology_nvlink_links", "gauge", "", "NVLink links between this GPU and the peer GPU "
                     "(through NVSwitches: all of this GPU's active switch links, as nvidia-smi topo -m prints "
                     "NV18); 0 when the pair has no NVLink path. link_type is the closest path (nvlink, "
                     "nvswitch, or the PCIe path), pcie_path the PCIe common ancestor: internal, pcie_switch "
                     "(PIX), pcie_switches (PXB), host_bridge (PHB), numa_node (NODE: same socket), system "
                     "(SYS: across sockets).", "topology",
                     "nvmlDeviceGetP2PStatus(NVML_P2P_CAPS_INDEX_NVLINK), nvmlDeviceGetNvLinkState/"
                     "RemoteDeviceType/RemotePciInfo_v2 per link, nvmlDeviceGetTopologyCommonAncestor",
                     labels=GPU_LABELS + ("peer_gpu", "peer_uuid", "link_type", "pcie_path"), max_value=64)
NUMA_NODE = _m("gpu_numa_node", "gauge", "", "NUMA node the GPU is attached to (its CPU socket on most "
               "servers); absent where the system has no NUMA information.", "topology", "nvmlDeviceGetNumaNodeId")
NVLINK_DOMAIN = _m("gpu_topology_nvlink_domain", "gauge", "", "Lowest NVML index among this GPU and the GPUs of "
                   "the node it reaches over NVLink (straight or through NVSwitches): GPUs with the same value "
                   "share NVLink (on NVSwitch systems every GPU, with NVLink bridges each bridged set); a GPU "
                   "without NVLink peers has its own index.", "topology",
                   "the pairs of gpuobs_gpu_topology_nvlink_links with links > 0", max_value=1024)
CPU_AFFINITY = _m("gpu_cpu_affinity", "info", "", "The CPUs closest to the GPU (ideal CPU affinity), as a "
                  "CPU list such as 0-55,112-167 in the cpus label.", "topology",
                  "nvmlDeviceGetCpuAffinity (a bitmask of 64-bit words)", labels=GPU_LABELS + ("cpus",))

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(TOPOLOGY_NVLINK, CPU_AFFINITY)
