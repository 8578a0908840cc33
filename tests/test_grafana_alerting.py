"""alerts/grafana-alerting.json against Grafana's file-provisioning format for alert rules, as Grafana
documents it and as its provisioning loader reads it, not against what our generator means to write.

Checked in grafana/grafana:

- docs/sources/alerting/set-up/provision-alerting-resources/file-provisioning/index.md: `apiVersion: 1`;
  `groups[]` with `orgId` (default 1), `name`, `folder`, `interval` (a duration), `rules[]`; each rule
  with `uid`, `title`, `condition` ("which query should be used for the condition"), `data[]` (queries:
  `refId`, `datasourceUid`, `model`; expressions use the datasource `__expr__`), `noDataState`
  (NoData, Alerting, OK), `execErrState` (Error, Alerting, OK), `for`, `annotations`, `labels`.
- pkg/services/provisioning/alerting/rules_types.go: the loader's structs `AlertRuleGroupV1`,
  `AlertRuleV1` (also `dashboardUid`, `panelId`, `keepFiringFor`, `isPaused`,
  `missing_series_evals_to_resolve`, `notification_settings`, `record`) and `QueryV1` (`refId`,
  `queryType`, `relativeTimeRange`, `datasourceUid`, `model`), and what it rejects: "rule group has no
  name set", "rule group has no folder set", an interval, `for` or `keepFiringFor` that
  prometheus/common's `model.ParseDuration` refuses, "rule has no title set", "no UID set", an unknown
  noDataState/execErrState, "no data set", "no condition set".
- pkg/services/provisioning/alerting/config_reader.go: `.json` files are read with `yaml.Unmarshal`.
- pkg/services/provisioning/values/values.go: string values go through `os.ExpandEnv` (`$$` for a
  literal `$`); labels are, annotations are not (pull request 54975, and the docs' "Template variable
  interpolation" section, pull request 84106).
- pkg/util/shortid_generator.go: a UID has at most 40 characters, letters, digits, `-` and `_`.
- pkg/services/ngalert/models: `RelativeTimeRange` from/to are whole seconds (YAML integers), and a
  query that is not an expression needs from > to; the condition must be one of the rule's refIds
  ("Condition ... does not exist, must be one of ..."); a group's interval must divide exactly by the
  scheduler's base interval (10 s by default; `ValidateRuleGroupInterval`); titles and group names have
  at most 190 characters.
- Grafana's template docs: in Grafana `$value` is a string of every query's labels and values; a query's
  number is `$values.<refId>.Value`.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import REPO

PATH = REPO / "alerts" / "grafana-alerting.json"
TOP_KEYS = {"apiVersion", "groups", "deleteRules"}
GROUP_KEYS = {"orgId", "name", "folder", "interval", "rules"}
RULE_KEYS = {"uid", "title", "condition", "data", "dasboardUid", "dashboardUid", "panelId", "noDataState",
             "execErrState", "for", "keepFiringFor", "missing_series_evals_to_resolve", "annotations", "labels",
             "isPaused", "notification_settings", "record"}
RULE_REQUIRED = {"uid", "title", "condition", "data", "for"}  # "<..., required>" in the docs' example
QUERY_KEYS = {"refId", "queryType", "relativeTimeRange", "datasourceUid", "model"}
NO_DATA_STATES = {"NoData", "Alerting", "OK", "KeepLast"}
EXEC_ERR_STATES = {"Error", "Alerting", "OK", "KeepLast"}
EXPRESSION_UIDS = {"__expr__", "-100"}  # "-100": the older name of the expression datasource
EXPRESSION_TYPES = {"math", "reduce", "resample", "classic_conditions", "threshold", "sql"}
UID = re.compile(r"^[a-zA-Z0-9\-_]{1,40}$")
# prometheus/common model.ParseDuration: units largest first, each at most once; "0" alone is zero
DURATION = re.compile(r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$")
UNITS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
BASE_INTERVAL_S = 10


def parse_duration(text: str) -> float:
    """Seconds, as Prometheus parses a duration; ValueError where it would fail."""
    if text == "0":
        return 0.0
    if not text or not DURATION.match(text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * UNITS[u] for n, u in re.findall(r"([0-9]+)(ms|y|w|d|h|m|s)", text))


@pytest.fixture(scope="module")
def provisioning() -> dict:
    text = PATH.read_text()
    doc = json.loads(text)
    assert yaml.safe_load(text) == doc, "Grafana reads .json provisioning files as YAML: it must read the same"
    return doc


def rules(doc: dict):
    for group in doc["groups"]:
        for rule in group["rules"]:
            yield group, rule


def test_parse_duration_follows_prometheus():
    assert parse_duration("1h30m") == 5400 and parse_duration("0") == 0 and parse_duration("0s") == 0
    for bad in ("", "1.5m", "5 m", "m", "1m1h", "-1m", "1M"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_file_envelope(provisioning):
    assert set(provisioning) <= TOP_KEYS
    assert provisioning["apiVersion"] == 1
    assert isinstance(provisioning["groups"], list) and provisioning["groups"]


def test_rule_groups(provisioning):
    seen = set()
    for group in provisioning["groups"]:
        assert set(group) <= GROUP_KEYS and {"name", "folder", "interval", "rules"} <= set(group), group.keys()
        org = group.get("orgId", 1)  # "<int> organization ID, default = 1"
        assert isinstance(org, int) and not isinstance(org, bool) and org >= 1
        for key in ("name", "folder", "interval"):
            assert isinstance(group[key], str) and group[key].strip(), (key, group.get("name"))
            assert "$" not in group[key], f"{key} would be expanded as an environment variable"
        assert len(group["name"]) <= 190
        interval = parse_duration(group["interval"])
        assert interval > 0 and interval % BASE_INTERVAL_S == 0, group["interval"]
        assert (org, group["folder"], group["name"]) not in seen, "one group per name and folder"
        seen.add((org, group["folder"], group["name"]))
        assert isinstance(group["rules"], list) and group["rules"], group["name"]


def test_rules_are_at_rule_level_not_in_the_ruler_api_shape(provisioning):
    """The ruler API nests title, condition and data under `grafana_alert`; the loader reads them from the
    rule itself and rejects such a rule with "rule has no title set"."""
    for _group, rule in rules(provisioning):
        assert "grafana_alert" not in rule
        assert set(rule) <= RULE_KEYS, sorted(set(rule) - RULE_KEYS)
        assert RULE_REQUIRED <= set(rule), sorted(RULE_REQUIRED - set(rule))


def test_uids_and_titles(provisioning):
    uids, titles = set(), set()
    for group, rule in rules(provisioning):
        assert isinstance(rule["uid"], str) and UID.match(rule["uid"]), rule["uid"]
        assert rule["uid"] not in uids, f"duplicate uid {rule['uid']}"
        uids.add(rule["uid"])
        title = rule["title"]
        assert isinstance(title, str) and title.strip() and len(title) <= 190 and "$" not in title
        assert (group["folder"], title) not in titles, f"duplicate title {title} in folder {group['folder']}"
        titles.add((group["folder"], title))


def test_states_durations_and_flags(provisioning):
    for _, rule in rules(provisioning):
        name = rule["title"]
        assert rule.get("noDataState", "NoData") in NO_DATA_STATES, name
        assert rule.get("execErrState", "Alerting") in EXEC_ERR_STATES, name
        for key in ("for", "keepFiringFor"):
            if key in rule:
                assert isinstance(rule[key], str) and parse_duration(rule[key]) >= 0, (name, key)
        assert isinstance(rule.get("isPaused", False), bool), name


def test_queries_and_condition(provisioning):
    for _, rule in rules(provisioning):
        name, data = rule["title"], rule["data"]
        assert isinstance(data, list) and data, f"{name}: no data set"
        refs = [q.get("refId") for q in data]
        assert all(isinstance(r, str) and r for r in refs) and len(set(refs)) == len(refs), (name, refs)
        assert isinstance(rule["condition"], str) and rule["condition"] in refs, \
            f"{name}: condition {rule['condition']} does not exist, must be one of {refs}"
        for q in data:
            assert set(q) <= QUERY_KEYS and {"refId", "datasourceUid", "model"} <= set(q), (name, q.keys())
            uid, model = q["datasourceUid"], q["model"]
            assert isinstance(uid, str) and uid.strip() and "$" not in uid, (name, q["refId"])
            assert isinstance(model, dict) and model.get("refId") == q["refId"], (name, q["refId"])
            rtr = q.get("relativeTimeRange", {"from": 0, "to": 0})
            assert set(rtr) == {"from", "to"}, (name, rtr)
            assert all(type(rtr[k]) is int and rtr[k] >= 0 for k in ("from", "to")), \
                f"{name}: relativeTimeRange takes whole seconds: {rtr}"
            if uid in EXPRESSION_UIDS:
                assert model.get("type") in EXPRESSION_TYPES, (name, model.get("type"))
                assert model.get("datasource", {}).get("uid", uid) in EXPRESSION_UIDS
                expression = model.get("expression", "")
                used = set(re.findall(r"\$\{?([A-Za-z][A-Za-z0-9_]*)", expression)) if model["type"] == "math" \
                    else {expression}
                assert used and used <= set(refs) - {q["refId"]}, f"{name}: {q['refId']} reads {used}"
            else:
                assert rtr["from"] > rtr["to"], f"{name}: query {q['refId']} has an empty time range"
                assert model.get("datasource", {}).get("uid") == uid, (name, q["refId"])
                assert isinstance(model.get("expr"), str) and model["expr"].strip(), (name, q["refId"])


def test_labels_and_annotations(provisioning):
    for _, rule in rules(provisioning):
        name = rule["title"]
        refs = {q["refId"] for q in rule["data"]}
        for key in ("labels", "annotations"):
            values = rule.get(key, {})
            assert isinstance(values, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in values.items()), (name, key)
        # labels go through os.ExpandEnv: a `$` would be replaced by an environment variable (or nothing)
        assert not any("$" in v for v in rule.get("labels", {}).values()), name
        for text in rule.get("annotations", {}).values():
            assert "${" not in text, f"{name}: braced variables are expanded from the environment"
            assert not re.search(r"\$value\b", text), f"{name}: Grafana's $value is a string, not a number"
            assert set(re.findall(r"\$values\.([A-Za-z0-9_]+)\.", text)) <= refs, name
        url = rule.get("annotations", {}).get("runbook_url", "")
        assert re.match(r"^https?://[^/\s]+/\S+\.md$", url), f"{name}: runbook_url {url!r} is not absolute"


def test_same_pack_as_the_prometheus_rules(provisioning):
    """Each Grafana rule runs the PromQL of the Prometheus rule of the same name, with its for,
    keep_firing_for and labels."""
    prom = {r["alert"]: r for g in yaml.safe_load((REPO / "alerts" / "gpuobs.rules.yml").read_text())["groups"]
            for r in g["rules"] if "alert" in r}
    grafana = {rule["title"]: rule for _, rule in rules(provisioning)}
    assert set(grafana) == set(prom)
    for name, rule in grafana.items():
        queries = [q for q in rule["data"] if q["datasourceUid"] not in EXPRESSION_UIDS]
        assert [q["model"]["expr"] for q in queries] == [prom[name]["expr"]], name
        assert parse_duration(rule["for"]) == parse_duration(prom[name]["for"]), name
        assert parse_duration(rule.get("keepFiringFor", "0")) == parse_duration(prom[name].get("keep_firing_for", "0"))
        assert rule["labels"] == prom[name]["labels"], name
        assert rule["annotations"]["runbook_url"] == prom[name]["annotations"]["runbook_url"], name
