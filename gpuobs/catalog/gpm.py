"""The gpm family: GPU performance monitoring (profiling) ratios, Hopper and newer."""

from __future__ import annotations

from ..nvml import pynvml as N
from .metric import Metric, _m, detail

# (metric, nvmlGpmMetricId_t, DCGM profiling field); gpuobs.nvml backfills the ids older pynvml lacks
_GPM = [("sm_active", N.NVML_GPM_METRIC_SM_UTIL, "DCGM_FI_PROF_SM_ACTIVE", "Fraction of SMs busy."),
        ("sm_occupancy", N.NVML_GPM_METRIC_SM_OCCUPANCY, "DCGM_FI_PROF_SM_OCCUPANCY",
         "Resident warps over the SMs' maximum."),
        ("tensor_active", N.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
         "Fraction of cycles any tensor pipe was active."),
        ("dram_active", N.NVML_GPM_METRIC_DRAM_BW_UTIL, "DCGM_FI_PROF_DRAM_ACTIVE",
         "Fraction of peak DRAM bandwidth used."),
        ("fp64_active", N.NVML_GPM_METRIC_FP64_UTIL, "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
         "Fraction of cycles the FP64 pipe was active."),
        ("fp32_active", N.NVML_GPM_METRIC_FP32_UTIL, "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
         "Fraction of cycles the FP32 pipe was active."),
        ("fp16_active", N.NVML_GPM_METRIC_FP16_UTIL, "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
         "Fraction of cycles the FP16 pipe was active."),
        ("graphics_active", N.NVML_GPM_METRIC_GRAPHICS_UTIL, "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
         "Fraction of time the graphics engine was active.")]
GPM_METRICS: dict[int, Metric] = {
    gid: _m(f"gpu_{name}_ratio", "gauge", "ratio", help, "gpm",
            f"nvmlGpmMetricsGet metric {gid} (percent) / 100 over two nvmlGpmSampleGet samples",
            dcgm={(): dcgm}, max_value=1.0)
    for name, gid, dcgm, help in _GPM}

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(*(m for gid, m in GPM_METRICS.items()
         if gid not in (N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_ANY_TENSOR_UTIL)))
