"""Rule tiers: which rules a shard holding whole nodes can evaluate, and which need the fleet.

A large fleet is scraped by several Prometheus (or vmagent) shards, each holding every series of
the nodes whose name hashes to it (exporters/prometheus/sharded.yml), and everything is
remote-written to one VictoriaMetrics. Every recording and alerting rule of the pack falls in one
of two tiers, derived here from its PromQL:

- local: correct on any shard that holds the whole node. Every aggregation keeps `node`
  (`by (..., node, ...)`, or `without (...)` not dropping it), every vector match stays within one
  node (`on (..., node, ...)`, `ignoring (...)` not ignoring it, or no modifier: every label), and it
  reads only what a node's exporter serves (catalog metrics the exporter emits, and the exporter
  target's own `up{job="<exporter_job>"}`) and local records. Runs on each shard
  (alerts/gpuobs-local.rules.yml).
- global: anything else: an aggregation or a join across nodes (by cluster, team, namespace,
  job_id, hpc_job, model; whole-fleet `count(...)`, `absent(...)`, `vector(...)`), a series no
  node shard scrapes (training and inference processes, kube-state-metrics, Kueue), a global record,
  and every record of the weekly group. Runs on vmalert against VictoriaMetrics
  (alerts/gpuobs-global.rules.yml), which holds every shard's series and local records.

The reading is textual but conservative: strings, label matchers and ranges are blanked first, an
aggregation operator directly followed by its parenthesis has no grouping (a postfix `sum(x) by
(node)` counts as fleet-wide), and a series name the catalog does not list as the exporter's counts
as one no shard holds. A rule wrongly called global still evaluates correctly (on everything); one
wrongly called local could not, and the tests check the local tier against these rules.

`placements(t)` gives each rule its tier and why; `tier_groups(groups, tier, t)` filters rule groups
to one tier; `markdown(t)` is docs/rule-tiers.md. Nothing is cached: names are read from the catalog
and the records at each call, so a renamed metric keeps its tier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import catalog as c
from ..records import CLUSTER_XID_ERRORS, WEEKLY_GROUP, recording_rules
from .rules import Thresholds, alerts

LOCAL, GLOBAL = "local", "global"
TIERS = (LOCAL, GLOBAL)
NODE = "node"
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
                          "quantile", "count_values", "limitk", "limit_ratio"})
FLEET_FUNCTIONS = frozenset({"absent", "absent_over_time", "vector", "scalar"})  # results without a node
KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left",
                      "group_right", "inf", "nan", "atan2"})
# fields vmalert 1.79 (Debian's) refuses in a rule; newer vmalert reads keep_firing_for
VMALERT_UNSUPPORTED = ("keep_firing_for",)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:.])\d[\d.]*(?:[eE][+-]?\d+)?[a-z]*")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_CALL = re.compile(r"\s*\(")
_JOB = re.compile(r'\bjob\s*=\s*"([^"]*)"')


def _blank(text: str, pattern: re.Pattern, keep_ends: bool = False) -> str:
    """text with every match of pattern replaced by spaces (its first and last characters kept with
    keep_ends), so that positions still point into the original."""
    def spaces(m: re.Match) -> str:
        s = m.group(0)
        return s[0] + " " * (len(s) - 2) + s[-1] if keep_ends and len(s) >= 2 else " " * len(s)
    return pattern.sub(spaces, text)


@dataclass(frozen=True)
class Parsed:
    """What a PromQL expression reads and how it groups. selectors: (series name, its label matchers
    as written, "" if none) in order; clauses: (by|without|on|ignoring|group_left|group_right, labels);
    fleet: aggregations without grouping and functions whose result has no labels (absent, vector)."""
    selectors: tuple[tuple[str, str], ...]
    clauses: tuple[tuple[str, tuple[str, ...]], ...]
    fleet: tuple[str, ...]


def parse(expr: str) -> Parsed:
    """Read expr's series selectors, grouping and matching clauses and fleet-wide operations from
    its text (strings, matchers and ranges blanked first; see the module's docstring)."""
    quoted = _blank(expr, _STRING, keep_ends=True)  # label_replace's "(.*)" holds no parenthesis any more
    clauses = tuple((m.group(1), tuple(x.strip() for x in m.group(2).split(",") if x.strip()))
                    for m in _CLAUSE.finditer(quoted))
    fleet = tuple(m.group(1) for m in re.finditer(
        r"\b(" + "|".join(sorted(AGGREGATIONS | FLEET_FUNCTIONS)) + r")\s*\(", quoted))
    bare = _blank(_blank(_blank(_blank(quoted, _CLAUSE), _MATCHERS), _RANGE), _NUMBER)
    selectors = []
    for m in _IDENT.finditer(bare):
        name = m.group(0)
        if name.lower() in KEYWORDS or _CALL.match(bare, m.end()):
            continue  # a keyword, or a function or aggregation operator
        rest = quoted[m.end():]
        block = _MATCHERS.match(quoted, m.end() + len(rest) - len(rest.lstrip()))  # past the spaces after the name
        selectors.append((name, expr[block.start():block.end()] if block else ""))
    return Parsed(tuple(selectors), clauses, fleet)


def exporter_series() -> frozenset[str]:
    """Sample names a node's exporter serves (catalog metrics without an OTel instrument: those are
    the training, inference and telemetry processes', wherever they run), by their names now."""
    return frozenset(s for m in c.ALL if not m.otel_name for s in {m.exposed_name, *m.prometheus_samples})


def _on_the_node(name: str, matchers: str, exporter: frozenset[str], t: Thresholds) -> bool:
    """Whether a node shard holds this selector's series: the exporter's, or its targets' `up`."""
    if name == "up":
        job = _JOB.search(matchers)
        return job is not None and job.group(1) == t.exporter_job
    return name in exporter


def _clause_reasons(parsed: Parsed) -> list[str]:
    reasons = []
    for kind, labels in parsed.clauses:
        if kind in ("by", "on") and NODE not in labels:
            reasons.append(f"{kind} ({', '.join(labels)}) drops node")
        elif kind in ("without", "ignoring") and NODE in labels:
            reasons.append(f"{kind} ({', '.join(labels)}) drops node")
    reasons += [f"{name}(...) over every series" for name in parsed.fleet]
    return reasons


@dataclass(frozen=True)
class Placement:
    """One rule's tier. kind: "record" or "alert"; group: its rule group (gpuobs-<group>); reasons:
    why it is global (empty for a local rule); series: the series names it reads that are no
    records, records: the records it reads, each in order of first appearance."""
    name: str
    kind: str
    group: str
    tier: str
    reasons: tuple[str, ...]
    series: tuple[str, ...]
    records: tuple[str, ...]


def _place(name: str, kind: str, group: str, expr: str, tier_of: dict[str, str], exporter: frozenset[str],
           t: Thresholds, forced: tuple[str, ...] = ()) -> Placement:
    parsed = parse(expr)
    reasons = list(forced) + _clause_reasons(parsed)
    series, read = [], []
    for sel, matchers in parsed.selectors:
        if sel in tier_of:
            read.append(sel)
            if tier_of[sel] == GLOBAL:
                reasons.append(f"reads the global record {sel}")
        else:
            series.append(sel)
            if not _on_the_node(sel, matchers, exporter, t):
                reasons.append(f"reads {sel}{matchers}, which no node shard scrapes")
    reasons = list(dict.fromkeys(reasons))
    return Placement(name, kind, group, GLOBAL if reasons else LOCAL, tuple(reasons),
                     tuple(dict.fromkeys(series)), tuple(dict.fromkeys(read)))


def placements(t: Thresholds) -> dict[str, Placement]:
    """Every rule of the pack for thresholds t (records first, in file order, then alerts), by name
    (record names hold colons, alert names none: they never collide), with its tier and why."""
    exporter = exporter_series()
    rules = recording_rules(t)
    tier_of = {r.record: LOCAL for r in rules}  # a record reads only records defined before it...
    out: dict[str, Placement] = {}
    for _ in range(len(rules)):  # ...but read to a fixed point all the same: global only spreads
        for r in rules:
            forced = ("in the weekly group",) if r.group == WEEKLY_GROUP else ()
            out[r.record] = _place(r.record, "record", r.group, r.expr, tier_of, exporter, t, forced)
        changed = {n for n, p in out.items() if p.tier != tier_of[n]}
        tier_of.update({n: out[n].tier for n in changed})
        if not changed:
            break
    for a in alerts(t):
        out[a.name] = _place(a.name, "alert", a.group, a.expr, tier_of, exporter, t)
    return out


def judge(expr: str, t: Thresholds, placed: dict[str, Placement] | None = None) -> Placement:
    """The tier an alert with this expression would have in the pack for thresholds t (its records'
    tiers from placed, else from placements(t)), named "expr"."""
    placed = placed or placements(t)
    tier_of = {n: p.tier for n, p in placed.items() if p.kind == "record"}
    return _place("expr", "alert", "", expr, tier_of, exporter_series(), t)


def rule_name(rule: dict) -> str:
    """The name of a rule of a rule file: its record or its alert."""
    return rule.get("record") or rule["alert"]


def tier_groups(groups: list[dict], tier: str, t: Thresholds) -> list[dict]:
    """The rule groups (gpuobs.alerts.build.rule_groups(t)) with only the rules of one tier, each
    group's name and interval kept, groups left empty dropped. The global tier's rules lose the
    fields vmalert 1.79 refuses (VMALERT_UNSUPPORTED): it runs on vmalert."""
    if tier not in TIERS:
        raise ValueError(f"no tier {tier!r}: {TIERS}")
    placed = placements(t)
    out = []
    for group in groups:
        rules = [dict(r) for r in group["rules"] if placed[rule_name(r)].tier == tier]
        if tier == GLOBAL:
            for r in rules:
                for key in VMALERT_UNSUPPORTED:
                    r.pop(key, None)
        if rules:
            out.append({**group, "rules": rules})
    return out


_COUNTING = re.compile(r"\b(?:sum|count)_over_time\(\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def sample_counting(t: Thresholds) -> list[str]:
    """Global records that sum or count the samples of another record over a range (the weekly step
    averages and GPU-hour sums): on vmalert the newest samples of a record it wrote itself are not
    readable yet (remote write, then VictoriaMetrics makes them searchable), so these can miss
    the evaluations written within that delay, where a Prometheus evaluating both sees every one."""
    placed = placements(t)
    return [r.record for r in recording_rules(t) if placed[r.record].tier == GLOBAL
            and any(m in placed and placed[m].kind == "record" for m in _COUNTING.findall(r.expr))]


def vmalert_dropped(t: Thresholds) -> list[str]:
    """The global tier's alerts that have a field vmalert 1.79 refuses (keep_firing_for), which the
    global files leave out."""
    placed = placements(t)
    return [a.name for a in alerts(t) if a.keep_firing_for and placed[a.name].tier == GLOBAL]


# ------------------------------------------------------------------------------ docs/rule-tiers.md
DOC_PATH = "docs/rule-tiers.md"


def series_source(name: str, t: Thresholds) -> str:
    """Who exports a series a rule reads: the gpuobs exporter (on the node), a process instrumented
    with gpuobs.instrument (its catalog family), kube-state-metrics, Kueue or Prometheus (`up`)."""
    by_sample = {s: m for m in c.ALL for s in {m.exposed_name, *m.prometheus_samples}}
    if name in by_sample and not by_sample[name].otel_name:
        return "exporter"
    if name in by_sample:
        return f"{by_sample[name].family} processes"
    if name == "up":
        return "Prometheus (scrape health)"
    return {"kube": "kube-state-metrics", "kueue": "Kueue"}.get(name.split("_")[0], "other")


def _code(names) -> str:
    return ", ".join(f"`{n}`" for n in names).replace("|", "\\|") or "none"


def _table(rows: list[Placement], why: bool) -> list[str]:
    head = "| rule | kind | group | reads | why global |\n|---|---|---|---|---|" if why else \
        "| rule | kind | group | reads |\n|---|---|---|---|"
    lines = [head]
    for p in rows:
        cells = [f"`{p.name}`", p.kind, f"gpuobs-{p.group}", _code(p.records + p.series)]
        if why:
            cells.append("; ".join(p.reasons).replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _inputs(rows: list[Placement], placed: dict[str, Placement], t: Thresholds) -> list[str]:
    """Bullets: the series a tier's rules read, by who exports them, and the other tier's records."""
    series = list(dict.fromkeys(s for p in rows for s in p.series))
    by_source: dict[str, list[str]] = {}
    for s in series:
        by_source.setdefault(series_source(s, t), []).append(s)
    lines = [f"- from {source}: {_code(names)}" for source, names in by_source.items()]
    tier = rows[0].tier if rows else LOCAL
    other = list(dict.fromkeys(r for p in rows for r in p.records if placed[r].tier != tier))
    if other:
        lines.append(f"- local records, evaluated on the shards and remote-written: {_code(other)}")
    return lines


INTRO = """# Rule tiers: a rule pack that shards

One Prometheus holding every node evaluates the whole pack, `alerts/gpuobs.rules.yml` (the
PrometheusRule `alerts/prometheusrule.yaml`, the only one `alerts/kustomization.yaml` lists, so
`kubectl apply -k exporters/kubernetes` deploys every rule once). A fleet too large for one
Prometheus is scraped by shards, each holding every series of the nodes whose name hashes to it
(`exporters/prometheus/sharded.yml`), and every shard remote-writes to one VictoriaMetrics. Each rule
is then in exactly one of two tiers, generated as files of their own:

| tier | rule file | PrometheusRule | where it runs | rules |
|---|---|---|---|---|
| local | `alerts/gpuobs-local.rules.yml` | `alerts/prometheusrule-local.yaml` (`role: alert-rules-local`) | every Prometheus shard holding whole nodes | {local} |
| global | `alerts/gpuobs-global.rules.yml` | `alerts/prometheusrule-global.yaml` (`role: alert-rules-global`) | vmalert against VictoriaMetrics | {global_} |

The two files together are the single file, rule for rule, group by group (each file keeps the
group names and intervals), except that the global tier leaves out `keep_firing_for`, which
Debian's vmalert 1.79 refuses (see the differences on vmalert below). The tier PrometheusRules are listed by no kustomization: select them per evaluator
(a shard's Prometheus by `role: alert-rules-local`, vmalert's VMRules converted from
`role: alert-rules-global`), never together with `alerts/prometheusrule.yaml`.

## How a rule's tier is decided

`gpuobs/alerts/tiers.py` reads each rule's PromQL (`tests/test_rule_tiers.py` checks it):

- **local**: every aggregation keeps `node` (`by (..., node, ...)`, or `without (...)` that keeps it),
  every vector match stays within one node (`on (..., node, ...)`, `ignoring (...)` that keeps it,
  or no modifier: every label), and it reads only series a node's exporter serves (with the exporter
  target's own `up{{job="{job}"}}`) and local records. Such a rule gives the same result on a shard
  holding the whole node as on a Prometheus holding every node.
- **global**: everything else: aggregations and joins across nodes (by cluster, team, namespace,
  Slurm job, training job, model; `count(...)` or `absent(...)` of the fleet, `vector(...)`), series
  no node shard scrapes (training and inference processes, kube-state-metrics, Kueue), every record
  of the weekly group (`gpuobs-recording-weekly`), and any rule that reads a global record. A local
  rule never reads a global record.

## Deploying the tiers

`deploy/fleet/README.md` is the whole deployment on Debian's packages, with each command line.
In short:

1. **Shards** (`deploy/fleet/prometheus-shard.yml`, or `exporters/prometheus/sharded.yml` on
   Kubernetes): hashmod on `node`, so that a node's series are all on one shard;
   `rule_files: [alerts/gpuobs-local.rules.yml]`; only `cluster` as an external label (a node that
   moves to another shard keeps its series); `remote_write` to VictoriaMetrics of every series and
   record the global tier reads (the tests check the `keep` filter of
   `exporters/prometheus/sharded.yml` and `remote-write.yml` against the inputs below). Their
   alerts go to Alertmanager themselves.
2. **Everything else** (training and inference processes, kube-state-metrics, Kueue) is scraped by
   any Prometheus or vmagent that remote-writes to the same VictoriaMetrics: no shard holds those
   series, so no local rule reads them.
3. **vmalert** evaluates the global tier on VictoriaMetrics and writes its records back there:
   `vmalert -rule=alerts/gpuobs-global.rules.yml -datasource.url=http://victoriametrics:8428
   -remoteWrite.url=http://victoriametrics:8428 -notifier.url=http://alertmanager:9093`
   (`deploy/fleet/default/vmalert` adds the rest). Global rules read local records and raw series
   as remote-written, so they see them `-search.latencyOffset` (30 s by default) and the
   remote-write delay late: the urgent per-GPU and per-node alerts are the shards'.
4. **Dashboards** query VictoriaMetrics, which holds both tiers' records.

With vmagent shards (which keep no data and evaluate nothing), run both tier files on vmalert
against VictoriaMetrics: a local rule is correct anywhere that holds its whole node (but Debian's
vmalert 1.79 refuses the local tier's `keep_firing_for`: a newer vmalert, or a copy without it).

## Differences on vmalert

`tests/test_rule_tiers.py` evaluates the global tier on vmalert over VictoriaMetrics and on a
Prometheus holding the same data, and compares every record. They agree, except where vmalert
works differently from Prometheus:

- **`keep_firing_for`** is left out of the global tier: {dropped} resolve once their condition is
  false instead of {keep} later.
- **Records read records a moment late.** vmalert writes each result through remote write, and
  VictoriaMetrics makes a sample searchable only a moment later (a new series up to about 10 s
  later), so a rule reading a global record reads the evaluations that have arrived, not the one
  its group has just made as on Prometheus. Values settle an evaluation later; when a record
  first appears, each level of records reading records adds that delay.
- **Records that count the evaluations of another record** can miss the newest ones, not readable
  yet: {counted}. With 30 s records and 5 m steps a step average may read 9 of a step's 10
  evaluations (10 % low) when both groups tick together; a weekly sum loses at most its newest step.
  The test checks these records are there on both, not their values.
- **`increase()` of a counter that appeared within the window**: MetricsQL counts its first value,
  PromQL does not once the series has two samples, so `{xid}`
  and the weekly failure counts count a GPU's first XID within the window on VictoriaMetrics only.
"""  # noqa: E501 (its Markdown table rows cannot wrap)


def markdown(t: Thresholds) -> str:
    """docs/rule-tiers.md: what the tiers are, how they are decided and deployed, and per tier each
    rule and what it reads (the series by who exports them, the records)."""
    placed = placements(t)
    rows = {tier: [p for p in placed.values() if p.tier == tier] for tier in TIERS}
    dropped = vmalert_dropped(t)
    count = {tier: f"{sum(p.kind == 'record' for p in r)} records, {sum(p.kind == 'alert' for p in r)} alerts"
             for tier, r in rows.items()}
    lines = [INTRO.format(local=count[LOCAL], global_=count[GLOBAL], job=t.exporter_job, keep=t.keep_firing,
                          dropped=_code(dropped) if dropped else "no alert", counted=_code(sample_counting(t)),
                          xid=CLUSTER_XID_ERRORS.name)]
    lines += ["## Local tier: on each shard", "",
              "Inputs, all on the shard that holds the node:", "", *_inputs(rows[LOCAL], placed, t), "",
              *_table(rows[LOCAL], why=False), "",
              "## Global tier: vmalert on VictoriaMetrics", "",
              "Inputs, all remote-written to VictoriaMetrics (by the shards, or by whatever scrapes the "
              "processes, kube-state-metrics and Kueue); the global records are vmalert's own:", "",
              *_inputs(rows[GLOBAL], placed, t), "", *_table(rows[GLOBAL], why=True)]
    return "\n".join(lines) + "\n"
