"""Records of XID and uncorrected ECC errors, per cluster."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CLUSTER,
                   UNCORRECTED,
                   Record,
)

# ---------------------------------------------------------------------------------------- errors
# a series born within the window (its first XID) counts with its value: increase() misses it
CLUSTER_XID_ERRORS = Record(
    ("cluster", "xid"), c.XID_ERRORS, "increase",
    lambda t: f"sum by (cluster, xid) (increase({c.XID_ERRORS.exposed_name}[{t.long_window}]) or "
              f"({c.XID_ERRORS.exposed_name} unless {c.XID_ERRORS.exposed_name} offset {t.long_window}))")
CLUSTER_ECC_UNCORRECTED = Record(
    CLUSTER, "gpuobs_gpu_ecc_uncorrected", "increase",
    lambda t: f"sum by (cluster) (increase({c.ECC_ERRORS.exposed_name}{UNCORRECTED}[{t.long_window}]))")
