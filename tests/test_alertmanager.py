"""The generated Alertmanager configuration: amtool accepts it and routes each severity to its
receiver; the generated alerting files carry the pack (their drift: tests/test_generate.py)."""

from __future__ import annotations

import subprocess
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import REPO, require_tool

from gpuobs.alerts.build import RECEIVERS, alertmanager_config, outputs, receiver_urls, write_fast_rules
from gpuobs.alerts.rules import DEFAULT, DEFAULT_RUNBOOK_BASE, FAST, SEVERITIES, Thresholds, alerts


def test_every_alert_follows_the_conventions():
    names = set()
    for a in alerts(DEFAULT):
        assert a.name[0].isupper() and "_" not in a.name and a.name not in names, a.name
        names.add(a.name)
        assert a.severity in SEVERITIES or a.name == "Watchdog", a.name
        assert a.for_, f"{a.name} needs an explicit for"
        assert "{{" not in a.summary, f"{a.name}: summary must not be templated"
        assert "{{" in a.description or a.scope == "cluster", f"{a.name}: description should carry identity"
        if a.scope == "gpu":
            assert "$labels.uuid" in a.description and "$labels.node" in a.description, a.name
        assert (REPO / "docs" / "runbooks" / f"{a.name}.md").exists(), a.name


def test_runbooks_have_every_section():
    for path, text in outputs().items():
        if path.parent.name == "runbooks":
            for section in ("## Meaning", "## Impact", "## Diagnosis", "## Action"):
                assert section in text, f"{path.name} lacks {section}"


def test_amtool_checks_config_and_routes_each_severity(tmp_path):
    amtool = require_tool("amtool")
    config = REPO / "alerts" / "alertmanager.yml"
    out = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    job = {"scope": "job", "cluster": "c1", "job_id": "j1"}
    for labels, receiver in [({"severity": "critical", "alertname": "GpuLost", "scope": "gpu"}, "pager"),
                             ({"severity": "warning", "alertname": "GpuRowRemapPending"}, "ticket"),
                             ({"severity": "info", "alertname": "GpuFleetIdleCapacity"}, "null"),
                             ({"severity": "none", "alertname": "Watchdog", "scope": "cluster"}, "watchdog"),
                             # a job's critical alerts page its owner; its warnings are tickets
                             ({"severity": "critical", "alertname": "TrainingCollectiveTimeout", **job}, "job-owner"),
                             ({"severity": "critical", "alertname": "TrainingStalled", **job}, "job-owner"),
                             ({"severity": "warning", "alertname": "TrainingNcclError", **job}, "ticket"),
                             # a GPU's critical alert stays on-call's, whatever job runs on it
                             ({"severity": "critical", "alertname": "GpuEccErrorFromLogs", "scope": "gpu",
                               "job_id": "j1"}, "pager")]:
        args = [f"{k}={v}" for k, v in labels.items()]
        out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}", *args],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == receiver, (labels, out.stdout, out.stderr)


def test_the_job_owner_route_groups_by_job():
    route = next(r for r in alertmanager_config()["route"]["routes"] if r["receiver"] == "job-owner")
    assert route["group_by"] == ["cluster", "job_id"] and 'scope="job"' in route["matchers"]
    pack = {a.name: a for a in alerts(DEFAULT)}
    for name in ("TrainingCollectiveTimeout", "TrainingCollectivePeerCrash", "TrainingCudaOOM",
                 "TrainingCudaIllegalAddress"):
        assert pack[name].scope == "job" and pack[name].severity == "critical", name


def test_receivers_missing_from_the_callers_dict_fall_back_to_the_pager_url():
    """Callers pass webhook URLs for the receivers they know; one they lack (job-owner, added later)
    gets the pager's URL with its own name as the last path segment, so no KeyError and its
    notifications stay apart."""
    urls = {"pager": "http://127.0.0.1:9/hooks/pager", "ticket": "http://127.0.0.1:9/hooks/ticket",
            "watchdog": "http://127.0.0.1:9/hooks/watchdog"}
    config = alertmanager_config(urls, fast=True)
    got = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"] if "webhook_configs" in r}
    assert got == {**urls, "job-owner": "http://127.0.0.1:9/hooks/job-owner"}
    assert set(got) == set(RECEIVERS) and {r["name"] for r in config["receivers"]} == {*RECEIVERS, "null"}
    assert receiver_urls()["job-owner"] == "http://webhook:5001/job-owner"
    assert receiver_urls({"job-owner": "http://owner.example/hook"})["job-owner"] == "http://owner.example/hook"
    routed = {r["receiver"] for r in config["route"]["routes"]} | {config["route"]["receiver"]}
    assert routed == {*RECEIVERS, "null"}, "every receiver is routed to, and only those"


def test_prometheus_rule_and_grafana_alerting_carry_the_same_pack():
    import json

    rule = yaml.safe_load((REPO / "alerts" / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    in_rule = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    grafana = json.loads((REPO / "alerts" / "grafana-alerting.json").read_text())
    in_grafana = {r["title"] for g in grafana["groups"] for r in g["rules"]}  # tests/test_grafana_alerting.py: format
    expected = {a.name for a in alerts(DEFAULT)}
    assert in_rule == expected == in_grafana
    for g in grafana["groups"]:
        for r in g["rules"]:
            assert r["for"] and r["labels"]["severity"]
            assert r["annotations"]["runbook_url"].startswith(DEFAULT_RUNBOOK_BASE)


def test_runbook_urls_are_absolute_and_name_their_runbook(tmp_path):
    """On-call clicks runbook_url in Alertmanager and chat: an absolute http(s) URL, the base, then
    docs/runbooks' file of the alert, in every generated rule file (the fast one, built, too)."""
    assert urlsplit(DEFAULT_RUNBOOK_BASE).scheme == "https" and urlsplit(DEFAULT_RUNBOOK_BASE).netloc
    assert DEFAULT_RUNBOOK_BASE.endswith("/docs/runbooks")
    committed = REPO / "alerts"
    for path in (committed / "gpuobs.rules.yml", write_fast_rules(tmp_path), committed / "prometheusrule.yaml"):
        name = path.name
        doc = yaml.safe_load(path.read_text())
        for g in doc.get("spec", doc)["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    url = r["annotations"]["runbook_url"]
                    assert url == f"{DEFAULT_RUNBOOK_BASE}/{r['alert']}.md", (name, url)
                    assert (REPO / "docs" / "runbooks" / f"{r['alert']}.md").exists(), url


@pytest.mark.parametrize("base", ["docs/runbooks", "/docs/runbooks", "ftp://example.com/runbooks",
                                  "https://", "example.com/runbooks", "https://wiki.example.com/run books",
                                  "https://wiki.example.com/runbooks?page=1", "https://wiki.example.com/x#y", ""])
def test_runbook_base_must_be_an_absolute_http_url(base):
    with pytest.raises(ValueError):
        Thresholds(runbook_base=base)


@pytest.mark.parametrize("profile", ["default", "fast"])
def test_promtool_checks_each_rule_file(profile, tmp_path):
    """The committed default profile, and the fast one as the demo and the tests build it."""
    promtool = require_tool("promtool")
    path = REPO / "alerts" / "gpuobs.rules.yml" if profile == "default" else write_fast_rules(tmp_path)
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    assert f"(profile {profile})" in path.read_text().splitlines()[0]


def test_fast_rules_are_built_where_used_with_the_fast_thresholds(tmp_path):
    path = write_fast_rules(tmp_path)
    assert path == tmp_path / "gpuobs-fast.rules.yml" and not (REPO / "alerts" / path.name).exists()
    rules = {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}
    fast, default = {a.name: a for a in alerts(FAST)}, {a.name: a for a in alerts(DEFAULT)}
    assert rules.keys() == fast.keys() == default.keys()
    assert all(rules[n]["for"] == fast[n].for_ for n in rules)
    assert any(fast[n].for_ != default[n].for_ for n in rules)  # seconds where the default waits minutes


def test_an_unusable_gpu_pages_once():
    """GpuLost and GpuUnhealthy split an unusable GPU by its reason (their promtool cases show one
    fires, never both); the sampling-timeout warning shares their family, so either inhibits it on
    that GPU; the exporter's self-health warnings are node-scoped, so NvmlDown and GpuExporterDown
    inhibit them."""
    pack = {a.name: a for a in alerts(DEFAULT)}
    lost, unhealthy, timeouts = pack["GpuLost"], pack["GpuUnhealthy"], pack["GpuSamplingTimeouts"]
    assert lost.severity == unhealthy.severity == "critical" and timeouts.severity == "warning"
    assert lost.family == unhealthy.family == timeouts.family and lost.scope == unhealthy.scope == timeouts.scope
    inhibit = alertmanager_config()["inhibit_rules"]
    same_family = [r for r in inhibit if r["source_matchers"] == ['severity="critical"']
                   and r["target_matchers"] == ['severity="warning"']]
    assert same_family and {"uuid", "family", "node"} <= set(same_family[0]["equal"])
    node_down = next(r for r in inhibit if r["source_matchers"] == ['alertname=~"GpuExporterDown|NvmlDown"'])
    assert node_down["target_matchers"][0] == 'scope=~"gpu|node"'
    for name in ("GpuXidWatcherDown", "GpuExporterCollectorFailing", "GpuMetricsStale"):
        assert pack[name].scope == "node", name
