"""The exporter on an 8xH100 simulated node serves every family for every GPU; the catalog and
docs/metrics.md agree, and docs/cardinality.md matches what the exporter serves."""

from __future__ import annotations

import pytest

from conftest import REPO
from gpuobs import catalog as c
from gpuobs.docs import METRICS_MD, metrics_markdown
from gpuobs.sim import scenario

EIGHT = scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml")


def test_docs_metrics_md_is_generated_from_the_catalog():
    assert METRICS_MD.read_text() == metrics_markdown(), "run: python -m gpuobs.docs"


def test_docs_cardinality_md_is_measured_from_the_exporter():
    # In a child process: the measurement initialises NVML on simulators of its own, which must
    # not meet NVML state left by other tests in this process.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpuobs.docs", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"run: python -m gpuobs.docs\n{done.stdout}{done.stderr}"


def test_catalog_names_follow_prometheus_conventions():
    for m in c.ALL:
        assert m.name.startswith("gpuobs_") or (m.family == "inference" and m.name.startswith("gen_ai_")), m.name
        assert not m.name.endswith("_total"), f"{m.name}: _total is added to counters at exposition"
        assert m.family in (*c.FAMILIES, "exporter", *c.APP_FAMILIES), m.name
        if m.unit:
            assert m.name.endswith(f"_{m.unit}") or m.name.endswith(f"_{m.unit}_ratio"), m.name
        if m.unit == "ratio":
            assert m.max_value == 1.0, m.name
        assert m.help.endswith(".") and m.source, m.name
    assert len({m.exposed_name for m in c.ALL}) == len(c.ALL)


def test_every_family_present_for_every_gpu(exporter):
    run = exporter(EIGHT, families=set(c.FAMILIES))
    run.next_snapshot(2)  # GPM needs two samples
    uuids = set(run.values("gpuobs_gpu_up", ))
    assert len(uuids) == 8 and all(v == 1 for v in run.values("gpuobs_gpu_up").values())
    scrape = run.scrape()
    per_gpu = {}
    for name, labels, _ in scrape:
        if "uuid" in labels:
            per_gpu.setdefault(name, set()).add(labels["uuid"])
    # per GPU, less XIDs (none happened) and what a healthy GPU does not have
    expected = [m for m in c.ALL if m.identity == c.GPU_LABELS and m.family != "xid"
                and m is not c.GPU_UNHEALTHY]
    missing = {m.exposed_name for m in expected if per_gpu.get(m.exposed_name) != uuids}
    # not in this scenario: no MIG devices, no retired pages on Hopper, no fan on SXM boards
    assert missing == {"gpuobs_gpu_retired_pages_total", "gpuobs_gpu_retired_pages_pending",
                       "gpuobs_gpu_fan_speed_ratio"}
    assert run.values("gpuobs_nvml_up") == {"": 1.0}
    assert run.values("gpuobs_gpus_present") == {"": 8.0}


def test_values_match_the_simulated_state(exporter):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]})
    g = run.sim.state.gpu(1)
    uuid = g.uuid.s.decode()
    from gpuobs.sim.state import set_val

    set_val(g.power_mw, 432100)
    set_val(g.temp_gpu, 77)
    set_val(g.util_gpu, 55)
    set_val(g.clock_events, 0x44 | (1 << 20))
    run.next_snapshot(2)
    assert run.values("gpuobs_gpu_power_usage_watts")[uuid] == pytest.approx(432.1)
    assert run.values("gpuobs_gpu_temperature_celsius")[uuid] == 77
    assert run.values("gpuobs_gpu_utilization_ratio")[uuid] == pytest.approx(0.55)
    active = {l["reason"]: v for n, l, v in run.scrape()
              if n == "gpuobs_gpu_clock_event_reason_active" and l["uuid"] == uuid}
    assert active["sw_power_cap"] == 1 and active["hw_thermal_slowdown"] == 1 and active["gpu_idle"] == 0
    assert active["bit_20"] == 1
    assert run.values("gpuobs_gpu_memory_total_bytes")[uuid] == 81559 * 1024 * 1024
    assert run.values("gpuobs_gpu_clock_hertz", clock="sm")[uuid] == 345e6
