"""promtool tests with known answers of the energy records (gpuobs.records' energy section): watts now,
joules and grams of CO2e over the weekly window by namespace, team and Slurm job, with a GPU that
changes holder mid-window, a GPU without an energy counter (charged its power usage gauge), a GPU
nobody holds (nobody's energy) and a namespace that holds no GPU (no series), at grid intensities
matched by node label, by cluster and by default.

Every expected value is worked out here from the input series and the settings, never read from the
rules. As in tests/test_efficiency_rules.py, every group evaluates once per weekly step (promtool has
one evaluation_interval), so an evaluation at t stands for the step that starts at t.
"""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
import yaml
from conftest import require_tool
from rule_subset import subset
from test_efficiency_rules import check

from gpuobs import catalog as c
from gpuobs import records as r
from gpuobs.alerts.build import rule_groups
from gpuobs.alerts.rules import DEFAULT, Thresholds
from gpuobs.records import WEEKLY_GROUP, duration_seconds

GREEN, EAST_G, DEFAULT_G = 50.0, 300.0, 400.0  # gCO2e/kWh: node label zone=green, cluster east, the rest
T = dataclasses.replace(DEFAULT, weekly_window="2h", weekly_interval="5m", eval_interval="5m",
                        grid_intensities=(("label_zone", "green", GREEN), ("cluster", "east", EAST_G)),
                        grid_intensity_default=DEFAULT_G)
SCRAPE_S, SAMPLES, FIRST = 30, 241, 10  # 2 h of 30 s samples; none in the first 5 min step
CHANGE = 125  # sample at which GPU n1/0 passes from namespace a to namespace b (62.5 min: mid-step)
STEP = int(duration_seconds(T.weekly_interval)) // SCRAPE_S
# (cluster, node, gpu, watts, energy counter?, [(first sample, end sample, attribution)])
GPUS = [
    ("east", "n1", 0, 300.0, True, [(FIRST, CHANGE, {"k8s_namespace": "a"}), (CHANGE, SAMPLES, {"k8s_namespace": "b"})]),
    ("east", "n1", 1, 200.0, False, [(FIRST, SAMPLES, {"hpc_job": "42"})]),  # no energy counter: its power gauge
    ("east", "n2", 0, 500.0, True, [(FIRST, SAMPLES, {})]),  # nobody holds it: nobody's energy
    ("west", "n3", 0, 100.0, True, [(FIRST, SAMPLES, {"hpc_job": "7"})]),
]
TEAMS = {"a": "ml", "c": "ml"}  # c holds no GPU: no series; b has no team label: its own team
ZONES = {("east", "n1"): "green", ("east", "n2"): "blue"}


def intensity(cluster: str, node: str) -> float:
    """The first override that matches, as the settings say: zone label, then cluster, then default."""
    if ZONES.get((cluster, node)) == "green":
        return GREEN
    return EAST_G if cluster == "east" else DEFAULT_G


def values(first: int, end: int, value) -> str:
    """A promtool values line: nothing before first, value(i) from first to end, a staleness marker at end."""
    out = ["_"] * first + [repr(float(value(i))) for i in range(first, end)] + (["stale"] if end < SAMPLES else [])
    return " ".join(out)


def series() -> list[dict]:
    out = []
    for cluster, node, gpu, watts, counted, holds in GPUS:
        base = {"cluster": cluster, "node": node, "instance": f"{node}:9445", "job": "gpuobs", "gpu": str(gpu),
                "uuid": f"GPU-{node}-{gpu}"}
        for first, end, who in holds:
            lbl = ",".join(f'{k}="{v}"' for k, v in {**base, **who}.items())
            out.append({"series": f"{c.GPU_UP.name}{{{lbl}}}", "values": values(first, end, lambda i: 1)})
            # a GPU with a counter also serves a power gauge the records must not read (off by far)
            out.append({"series": f"{c.POWER_USAGE.name}{{{lbl}}}",
                        "values": values(first, end, lambda i, w=watts, e=counted: 999 if e else w)})
            if counted:  # one counter across holders: joules since the driver loaded
                out.append({"series": f"{c.ENERGY.exposed_name}{{{lbl}}}",
                            "values": values(first, end, lambda i, w=watts: 1e9 + w * SCRAPE_S * i)})
    ksm = {"job": "kube-state-metrics", "cluster": "east"}
    for ns in ("a", "b", "c"):
        lbl = ",".join(f'{k}="{v}"' for k, v in {**ksm, "namespace": ns, "label_team": TEAMS.get(ns, "")}.items())
        out.append({"series": f"{r.KSM_NAMESPACE_LABELS}{{{lbl}}}", "values": f"1x{SAMPLES - 1}"})
    for (cluster, node), zone in ZONES.items():
        out.append({"series": f'{r.KSM_NODE_LABELS}{{cluster="{cluster}",node="{node}",label_zone="{zone}"}}',
                    "values": f"1x{SAMPLES - 1}"})
    return out


def expected(key: str, value: str, team: bool = False) -> dict[str, float]:
    """{watts now, joules, grams} of the holders whose `key` is value (team: namespaces of that team):
    each evaluation at which a holder's series is there charges it one step of its GPU's watts, but
    the GPU's very first sample (a counter's rate needs two: the exporter's first scrape charges nothing)."""
    out = {"watts": 0.0, "joules": 0.0, "grams": 0.0}
    for cluster, node, _, watts, counted, holds in GPUS:
        born = holds[0][0] + (1 if counted else 0)
        for first, end, who in holds:
            name = who.get(key)
            if name is None or (TEAMS.get(name, name) if team else name) != value:
                continue
            steps = sum(1 for i in range(max(first, born), end) if i % STEP == 0)  # evaluations that see it
            joules = steps * duration_seconds(T.weekly_interval) * watts
            out["joules"] += joules
            out["grams"] += joules / 3.6e6 * intensity(cluster, node)
            out["watts"] += watts if end == SAMPLES else 0.0
    return out


def promtool(tmp_path, tests: list[dict]) -> None:
    binary = require_tool("promtool")
    groups = [g for g in rule_groups(T) if g["name"] in ("gpuobs-recording", f"gpuobs-{WEEKLY_GROUP}")]
    one = {"name": "energy", "rules": [rule for g in groups for rule in g["rules"]]}  # see test_efficiency_rules
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [one]}, sort_keys=False))
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": T.weekly_interval,
           "tests": [{"interval": f"{SCRAPE_S}s", "input_series": series(),
                      "promql_expr_test": [{"eval_time": T.weekly_window, **t} for t in tests]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10 ** 6))
    out = subprocess.run([binary, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def _tests_of(level: str, lbl: dict, want: dict[str, float]) -> list[dict]:
    """Checks of a holder's energy and CO2e over the window, and of its watts now where it holds a GPU now."""
    records = {"watts": f"{level}_POWER", "joules": f"{level}_ENERGY", "grams": f"{level}_CO2E"}
    return [check(r.NAMES[records[k]], lbl, want[k]) for k in records if k != "watts" or want[k]]


def test_the_worked_example_splits_the_changing_gpu_by_holder():
    a, b = expected("k8s_namespace", "a"), expected("k8s_namespace", "b")
    whole = ((SAMPLES - FIRST + STEP - 1) // STEP - 1) * duration_seconds(T.weekly_interval) * 300.0  # less the first
    assert a["joules"] > 0 and b["joules"] > 0 and a["joules"] + b["joules"] == whole  # each holder its part
    assert (a["watts"], b["watts"]) == (0.0, 300.0)
    assert expected("hpc_job", "42")["grams"] == expected("hpc_job", "42")["joules"] / 3.6e6 * GREEN
    assert expected("hpc_job", "7")["grams"] == expected("hpc_job", "7")["joules"] / 3.6e6 * DEFAULT_G


def test_energy_and_co2e_by_namespace_team_and_job(tmp_path):
    tests = []
    for ns in ("a", "b"):
        tests += _tests_of("NAMESPACE", {"cluster": "east", "k8s_namespace": ns}, expected("k8s_namespace", ns))
    for team in ("ml", "b"):
        tests += _tests_of("TEAM", {"cluster": "east", "team": team}, expected("k8s_namespace", team, team=True))
    for cluster, job in (("east", "42"), ("west", "7")):
        tests += _tests_of("JOB", {"cluster": cluster, "hpc_job": job}, expected("hpc_job", job))
    # namespace c holds no GPU and the unattributed GPU is nobody's: only a and b, 42 and 7 have series
    tests += [{"expr": f"count({rec.name})", "exp_samples": [{"labels": "{}", "value": n}]}
              for rec, n in ((r.NAMESPACE_ENERGY, 2), (r.TEAM_ENERGY, 2), (r.JOB_ENERGY, 2), (r.JOB_CO2E, 2),
                             (r.NAMESPACE_POWER, 1))]  # a holds nothing now: no watts now
    promtool(tmp_path, tests)


@pytest.mark.parametrize("bad", [dict(grid_intensities=(("no-label", ".*", 1.0),)),
                                 dict(grid_intensities=(("cluster", "(", 1.0),)),
                                 dict(grid_intensities=(("cluster", ".*", -1.0),)),
                                 dict(grid_intensity_default=float("nan"))])
def test_grid_intensity_settings_are_checked(bad):
    with pytest.raises(ValueError):
        Thresholds(**bad)


def test_the_report_settings_file_reads_grid_intensity_in_order_and_refuses_bad_entries(tmp_path):
    from gpuobs import report
    good = tmp_path / "good.yaml"
    good.write_text("grid_intensity:\n  label_zone=green: 50\n  cluster=east: 300\n  default: 123\n")
    t = report.load_settings(good).thresholds()
    assert (t.grid_intensities, t.grid_intensity_default) == ((("label_zone", "green", 50.0),
                                                               ("cluster", "east", 300.0)), 123.0)
    assert report.load_settings(None).thresholds().grid_intensity_default == DEFAULT.grid_intensity_default
    for bad in ("grid_intensity: {east: 1}", "grid_intensity: {'cluster=(': 1}", "grid_intensity: {default: -1}",
                "grid_intensity: {'no label=x': 1}", "grid_intensity: {default: lots}"):
        path = tmp_path / "bad.yaml"
        path.write_text(bad + "\n")
        with pytest.raises(report.ReportError):
            report.load_settings(path)


# --------------------------------------------------------------------- energy per training job (job_id)
# GPUs: (cluster, node, gpu, uuid, watts, attribution); ranks: (job_id, rank, where it says it runs,
# steps/s, tokens/s). Each path of the join once, and what it must not map:
JOB_GPUS_IN = [
    ("west", "n1", "0", "GPU-a", 100.0, {}),  # jobs a (two ranks) and s by UUID: charged to both
    ("west", "n1", "1", "GPU-b", 120.0, {"k8s_namespace": "ml", "k8s_pod": "pb"}),  # job b's pod (its UUID unknown)
    ("west", "n2", "0", "GPU-e1", 200.0, {"k8s_namespace": "ml", "k8s_pod": "pe"}),  # job e: two ranks in pod pe,
    ("west", "n2", "1", "GPU-e2", 300.0, {"k8s_namespace": "ml", "k8s_pod": "pe"}),  # no UUIDs: both GPUs
    ("east", "n2", "2", "GPU-f", 50.0, {"k8s_namespace": "ml", "k8s_pod": "pf"}),  # and its third rank's pod
    ("west", "n3", "0", "GPU-c0", 150.0, {"hpc_job": "c"}),  # Slurm job c on n3: both its GPUs
    ("west", "n3", "1", "GPU-c1", 150.0, {"hpc_job": "c"}),
    ("west", "n4", "0", "GPU-d0", 400.0, {}),  # job d alone on bare host n4: its unheld GPU only
    ("west", "n4", "1", "GPU-d1", 999.0, {"hpc_job": "other"}),
    ("west", "n5", "0", "GPU-g0", 700.0, {}),  # jobs g and h on bare host n5: neither can be told apart
]
JOB_RANKS = [
    ("a", "0", {"host": "n1", "uuid": "GPU-a"}, 2.0, 0.0), ("a", "1", {"host": "n1", "uuid": "GPU-a"}, 2.0, 0.0),
    ("s", "0", {"host": "n1", "uuid": "GPU-a"}, 1.0, 0.0),
    ("b", "0", {"host": "pb", "k8s_namespace": "ml", "k8s_pod": "pb", "uuid": "GPU-zz"}, 1.0, 0.0),
    ("e", "0", {"host": "pe", "k8s_namespace": "ml", "k8s_pod": "pe"}, 2.0, 1000.0),
    ("e", "1", {"host": "pe", "k8s_namespace": "ml", "k8s_pod": "pe"}, 2.0, 1000.0),
    ("e", "2", {"host": "pf", "k8s_namespace": "ml", "k8s_pod": "pf"}, 2.6, 500.0),
    ("c", "0", {"host": "n3"}, 1.0, 0.0), ("c", "1", {"host": "n3"}, 1.0, 0.0),
    ("d", "0", {"host": "n4"}, 4.0, 0.0),
    ("g", "0", {"host": "n5"}, 1.0, 0.0), ("h", "0", {"host": "n5"}, 1.0, 0.0),
]
JOB_MAPS = {"a": {"GPU-a"}, "s": {"GPU-a"}, "b": {"GPU-b"}, "e": {"GPU-e1", "GPU-e2", "GPU-f"},
            "c": {"GPU-c0", "GPU-c1"}, "d": {"GPU-d0"}}  # worked out from the paths above, by hand
EVAL_S = 60


def _job_series() -> list[dict]:
    """GPU info, up and energy counter of each GPU (joules growing at its watts); each rank's rank info
    and step and token counters growing at its rates; 1 min samples for 10 min."""
    out = []
    n = 10
    for cluster, node, gpu, uuid, watts, who in JOB_GPUS_IN:
        lbl = ",".join(f'{k}="{v}"' for k, v in {"cluster": cluster, "node": node, "instance": f"{node}:9445",
                                                   "job": "gpuobs", "gpu": gpu, "uuid": uuid, **who}.items())
        out += [{"series": f"{c.GPU_INFO.exposed_name}{{{lbl}}}", "values": f"1x{n}"},
                {"series": f"{c.GPU_UP.name}{{{lbl}}}", "values": f"1x{n}"},
                {"series": f"{c.ENERGY.exposed_name}{{{lbl}}}", "values": f"1e9+{watts * EVAL_S:g}x{n}"}]
    for job, rank, where, steps, tokens in JOB_RANKS:
        lbl = ",".join(f'{k}="{v}"' for k, v in {"cluster": "west", "instance": f"{job}{rank}:9464", "job": "training",
                                                   "job_id": job, "rank": rank, **where}.items())
        out += [{"series": f"{c.RANK_INFO.exposed_name}{{{lbl}}}", "values": f"1x{n}"},
                {"series": f"{c.STEPS.exposed_name}{{{lbl}}}", "values": f"0+{steps * EVAL_S:g}x{n}"}]
        if tokens:
            out.append({"series": f"{c.TOKENS_TRAINED.exposed_name}{{{lbl}}}", "values": f"0+{tokens * EVAL_S:g}x{n}"})
    return out


def _job_expected() -> dict[str, dict[str, float]]:
    """Per job the JOB_MAPS GPUs' watts and CO2e g/s (each GPU's grid intensity by its cluster), its
    steps/s (the mean of its ranks') and tokens/s (their sum)."""
    gpus = {uuid: (cluster, watts) for cluster, _, _, uuid, watts, _ in JOB_GPUS_IN}
    out = {}
    for job, uuids in JOB_MAPS.items():
        ranks = [(steps, tokens) for j, _, _, steps, tokens in JOB_RANKS if j == job]
        out[job] = {"watts": sum(gpus[u][1] for u in uuids),
                    "grams": sum(gpus[u][1] * intensity(gpus[u][0], "") for u in uuids) / 3.6e6,
                    "steps": sum(s for s, _ in ranks) / len(ranks), "tokens": sum(t for _, t in ranks)}
    return out


def test_job_gpus_map_each_job_through_the_paths_and_charge_it_their_watts(tmp_path):
    """JOB_GPUS: job a by UUID (two ranks, one GPU, shared by UUID with job s), b by its pod (its UUID
    unknown to every GPU), e by its pods (two ranks in one pod: every GPU of both pods, where RANK_GPUS
    has no pair), Slurm job c by hpc_job and host, d by its bare host (not the GPU another job holds),
    and neither g nor h (two jobs on one bare host). Then per job its watts, CO2e rate, J/step and
    J/token from the GPUs' energy counters and its ranks' counters."""
    want = _job_expected()
    name = r.JOB_GPUS.name
    pairs = [{"labels": f'{name}{{job_id="{job}",node="{node}",gpu="{gpu}",uuid="{uuid}"}}', "value": 1}
             for job, uuids in JOB_MAPS.items() for _, node, gpu, uuid, _, _ in JOB_GPUS_IN if uuid in uuids]
    tests = [{"expr": name, "exp_samples": pairs}]
    for job, w in want.items():
        tests += [check(r.TRAINING_JOB_POWER, {"job_id": job}, w["watts"]),
                  check(r.TRAINING_JOB_CO2E_RATE, {"job_id": job}, w["grams"]),
                  check(r.TRAINING_JOB_ENERGY_PER_STEP, {"job_id": job}, w["watts"] / w["steps"])]
    e = want["e"]
    tests += [check(r.TRAINING_JOB_ENERGY_PER_TOKEN, {"job_id": "e"}, e["watts"] / e["tokens"]),
              {"expr": f"count({r.TRAINING_JOB_ENERGY_PER_TOKEN.name})",  # only e reports tokens
               "exp_samples": [{"labels": "{}", "value": 1}]}]
    exprs = [name, r.TRAINING_JOB_CO2E_RATE.name, r.TRAINING_JOB_ENERGY_PER_STEP.name,
             r.TRAINING_JOB_ENERGY_PER_TOKEN.name]
    groups = subset(rule_groups(T), exprs)
    binary = require_tool("promtool")
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"groups": [{**g, "interval": f"{EVAL_S}s"} for g in groups]},
                                                   sort_keys=False))
    doc = {"rule_files": ["r.yml"], "evaluation_interval": f"{EVAL_S}s",
           "group_eval_order": [g["name"] for g in groups],
           "tests": [{"interval": f"{EVAL_S}s", "input_series": _job_series(),
                      "promql_expr_test": [{"eval_time": "8m", **t} for t in tests]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10 ** 6))
    out = subprocess.run([binary, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_the_job_example_has_what_the_paths_must_tell_apart():
    """The worked example is not trivial: a GPU shared by UUID, a job on more GPUs than a pod, a job on
    no GPU, and per-step energy that differs from the sum or maximum of the ranks' rates."""
    want = _job_expected()
    assert JOB_MAPS["a"] == JOB_MAPS["s"] and len(JOB_MAPS["e"]) == 3 and not {"g", "h"} & set(JOB_MAPS)
    assert want["e"]["steps"] not in (2.0, 2.6, 6.6) and want["e"]["grams"] != want["e"]["watts"] * 400 / 3.6e6
