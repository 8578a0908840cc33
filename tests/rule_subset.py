"""Cutting a rule file down to what a promtool test reads: promtool evaluates every rule of its files
at every step, so a week of 5-minute steps over every weekly record, or hours of 30 s steps over
every recording rule, costs tens of seconds that the test does not look at."""

from __future__ import annotations

from gpuobs.records import TOKEN


def needed(groups: list[dict], exprs: list[str]) -> set[str]:
    """The record names the expressions read, with the records those read, transitively."""
    by_record = {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}
    want: set[str] = set()
    todo = [t for e in exprs for t in TOKEN.findall(e)]
    while todo:
        name = todo.pop()
        if name in by_record and name not in want:
            want.add(name)
            todo.extend(TOKEN.findall(by_record[name]))
    return want


def subset(groups: list[dict], exprs: list[str], alerts: tuple[str, ...] = ()) -> list[dict]:
    """The groups (in order, each keeping its name and interval) with only the alerts named and the
    records the expressions and those alerts need; groups left empty are dropped."""
    exprs = exprs + [r["expr"] for g in groups for r in g["rules"] if r.get("alert") in alerts]
    want = needed(groups, exprs)
    out = []
    for g in groups:
        rules = [r for r in g["rules"] if r.get("record") in want or r.get("alert") in alerts]
        if rules:
            out.append({**g, "rules": rules})
    return out
