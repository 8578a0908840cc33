"""The exporter on an 8xH100 simulated node serves every family for every GPU. (docs/metrics.md and
docs/cardinality.md against the catalog and the exporter: `gpuobs generate --check`, in
tests/test_generate.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from gpuobs import catalog as c
from gpuobs.collect import REGISTRY
from gpuobs.sim import scenario

EIGHT = scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml")


def test_catalog_names_follow_prometheus_conventions():
    for m in c.ALL:
        assert m.name.startswith("gpuobs_") or (m.family == "inference" and m.name.startswith("gen_ai_")), m.name
        assert not m.name.endswith("_total"), f"{m.name}: _total is added to counters at exposition"
        assert m.family in (*REGISTRY, "exporter", *c.APP_FAMILIES), m.name
        if m.unit:
            assert m.name.endswith(f"_{m.unit}") or m.name.endswith(f"_{m.unit}_ratio"), m.name
        if m.unit == "ratio":
            assert m.max_value == 1.0, m.name
        assert m.help.endswith(".") and m.source, m.name
    assert len({m.exposed_name for m in c.ALL}) == len(c.ALL)


def test_every_family_present_for_every_gpu(exporter):
    run = exporter(EIGHT, families=set(REGISTRY))
    run.next_snapshot(2)  # GPM needs two samples
    # every family's first probe of 8 GPUs can overrun the fixture's 0.16 s pass deadline on a loaded
    # machine (the GPU is then honestly down, reason "timeout", for that pass): wait for a full pass
    up = lambda scrape: [v for n, _, v in scrape if n == "gpuobs_gpu_up"]  # noqa: E731
    scrape = run.wait_for(lambda scrape: up(scrape) == [1.0] * 8, 10, "all 8 GPUs up")
    uuids = {labels["uuid"] for n, labels, _ in scrape if n == "gpuobs_gpu_up"}
    per_gpu = {}
    for name, labels, _ in scrape:
        if "uuid" in labels:
            per_gpu.setdefault(name, set()).add(labels["uuid"])
    # per GPU, less XIDs and kernel-log lines (none happened) and what a healthy GPU does not have
    expected = [m for m in c.ALL if m.identity == c.GPU_LABELS and m.family not in ("xid", "kernel_log")
                and m is not c.GPU_UNHEALTHY]
    missing = {m.exposed_name for m in expected if per_gpu.get(m.exposed_name) != uuids}
    # not in this scenario: no MIG devices, no retired pages on Hopper, no fan on SXM boards, no fabric
    # health from the captured driver
    assert missing == {"gpuobs_gpu_retired_pages_total", "gpuobs_gpu_retired_pages_pending",
                       "gpuobs_gpu_fan_speed_ratio", "gpuobs_gpu_fabric_health_mask"}
    assert run.values("gpuobs_nvml_up") == {"": 1.0}
    assert run.values("gpuobs_gpus_present") == {"": 8.0}


def test_values_match_the_simulated_state(exporter):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]})
    g = run.sim.state.gpu(1)
    uuid = g.uuid.s.decode()
    from gpuobs.sim.state import set_val

    set_val(g.power_mw, 72600)  # divided, not multiplied by 0.001 (72.60000000000001)
    set_val(g.temp_gpu, 77)
    set_val(g.util_gpu, 55)
    set_val(g.clock_events, 0x44 | (1 << 20))
    run.next_snapshot(2)
    assert run.values("gpuobs_gpu_power_usage_watts")[uuid] == 72.6
    power = [line for line in run.get()[1].splitlines()
             if line.startswith("gpuobs_gpu_power_usage_watts{") and uuid in line]
    assert power and power[0].endswith("} 72.6"), power  # the text served, not only the parsed float
    assert run.values("gpuobs_gpu_temperature_celsius")[uuid] == 77
    assert run.values("gpuobs_gpu_utilization_ratio")[uuid] == pytest.approx(0.55)
    active = {l["reason"]: v for n, l, v in run.scrape()
              if n == "gpuobs_gpu_clock_event_reason_active" and l["uuid"] == uuid}
    assert active["sw_power_cap"] == 1 and active["hw_thermal_slowdown"] == 1 and active["gpu_idle"] == 0
    assert active["bit_20"] == 1
    assert run.values("gpuobs_gpu_memory_total_bytes")[uuid] == 81559 * 1024 * 1024
    assert run.values("gpuobs_gpu_clock_hertz", clock="sm")[uuid] == 345e6


# ---- the family registry ------------------------------------------------------------------------


def test_registry_order_defaults_and_uses():
    from gpuobs.collect import default_families, needs_watcher

    assert list(REGISTRY) == ["identity", "utilization", "gpm", "memory", "power", "thermal", "clocks",
                              "clock_events", "ecc", "pcie", "nvlink", "fabric", "topology", "mig", "processes",
                              "xid", "kernel_log"]
    assert set(REGISTRY) - default_families() == {"processes"}
    assert REGISTRY["mig"].uses == ("gpm",) and set(REGISTRY["processes"].uses) == {"memory", "mig"}
    for spec in REGISTRY.values():  # a family runs after those whose state it reads
        assert all(list(REGISTRY).index(u) < list(REGISTRY).index(spec.name) for u in spec.uses), spec.name
        assert spec.cls.name == spec.name
    assert needs_watcher({"xid", "power"}) and not needs_watcher({"power", "processes"})


def test_register_refuses_duplicates_and_uses_out_of_order():
    from gpuobs.collect.base import Family, register

    with pytest.raises(ValueError, match="registered twice"):
        register("power")(type("Again", (Family,), {}))
    with pytest.raises(ValueError, match="must be registered before"):
        register("early", uses=("nowhere",))(type("Early", (Family,), {}))
    assert "early" not in REGISTRY


def test_build_families_wires_what_each_family_uses():
    from gpuobs.collect import build_families
    from gpuobs.collect.xid import XidWatcher
    from gpuobs.nvml import Session

    built = {f.name: f for f in build_families(set(REGISTRY), process_cap=7)}
    assert list(built) == [n for n in REGISTRY if n not in ("xid", "kernel_log")]  # no watchers: left out
    assert built["mig"].gpm is built["gpm"]
    assert built["processes"].mig is built["mig"] and built["processes"].memory is built["memory"]
    assert built["processes"].cap == 7
    alone = build_families({"mig", "processes"}, process_cap=3)
    assert [f.name for f in alone] == ["mig", "processes"]
    assert alone[0].gpm is None and alone[1].memory is None and alone[1].mig is alone[0]
    watcher = XidWatcher(Session())
    assert build_families({"xid"}, process_cap=1, watcher=watcher)[0].watcher is watcher
    with pytest.raises(ValueError, match="unknown metric families: nope"):
        build_families({"power", "nope"}, process_cap=1)


def test_cli_flags_and_defaults_come_from_the_registry_and_the_config():
    import dataclasses

    from gpuobs.cli import exporter as command
    from gpuobs.exporter import ExporterConfig

    with pytest.raises(TypeError):
        ExporterConfig("0.0.0.0", 9445)  # keywords only
    config = ExporterConfig()
    params = {p.name: p for p in command.params}
    for name in ("listen_address", "port", "interval", "process_cap", "naming"):
        assert params[name].default == getattr(config, name), name
    assert {f.name for f in dataclasses.fields(ExporterConfig)} >= set(params) - {
        "families", "processes", "scenario_file", "log_level", "web_listen_address"}
    flag = params["processes"]  # one opt-in flag per family off by default
    assert flag.opts == ["--processes"] and flag.secondary_opts == ["--no-processes"]
    assert flag.envvar == "GPUOBS_PROCESSES" and flag.default is False
    assert all(name in params["families"].help for name in REGISTRY)


def test_exporter_doc_lists_the_registry_families():
    row = next(line for line in (REPO / "docs" / "exporter.md").read_text().splitlines()
               if line.startswith("| `--families`"))
    listed = row.rsplit("|", 2)[-2].split(":", 1)[1]
    assert [n.strip() for n in listed.split(",")] == list(REGISTRY)


# ------------------------------------------------------------------ one emit path, declared ranges
def _dropped(run, metric: c.Metric, reason: str) -> float:
    return run.values(c.DROPPED.exposed_name, metric=metric.name, reason=reason).get("", 0.0)


def test_a_signed_metric_serves_its_negative_values_and_drops_what_is_out_of_its_range(exporter):
    """The margin to T.Limit is negative on a GPU hotter than its T.Limit: served, not dropped as
    the old `>= 0` check did; below its declared range it is dropped and counted like any other
    impossible value. The memory temperature (a batched field value) goes through the same gate."""
    from gpuobs.sim.state import set_val

    assert c.TEMPERATURE_MARGIN.valid[0] < 0 <= c.TEMPERATURE.valid[0]
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]}, interval=0.1)
    g = run.sim.state.gpu(0)
    uuid = g.uuid.s.decode()
    margin = c.TEMPERATURE_MARGIN.exposed_name
    set_val(g.temp_margin, -7)
    run.wait_for(lambda s: run.values(margin).get(uuid) == -7, 5, "a negative margin served")
    assert _dropped(run, c.TEMPERATURE_MARGIN, "out_of_range") == 0
    set_val(g.temp_margin, c.TEMPERATURE_MARGIN.valid[0] - 1)
    set_val(g.temp_mem, c.MEMORY_TEMPERATURE.valid[1] + 1)
    run.wait_for(lambda s: uuid not in run.values(margin)
                 and uuid not in run.values(c.MEMORY_TEMPERATURE.exposed_name), 5, "out-of-range values dropped")
    run.next_snapshot(2)
    first = _dropped(run, c.TEMPERATURE_MARGIN, "out_of_range")
    assert first >= 1 and _dropped(run, c.MEMORY_TEMPERATURE, "out_of_range") >= 1
    run.next_snapshot(2)
    assert _dropped(run, c.TEMPERATURE_MARGIN, "out_of_range") > first  # counted on every pass
    set_val(g.temp_margin, 12)
    run.wait_for(lambda s: run.values(margin).get(uuid) == 12, 5, "a good value served again")


@pytest.mark.parametrize(("raw", "scale", "kept"), [
    (-5, 1.0, -5.0), (5, 1.0, 5.0), (-201, 1.0, None), (201, 1.0, None), (0xFFFFFFFF, 1.0, None),
    (float("nan"), 1.0, None), (-100, 0.5, -50.0)])
def test_the_one_gate_keeps_values_in_the_declared_range(raw, scale, kept):
    from gpuobs.collect.base import checked

    drops = []
    sample = checked(c.TEMPERATURE_MARGIN, ("0", "GPU-x"), raw, raw * scale, lambda m, why: drops.append((m, why)))
    assert (sample.value if sample else None) == kept
    assert len(drops) == (kept is None) and all(m is c.TEMPERATURE_MARGIN for m, _ in drops)
    unsigned = checked(c.TEMPERATURE, ("0", "GPU-x"), -5, -5.0, lambda m, why: drops.append((m, why)))
    assert unsigned is None and drops[-1] == (c.TEMPERATURE, "out_of_range")


def test_no_collector_checks_a_value_range_of_its_own():
    """Every NVML value goes through base.checked (GpuCtx.emit and the field-values batch both call
    it): nothing else reads a metric's range or sentinels, so the declared range is the whole rule."""
    import gpuobs.collect

    for path in Path(gpuobs.collect.__file__).parent.glob("*.py"):
        source = path.read_text()
        for name in ("limits(", "drop_reason(", ".max_value", ".min_value", ".valid"):
            assert path.name == "base.py" or name not in source, f"{path.name} uses {name}"
    assert "checked(" in (Path(gpuobs.collect.__file__).parent / "sampler.py").read_text()
