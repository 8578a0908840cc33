"""Records of memory repairs (row remapping), degraded PCIe links and the per-GPU error-rate trends
the degradation alerts compare with their own past."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CORRECTED,
                   GPU,
                   NODE,
                   Record,
                   aggregate,
                   count_of,
                   pcie_below_max,
)

# ----------------------------------------------------------------------------------- memory repairs
NODE_REMAP_PENDING = aggregate("sum", NODE, c.REMAP_PENDING)
NODE_REMAP_FAILURE = aggregate("sum", NODE, c.REMAP_FAILURE)
NODE_PCIE_DEGRADED = count_of(NODE, "gpuobs_gpus_pcie_degraded", lambda t: pcie_below_max())
# ------------------------------------------------------------------------------ degradation trends
# Per GPU, the error rates over trend_step (an hour by default: corrected ECC errors come tens an hour,
# so rate_window's rates are 0 or 1 error and all noise) that the degradation alerts compare with their own earlier
# values, and the banks low on spare rows: every label of the series kept, so the alerts and the
# "GPUs most at risk" panel match them to the GPU.
GPU_ECC_CORRECTED_RATE = Record(GPU, c.ECC_ERRORS, "corrected_rate",
                                lambda t: f"rate({c.ECC_ERRORS.exposed_name}{CORRECTED}[{t.trend_step}])")
GPU_PCIE_REPLAYS_RATE = Record(GPU, c.PCIE_REPLAYS, "rate",
                               lambda t: f"rate({c.PCIE_REPLAYS.exposed_name}[{t.trend_step}])")
# Data-link errors of all of a GPU's links: one flaky link is the GPU's (or its baseboard's)
# problem, and a GPU's 18 links would make 18 trends to judge
GPU_NVLINK_ERRORS_RATE = Record(GPU, c.NVLINKS_ERRORS, "rate",
                                lambda t: f"rate({c.NVLINKS_ERRORS.exposed_name}[{t.trend_step}])")
GPU_REMAP_BANKS_LOW = Record(GPU, c.REMAP_BANKS, "low_or_none",
                             lambda t: f'sum without (availability) ({c.REMAP_BANKS.name}{{availability=~"low|none"}})')
