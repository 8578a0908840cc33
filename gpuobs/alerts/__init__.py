"""Alert and recording rules, Alertmanager routing, Grafana alerting and runbooks, generated from
one set of Python definitions (rules.py, over the metric catalog and the records of gpuobs.records;
runbooks/ for the runbooks' Markdown templates, one per alert in its family's folder); build.py
writes them."""

from ..records import recording_rules
from .rules import DEFAULT, DEFAULT_RUNBOOK_BASE, FAST, Alert, Thresholds, alerts

__all__ = ["DEFAULT", "DEFAULT_RUNBOOK_BASE", "FAST", "Alert", "Thresholds", "alerts", "recording_rules"]
