"""The PromQL contract: the catalog's metric names and the records of gpuobs.records are the only
names the alert pack, the dashboards and the runbooks use.

- records are named `level:metric:operation` from what they read, whatever the windows;
- rule groups follow from the alerts' scope (and per-link NVLink series);
- no definition types a recording-rule or metric name: they come from the catalog and the records;
- every metric and record a runbook names exists;
- renaming a catalog metric renames it in every generated rule, record, panel query and runbook,
  and changes nothing else.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from contextlib import contextmanager
from string import Template

import pytest
from conftest import REPO

from gpuobs import catalog as c
from gpuobs import records
from gpuobs.alerts import build as alerts_build
from gpuobs.alerts import runbooks
from gpuobs.alerts.rules import DEFAULT, FAST, SCOPE_GROUPS, alerts
from gpuobs.dashboards import build as dashboards_build

RECORD = re.compile(r"(?<![\w:])[a-z_]+:[a-z0-9_]+:[a-z0-9_]+(?![\w:])")  # level:metric:operation
METRIC = re.compile(r"(?<![\w:])(?:gpuobs|gen_ai)_[a-z0-9_]+")  # a gpuobs or GenAI metric (or GenAI label)
SAMPLES = {s for m in c.ALL for s in (m.name, m.exposed_name, *m.prometheus_samples)}
LABELS = {label for m in c.ALL for label in m.labels}


# ---------------------------------------------------------------------------------------- records
def test_records_are_named_level_metric_operation():
    names = [r.name for r in records.RECORDS]
    assert len(names) == len(set(names)), "two records of the same name"
    assert all(RECORD.fullmatch(n) for n in names), names
    by_name = {r.name: r for r in records.RECORDS}
    assert by_name["cluster:gpuobs_gpu_power_usage_watts:sum"] is records.CLUSTER_POWER
    # a record read further keeps the metric part of what it reads, and its operation
    assert records.STRAGGLER_RATIO.name == "job_id_rank:gpuobs_training_compute_seconds:ratio_to_others"
    assert records.CLUSTER_GPUS_EXPECTED.name == "cluster:gpuobs_gpus_expected:sum"
    assert records.DATA_WAIT_RATIO.name == "job_id_rank:gpuobs_training_data_wait:ratio"
    assert records.MODEL_REQUEST_P99.name == "model:gen_ai_server_request_duration_seconds:p99"
    assert records.CLUSTER_GOODPUT.name == "cluster:gpuobs_training_goodput:ratio"  # seconds per second
    for r in records.RECORDS:  # the metric part is the catalog metric's name, or a quantity of its own
        if isinstance(r.source, c.Metric) and r.metric != r.source.name:
            assert r.operation == "ratio" and r.source.unit == "seconds", r.name


def test_record_names_do_not_depend_on_the_windows():
    default, fast = records.recording_rules(DEFAULT), records.recording_rules(FAST)
    assert [r.record for r in default] == [r.record for r in fast] == [r.name for r in records.RECORDS]
    assert [r.group for r in default] == [r.group for r in fast]
    changed = [d.record for d, f in zip(default, fast) if d.expr != f.expr]
    assert records.NODE_NVLINK_TX.name in changed and records.CLUSTER_POWER.name not in changed


def test_records_read_only_what_exists():
    """Every name a record's expression selects is a catalog sample or another record, defined before it
    (a latch, records.LATCHES, also reads itself)."""
    seen: set[str] = set()
    latches = {r.name for r in records.LATCHES}
    for rule in records.recording_rules(DEFAULT):
        for token in records.TOKEN.findall(rule.expr):
            if RECORD.fullmatch(token):
                assert token in seen or token == rule.record in latches, f"{rule.record} reads {token} before it is defined"
            elif METRIC.fullmatch(token):
                assert token in SAMPLES | LABELS, f"{rule.record} reads {token}, which the catalog lacks"
        seen.add(rule.record)


# ------------------------------------------------------------------------------------ rule groups
def test_rule_groups_follow_from_scope_and_links():
    pack = alerts(DEFAULT)
    assert {a.group for a in pack} <= set(alerts_build.GROUP_ORDER)
    groups = {g["name"]: [r.get("alert") or r["record"] for r in g["rules"]] for g in alerts_build.rule_groups(DEFAULT)}
    assert sum(map(len, groups.values())) == len(pack) + len(records.RECORDS), "a rule in no group"
    # the NVLink rules read the per-GPU totals: no rule reads a per-link series, so no links groups
    assert "gpuobs-links" not in groups and "gpuobs-recording-links" not in groups
    assert set(groups["gpuobs-meta"]) == {a.name for a in pack if a.scope == "cluster"}
    for a in pack:
        if a.group != "links":
            assert a.group == SCOPE_GROUPS[a.scope], a.name


def test_dashboards_import_the_records_without_the_alert_pack():
    code = ("import sys, gpuobs.records, gpuobs.dashboards.build; "
            "assert not [m for m in sys.modules if m.startswith('gpuobs.alerts')], sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# ------------------------------------------------------------------------------- no literal names
# Every module of gpuobs/ but the catalog (where metric names are defined) is checked. The exceptions,
# by module and name, each with why; an exception no longer needed fails too.
NAME_EXCEPTIONS: dict[str, tuple[frozenset[str], str]] = {
    "gpuobs/logpatterns.py": (frozenset({"gpuobs_log_pattern_matches"}),
                              "layer 1 beside the catalog, so it may not import it; tests/test_logpatterns.py "
                              "pins the name to catalog.LOG_PATTERN_MATCHES"),
    "gpuobs/logs/fluentbit.py": (frozenset({"gpuobs_log_patterns", "gpuobs_pattern_"}),
                                 "a Fluent Bit tag and a filter-alias prefix, not metric names"),
}
DEFINES_NAMES = ("gpuobs/catalog", "gpuobs/records")  # metric names; record names and their quantities
MODULES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "gpuobs").rglob("*.py")
                 if not p.relative_to(REPO).as_posix().startswith(DEFINES_NAMES)
                 and not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))


def literals(source: str) -> list[str]:
    """The string constants of a module, docstrings left out (they may quote names as examples)."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def typed_names(source: str) -> list[str]:
    """Recording-rule and metric names typed in a module's strings (GenAI labels are no metric)."""
    found = []
    for text in literals(source):
        found += RECORD.findall(text) + [m for m in METRIC.findall(text) if m not in LABELS]
    return found


@pytest.mark.parametrize("path", MODULES)
def test_no_module_types_a_record_or_metric_name(path):
    allowed, _why = NAME_EXCEPTIONS.get(path, (frozenset(), ""))
    found = typed_names((REPO / path).read_text())
    assert not set(found) - allowed, f"{path}: use gpuobs.catalog and gpuobs.records ({set(found) - allowed})"
    assert allowed <= set(found), f"{path}: drop the exception for {allowed - set(found)}: no longer typed"


def test_the_literal_check_covers_every_module():
    assert len(MODULES) > 80 and "gpuobs/sim/fidelity.py" in MODULES and "gpuobs/logs/fluentd.py" in MODULES
    assert not [m for m in MODULES if m.startswith("gpuobs/catalog")] and set(NAME_EXCEPTIONS) <= set(MODULES)


def test_runbook_templates_type_no_record_or_metric_name():
    """The Markdown templates and snippets too (gpuobs/alerts/runbooks/): `$NAME` for every metric and record."""
    templates = sorted((REPO / "gpuobs" / "alerts" / "runbooks").rglob("*.md"))
    assert len(templates) > len(alerts(DEFAULT))  # one per alert, and the shared snippets
    typed = {p.relative_to(REPO).as_posix(): [*RECORD.findall(t), *(m for m in METRIC.findall(t) if m not in LABELS)]
             for p in templates for t in [p.read_text()]}
    assert not {p: names for p, names in typed.items() if names}, "write $NAME (gpuobs.catalog or gpuobs.records)"


def test_the_literal_check_sees_names():
    source = ('X = "cluster:gpuobs_gpus_lost:count"\n'
              'def f():\n    """gpuobs_gpu_up"""\n    return f"{x} gpuobs_gpu_up"\n')
    assert typed_names(source) == ["cluster:gpuobs_gpus_lost:count", "gpuobs_gpu_up"]


# ------------------------------------------------------------------------------------------ runbooks
def unknown_names(text: str) -> list[str]:
    """Metric and record names in a text that neither the catalog nor the records define."""
    defined = {r.name for r in records.RECORDS}
    return ([n for n in RECORD.findall(text) if n not in defined]
            + [n for n in METRIC.findall(text) if n not in SAMPLES | LABELS])


def test_every_runbook_names_only_metrics_and_records_that_exist():
    assert set(runbooks.RUNBOOKS) == {a.name for a in alerts(DEFAULT)}
    for name in runbooks.RUNBOOKS:
        text = "\n".join(runbooks.render(name).values())
        assert "$" not in text, f"{name}: a $NAME left unfilled"
        assert not unknown_names(text), f"{name} names {unknown_names(text)}, which do not exist"


def test_the_runbook_check_catches_names_that_do_not_exist():
    assert unknown_names("rate(gpuobs_gpu_power_usage_watts_total[5m]) and cluster:gpuobs_gpus_gone:count") == [
        "cluster:gpuobs_gpus_gone:count", "gpuobs_gpu_power_usage_watts_total"]
    assert not unknown_names('gpuobs_gpu_power_usage_watts{gen_ai_request_model="m"} / '
                             "job_id:gpuobs_training_tokens:rate")
    with pytest.raises(KeyError):  # a $NAME that is neither a catalog metric nor a record
        Template("$POWER_USAGES").substitute(runbooks.names())
    values = runbooks.names()
    assert values["POWER_USAGE"] == "gpuobs_gpu_power_usage_watts" and values["ECC_ERRORS"].endswith("_total")
    assert values["STRAGGLER_RATIO"] == records.STRAGGLER_RATIO.name


# --------------------------------------------------------------------------------------- a rename
# New names as long as the old ones: the YAML writer folds long lines, so only then is each file
# exactly the old one with the names replaced.
RENAMES = {c.POWER_USAGE: "gpuobs_gpu_board_power_watts",  # a gauge: panels, records, runbooks
           c.COMPUTE: "gpuobs_training_working_seconds"}  # a counter feeding the straggler records and alert


@contextmanager
def renamed(renames: dict[c.Metric, str]):
    """Catalog metrics renamed in place. Each Metric is a singleton every reader holds (as a module
    attribute, in GPM_METRICS, QUANTILES, ALL): renaming the object is renaming the metric, and a
    name that was copied into a string at import keeps the old one."""
    old = {m: m.name for m in renames}
    try:
        for m, name in renames.items():
            object.__setattr__(m, "name", name)
        yield
    finally:
        for m, name in old.items():
            object.__setattr__(m, "name", name)


def generate() -> dict[str, str]:
    """Every generated file's content, built now in memory (nothing written), and the fast rules."""
    out = {str(p): text for build in (alerts_build, dashboards_build) for p, text in build.outputs().items()}
    out["fast rules"] = alerts_build.rules_file(FAST)
    return out


def test_renaming_a_catalog_metric_renames_every_reference():
    old = {m.name: new for m, new in RENAMES.items()}
    assert all(len(o) == len(n) for o, n in old.items())
    before = generate()
    with renamed(RENAMES):
        after = generate()
        assert records.CLUSTER_POWER.name == "cluster:gpuobs_gpu_board_power_watts:sum"
        assert records.STRAGGLER_RATIO.name == "job_id_rank:gpuobs_training_working_seconds:ratio_to_others"
    assert c.POWER_USAGE.name == "gpuobs_gpu_power_usage_watts"  # restored
    for name, new in old.items():
        referring = sorted(p for p, text in before.items() if name in text)
        # the rules (records and alerts), the dashboards and the runbooks all named it
        assert any(p.endswith(".rules.yml") for p in referring) and any(p.endswith(".json") for p in referring)
        assert any("runbooks" in p for p in referring), referring
        assert not [p for p, text in after.items() if name in text], f"{name} still named after the rename"
        assert all(new in after[p] for p in referring)
    expected = {p: _replace(text, old) for p, text in before.items()}
    assert [p for p in before if after[p] != expected[p]] == [], "a rename changed more than the names"


def _replace(text: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        text = text.replace(old, new)
    return text


# ------------------------------------------------------------------------------ runbook thresholds
FENCE = re.compile(r"```.*?```", re.S)  # PromQL examples: their windows are examples, not thresholds


def _prose(text: str) -> str:
    """A runbook text as prose: code blocks and `$thresholds.FIELD` tokens taken out, lines joined."""
    return " ".join(re.sub(r"\$thresholds\.\w+", "<t>", FENCE.sub(" ", text)).split())


def _quotes(t) -> dict[str, list[str]]:
    """How prose would quote each Thresholds field of t literally: a duration in words (and "5-minute",
    "an hour"), a share in percent, a temperature in °C, seconds in s, a factor as "1.2 times" or
    "1.2x", an hourly count; plain strings and small counts are left out (too common to tell)."""
    values = runbooks.threshold_values(t)
    quotes: dict[str, list[str]] = {}
    for key, text in values.items():
        name = key.removeprefix("thresholds.")
        raw = getattr(t, name, None)
        if isinstance(raw, str) and text != raw:  # a duration
            number, unit = text.split()
            quotes[name] = [text, f"{number}-{unit.rstrip('s')}"] + (
                [f"an {unit}", f"last {unit}", f"a {unit}"] if number == "1" else [])
        elif name.endswith(("_share", "_utilization", "_ratio")) or name.endswith("_bytes"):
            quotes[name] = [text]
        elif name.endswith("_c"):
            quotes[name] = [f"{text} °C"]
        elif name.endswith("_seconds"):
            quotes[name] = [f"{text} s"]
        elif name in ("step_regression", "straggler", "trend_factor"):
            quotes[name] = [f"{text} times", f"{text}x"]
        elif name.endswith("_per_h"):
            quotes[name] = [f"{text} an hour", f"{text} per hour", f"{text} single-bit"]
    return quotes


# Literal quotes of a default value that are not that threshold (checked by hand, each with its reason)
NOT_THRESHOLDS = {
    ("Watchdog", "1-minute"),  # the watchdog route's repeat interval, an Alertmanager setting
    ("TrainingStepTimeRegression", "5-minute"),  # the in-process quantile window of gpuobs.instrument
    ("InferenceLatencyHigh", "5 minutes"),  # the same in-process window, for requests
    ("GpuExporterGone", "a minute"),  # how soon a restarted pod is a target again
}


def literal_threshold_quotes(t=DEFAULT) -> list[tuple[str, str, str]]:
    """(alert, field, quote) for each runbook prose that quotes a value of t's Thresholds literally
    instead of through its `$thresholds.FIELD` token."""
    found = []
    for alert, sections in runbooks.RUNBOOKS.items():
        prose = _prose("\n".join(sections.values()))
        for name, quotes in _quotes(t).items():
            for quote in quotes:
                if re.search(rf"(?<![\w.]){re.escape(quote)}(?![\w.])", prose) and (alert, quote) not in NOT_THRESHOLDS:
                    found.append((alert, name, quote))
    return found


def test_runbooks_quote_thresholds_only_through_their_tokens():
    """A number a runbook quotes from Thresholds is rendered from the Thresholds in use: none is typed."""
    assert literal_threshold_quotes() == []


def test_the_threshold_quote_check_sees_a_typed_number(monkeypatch):
    text = dict(runbooks.RUNBOOKS["TrainingStalled"])
    text["meaning"] = "A rank has not finished a step for 10 minutes; over 30 % of the time is data wait."
    monkeypatch.setitem(runbooks.RUNBOOKS, "TrainingStalled", text)
    assert {(a, n) for a, n, _ in literal_threshold_quotes()} >= {
        ("TrainingStalled", "training_stall"), ("TrainingStalled", "data_wait_share")}


def test_runbooks_render_the_thresholds_in_use():
    """Other Thresholds, other numbers in the prose: what the runbook quotes is what the rule uses."""
    import dataclasses

    other = dataclasses.replace(DEFAULT, training_stall="17m", flap_share=0.25, temp_margin_c=7.0,
                                ecc_corrected_per_s=30 / 3600, long_window="2h", keep_firing="9m")
    stalled = runbooks.render("TrainingStalled", other)["meaning"]
    assert "for 17 minutes" in stalled and "10 minutes" not in stalled
    assert "25 %" in runbooks.render("GpuLost", other)["meaning"]
    assert "within 7 °C" in runbooks.render("GpuTemperatureNearSlowdown", other)["meaning"]
    assert "more than 30 single-bit" in runbooks.render("GpuEccCorrectedRate", other)["meaning"]
    assert "kept 9 minutes more" in runbooks.render("GpuXidRebootRequired", other)["meaning"]
    assert alerts_build.runbook(alerts(other)[0], other) != alerts_build.runbook(alerts(DEFAULT)[0], DEFAULT)
    fast = runbooks.render("TrainingStalled", FAST)["meaning"]
    assert f"for {FAST.training_stall[:-1]} seconds" in fast
    with pytest.raises(KeyError):  # a token naming no field
        runbooks._Text("$thresholds.no_such_field").substitute(runbooks.names() | runbooks.threshold_values())


DEGRADATION = ("GpuEccCorrectedRising", "GpuPcieReplaysRising", "GpuNvlinkErrorsRising", "GpuRowRemapBanksDepleting",
               "GpuTemperatureTrendingToSlowdown", "GpuPowerBrakeRepeated")


def test_degradation_alerts_say_drain_and_plan_the_replacement():
    pack = {a.name: a for a in alerts(DEFAULT)}
    for name in DEGRADATION:
        action = runbooks.render(name)["action"]
        assert action.startswith("The GPU is degrading: drain it and plan its replacement."), name
        assert "kubectl cordon" in action and "scontrol update" in action, name
        assert pack[name].severity == "warning" and "drain it and plan its replacement" in pack[name].summary
