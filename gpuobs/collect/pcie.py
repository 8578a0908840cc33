"""PCIe: link generation and width (current vs max), byte counters, their rate between passes and
replays. Bytes come from counter fields, never from the blocking 20 ms nvmlDeviceGetPcieThroughput."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx, Rate, register

LINK = [(c.PCIE_GENERATION, N.nvmlDeviceGetCurrPcieLinkGeneration),
        (c.PCIE_WIDTH, N.nvmlDeviceGetCurrPcieLinkWidth)]
MAXIMA = [(c.PCIE_MAX_GENERATION, N.nvmlDeviceGetMaxPcieLinkGeneration),  # what GPU and slot can do: fixed
          (c.PCIE_MAX_WIDTH, N.nvmlDeviceGetMaxPcieLinkWidth)]

DIRECTIONS = {"transmit": N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "receive": N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}


@dataclass
class PcieState:
    """Per-GPU PCIe state: the last link generation and width read, the probed maxima, and one Rate per
    direction for the throughput."""
    link: list[tuple[c.Metric, int | None]] = field(default_factory=list)  # last link state read
    maxima: list[tuple[c.Metric, int | None]] = field(default_factory=list)  # probed
    rates: dict[str, Rate] = field(default_factory=lambda: {d: Rate() for d in DIRECTIONS})


@register("pcie")
class Pcie(Family):
    """PCIe link (current and maximum generation and width), byte and replay counters from the batch, and
    the throughput per direction computed between passes."""
    State = PcieState
    FIELDS = [FieldSpec(N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, c.PCIE_TX),
              FieldSpec(N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, c.PCIE_RX),
              FieldSpec(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, c.PCIE_REPLAYS)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        """The TX and RX byte counters and the replay counter (NVML_FI_DEV_PCIE_*), the same on every GPU."""
        return self.FIELDS

    def probe(self, gpu: GpuCtx) -> None:
        """Reads the link's maximum generation and width (fixed for the GPU's life; None where not answered)."""
        self.state(gpu).maxima = [(metric, gpu.get(fn)) for metric, fn in MAXIMA]

    def collect(self, gpu: GpuCtx) -> None:
        """Emits the link state (read on slow samples, or again after a failed read), the maxima (probed again
        while one is missing) and c.PCIE_THROUGHPUT per direction in bytes/s from the batched counters."""
        st = self.state(gpu)
        # link state changes rarely: slow samples only, unless a read gave nothing (a failed or
        # timed-out call is read again next pass; NOT_SUPPORTED costs nothing: remembered by gpuobs.nvml)
        if gpu.slow or not st.link or any(value is None for _, value in st.link):
            st.link = [(metric, gpu.get(fn)) for metric, fn in LINK]
        if any(value is None for _, value in st.maxima):
            self.probe(gpu)  # a failed read is asked again next pass, as the link's
        for metric, value in st.link + st.maxima:
            gpu.emit(metric, value)
        now = time.monotonic()  # the counters were read just before, in this pass's field-values call
        for direction, fid in DIRECTIONS.items():
            gpu.emit(c.PCIE_THROUGHPUT, st.rates[direction].update(gpu.fields.get((fid, 0)), now), direction)
