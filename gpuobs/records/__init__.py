"""The recording rules as named objects: the PromQL contract between the metric catalog and what reads
it (the alert pack, the dashboards, the runbooks, `gpuobs report`).

Every record is named `level:metric:operations`, Prometheus's convention, and the name is computed
each time it is read, never typed: the level from the labels its series keep, the metric from what it
reads (the catalog metric, or the record it aggregates further) and the operation. A record that
defines a quantity of its own (lost GPUs, the share of time spent waiting for data) names that
quantity instead. Expressions are built for a set of windows (`Windows`; gpuobs.alerts.Thresholds is
one); names never do. Nothing here reads a catalog name at import: rename a catalog metric and every
record, rule, panel query and runbook that reads it follows.

One module per family (FAMILIES, in rule-file order); base.py holds the Record type and the helpers.
Every public name of every family module is re-exported here, so `records.X` reads any record. The
dashboards import this package without the alert pack; `recording_rules` gives the rules of one
profile, in the order of their definitions (RECORDS: the families in order, each in its own order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

from .. import catalog as c
from . import (
    allocation,
    energy,
    errors,
    idle_gpus,
    inference,
    interconnect,
    inventory,
    placement,
    power,
    reliability,
    slowdown,
    thermal,
    training,
    weekly,
)
from .allocation import *  # noqa: F403 (re-exports: records.X keeps working for every family's names)
from .base import *  # noqa: F403
from .base import Record, Windows  # noqa: F401 (named for readers and type checkers)
from .energy import *  # noqa: F403
from .errors import *  # noqa: F403
from .idle_gpus import *  # noqa: F403
from .inference import *  # noqa: F403
from .interconnect import *  # noqa: F403
from .inventory import *  # noqa: F403
from .placement import *  # noqa: F403
from .power import *  # noqa: F403
from .reliability import *  # noqa: F403
from .slowdown import *  # noqa: F403
from .thermal import *  # noqa: F403
from .training import *  # noqa: F403
from .weekly import *  # noqa: F403
from .weekly import WEEKLY_GROUP

# the families in the order their rules appear in the rule files (the order of the single module before)
FAMILIES: tuple[ModuleType, ...] = (inventory, power, thermal, interconnect, reliability, idle_gpus, errors, training,
                                    slowdown, inference, weekly, placement, allocation, energy)


def _defined(families: tuple[ModuleType, ...]) -> dict[str, Record]:
    """{Python name: Record} of every record the families define, in definition order; a record a
    family imports from an earlier one keeps its first place."""
    names: dict[str, Record] = {}
    for family in families:
        for name, value in vars(family).items():
            if isinstance(value, Record) and not name.startswith("_"):
                names.setdefault(name, value)
    return names


NAMES: dict[str, Record] = _defined(FAMILIES)  # by Python name
RECORDS: tuple[Record, ...] = tuple(NAMES.values())
# the weekly group: the weekly family's records, the allocation family's GPU-hours and the energy family's totals
WEEKLY = weekly.REVIEW + tuple(x for recs in (*allocation.WEEKLY_USAGE.values(), *energy.WEEKLY_ENERGY.values())
                                  for x in recs)

TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")  # a PromQL identifier: metric, record, label or function


def metrics_read(expr: str) -> set[c.Metric]:
    """The catalog metrics whose samples a PromQL expression names (by their names now)."""
    tokens = set(TOKEN.findall(expr))
    return {m for m in c.ALL if tokens.intersection({m.exposed_name, *m.prometheus_samples})}


def per_link(expr: str) -> bool:
    """Whether expr reads per-link NVLink series (a `link` label: 72 to 108 series per GPU), which
    rule groups of their own keep from delaying the others on a big fleet."""
    return any("link" in m.labels for m in metrics_read(expr))


@dataclass(frozen=True)
class Rule:
    """One recording rule of one profile, as a rule file holds it; group is "recording",
    "recording-links" for those that read per-link series, or WEEKLY_GROUP for the weekly records."""
    record: str
    expr: str
    group: str


def recording_rules(t: Windows) -> list[Rule]:
    """The fleet aggregates dashboards and alerts read (cheap to query on thousands of GPUs), for windows t."""
    rules = []
    for r in RECORDS:
        expr = r.expr(t)
        group = WEEKLY_GROUP if r in WEEKLY else "recording-links" if per_link(expr) else "recording"
        rules.append(Rule(r.name, expr, group))
    return rules
