"""ECC: mode, error counters (corrected/uncorrected x volatile/aggregate), retired pages and
remapped rows, all counters from one batched field-values call."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from dataclasses import dataclass
from typing import Any

from .base import Family, FieldSpec, GpuCtx, register


@dataclass
class EccState:
    mode: Any = None  # last nvmlDeviceGetEccMode answer: (current, pending), None when failed
    read: bool = False  # mode read at least once


@register("ecc")
class Ecc(Family):
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
        return self.FIELDS

    def collect(self, gpu: GpuCtx) -> None:
        st = self.state(gpu)
        if gpu.slow or not st.read:  # the mode changes only with a reboot after nvidia-smi -e
            st.mode, st.read = gpu.get(N.nvmlDeviceGetEccMode), True
        gpu.emit(c.ECC_MODE, st.mode[0] if st.mode else None)
