"""The alert pack and its recording rules, defined once in Python over catalog names.

Thresholds and windows live in `Thresholds`; `FAST` is the same pack with seconds instead of
minutes, for the demo and end-to-end tests. Alerts are data (`Alert`, keyword fields), one function
per family (FAMILIES), each in its own module of gpuobs.alerts.families; their rule group follows
from their scope. What the families share (Thresholds, Alert, helpers) is in gpuobs.alerts.common
and re-exported here. The recording rules they and the dashboards read are named objects in
gpuobs.records; names come from there and from the catalog.
"""

from __future__ import annotations

from .common import (
    DEFAULT,
    DEFAULT_RUNBOOK_BASE,
    FAST,
    SCOPE_GROUPS,
    SEVERITIES,
    Alert,
    Thresholds,
    _seconds,
    check_runbook_base,
)
from .families.exporter import exporter
from .families.inference import inference
from .families.interconnect import interconnect
from .families.memory import memory
from .families.meta import meta
from .families.placement import placement
from .families.power import power
from .families.presence import presence
from .families.telemetry import telemetry
from .families.thermal import thermal
from .families.training import training
from .families.training_logs import training_logs
from .families.utilization import utilization
from .families.xid import xid

__all__ = ["DEFAULT", "DEFAULT_RUNBOOK_BASE", "FAMILIES", "FAST", "SCOPE_GROUPS", "SEVERITIES", "Alert", "Thresholds",
           "_seconds", "alerts", "check_runbook_base"]

# One function per family, in the pack's order; each returns its alerts for thresholds t.
FAMILIES = (thermal, power, utilization, xid, memory, interconnect, presence, exporter, telemetry, training,
            training_logs, inference, placement, meta)


def alerts(t: Thresholds) -> list[Alert]:
    """The pack, family by family (FAMILIES). Per-GPU descriptions carry node, index and UUID; every
    alert has an explicit for."""
    return [a for family in FAMILIES for a in family(t)]
