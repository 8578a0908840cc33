"""Node dashboard, row "XID errors": from NVML events and from the kernel log (xid and kernel_log families)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import rate, target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'XID errors' row and its panels to the Node dashboard's layout L."""
    L.row("XID errors")
    L.add(k.timeseries("XID errors", [target(rate(m(c.XID_ERRORS), "increase"), GPU + " XID {{xid}}")], "short",
                       "XID errors reported by the driver, per code.", bars=True, stack=True, min=0), 12, 7)
    L.add(k.table("XID history", [target(m(c.XID_ERRORS)), target(f"{m(c.XID_LAST_SEEN)} * 1000")],
                  "short", "Count of each XID code per GPU since the exporter started, and when it was last seen.",
                  merge=True, hide=("cluster", "node"), rename={"Value #A": "count", "Value #B": "last seen"},
                  overrides=[{"matcher": {"id": "byName", "options": "last seen"},
                              "properties": [{"id": "unit", "value": "dateTimeAsIso"}]}]), 12, 7)
    L.add(k.timeseries("Kernel-log XIDs", [target(rate(m(c.KERNEL_XID_ERRORS), "increase"), GPU + " XID {{xid}}")],
                       "short", "NVRM Xid lines in the kernel log, per GPU and code: a second source beside the "
                       "NVML events (also XIDs from while the exporter was down). GpuXidFromLogs fires on those "
                       "NVML did not count.", bars=True, stack=True, min=0), 12, 7)
    L.add(k.timeseries("Kernel-log driver messages", [target(rate(m(c.KERNEL_LOG_MATCHES), "increase"),
                                                             GPU + " {{pattern}}")], "short",
                       "Kernel-log lines matched by the log-pattern catalog (Xid, ECC, NVLink/fabric), per GPU "
                       "and pattern.", bars=True, stack=True, min=0), 12, 7)
