"""Alerts of the xid family: XID errors by tier of action, and XIDs the kernel log has that NVML's event path
missed."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import logpatterns as lp
from ... import records
from ..common import GPU, Alert, Thresholds, _counted, _kernel_counted, _seconds

XID_BY = "cluster, node, gpu, uuid, xid"  # one XID code of one GPU, whatever the target labels (pod, instance)


def _xid(xids: str, t: Thresholds) -> str:
    # The event's own time, not only the counter: after an exporter restart an XID's series are gone
    # until it recurs, and come back at 1, so increase() sees nothing and a series "new within the
    # window" may well have existed before the restart. XID_LAST_SEEN is the Unix time of the last
    # event, whatever came before; the counter covers a node clock running more than rate_window
    # behind Prometheus's.
    seen = f'{c.XID_LAST_SEEN.name}{{xid=~"{xids}"}}'
    count = f'{c.XID_ERRORS.exposed_name}{{xid=~"{xids}"}}'
    return f"time() - {seen} < {_seconds(t.rate_window):g} or increase({count}[{t.rate_window}]) > 0"


def _xid_unseen_by_nvml(t: Thresholds) -> str:
    """XIDs the kernel log counted on a GPU within long_window and NVML's event path did not: more of
    a code than NVML counted, or a code NVML has no series of. NVML's series count from the exporter's
    start, so one new within the window (by all its labels) holds only events within it. The kernel's
    count since boot and go on across exporter restarts, so XIDs while the exporter was down show as
    their rise (_kernel_counted)."""
    w, xe = t.long_window, c.XID_ERRORS.exposed_name
    kernel = _kernel_counted(c.KERNEL_XID_ERRORS.exposed_name, XID_BY, w)
    nvml = _counted(xe, XID_BY, w, f"{xe} offset {w}")
    return f"{kernel} > {nvml} or {kernel} > 0 unless on ({XID_BY}) {nvml}"


def xid(t: Thresholds) -> list[Alert]:
    """XID errors by tier of action (counters: alerts resolve once no new XID arrives)."""
    alert = partial(Alert, family="xid", for_="0s", scope="gpu", keep_firing_for=t.keep_firing)
    tiers = records.XID_TIERS  # codes by tier, shared with the weekly failure rates
    return [
        alert(name="GpuXidRebootRequired", expr=_xid(tiers["xid_reboot"], t), severity="critical",
              summary="GPU fell off the bus (XID 79): the node needs a reboot.",
              description=f"{GPU} reported XID {{{{ $labels.xid }}}}: reboot the node."),
        alert(name="GpuXidResetRequired", expr=_xid(tiers["xid_reset"], t), severity="critical",
              summary="GPU reported an XID that needs a GPU reset.",
              description=f"{GPU} reported XID {{{{ $labels.xid }}}}: drain it and reset the GPU."),
        alert(name="GpuXidApplicationError", expr=_xid(tiers["xid_application"], t), severity="warning",
              summary="GPU reported an application-level XID: restart the application.",
              description=f"{GPU} reported XID {{{{ $labels.xid }}}} (contained error): restart the affected "
                          "application."),
        alert(name="GpuXidNvlinkError", expr=_xid(tiers["xid_nvlink"], t), severity="warning",
              summary="GPU reported an NVLink error (XID 74).",
              description=f"{GPU} reported XID 74: check its NVLink links."),
        alert(name=lp.BY_NAME["nvrm_xid"].alert, expr=_xid_unseen_by_nvml(t), for_=t.for_short,
              severity="critical", keep_firing_for=None,
              summary="The kernel log has XIDs that NVML's event path did not report.",
              description=f"The kernel log counted {{{{ $value }}}} XID {{{{ $labels.xid }}}} on {GPU} in the last "
                          f"{t.long_window}, more than the exporter's NVML event path reported: the XID alerts "
                          "missed them."),
    ]
