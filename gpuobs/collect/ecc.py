"""ECC: mode, error counters (corrected/uncorrected x volatile/aggregate), retired pages and
remapped rows, all counters from one batched field-values call."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx


class Ecc(Family):
    name = "ecc"
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
        if gpu.slow or "mode" not in gpu.cache:
            gpu.cache["mode"] = gpu.get("nvmlDeviceGetEccMode", N.nvmlDeviceGetEccMode)
        mode = gpu.cache["mode"]
        gpu.emit(c.ECC_MODE, mode[0] if mode else None)
