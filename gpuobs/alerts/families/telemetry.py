"""Alerts of the instrumentation's self-health: its own losses."""

from __future__ import annotations

from ... import catalog as c
from ..common import Alert, Thresholds


def telemetry(t: Thresholds) -> list[Alert]:
    """The instrumentation's own losses."""
    return [
        Alert(name="TelemetryLogRecordsDropped", expr=f"increase({c.LOGS_DROPPED.exposed_name}[{t.for_medium}]) > 0",
              for_=t.for_long, severity="warning", scope="service", family="telemetry",
              summary="A process keeps dropping its log records.",
              description="{{ $labels.job }} target {{ $labels.instance }} dropped {{ $value | humanize }} log "
                          f"records in the last {t.for_medium}, and has kept dropping them for {t.for_long}: its "
                          "Fluentd is down or too slow."),
    ]
