"""The exporter on an 8xH100 simulated node serves every family for every GPU. (docs/metrics.md and
docs/cardinality.md against the catalog and the exporter: `gpuobs generate --check`, in
tests/test_generate.py.)"""

from __future__ import annotations

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
