"""Records of XID and uncorrected ECC errors, per cluster."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CLUSTER,
                   UNCORRECTED,
                   Record,
)

# ---------------------------------------------------------------------------------------- errors


def new_first(sel: str, w: str) -> str:
    """The events a counter series counted within window w: its value if it is new within w (the
    exporter creates an XID counter at its first XID, at 1, and all it counts is within w), else
    increase() over w. The new-series term comes first: `or` keeps the left operand's series, and
    increase() of a new series is 0 from its second sample on (its first XID never counted), as the
    alert pack's _counted helper (gpuobs.alerts.rules) orders it."""
    return f"({sel} unless {sel} offset {w}) or increase({sel}[{w}])"


CLUSTER_XID_ERRORS = Record(
    ("cluster", "xid"), c.XID_ERRORS, "increase",
    lambda t: f"sum by (cluster, xid) ({new_first(c.XID_ERRORS.exposed_name, t.long_window)})")
CLUSTER_ECC_UNCORRECTED = Record(
    CLUSTER, "gpuobs_gpu_ecc_uncorrected", "increase",
    lambda t: f"sum by (cluster) (increase({c.ECC_ERRORS.exposed_name}{UNCORRECTED}[{t.long_window}]))")
