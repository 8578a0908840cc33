"""Alerts of the nvlink and pcie families: links down or degraded, error and replay rates and trends, driver
NVLink messages."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import logpatterns as lp
from ... import records
from ...records import GPU_BY
from ..common import DEGRADING, GPU, LINE, Alert, Thresholds, _gpu_lines, _rising


def interconnect(t: Thresholds) -> list[Alert]:
    """NVLink links and errors (per GPU, over its links: the per-link series are detail), PCIe link
    and replays."""
    nvlink = partial(Alert, family="nvlink", scope="gpu")
    pcie = partial(Alert, family="pcie", scope="gpu")
    w = t.rate_window
    return [
        nvlink(name="GpuNvlinkDown", expr=f"{c.NVLINKS_DOWN.name} > 0", for_=t.for_short, severity="critical",
               summary="An NVLink link is down.",
               description=f"{GPU} has {{{{ $value }}}} NVLink link(s) down (which: gpuobs exporter --detail nvlink "
                           f"serves {c.NVLINK_UP.name} per link)."),
        nvlink(name="GpuNvlinkErrorRate",
               expr=f"rate({c.NVLINKS_ERRORS.exposed_name}[{w}]) > {t.nvlink_errors_per_s:g}", for_=t.for_short,
               severity="warning", summary="NVLink errors are rising.",
               description=f"{GPU} has {{{{ $value | humanize }}}} NVLink data-link errors/s over its links."),
        pcie(name="GpuPcieLinkDegraded",
             expr=f"({records.pcie_below_max()}) and on ({GPU_BY}) {c.UTILIZATION.name} > {t.pcie_busy_utilization:g}",
             for_=t.for_medium, severity="warning",
             summary="PCIe link below its maximum generation or width under load.",
             description=f"{GPU} runs its PCIe link below its maximum while busy."),
        pcie(name="GpuPcieReplayRate", expr=f"rate({c.PCIE_REPLAYS.exposed_name}[{w}]) > {t.pcie_replays_per_s:g}",
             for_=t.for_short, severity="warning", summary="PCIe replays are rising.",
             description=f"{GPU} has {{{{ $value | humanize }}}} PCIe replays per second."),
        nvlink(name="GpuNvlinkErrorsRising",
               expr=_rising(records.GPU_NVLINK_ERRORS_RATE, t.nvlink_errors_trend_per_s, t), for_=t.for_medium,
               severity="warning", summary="NVLink data-link errors on a GPU are rising. " + DEGRADING,
               description=f"{GPU} has {{{{ $value | printf \"%.3g\" }}}} NVLink data-link "
                           f"errors per second over the last {t.trend_window}, over {t.trend_factor:g}x its rate "
                           f"{t.trend_baseline} earlier."),
        pcie(name="GpuPcieReplaysRising",
             expr=_rising(records.GPU_PCIE_REPLAYS_RATE, t.pcie_replays_trend_per_s, t), for_=t.for_medium,
             severity="warning", summary="PCIe replays on a GPU are rising. " + DEGRADING,
             description=f"{GPU} has {{{{ $value | printf \"%.3g\" }}}} PCIe replays per second over the last "
                         f"{t.trend_window}, over {t.trend_factor:g}x its rate {t.trend_baseline} earlier."),
        nvlink(name=lp.BY_NAME["nvlink_error"].alert, expr=_gpu_lines("nvlink_error", t), for_="0s",
               severity="warning", summary="The logs report NVLink, NVSwitch or fabric manager errors.",
               description=f"The logs of {LINE} report NVLink, NVSwitch or fabric manager errors in the last "
                           f"{t.rate_window}.",
               keep_firing_for=t.keep_firing),
    ]
