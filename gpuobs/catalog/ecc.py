"""The ecc family: ECC errors, page retirement and DRAM row remapping."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, default_values, detail

ECC_MODE = _m("gpu_ecc_enabled", "gauge", "", "1 if ECC is enabled now.", "ecc", "nvmlDeviceGetEccMode current")
ECC_ERRORS = _m("gpu_ecc_errors", "counter", "", "ECC errors in device memory.", "ecc",
                "NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL", labels=GPU_LABELS + ("error_type", "counter_type"),
                dcgm={("corrected", "volatile"): "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                      ("uncorrected", "volatile"): "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                      ("corrected", "aggregate"): "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
                      ("uncorrected", "aggregate"): "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"})
RETIRED_PAGES = _m("gpu_retired_pages", "counter", "", "Memory pages retired (pre-Ampere page retirement).", "ecc",
                   "NVML_FI_DEV_RETIRED_SBE / NVML_FI_DEV_RETIRED_DBE", labels=GPU_LABELS + ("cause",),
                   dcgm={("single_bit_ecc",): "DCGM_FI_DEV_RETIRED_SBE",
                         ("double_bit_ecc",): "DCGM_FI_DEV_RETIRED_DBE"})
RETIRED_PAGES_PENDING = _m("gpu_retired_pages_pending", "gauge", "", "1 if a page retirement waits for a reset.",
                           "ecc", "NVML_FI_DEV_RETIRED_PENDING", dcgm={(): "DCGM_FI_DEV_RETIRED_PENDING"})
REMAPPED_ROWS = _m("gpu_remapped_rows", "counter", "", "DRAM rows remapped after ECC errors.", "ecc",
                   "NVML_FI_DEV_REMAPPED_COR / NVML_FI_DEV_REMAPPED_UNC", labels=GPU_LABELS + ("error_type",),
                   dcgm={("correctable",): "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                         ("uncorrectable",): "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"})
REMAP_PENDING = _m("gpu_row_remap_pending", "gauge", "", "1 if a row remap waits for a GPU reset.", "ecc",
                   "NVML_FI_DEV_REMAPPED_PENDING", dcgm={(): "DCGM_FI_DEV_ROW_REMAP_PENDING"})
REMAP_FAILURE = _m("gpu_row_remap_failure", "gauge", "", "1 if a row remap failed (the GPU needs service).", "ecc",
                   "NVML_FI_DEV_REMAPPED_FAILURE", dcgm={(): "DCGM_FI_DEV_ROW_REMAP_FAILURE"})
ECC_PENDING = _m("gpu_ecc_pending_enabled", "gauge", "", "1 if ECC will be enabled after the next reboot "
                 "(differs from gpuobs_gpu_ecc_enabled while a change waits).", "ecc",
                 "nvmlDeviceGetEccMode pending", dcgm={(): "DCGM_FI_DEV_ECC_PENDING"}, max_value=1)
ECC_LOCATIONS = ("sram", "dram")  # NVML_MEMORY_LOCATION_SRAM, NVML_MEMORY_LOCATION_DRAM
ECC_LOCATION_ERRORS = _m("gpu_ecc_location_errors", "counter", "", "ECC errors by memory location: on-chip SRAM "
                         "(caches, register files) or DRAM (device memory); refreshed every few passes.", "ecc",
                         "nvmlDeviceGetMemoryErrorCounter(NVML_MEMORY_ERROR_TYPE_{CORRECTED,UNCORRECTED}, "
                         "NVML_{VOLATILE,AGGREGATE}_ECC, NVML_MEMORY_LOCATION_{SRAM,DRAM})",
                         labels=GPU_LABELS + ("location", "error_type", "counter_type"),
                         dcgm={(loc, kind, counter): f"DCGM_FI_DEV_ECC_{bit}_{cnt}_{dcgm_loc}"
                               for loc, dcgm_loc in (("sram", "SRM"), ("dram", "DEV"))
                               for kind, bit in (("corrected", "SBE"), ("uncorrected", "DBE"))
                               for counter, cnt in (("volatile", "VOL"), ("aggregate", "AGG"))})
REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")  # nvmlRowRemapperHistogramValues_t fields
REMAP_BANKS = _m("gpu_row_remap_banks", "gauge", "", "Memory banks by how many spare rows they have left for "
                 "remapping: max, high, partial, low, none (banks with none cannot remap another row).", "ecc",
                 "nvmlDeviceGetRowRemapperHistogram .max/.high/.partial/.low/.none",
                 labels=GPU_LABELS + ("availability",),
                 dcgm={(a,): f"DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_{a.upper()}" for a in REMAP_AVAILABILITY})

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY); of a default_values metric the default profile serves only those label values
detail(ECC_MODE, ECC_PENDING, ECC_LOCATION_ERRORS, REMAPPED_ROWS)
default_values(ECC_ERRORS, "counter_type", {"volatile"})
default_values(REMAP_BANKS, "availability", {"low", "none"})
