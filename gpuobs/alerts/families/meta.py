"""Alerts of the alerting pipeline itself: the watchdog."""

from __future__ import annotations

from ..common import Alert, Thresholds


def meta(t: Thresholds) -> list[Alert]:
    """The alerting pipeline itself."""
    return [
        Alert(name="Watchdog", expr="vector(1)", for_="0s", severity="none", scope="cluster", family="meta",
              summary="Always firing: proves the alerting pipeline works end to end.",
              description="This alert always fires. If it stops arriving, Prometheus or Alertmanager is broken."),
    ]
