"""`--naming dcgm` as a drop-in for dcgm-exporter: every metric its default counter list enables, with
the type and labels dcgm-exporter gives it, semantics as DCGM defines them (last XID, throttle
bitmask, PCIe and NVLink rates), scraped from the simulator by promtool and a real Prometheus."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from conftest import REPO, require_tool

from gpuobs.collect import Sampler, Session, build_families, default_families
from gpuobs.exporter import render
from gpuobs.sim.state import set_counter, set_val

H100X2 = {"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}

# dcgm-exporter's etc/default-counters.csv, its uncommented lines (facts: field, type): what a
# dcgm-exporter deployed with its defaults serves, and so what dashboards and alerts built on it read.
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge", "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge", "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge", "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge", "DCGM_FI_DEV_FB_USED": "gauge", "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DRIVER_VERSION": "label",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge", "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}
NOT_SERVED = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}  # no NVML source on bare metal: docs/dcgm.md says why
SERVED = {name: kind for name, kind in DEFAULT_COUNTERS.items() if kind != "label" and name not in NOT_SERVED}
# The labels dcgm-exporter puts on a whole-GPU series (both spellings of the host name: releases up to
# 4.8.2 write Hostname, its newest source hostname), then its label fields
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname", "DCGM_FI_DRIVER_VERSION"}
XID_LABELS = GPU_LABELS | {"err_code", "err_msg"}
SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """({family: TYPE}, [(sample name as written, labels, value)]) of a text-format body. Written by
    hand: prometheus_client's parser renames the samples of a counter family to `<name>_total`,
    which Prometheus does not."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, labels, value = SAMPLE.match(line).groups()
            samples.append((name, dict(LABEL.findall(labels or "")), float(value)))
    return types, samples


def dcgm_scrape(run) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    status, text = run.get()
    assert status == 200, text
    return parse(text)


def series(samples, name: str) -> dict[str, tuple[dict[str, str], float]]:
    """{UUID: (labels, value)} of one DCGM field's whole-GPU series."""
    return {l["UUID"]: (l, v) for n, l, v in samples if n == name and "GPU_I_ID" not in l}


def test_every_default_counter_is_served_with_its_type_and_labels(exporter):
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    run.next_snapshot(3)  # rates need two passes
    types, samples = dcgm_scrape(run)
    driver = run.sim.state.s.driver_version.s.decode()
    uuids = {run.sim.state.gpu(i).uuid.s.decode() for i in range(2)}
    for name, kind in SERVED.items():
        assert types.get(name) == kind, name
        got = series(samples, name)
        assert set(got) == uuids, name
        for _uuid, (labels, value) in got.items():
            assert set(labels) == (XID_LABELS if name == "DCGM_FI_DEV_XID_ERRORS" else GPU_LABELS), name
            assert labels["device"] == f"nvidia{labels['gpu']}" and labels["gpu"] in {"0", "1"}
            assert labels["modelName"] == "NVIDIA H100 80GB HBM3" and labels["pci_bus_id"]
            assert labels["Hostname"] == labels["hostname"] == "node-a"
            assert labels["DCGM_FI_DRIVER_VERSION"] == driver and driver
            assert value >= 0, name
    for name in NOT_SERVED:
        assert name not in types


def test_last_xid_per_gpu_with_its_code_and_message(exporter):
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    run.next_snapshot(2)
    u0, u1 = (run.sim.state.gpu(i).uuid.s.decode() for i in range(2))
    _, samples = dcgm_scrape(run)
    before = series(samples, "DCGM_FI_DEV_XID_ERRORS")
    for uuid in (u0, u1):  # before any XID: 0, as dcgm-exporter shows it
        labels, value = before[uuid]
        assert value == 0 and labels["err_code"] == "0" and labels["err_msg"] == "No Error"

    def last(uuid):
        run.next_snapshot(1)
        return series(dcgm_scrape(run)[1], "DCGM_FI_DEV_XID_ERRORS")[uuid]

    run.sim.state.xid(1, 79)
    run.wait_for(lambda _: last(u1)[1] == 79, 10, "XID 79 on GPU 1")
    labels, _ = last(u1)
    assert labels["err_code"] == "79" and labels["err_msg"] == "GPU has fallen off the bus"
    assert last(u0)[1] == 0  # the other GPU is untouched
    run.sim.state.xid(1, 31)
    run.wait_for(lambda _: last(u1)[1] == 31, 10, "XID 31, the last one, on GPU 1")
    assert last(u1)[0]["err_code"] == "31"
    run.sim.state.xid(1, 4242)
    run.wait_for(lambda _: last(u1)[1] == 4242, 10, "an XID without a known title")
    assert last(u1)[0]["err_msg"] == "Unknown Error"


def test_throttle_bitmask_under_both_names_equals_the_simulated_mask(exporter):
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    g0 = run.sim.state.gpu(0)
    set_val(g0.clock_events, 0x4 | 0x40)  # sw_power_cap + hw_thermal_slowdown
    run.next_snapshot(2)
    _, samples = dcgm_scrape(run)
    u0 = g0.uuid.s.decode()
    for name in ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"):
        assert series(samples, name)[u0][1] == 0x44, name


def test_pcie_and_nvlink_rates(exporter):
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    g0 = run.sim.state.gpu(0)
    set_counter(g0.pcie_tx_bytes, rate=5e8)
    set_counter(g0.pcie_rx_bytes, rate=2e8)
    for link in range(g0.link_count):
        set_counter(g0.links[link].tx_bytes, rate=1e8)
        set_counter(g0.links[link].rx_bytes, rate=5e7)
    run.next_snapshot(3)
    _, samples = dcgm_scrape(run)
    u0 = g0.uuid.s.decode()
    assert g0.link_count > 0
    assert series(samples, "DCGM_FI_PROF_PCIE_TX_BYTES")[u0][1] == pytest.approx(5e8, rel=0.1)
    assert series(samples, "DCGM_FI_PROF_PCIE_RX_BYTES")[u0][1] == pytest.approx(2e8, rel=0.1)
    total_mb_s = g0.link_count * 1.5e8 / 1e6  # DCGM: MB/s, transmit and receive over all links
    assert series(samples, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")[u0][1] == pytest.approx(total_mb_s, rel=0.1)


def test_counter_families_differ_from_prometheus_client_only_in_their_help_and_type_names(make_sim):
    make_sim(H100X2)
    session = Session()
    try:
        sampler = Sampler(session, build_families(default_families(), process_cap=8), interval=1)
        sampler.sample_once()
        time.sleep(0.05)
        snap = sampler.sample_once()  # the second pass has the rates
    finally:
        session.shutdown()
    fams = render.dcgm_families(snap.samples, "node-a", xid_watched=True)
    counters = {f.name for f in fams if f.type == "counter"}
    assert {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} <= counters
    ours, theirs = render.dcgm_text(fams).decode().splitlines(), render._to_text(fams).decode().splitlines()
    assert len(ours) == len(theirs)
    changed = [(a, b) for a, b in zip(ours, theirs) if a != b]
    assert len(changed) == 2 * len(counters)
    for a, b in changed:
        kind, name = a.split()[1:3]
        assert kind in ("HELP", "TYPE") and name in counters
        assert b == a.replace(f"# {kind} {name} ", f"# {kind} {name}_total ", 1)


def promtool_problems(text: str) -> tuple[int, set[tuple[str, str]]]:
    result = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=60)
    lines = (result.stdout + result.stderr).splitlines()
    return result.returncode, {tuple(line.split(" ", 1)) for line in lines if line.strip()}


def test_promtool_finds_only_dcgm_exporters_own_naming_and_native_naming_clean(exporter):
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    run.next_snapshot(3)
    status, text = run.get()
    types, _ = parse(text)
    _, problems = promtool_problems(text)
    camel = "label names should be written in 'snake_case' not 'camelCase'"  # modelName, Hostname
    total = 'counter metrics should have "_total" suffix'
    dcgm = {name for name in types if name.startswith("DCGM_FI_")}
    named = {("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "metric name should not include type 'counter'")}
    assert problems == {(n, camel) for n in dcgm} | {(n, total) for n in dcgm if types[n] == "counter"} | named
    native = exporter(H100X2)
    native.next_snapshot(3)
    rc, problems = promtool_problems(native.get()[1])
    assert (rc, problems) == (0, set())


def test_a_real_prometheus_stores_the_bare_dcgm_names(exporter, prometheus):
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    query = prometheus([f"127.0.0.1:{run.exp.http.port}"])
    for name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_UTIL"):
        result = query(name)
        assert len(result) == 2 and all(r["metric"]["__name__"] == name for r in result), name
    assert not query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total")
    assert {r["metric"]["err_msg"] for r in query("DCGM_FI_DEV_XID_ERRORS")} == {"No Error"}


def test_docs_page_lists_every_default_counter():
    page = (REPO / "docs" / "dcgm.md").read_text()
    for name in DEFAULT_COUNTERS:
        assert f"`{name}`" in page, name
    assert "9400" in page and "--port 9400" in page
    assert "dcgm.md" in (REPO / "README.md").read_text() and "dcgm.md" in (REPO / "docs" / "exporter.md").read_text()


# ---- DCGM's semantics (issue 29): units, sources, MIG entities, XID titles, each checked against
# DCGM's or dcgm-exporter's source, cited where it is checked.
MIG3 = {"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]},
                 {"profile": "h100-sxm-80gb"}]}
NO_NVLINK = {"gpus": [{"profile": "h100-sxm-80gb"}, {"profile": "l40s-pcie"}]}


def test_violation_counters_in_nanoseconds_and_thermal_from_the_thermal_policy(exporter):
    # DCGM dcgmlib/dcgm_fields.h: DCGM_FI_DEV_{POWER,THERMAL,SYNC_BOOST}_VIOLATION are "Violation time in
    # ns"; dcgmlib/src/dcgm_fields.cpp gives them the NVML fields NVML_FI_DEV_PERF_POLICY_POWER,
    # _THERMAL and _SYNC_BOOST, which DcgmCacheManager reads with nvmlDeviceGetFieldValues and passes
    # through: the thermal one is the thermal policy's counter, not the SW thermal slowdown one (269).
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    g0 = run.sim.state.gpu(0)
    power, thermal_policy, sync, sw_thermal = 5_000_000_123, 7_000_000_001, 3_000_000_000, 11_000_000_000
    for slot, ns in ((0, power), (1, thermal_policy), (2, sync), (8, sw_thermal)):
        set_counter(g0.violation_ns[slot], start=ns, rate=0)
    run.next_snapshot(2)
    _, samples = dcgm_scrape(run)
    u0 = g0.uuid.s.decode()
    assert series(samples, "DCGM_FI_DEV_POWER_VIOLATION")[u0][1] == power
    assert series(samples, "DCGM_FI_DEV_SYNC_BOOST_VIOLATION")[u0][1] == sync
    assert series(samples, "DCGM_FI_DEV_THERMAL_VIOLATION")[u0][1] == thermal_policy
    # the gpuobs naming keeps the SW thermal slowdown counter under its clock-event reason, in seconds,
    # and the thermal policy's counter apart
    native = exporter(H100X2, hostname="node-a", profile="full")
    gn = native.sim.state.gpu(0)
    set_counter(gn.violation_ns[1], start=thermal_policy, rate=0)
    set_counter(gn.violation_ns[8], start=sw_thermal, rate=0)
    native.next_snapshot(2)
    status, text = native.get()
    un = gn.uuid.s.decode()
    got = {(n, labels.get("reason")): v for n, labels, v in parse(text)[1] if labels.get("uuid") == un}
    assert got[("gpuobs_gpu_clock_event_duration_seconds_total", "sw_thermal_slowdown")] == sw_thermal / 1e9
    assert got[("gpuobs_gpu_thermal_policy_violation_seconds_total", None)] == thermal_policy / 1e9


def test_mig_gpu_serves_gpu_instance_entities_as_dcgm_exporter_does(exporter):
    # dcgm-exporter internal/pkg/devicemonitoring/device_monitoring.go: with its default -d f (Flex),
    # monitorAllGPUInstances watches each GPU instance of a MIG GPU (FE_GPU_I) and the GPU itself only
    # when it has none; internal/pkg/collector/gpu_collector.go (toMetric) queries every device field of
    # each entity and labels an instance's series GPU_I_PROFILE (its profile name) and GPU_I_ID (the NVML
    # GPU instance id), on the parent GPU's gpu/UUID/device/modelName labels.
    run = exporter(MIG3, naming="dcgm", hostname="node-a")
    g0, g1 = run.sim.state.gpu(0), run.sim.state.gpu(1)
    used_mib = [20000, 9000, 3000]
    for i, mib in enumerate(used_mib):
        set_val(g0.migs[i].mem_used, mib * 2**20)
    set_val(g0.mem_used, sum(used_mib) * 2**20)
    run.next_snapshot(3)
    _, samples = dcgm_scrape(run)
    u0, u1 = g0.uuid.s.decode(), g1.uuid.s.decode()
    gis = {str(g0.migs[i].gi_id): g0.migs[i].profile.s.decode() for i in range(g0.mig_count)}
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"):
        on_mig = [(labels, v) for n, labels, v in samples if n == name and labels["UUID"] == u0]
        assert all("GPU_I_ID" in labels for labels, _ in on_mig), name  # no whole-GPU series on a MIG GPU
        assert {labels["GPU_I_ID"]: labels["GPU_I_PROFILE"] for labels, _ in on_mig} == gis, name
        assert [labels for n, labels, _ in samples if n == name and labels["UUID"] == u1 and "GPU_I_ID" not in labels]
    fb = [v for n, labels, v in samples if n == "DCGM_FI_DEV_FB_USED" and labels["UUID"] == u0]
    assert sum(fb) == sum(used_mib)  # summed by UUID: the GPU's used memory, not twice it
    power = {v for n, labels, v in samples if n == "DCGM_FI_DEV_POWER_USAGE" and labels["UUID"] == u0}
    assert len(power) == 1 and power.pop() > 0  # the device's value on each instance
    for prof in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        assert all("GPU_I_ID" in labels for n, labels, _ in samples if n == prof and labels["UUID"] == u0), prof


def test_nvlink_bandwidth_in_dcgm_units_and_zero_without_nvlink(exporter):
    # DCGM dcgmlib/src/DcgmCacheManager.cpp, ReadAndCacheNvLinkBandwidth: the NVML_FI_DEV_NVLINK_THROUGHPUT_DATA
    # RX + TX sum (KiB) over all links, its increase per second divided by 1000 into an INT64, and 0
    # published for a zero sum; dcgm-exporter then serves the field as 0 on a GPU without NVLink.
    run = exporter(NO_NVLINK, naming="dcgm", hostname="node-a")
    g0, g1 = run.sim.state.gpu(0), run.sim.state.gpu(1)
    kib_per_s = 1.5e8 / 1024
    for link in range(g0.link_count):
        set_counter(g0.links[link].tx_bytes, rate=1e8)
        set_counter(g0.links[link].rx_bytes, rate=5e7)
    run.next_snapshot(3)
    _, samples = dcgm_scrape(run)
    got = series(samples, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
    value = got[g0.uuid.s.decode()][1]
    assert value == int(value) and value == pytest.approx(g0.link_count * kib_per_s / 1000, rel=0.05)
    assert g1.link_count == 0 and got[g1.uuid.s.decode()][1] == 0


def test_xid_titles_are_dcgm_exporters_for_every_code_it_lists(exporter):
    # dcgm-exporter internal/pkg/collector/xid_errors.go (xidErrCodeToText: codes 0-172, from NVIDIA's
    # XID catalog) and gpu_collector.go (toMetric: err_msg is the table's title, "Unknown Error" past it).
    from gpuobs.exporter import xid_titles
    assert sorted(xid_titles.TITLES) == list(range(173))
    assert "Unknown Error" not in xid_titles.TITLES.values()
    run = exporter(H100X2, naming="dcgm", hostname="node-a")
    u1 = run.sim.state.gpu(1).uuid.s.decode()

    def last():
        run.next_snapshot(1)
        return series(dcgm_scrape(run)[1], "DCGM_FI_DEV_XID_ERRORS")[u1]

    for code, title in ((8, "GPU stopped processing"), (154, "GPU Recovery Action Changed"),
                        (172, "Uncorrectable SRAM Error"), (173, "Unknown Error")):
        run.sim.state.xid(1, code)
        run.wait_for(lambda _, code=code: last()[1] == code, 10, f"XID {code}")
        assert last()[0]["err_msg"] == title == render.xid_title(code)
