"""The generated Alertmanager configuration: amtool accepts it and routes each severity to its
receiver; generated alerting files equal what the code generates."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from conftest import REPO, require_tool
from gpuobs.alerts.build import ROOT, build, outputs
from gpuobs.alerts.rules import DEFAULT, SEVERITIES, alerts


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
    in_grafana = {r["grafana_alert"]["title"] for g in grafana["groups"] for r in g["rules"]}
    expected = {a.name for a in alerts(DEFAULT)}
    assert in_rule == expected == in_grafana
    for g in grafana["groups"]:
        for r in g["rules"]:
            assert r["for"] and r["labels"]["severity"] and r["annotations"]["runbook_url"].startswith("docs/runbooks/")


@pytest.mark.parametrize("profile", ["gpuobs.rules.yml", "gpuobs-fast.rules.yml"])
def test_promtool_checks_each_rule_file(profile):
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "rules", str(REPO / "alerts" / profile)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
