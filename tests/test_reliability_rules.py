"""promtool tests with known answers of the weekly reliability records (gpuobs.records, WEEKLY_GROUP):
GPU-hours, failures by class, failures per 1,000 GPU-hours, MTBF per node and model, GPU-hours lost
to failures and to checkpoint restarts, and the fleet's training goodput.

A review window of input sampled every weekly_interval (the group's step, 5m), the default profile's
rule group evaluated over it, with the window a day instead of a week (the rules take it as a
parameter; promtool's cost grows with its square); each expected value is worked out here from the
input, never read from the rules. Input series start one step late (`_` first), so that the answers
hold whether the range selectors are closed at their start (Prometheus 2) or open (Prometheus 3).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess

import pytest
import yaml
from conftest import require_tool
from rule_subset import subset

from gpuobs import records as r
from gpuobs.alerts.build import rule_groups
from gpuobs.alerts.rules import DEFAULT
from gpuobs.records import WEEKLY_GROUP, duration_seconds

T = dataclasses.replace(DEFAULT, weekly_window="1d")
STEP_S = duration_seconds(T.weekly_interval)
STEPS = int(duration_seconds(T.weekly_window) // STEP_S)  # 288 steps of 5 minutes in a day
WEEK = f"{int(duration_seconds(T.weekly_window) // 60)}m"  # the end of the review window
STEP_H = STEP_S / 3600
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
CLASSES = (*r.XID_TIERS, "gpu_lost", "remap_failure", "ecc_uncorrected")


def gpu(cluster: str, node: str, i: int) -> dict:
    return {"cluster": cluster, "node": node, "instance": f"{node}:9445", "job": "gpuobs", "gpu": str(i),
            "uuid": f"GPU-{node}-{i}"}


def s(metric: str, labels: dict, values: str) -> dict:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{sel}}}", "values": values}


def week(*runs: tuple[float, int]) -> str:
    """A week of samples, one a step, from (value, steps) runs, after one missing step."""
    assert sum(n for _, n in runs) == STEPS
    return "_ " + " ".join(f"{v}x{n - 1}" for v, n in runs)


def counter(per_step: float) -> str:
    """A counter rising per_step each step for the week, after one missing step."""
    return f"_ {per_step:g}+{per_step:g}x{STEPS - 1}"


def weekly_rule_file(tmp_path, exprs: list[str]) -> str:
    """The weekly group, cut down to the records the test expressions read (transitively)."""
    groups = [g for g in rule_groups(T) if g["name"] == f"gpuobs-{WEEKLY_GROUP}"]
    assert groups and groups[0]["interval"] == T.weekly_interval
    path = tmp_path / "weekly.rules.yml"
    path.write_text(yaml.safe_dump({"groups": subset(groups, exprs)}, sort_keys=False))
    return path.name


def promtool(tmp_path, series: list[dict], tests: list[dict]) -> None:
    """Run `promtool test rules` on the weekly group over series, with promql tests at the week's end."""
    binary = require_tool("promtool")
    rules = weekly_rule_file(tmp_path, [t["expr"] for t in tests])
    doc = {"rule_files": [rules], "evaluation_interval": T.weekly_interval,
           "tests": [{"interval": T.weekly_interval, "input_series": series,
                      "promql_expr_test": [{"eval_time": WEEK, **t} for t in tests]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10 ** 6))
    out = subprocess.run([binary, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def rounded(v: float) -> float:
    """v to the nearest millionth, as PromQL's round(v, 1e-6) computes it: promtool compares floats
    exactly, and a sum's last bit depends on its order."""
    return math.floor(v * 1e6 + 0.5) / 1e6


def expect(record: r.Record, rows: list[tuple[dict, float]], matchers: str = "") -> dict:
    """A promql test of record's series (labels, value), to the millionth."""
    return {"expr": f"round({record.name}{matchers}, 1e-6)",
            "exp_samples": [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in lb.items()) + "}",
                             "value": rounded(v)} for lb, v in rows]}


# ------------------------------------------------------------------------------------- the fleet
# c1/n1: 10 H100s up all the window; GPU 0 has three XID 79s, GPU 2 one XID 13 (an application error).
# c2/n2: one A100, lost for 30 steps (one loss), a row-remap failure and two uncorrectable ECC errors.
# c1/n1 GPU 0 also runs a training rank: 240 s of steps per step of 300 s, 30 s checkpointing, and one
# restart whose startup took an hour.
C1_GPUS = [gpu("c1", "n1", i) for i in range(10)]
A = gpu("c2", "n2", 0)
DOWN_STEPS = 30
TRAIN = {"cluster": "c1", "node": "n1", "instance": "n1:9464", "job": "training", "job_id": "j1", "rank": "0"}


def fleet() -> list[dict]:
    series = []
    for g in C1_GPUS:
        series += [s("gpuobs_gpu_up", g, week((1, STEPS))), s("gpuobs_gpu_info", {**g, "name": H100}, week((1, STEPS)))]
    series += [
        s("gpuobs_gpu_xid_errors_total", {**C1_GPUS[0], "xid": "79"},
          week((0, 20), (1, 70), (2, 70), (3, STEPS - 160))),
        s("gpuobs_gpu_xid_errors_total", {**C1_GPUS[2], "xid": "13"}, week((0, 50), (1, STEPS - 50))),
        s("gpuobs_gpu_up", A, week((1, 100), (0, DOWN_STEPS), (1, STEPS - 100 - DOWN_STEPS))),
        s("gpuobs_gpu_info", {**A, "name": A100}, week((1, STEPS))),
        s("gpuobs_gpu_row_remap_failure", A, week((0, 200), (1, STEPS - 200))),
        s("gpuobs_gpu_ecc_errors_total", {**A, "error_type": "uncorrected", "counter_type": "volatile"},
          week((0, 70), (2, STEPS - 70))),
        s("gpuobs_gpu_ecc_errors_total", {**A, "error_type": "corrected", "counter_type": "volatile"},
          week((0, 70), (50, STEPS - 70))),  # corrected errors are no failure
        s("gpuobs_training_goodput_seconds_total", TRAIN, counter(240)),
        s("gpuobs_training_badput_seconds_total", {**TRAIN, "cause": "checkpoint"}, counter(30)),
        s("gpuobs_training_badput_seconds_total", {**TRAIN, "cause": "startup"}, week((0, 20), (3600, STEPS - 20))),
        s("gpuobs_training_badput_seconds_total", {**TRAIN, "cause": "data_wait"}, counter(0)),
    ]
    return series


def test_weekly_reliability_known_answers(tmp_path):
    c1_hours = 10 * STEPS * STEP_H  # 10 GPUs x 24 h = 240 GPU-hours
    c2_hours = (STEPS - DOWN_STEPS) * STEP_H  # 21.5 h up...
    c2_lost = DOWN_STEPS * STEP_H  # ...2.5 h down
    c1_failures = {cls: 0 for cls in CLASSES} | {"xid_reboot": 3, "xid_application": 1}
    c2_failures = {cls: 0 for cls in CLASSES} | {"gpu_lost": 1, "remap_failure": 1, "ecc_uncorrected": 2}
    n1 = {"cluster": "c1", "node": "n1", "name": H100}
    n2 = {"cluster": "c2", "node": "n2", "name": A100}
    hardware = {k: v for k, v in c2_failures.items() if k not in r.NOT_HARDWARE}
    goodput, badput, restart = 240 * STEPS, (30 * STEPS + 3600), (30 * STEPS + 3600) / 3600
    tests = [
        expect(r.NODE_MODEL_GPU_HOURS, [(n1, c1_hours), (n2, c2_hours)]),
        expect(r.NODE_MODEL_GPU_HOURS_LOST, [(n1, 0), (n2, c2_lost)]),
        expect(r.NODE_MODEL_FAILURES, [({**n1, "class": k}, v) for k, v in c1_failures.items()]
               + [({**n2, "class": k}, v) for k, v in c2_failures.items()]),
        # 3 XID 79s in 240 GPU-hours: 12.5 per 1,000 GPU-hours
        expect(r.CLUSTER_FAILURE_RATE, [({"cluster": "c1", "class": k}, 1000 * v / c1_hours)
                                        for k, v in c1_failures.items()]
               + [({"cluster": "c2", "class": k}, 1000 * v / c2_hours) for k, v in c2_failures.items()]),
        # the XID 13 is an application's error: MTBF counts the three XID 79s only
        expect(r.NODE_MTBF, [({"cluster": "c1", "node": "n1"}, c1_hours / 3),
                             ({"cluster": "c2", "node": "n2"}, c2_hours / sum(hardware.values()))]),
        expect(r.MODEL_MTBF, [({"cluster": "c1", "name": H100}, c1_hours / 3),
                              ({"cluster": "c2", "name": A100}, c2_hours / 4)]),
        expect(r.CLUSTER_RESTART_HOURS, [({"cluster": "c1"}, restart)]),
        expect(r.CLUSTER_GOODPUT, [({"cluster": "c1"}, goodput / (goodput + badput))]),
    ]
    assert c1_hours == pytest.approx(240) and 1000 * 3 / c1_hours == pytest.approx(12.5)
    promtool(tmp_path, fleet(), tests)


def test_quiet_week_has_rates_of_zero_and_no_mtbf(tmp_path):
    """GPUs up all the window without a failure: every class at 0 per 1,000 GPU-hours, no GPU-hours lost,
    and no MTBF (no failure to divide by); a node without GPUs has no GPU-hours, so no rate."""
    hours = 10 * STEPS * STEP_H
    series = []
    for g in C1_GPUS:
        series += [s("gpuobs_gpu_up", g, week((1, STEPS))), s("gpuobs_gpu_info", {**g, "name": H100}, week((1, STEPS)))]
    tests = [expect(r.CLUSTER_FAILURE_RATE, [({"cluster": "c1", "class": k}, 0) for k in CLASSES]),
             expect(r.NODE_MODEL_GPU_HOURS, [({"cluster": "c1", "node": "n1", "name": H100}, hours)]),
             expect(r.NODE_MODEL_GPU_HOURS_LOST, [({"cluster": "c1", "node": "n1", "name": H100}, 0)]),
             expect(r.NODE_MTBF, []), expect(r.MODEL_MTBF, [])]
    promtool(tmp_path, series, tests)


def test_a_gpu_that_loses_its_info_still_counts_per_node(tmp_path):
    """A GPU whose gpuobs_gpu_info is gone (lost for longer than long_window, the exporter without it)
    keeps its GPU-hours and failures on its node, without a model."""
    g = gpu("c1", "n1", 0)
    # up at both ends of the window: Prometheus 2's step average shares a transition's step between up
    # and down (its ranges are closed at the start) and Prometheus 3's does not; the sum is the same
    series = [s("gpuobs_gpu_up", g, week((1, 100), (0, 16), (1, STEPS - 116)))]
    up = (STEPS - 16) * STEP_H
    tests = [expect(r.NODE_MODEL_GPU_HOURS, [({"cluster": "c1", "node": "n1"}, up)]),
             expect(r.NODE_MODEL_GPU_HOURS_LOST, [({"cluster": "c1", "node": "n1"}, 16 * STEP_H)]),
             expect(r.NODE_MTBF, [({"cluster": "c1", "node": "n1"}, up)])]
    promtool(tmp_path, series, tests)


def test_per_gpu_records_drop_every_label_attribution_adds():
    from gpuobs.exporter.render import ATTRIBUTION_LABELS

    assert set(r.ATTRIBUTION) == set(ATTRIBUTION_LABELS["gpuobs"].values())
    assert f"without ({', '.join(r.ATTRIBUTION)})" in r.GPU_UP_STEP.expr(DEFAULT)


# --------------------------------------------------------------------- a counter born at its first XID
# The exporter creates a GPU's XID counter at its first XID, at 1: increase() of such a series is 0
# from its second sample on (nothing rose within the range), so a count that let increase() win
# (`increase(x[w]) or (x unless x offset w)`: `or` keeps the left operand's series) lost every GPU's
# first XID. The new-series term comes first (records.new_first).
BORN_AT = 100  # steps (weekly) or scrapes (30 s) without the series, then 1 until the end


def test_a_weekly_xid_counter_born_at_1_counts_1(tmp_path):
    g = gpu("c1", "n1", 0)
    series = [s("gpuobs_gpu_up", g, week((1, STEPS))), s("gpuobs_gpu_info", {**g, "name": H100}, week((1, STEPS))),
              s("gpuobs_gpu_xid_errors_total", {**g, "xid": "79"}, f"_x{BORN_AT} 1x{STEPS}")]
    node = {"cluster": "c1", "node": "n1", "name": H100, "class": "xid_reboot"}
    assert BORN_AT < STEPS - 2  # the series has several step samples of 1 by the window's end
    promtool(tmp_path, series, [expect(r.NODE_MODEL_FAILURES, [(node, 1)], '{class="xid_reboot"}')])


def test_the_cluster_xid_record_counts_a_counter_born_at_1(tmp_path):
    """CLUSTER_XID_ERRORS over long_window (the 30 s recording group) on a counter born at 1 and
    scraped ten more times: 1 XID."""
    binary = require_tool("promtool")
    groups = [g for g in rule_groups(T) if g["name"] == "gpuobs-recording"]
    expr = f"{r.CLUSTER_XID_ERRORS.name}"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": subset(groups, [expr])}, sort_keys=False))
    born = {**gpu("c1", "n1", 0), "xid": "79"}
    at = f"{(BORN_AT + 10) * 30}s"  # 10 scrapes after its birth, well within long_window
    assert duration_seconds(T.long_window) > (BORN_AT + 10) * 30 - BORN_AT * 30
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": T.eval_interval,
           "tests": [{"interval": "30s",
                      "input_series": [s("gpuobs_gpu_xid_errors_total", born, f"_x{BORN_AT} 1x20")],
                      "promql_expr_test": [{"eval_time": at, "expr": expr, "exp_samples": [
                          {"labels": f'{{__name__="{expr}", cluster="c1", xid="79"}}', "value": 1}]}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10 ** 6))
    out = subprocess.run([binary, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
