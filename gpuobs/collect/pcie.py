"""PCIe: link generation and width (current vs max), byte counters and replays. Bytes come from
counter fields, never from the blocking 20 ms nvmlDeviceGetPcieThroughput."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx

LINK = [(c.PCIE_GENERATION, "nvmlDeviceGetCurrPcieLinkGeneration", N.nvmlDeviceGetCurrPcieLinkGeneration),
        (c.PCIE_MAX_GENERATION, "nvmlDeviceGetMaxPcieLinkGeneration", N.nvmlDeviceGetMaxPcieLinkGeneration),
        (c.PCIE_WIDTH, "nvmlDeviceGetCurrPcieLinkWidth", N.nvmlDeviceGetCurrPcieLinkWidth),
        (c.PCIE_MAX_WIDTH, "nvmlDeviceGetMaxPcieLinkWidth", N.nvmlDeviceGetMaxPcieLinkWidth)]


class Pcie(Family):
    name = "pcie"
    FIELDS = [FieldSpec(N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, c.PCIE_TX),
              FieldSpec(N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, c.PCIE_RX),
              FieldSpec(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, c.PCIE_REPLAYS)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        return self.FIELDS

    def collect(self, gpu: GpuCtx) -> None:
        if gpu.slow or "link" not in gpu.cache:  # link state changes rarely: slow samples only
            gpu.cache["link"] = [(metric, gpu.get(call, fn)) for metric, call, fn in LINK]
        for metric, value in gpu.cache["link"]:
            gpu.emit(metric, value)
