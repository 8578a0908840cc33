"""The generated Alertmanager configuration: amtool accepts it and routes each severity to its
receiver; generated alerting files equal what the code generates."""

from __future__ import annotations

import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

from conftest import REPO, require_tool
from gpuobs.alerts.build import ROOT, alertmanager_config, build, outputs
from gpuobs.alerts.rules import DEFAULT, DEFAULT_RUNBOOK_BASE, SEVERITIES, Thresholds, alerts


def test_generated_files_are_up_to_date():
    assert ROOT == REPO
    stale = build(check=True)
    assert not stale, f"run `gpuobs alerts build`: {[str(p.relative_to(REPO)) for p in stale]}"


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
    for labels, receiver in [({"severity": "critical", "alertname": "GpuLost"}, "pager"),
                             ({"severity": "warning", "alertname": "GpuRowRemapPending"}, "ticket"),
                             ({"severity": "info", "alertname": "GpuFleetIdleCapacity"}, "null"),
                             ({"severity": "none", "alertname": "Watchdog"}, "watchdog")]:
        args = [f"{k}={v}" for k, v in labels.items()]
        out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}", *args],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == receiver, (labels, out.stdout, out.stderr)


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


def test_runbook_urls_are_absolute_and_name_their_runbook():
    """On-call clicks runbook_url in Alertmanager and chat: an absolute http(s) URL, the base, then
    docs/runbooks' file of the alert, in every generated rule file."""
    assert urlsplit(DEFAULT_RUNBOOK_BASE).scheme == "https" and urlsplit(DEFAULT_RUNBOOK_BASE).netloc
    assert DEFAULT_RUNBOOK_BASE.endswith("/docs/runbooks")
    for name in ("gpuobs.rules.yml", "gpuobs-fast.rules.yml", "prometheusrule.yaml"):
        doc = yaml.safe_load((REPO / "alerts" / name).read_text())
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


def test_runbook_base_from_the_command_line_and_the_environment(tmp_path):
    from click.testing import CliRunner

    from gpuobs.cli import main

    assert Thresholds(runbook_base="http://wiki.example.com/gpu/").runbook_url("GpuLost") == \
        "http://wiki.example.com/gpu/GpuLost.md"
    runner = CliRunner()
    out = runner.invoke(main, ["alerts", "build", "--out", str(tmp_path / "a"), "--runbook-base-url",
                               "https://wiki.example.com/gpu-runbooks/"])
    assert out.exit_code == 0, out.output
    rules = (tmp_path / "a" / "alerts" / "gpuobs.rules.yml").read_text()
    assert "runbook_url: https://wiki.example.com/gpu-runbooks/GpuLost.md" in rules
    assert DEFAULT_RUNBOOK_BASE not in rules and (tmp_path / "a" / "docs" / "runbooks" / "GpuLost.md").exists()
    assert "https://wiki.example.com/gpu-runbooks/GpuLost.md" in \
        (tmp_path / "a" / "alerts" / "grafana-alerting.json").read_text()
    out = runner.invoke(main, ["alerts", "build", "--out", str(tmp_path / "b")],
                        env={"GPUOBS_RUNBOOK_BASE_URL": "https://runbooks.example.org"})
    assert out.exit_code == 0, out.output
    fast = (tmp_path / "b" / "alerts" / "gpuobs-fast.rules.yml").read_text()
    assert "https://runbooks.example.org/GpuLost.md" in fast
    out = runner.invoke(main, ["alerts", "build", "--out", str(tmp_path / "c"), "--runbook-base-url", "docs/runbooks"])
    assert out.exit_code == 2 and "absolute http(s) URL" in out.output
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("profile", ["gpuobs.rules.yml", "gpuobs-fast.rules.yml"])
def test_promtool_checks_each_rule_file(profile):
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "rules", str(REPO / "alerts" / profile)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


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
