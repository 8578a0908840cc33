"""promtool tests with known answers of the allocation records (gpuobs.records' allocation section):
GPUs allocated, used, wasted and their cost per hour by namespace, team (kube-state-metrics'
namespace labels) and Slurm job; the same as GPU-hours and money over the weekly window; pending GPU
demand from kube-state-metrics; Kueue's pending workloads and GPU quota use.

Every expected value is worked out here from the input series and the settings, never read from the
rules. The weekly window is shortened to WINDOW so that the test evaluates a few hundred times.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess

import pytest
import yaml
from conftest import require_tool

from gpuobs import records as r
from gpuobs.alerts.build import rule_groups
from gpuobs.alerts.rules import DEFAULT
from gpuobs.records import WEEKLY_GROUP, duration_seconds

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
H100_COST, OTHER_COST = 3.0, 1.25
# promtool's unit tests evaluate every group at evaluation_interval, whatever its own interval: the
# 30 s records are evaluated once per weekly step here (eval_interval), which the step records read as such
T = dataclasses.replace(DEFAULT, team_label="label_team", weekly_window="2h", weekly_interval="5m", eval_interval="5m",
                        gpu_hour_costs=((".*H100.*", H100_COST),), gpu_hour_cost_default=OTHER_COST)
# (node, gpu, model, utilisation, attribution labels) of every GPU
GPUS = [
    ("n1", 0, H100, 0.5, {"k8s_namespace": "a", "k8s_pod": "a-0"}),
    ("n1", 1, H100, 0.5, {"k8s_namespace": "a", "k8s_pod": "a-0"}),
    ("n1", 2, H100, 1.0, {"k8s_namespace": "a", "k8s_pod": "a-1"}),
    ("n1", 3, H100, 0.0, {"k8s_namespace": "a", "k8s_pod": "a-1"}),  # held but idle: wasted
    ("n2", 0, A100, 0.0, {"k8s_namespace": "b", "k8s_pod": "b-0"}),
    ("n2", 1, A100, 0.25, {"k8s_namespace": "b", "k8s_pod": "b-0"}),
    ("n2", 2, A100, 0.0, {}),  # no pod holds it: idle, but nobody's waste
    ("n3", 0, H100, 0.25, {"k8s_namespace": "c", "k8s_pod": "c-0"}),
    ("n3", 1, H100, None, {"k8s_namespace": "c", "k8s_pod": "c-0"}),  # in MIG mode: no utilization (NVML gives none)
    ("n4", 0, H100, 0.0, {"hpc_job": "42"}),
    ("n4", 1, H100, 0.75, {"hpc_job": "42"}),
]
TEAMS = {"a": "ml", "c": "ml"}  # namespace b has no team label: its own team
EVAL = T.weekly_window  # input starts one step late: the same samples in the window, closed at its start or not


def labels(node: str, gpu: int) -> dict:
    return {"cluster": "east", "node": node, "instance": f"{node}:9445", "job": "gpuobs", "gpu": str(gpu),
            "uuid": f"GPU-{node}-{gpu}"}


def s(metric: str, lbl: dict, value: float) -> dict:
    sel = ",".join(f'{k}="{v}"' for k, v in lbl.items())
    return {"series": f"{metric}{{{sel}}}", "values": f"_x10 {value:g}x300"}  # none in the first 5m step


def gpu_series() -> list[dict]:
    out = []
    for node, i, model, util, who in GPUS:
        if util is not None:
            out.append(s("gpuobs_gpu_utilization_ratio", {**labels(node, i), **who}, util))
        out.append(s("gpuobs_gpu_up", {**labels(node, i), **who}, 1))
        out.append(s("gpuobs_gpu_info", {**labels(node, i), "name": model, **who}, 1))
    return out


def k8s_series() -> list[dict]:
    ksm = {"job": "kube-state-metrics", "cluster": "east"}
    out = [s(r.KSM_NAMESPACE_LABELS, {**ksm, "namespace": ns, "label_team": team}, 1) for ns, team in TEAMS.items()]
    out.append(s(r.KSM_NAMESPACE_LABELS, {**ksm, "namespace": "b"}, 1))
    pods = {("p1", "Pending"): (1, 1), ("p2", "Pending"): (4,), ("p3", "Running"): (8,)}  # GPUs per container
    for (pod, phase), containers in pods.items():
        for other in ("Pending", "Running"):
            out.append(s(r.KSM_PHASE, {**ksm, "namespace": "a", "pod": pod, "phase": other}, int(other == phase)))
        for n, gpus in enumerate(containers):
            req = {**ksm, "namespace": "a", "pod": pod, "container": f"c{n}", "unit": "integer"}
            out.append(s(r.KSM_REQUESTS, {**req, "resource": "nvidia_com_gpu"}, gpus))
            out.append(s(r.KSM_REQUESTS, {**req, "resource": "cpu", "unit": "core"}, 16))
    return out


QUEUE = {"cq": {"f1": (8, 10), "f2": (4, 6)}}  # cluster queue: flavor: (GPUs in use, nominal quota)


def kueue_series() -> list[dict]:
    kueue = {"job": "kueue", "cluster": "east", "cluster_queue": "cq"}
    out = [s(r.KUEUE_PENDING, {**kueue, "status": "active"}, 2),
           s(r.KUEUE_PENDING, {**kueue, "status": "inadmissible"}, 1)]
    for flavor, (used, quota) in QUEUE["cq"].items():
        for resource, scale in (("nvidia.com/gpu", 1), ("cpu", 100)):
            lbl = {**kueue, "flavor": flavor, "resource": resource}
            out += [s(r.KUEUE_USAGE, lbl, used * scale), s(r.KUEUE_QUOTA, lbl, quota * scale)]
    return out


def cost(model: str) -> float:
    return H100_COST if "H100" in model else OTHER_COST


def expected(key: str, value: str) -> dict[str, float]:
    """{allocated, used, wasted, allocated_cost, wasted_cost} of the GPUs whose `key` is value."""
    mine = [(model, util) for _, _, model, util, who in GPUS if who.get(key) == value]
    wasted = [(model, util) for model, util in mine if util is not None and util <= T.idle_utilization]
    return {"allocated": len(mine), "used": sum(u for _, u in mine if u is not None), "wasted": len(wasted),
            "allocated_cost": sum(cost(m) for m, _ in mine), "wasted_cost": sum(cost(m) for m, _ in wasted)}


def team_of(ns: str) -> str:
    return TEAMS.get(ns, ns)


def expected_team(team: str) -> dict[str, float]:
    namespaces = {who["k8s_namespace"] for *_, who in GPUS if "k8s_namespace" in who}
    parts = [expected("k8s_namespace", ns) for ns in sorted(namespaces) if team_of(ns) == team]
    return {k: sum(p[k] for p in parts) for k in parts[0]}


def rounded(v: float) -> float:
    return math.floor(v * 1e6 + 0.5) / 1e6


def check(record: r.Record, lbl: dict, value: float) -> dict:
    sel = ",".join(f'{k}="{v}"' for k, v in lbl.items())
    return {"expr": f"round({record.name}{{{sel}}}, 1e-6)",
            "exp_samples": [{"labels": f"{{{', '.join(f'{k}={chr(34)}{v}{chr(34)}' for k, v in lbl.items())}}}",
                             "value": rounded(value)}]}


def promtool(tmp_path, series: list[dict], tests: list[dict]) -> None:
    binary = require_tool("promtool")
    groups = [g for g in rule_groups(T) if g["name"] in ("gpuobs-recording", f"gpuobs-{WEEKLY_GROUP}")]
    assert [g["name"] for g in groups] == ["gpuobs-recording", f"gpuobs-{WEEKLY_GROUP}"]
    # one group, the 30 s records first: promtool may evaluate two groups of one tick in either order,
    # and a weekly step evaluated before the record it averages would miss that tick's sample
    one = {"name": "allocation", "rules": [rule for g in groups for rule in g["rules"]]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [one]}, sort_keys=False))
    # promtool evaluates every group at evaluation_interval: the weekly group's step, for its GPU-hours
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": T.weekly_interval,
           "tests": [{"interval": "30s", "input_series": series,
                      "promql_expr_test": [{"eval_time": EVAL, **t} for t in tests]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10 ** 6))
    out = subprocess.run([binary, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


NOW = {"allocated": "GPUS_ALLOCATED", "used": "GPUS_USED", "wasted": "GPUS_WASTED", "wasted_cost": "WASTED_COST"}
WEEK = {"allocated": "GPU_HOURS_ALLOCATED", "used": "GPU_HOURS_USED", "wasted": "GPU_HOURS_WASTED",
        "wasted_cost": "WASTED_COST_WEEK"}


def _tests_of(prefix: str, lbl: dict, want: dict[str, float]) -> list[dict]:
    hours = duration_seconds(T.weekly_window) / 3600  # every GPU held the whole window
    tests = [check(r.NAMES[f"{prefix}_{name}"], lbl, want[k]) for k, name in NOW.items()]
    return tests + [check(r.NAMES[f"{prefix}_{name}"], lbl, want[k] * hours) for k, name in WEEK.items()]


def test_the_worked_example_is_what_the_brief_says():
    a = expected("k8s_namespace", "a")
    assert a == {"allocated": 4, "used": 2.0, "wasted": 1, "allocated_cost": 12.0, "wasted_cost": 3.0}
    assert expected_team("ml")["allocated"] == 6 and expected_team("b")["allocated"] == 2  # ml: a's 4, c's 2
    assert expected("k8s_namespace", "c") == {"allocated": 2, "used": 0.25, "wasted": 0, "allocated_cost": 6.0,
                                              "wasted_cost": 0}  # the GPU in MIG mode: held, neither used nor wasted


def test_allocation_use_and_cost_by_namespace_team_and_job(tmp_path):
    east = {"cluster": "east"}
    tests = []
    for ns in ("a", "b", "c"):
        tests += _tests_of("NAMESPACE", {**east, "k8s_namespace": ns}, expected("k8s_namespace", ns))
    for team in ("ml", "b"):
        tests += _tests_of("TEAM", {**east, "team": team}, expected_team(team))
    tests += _tests_of("JOB", {**east, "hpc_job": "42"}, expected("hpc_job", "42"))
    # the unattributed GPU is nobody's: only the namespaces above have series
    tests.append({"expr": f"count({r.NAMESPACE_GPUS_ALLOCATED.name})", "exp_samples": [{"labels": "{}", "value": 3}]})
    promtool(tmp_path, gpu_series() + k8s_series(), tests)


def test_pending_demand_and_kueue_quota(tmp_path):
    pending = 1 + 1 + 4  # p1's two containers and p2; p3 runs
    used = sum(u for u, _ in QUEUE["cq"].values())
    quota = sum(q for _, q in QUEUE["cq"].values())
    assert (pending, used / quota) == (6, 0.75)
    queue = {"cluster": "east", "cluster_queue": "cq"}
    tests = [check(r.NAMESPACE_GPUS_PENDING, {"cluster": "east", "k8s_namespace": "a"}, pending),
             check(r.QUEUE_PENDING_WORKLOADS, queue, 3),
             check(r.QUEUE_GPU_USAGE, queue, used), check(r.QUEUE_GPU_QUOTA, queue, quota),
             check(r.QUEUE_GPU_QUOTA_USED, queue, used / quota)]
    promtool(tmp_path, k8s_series() + kueue_series(), tests)


@pytest.mark.parametrize("model, want", [(H100, DEFAULT.gpu_hour_costs[0][1]),
                                         ("Tesla T4", DEFAULT.gpu_hour_cost_default)])
def test_cost_table_first_match_then_default(model, want):
    import re
    got = next((c for rx, c in DEFAULT.gpu_hour_costs if re.fullmatch(rx, model)), DEFAULT.gpu_hour_cost_default)
    assert got == want
    assert f'name=~"{DEFAULT.gpu_hour_costs[0][0]}"' in r.gpu_hour_cost(DEFAULT)


def test_the_report_prices_and_judges_idle_like_the_rules():
    """gpuobs.report built from the same Thresholds prices every model of the example as the records do."""
    from gpuobs import report
    settings = report.Settings.from_thresholds(T)
    assert settings.idle_utilization == T.idle_utilization and settings.currency == T.currency
    assert {model: settings.cost(model) for _, _, model, _, _ in GPUS} == {H100: H100_COST, A100: OTHER_COST}
    assert report.Settings(costs={"NVIDIA A100-SXM4-40GB": 2.0, ".*A100.*": 9.0}).cost(A100) == 2.0  # exact first
