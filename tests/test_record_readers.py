"""Every recording rule has a reader: an alert, a dashboard panel, a runbook's PromQL, a section of
`gpuobs report`, or another record (which has a reader in turn: a record read only by unread
records would be caught at the end of that chain). A record nothing reads costs every Prometheus an
evaluation per interval and a series per group for nothing: give it a reader or remove it."""

from __future__ import annotations

import json
from pathlib import Path

from gpuobs import records, report
from gpuobs.alerts.build import rule_groups
from gpuobs.alerts.rules import DEFAULT

REPO = Path(__file__).resolve().parents[1]


def _tokens(text: str) -> set[str]:
    return set(records.TOKEN.findall(text))


def _panel_exprs(node) -> list[str]:
    """Every `expr` of a Grafana dashboard JSON (panels, rows, templating queries)."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k in ("expr", "query") and isinstance(v, str)] + [
            e for v in node.values() for e in _panel_exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _panel_exprs(v)]
    return []


def readers() -> dict[str, set[str]]:
    """{reader kind: the record names it reads}, from the generated rules, dashboards and runbooks
    (what users load) and from gpuobs.report."""
    groups = rule_groups(DEFAULT)
    alerts = " ".join(r["expr"] for g in groups for r in g["rules"] if "alert" in r)
    panels = " ".join(e for p in sorted((REPO / "dashboards").glob("*.json"))
                      for e in _panel_exprs(json.loads(p.read_text())))
    runbooks = " ".join(p.read_text() for p in sorted((REPO / "docs" / "runbooks").glob("*.md")))
    return {"alert": _tokens(alerts), "panel": _tokens(panels), "runbook": _tokens(runbooks),
            "report": {r.name for r in report.records_read()}}


def unread() -> list[str]:
    """The records no reader reads, directly or through the records that read them."""
    read = set().union(*readers().values())
    by_name = {r.name: r.expr(DEFAULT) for r in records.RECORDS}
    todo = [n for n in by_name if n in read]
    while todo:  # a record read by a read record is read
        for token in _tokens(by_name[todo.pop()]):
            if token in by_name and token not in read:
                read.add(token)
                todo.append(token)
    return [n for n in by_name if n not in read]


def test_every_record_has_a_reader():
    assert unread() == [], "records nothing reads: give each a reader or remove it"


def test_the_check_sees_a_record_without_a_reader(monkeypatch):
    orphan = records.Record(records.CLUSTER, "gpuobs_test_orphan", "sum", lambda t: "vector(1)")
    monkeypatch.setattr(records, "RECORDS", records.RECORDS + (orphan,))
    assert unread() == [orphan.name]
