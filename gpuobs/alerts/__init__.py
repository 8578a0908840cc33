"""Alert and recording rules, Alertmanager routing, Grafana alerting and runbooks, generated from
one set of Python definitions (rules.py) over the metric catalog's names (build.py writes them)."""

from .rules import (DEFAULT, DEFAULT_RUNBOOK_BASE, FAST, PROFILES, Alert, Record, Thresholds, alerts,
                    recording_rules)

__all__ = ["DEFAULT", "DEFAULT_RUNBOOK_BASE", "FAST", "PROFILES", "Alert", "Record", "Thresholds", "alerts",
           "recording_rules"]
