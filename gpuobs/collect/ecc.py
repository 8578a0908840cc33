"""ECC: mode (current and pending), error counters (corrected/uncorrected x volatile/aggregate),
retired pages and remapped rows, all from one batched field-values call; the errors per memory
location (SRAM, DRAM) and the remapped-row bank histogram, a breakdown of those totals, when the
totals change (on slow samples where the batch lacks them); the mode on slow samples."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx, register

# nvmlDeviceGetMemoryErrorCounter arguments per label: location, error type, counter type
LOCATIONS = {"sram": N.NVML_MEMORY_LOCATION_SRAM, "dram": N.NVML_MEMORY_LOCATION_DRAM}
ERROR_TYPES = {"corrected": N.NVML_MEMORY_ERROR_TYPE_CORRECTED, "uncorrected": N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
COUNTERS = {"volatile": N.NVML_VOLATILE_ECC, "aggregate": N.NVML_AGGREGATE_ECC}


@dataclass
class EccState:
    """Per-GPU ECC readings kept between passes: the mode (current, pending), the per-location counters
    and the row-remapper bank histogram, and the batched totals they were read with."""
    mode: Any = None  # last nvmlDeviceGetEccMode answer: (current, pending), None when failed
    read: bool = False  # mode, location counters and bank histogram read at least once
    locations: dict[tuple[str, str, str], int | None] = field(default_factory=dict)  # labels -> last count
    banks: Any = None  # last nvmlDeviceGetRowRemapperHistogram answer, None when failed
    totals: tuple[float | None, ...] | None = None  # the batched totals the breakdown was last read with


@register("ecc")
class Ecc(Family):
    """ECC mode, error counters (volatile and aggregate, corrected and uncorrected), retired pages and
    remapped rows from the field-values batch; the per-location breakdown and the bank histogram only when
    those totals move."""
    State = EccState
    FIELDS = [FieldSpec(N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, c.ECC_ERRORS, extra=("corrected", "volatile")),
              FieldSpec(N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, c.ECC_ERRORS, extra=("uncorrected", "volatile")),
              FieldSpec(N.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, c.ECC_ERRORS, extra=("corrected", "aggregate")),
              FieldSpec(N.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, c.ECC_ERRORS, extra=("uncorrected", "aggregate")),
              FieldSpec(N.NVML_FI_DEV_RETIRED_SBE, c.RETIRED_PAGES, extra=("single_bit_ecc",)),
              FieldSpec(N.NVML_FI_DEV_RETIRED_DBE, c.RETIRED_PAGES, extra=("double_bit_ecc",)),
              FieldSpec(N.NVML_FI_DEV_RETIRED_PENDING, c.RETIRED_PAGES_PENDING),
              FieldSpec(N.NVML_FI_DEV_REMAPPED_COR, c.REMAPPED_ROWS, extra=("correctable",)),
              FieldSpec(N.NVML_FI_DEV_REMAPPED_UNC, c.REMAPPED_ROWS, extra=("uncorrectable",)),
              FieldSpec(N.NVML_FI_DEV_REMAPPED_PENDING, c.REMAP_PENDING),
              FieldSpec(N.NVML_FI_DEV_REMAPPED_FAILURE, c.REMAP_FAILURE)]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        """The ECC totals, retired-page and remapped-row counts and their pending flags (the same on every GPU;
        a GPU without ECC answers NOT_SUPPORTED once, remembered by gpuobs.nvml)."""
        return self.FIELDS

    def probe(self, gpu: GpuCtx) -> None:
        """Marks the breakdown unread, so that collect() reads it again after a re-probe."""
        self.state(gpu).read = False  # capabilities are asked again: so is the breakdown

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.ECC_MODE and c.ECC_PENDING (nvmlDeviceGetEccMode, slow samples), the per-location counts
        (nvmlDeviceGetMemoryErrorCounter, detail) and c.REMAP_BANKS by availability
        (nvmlDeviceGetRowRemapperHistogram) from the last read of each."""
        st = self.state(gpu)
        # The mode changes only with a reboot after nvidia-smi -e: slow samples. The per-location
        # counters and the bank histogram are a breakdown of the batched totals (errors, remapped
        # rows): they cannot move while the totals do not.
        if gpu.slow or not st.read:
            st.mode = gpu.get(N.nvmlDeviceGetEccMode)
        totals = tuple(gpu.fields.get((spec.field_id, 0)) for spec in self.FIELDS)  # None: not given
        if not st.read or totals != st.totals or (gpu.slow and not any(v is not None for v in totals)):
            st.read, st.totals = True, totals
            # named per location: a GPU may count DRAM errors but not SRAM ones (answered once, remembered)
            st.locations = {labels: gpu.get(N.nvmlDeviceGetMemoryErrorCounter, ERROR_TYPES[labels[1]],
                                            COUNTERS[labels[2]], LOCATIONS[labels[0]],
                                            name=f"nvmlDeviceGetMemoryErrorCounter:{labels[0]}")
                            for labels in itertools.product(LOCATIONS, ERROR_TYPES, COUNTERS)
                            if gpu.serves(c.ECC_LOCATION_ERRORS)}  # detail: no call by default
            st.banks = gpu.get(N.nvmlDeviceGetRowRemapperHistogram)
        gpu.emit(c.ECC_MODE, st.mode[0] if st.mode else None)
        gpu.emit(c.ECC_PENDING, st.mode[1] if st.mode else None)
        for labels, count in st.locations.items():
            gpu.emit(c.ECC_LOCATION_ERRORS, count, *labels)
        if st.banks is not None:
            for availability in c.REMAP_AVAILABILITY:
                gpu.emit(c.REMAP_BANKS, getattr(st.banks, availability), availability)
