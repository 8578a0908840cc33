"""Node dashboard, row "MIG": MIG devices, mode, memory and profiling per MIG device (mig family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import GPU, m, metric_title


def row(L: k.Layout) -> None:
    """Append the 'MIG' row and its panels to the Node dashboard's layout L."""
    L.row("MIG")
    L.add(k.table("MIG devices", [target(m(c.MIG_INFO)), target(m(c.MIG_MEMORY_TOTAL))], "bytes",
                  "GPU instances and compute instances, with profile and memory.", merge=True,
                  hide=("cluster", "node", "Value #A"), rename={"Value #B": "memory"}), 12, 6)
    L.add(k.state_timeline("MIG mode", [target(m(c.MIG_MODE), GPU), target(m(c.MIG_PENDING), GPU + " pending")],
                           "short", "1 while MIG mode is enabled, and the mode pending for the next reset.",
                           thresholds=[{"color": "text", "value": None}, {"color": "blue", "value": 1}]), 12, 6)
    MIG = GPU + " GI {{gpu_instance_id}} CI {{compute_instance_id}}"
    L.add(k.timeseries("MIG memory used", [target(m(c.MIG_MEMORY_USED), MIG)], "bytes",
                       "Memory used per MIG device.", min=0), 8, 7)
    L.add(k.table("MIG BAR1 and SMs", [target(m(c.MIG_BAR1_USED)), target(m(c.MIG_BAR1_TOTAL)),
                                       target(m(c.MIG_SMS))], "short",
                  "BAR1 aperture in use and in total, and streaming multiprocessors, per MIG device.", merge=True,
                  hide=("cluster", "node", "uuid"),
                  rename={"Value #A": "BAR1 used", "Value #B": "BAR1 total", "Value #C": "SMs"}), 8, 7)
    for metric in c.MIG_GPM_METRICS.values():
        L.add(k.timeseries("MIG " + metric_title(metric), [target(m(metric), MIG)], "percentunit", metric.help,
                           min=0, max=1), 8, 7)
