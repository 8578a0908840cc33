"""Node dashboard, row "Profiling (GPM)": one panel per GPM metric of the catalog (gpm family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import GPU, m, metric_title


def row(L: k.Layout) -> None:
    """Append the 'Profiling (GPM)' row and its panels to the Node dashboard's layout L."""
    L.row("Profiling (GPM)")
    for metric in c.GPM_METRICS.values():
        L.add(k.timeseries(metric_title(metric), [target(m(metric), GPU)], "percentunit", metric.help, min=0, max=1),
              6, 7)
