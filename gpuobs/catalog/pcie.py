"""The pcie family: the PCIe link, its traffic and replays."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, detail

PCIE_GENERATION = _m("gpu_pcie_link_generation", "gauge", "", "PCIe link generation in use now.", "pcie",
                     "nvmlDeviceGetCurrPcieLinkGeneration", dcgm={(): "DCGM_FI_DEV_PCIE_LINK_GEN"})
PCIE_MAX_GENERATION = _m("gpu_pcie_link_generation_max", "gauge", "", "Highest PCIe generation the link supports.",
                         "pcie", "nvmlDeviceGetMaxPcieLinkGeneration", dcgm={(): "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"})
PCIE_WIDTH = _m("gpu_pcie_link_width", "gauge", "", "PCIe lanes in use now.", "pcie",
                "nvmlDeviceGetCurrPcieLinkWidth", dcgm={(): "DCGM_FI_DEV_PCIE_LINK_WIDTH"})
PCIE_MAX_WIDTH = _m("gpu_pcie_link_width_max", "gauge", "", "Most PCIe lanes the link supports.", "pcie",
                    "nvmlDeviceGetMaxPcieLinkWidth", dcgm={(): "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"})
PCIE_TX = _m("gpu_pcie_transmit_bytes", "counter", "bytes", "Bytes the GPU sent over PCIe.", "pcie",
             "NVML_FI_DEV_PCIE_COUNT_TX_BYTES")
PCIE_RX = _m("gpu_pcie_receive_bytes", "counter", "bytes", "Bytes the GPU received over PCIe.", "pcie",
             "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
PCIE_THROUGHPUT = _m("gpu_pcie_throughput_bytes_per_second", "gauge", "bytes_per_second",
                     "PCIe bytes per second between the last two passes, by direction (transmit, receive).",
                     "pcie", "NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES: increase between passes / time between them",
                     labels=GPU_LABELS + ("direction",),
                     dcgm={("transmit",): "DCGM_FI_PROF_PCIE_TX_BYTES", ("receive",): "DCGM_FI_PROF_PCIE_RX_BYTES"})
PCIE_REPLAYS = _m("gpu_pcie_replays", "counter", "", "PCIe replays (link-level retransmissions).", "pcie",
                  "NVML_FI_DEV_PCIE_REPLAY_COUNTER", dcgm={(): "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"})

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(PCIE_THROUGHPUT)
