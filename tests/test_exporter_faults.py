"""The exporter under NVML faults, seen over real HTTP: unsupported values, lost and removed GPUs,
a missing driver, UNKNOWN errors and re-initialisation, hung calls, impossible values, invalid
names, process churn, XID events and MIG."""

from __future__ import annotations

import random
import time

import pytest
from conftest import RunningExporter

from gpuobs import catalog as c
from gpuobs.sim.state import set_val

H100 = "h100-sxm-80gb"
TWO = {"gpus": [{"profile": H100, "count": 2}]}
MIB = 1024 * 1024

UP = "gpuobs_gpu_up"
UNHEALTHY = "gpuobs_gpu_unhealthy"
TIMEOUTS = "gpuobs_exporter_gpu_timeouts_total"
TEMP = "gpuobs_gpu_temperature_celsius"
MEM_TEMP = "gpuobs_gpu_memory_temperature_celsius"
POWER = "gpuobs_gpu_power_usage_watts"
UTIL = "gpuobs_gpu_utilization_ratio"
MEM_UTIL = "gpuobs_gpu_memory_utilization_ratio"
ERRORS = "gpuobs_exporter_nvml_errors_total"
DROPPED = "gpuobs_exporter_dropped_values_total"
PAIRS = "gpuobs_gpu_topology_nvlink_links"
REINITS = "gpuobs_exporter_nvml_reinits_total"
STALE = "gpuobs_exporter_snapshot_stale"
PROC_MEM = "gpuobs_gpu_process_memory_used_bytes"
PROC_SM = "gpuobs_gpu_process_sm_utilization_ratio"


def uuid(run: RunningExporter, slot: int) -> str:
    return run.sim.state.gpu(slot).uuid.s.decode()


def one(scrape, name: str, **match) -> dict[str, float]:
    """{uuid: value} of one metric in an existing scrape (RunningExporter.values scrapes anew)."""
    return {labels.get("uuid", ""): v for n, labels, v in scrape if n == name
            and all(labels.get(k) == str(val) for k, val in match.items())}


def series_of(scrape, uid: str) -> set[str]:
    """Names of every value series of one GPU: its up and unhealthy series aside."""
    return {n for n, labels, _ in scrape if labels.get("uuid") == uid and n not in (UP, UNHEALTHY, TIMEOUTS)}


def reasons(scrape) -> dict[str, str]:
    """{uuid: reason} of the GPUs reported unhealthy."""
    return {labels["uuid"]: labels["reason"] for n, labels, v in scrape if n == UNHEALTHY and v == 1}


def value(scrape, name: str, **match) -> float | None:
    found = [v for n, labels, v in scrape if n == name and all(labels.get(k) == str(x) for k, x in match.items())]
    assert len(found) <= 1, f"{name} {match}: {found}"
    return found[0] if found else None


def force_reinit(run: RunningExporter) -> None:
    """Make the session re-initialise NVML through its own path: driver-level errors in a row
    (every call fails, as when the driver goes away)."""
    before = run.exp.session.reinits
    run.exp.session.reinit_after = 3
    idx = run.sim.state.fail(None, 999)
    try:
        run.wait_for(lambda s: value(s, REINITS) > before, 5, "a re-initialisation")
    finally:
        run.sim.state.clear_fault(idx)
    run.wait_for(lambda s: value(s, "gpuobs_nvml_up") == 1 and list(one(s, UP).values()) == [1.0, 1.0], 5,
                 "NVML back up, both GPUs read")


# ---------------------------------------------------------------------------------------- 1


def test_not_supported_is_absent_remembered_and_reprobed_after_reinit(exporter):
    run = exporter(TWO, interval=0.1)
    st, session = run.sim.state, run.exp.session
    u0, u1 = uuid(run, 0), uuid(run, 1)
    scrape = run.scrape()
    assert set(one(scrape, MEM_TEMP)) == {u0, u1} and set(one(scrape, TEMP)) == {u0, u1}

    # one value inside nvmlDeviceGetFieldValues (NVML_FI_DEV_MEMORY_TEMP = 82), once only: if the
    # exporter asked again, the simulator would answer, so absence proves it was remembered
    st.fail("nvmlDeviceGetFieldValues", 3, gpu=0, field=82, times=1)
    set_val(st.gpu(1).temp_gpu, None)  # a whole call (nvmlDeviceGetTemperature) on GPU 1
    scrape = run.wait_for(lambda s: set(one(s, MEM_TEMP)) == {u1} and set(one(s, TEMP)) == {u0}, 5,
                          "unsupported values to disappear")
    assert session.field_unavailable(u0, 82, 0)
    assert session.is_unavailable(u1, "nvmlDeviceGetTemperature:")
    assert all(v > 0 for v in one(scrape, MEM_TEMP).values()) and all(v > 0 for v in one(scrape, TEMP).values())
    # other series of both GPUs unaffected
    assert series_of(scrape, u0) - {TEMP, MEM_TEMP} == series_of(scrape, u1) - {TEMP, MEM_TEMP}

    set_val(st.gpu(1).temp_gpu, 55)  # supported again, but not re-probed before a re-init
    st.reset_calls()
    n0 = run.exp.sampler.samples
    run.next_snapshot(6)
    passes = run.exp.sampler.samples - n0
    calls = st.calls().get("nvmlDeviceGetTemperature", 0)
    assert calls <= passes + 1, f"{calls} temperature calls in {passes} passes: GPU 1 is still asked"
    scrape = run.scrape()
    assert set(one(scrape, MEM_TEMP)) == {u1} and set(one(scrape, TEMP)) == {u0}

    force_reinit(run)
    scrape = run.wait_for(lambda s: set(one(s, MEM_TEMP)) == {u0, u1} and set(one(s, TEMP)) == {u0, u1}, 5,
                          "values re-probed after re-initialisation")
    assert one(scrape, TEMP)[u1] == 55
    assert not session.is_unavailable(u1, "nvmlDeviceGetTemperature:")


# ---------------------------------------------------------------------------------------- 2


def test_lost_gpu_reports_down_and_drops_every_value_series(exporter):
    run = exporter(TWO, interval=0.1)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    run.next_snapshot(2)  # GPM ratios need two samples
    before = run.scrape()
    full = series_of(before, u1)
    assert series_of(before, u0) == full and len(full) > 30

    run.sim.state.lose_gpu(0)
    scrape = run.wait_for(lambda s: one(s, UP).get(u0) == 0, 5, "gpu_up 0 for the lost GPU")
    assert one(scrape, UP) == {u0: 0.0, u1: 1.0}
    assert series_of(scrape, u0) == set(), "a lost GPU must not keep serving values"
    assert reasons(scrape) == {u0: "lost"}
    # the other GPU keeps every series but its pair with the lost one (its only peer), which goes too
    assert series_of(scrape, u1) == full - {PAIRS}
    assert not [labels for n, labels, _ in scrape if labels.get("peer_uuid") == u0]
    # the driver still counts a GPU that fell off the bus: present says so, gpu_up says it is lost
    assert value(scrape, "gpuobs_gpus_present") == 2 and value(scrape, "gpuobs_gpus_expected") == 2
    run.next_snapshot(2)
    scrape = run.scrape()
    assert series_of(scrape, u0) == set() and one(scrape, UP)[u0] == 0

    run.sim.state.lose_gpu(0, lost=False)  # back on the bus
    run.wait_for(lambda s: one(s, UP).get(u0) == 1 and TEMP in series_of(s, u0), 5, "the GPU back")
    run.wait_for(lambda s: series_of(s, u1) == full, 5, "the pair with the GPU back")


# ---------------------------------------------------------------------------------------- 3


def test_index_shift_keeps_series_on_their_uuid(exporter):
    # the last GPU is in MIG mode, so that cached MIG series must follow the shift as well
    run = exporter({"gpus": [{"profile": H100, "count": 2}, {"profile": H100, "mig": ["3g.40gb", "4g.40gb"]}]},
                   interval=0.1)
    u0, u1, u2 = (uuid(run, i) for i in range(3))
    run.next_snapshot(2)
    before = run.scrape()
    assert {u: l["gpu"] for n, l, _ in before if n == UP for u in [l["uuid"]]} == {u0: "0", u1: "1", u2: "2"}
    names = {u: series_of(before, u) for u in (u1, u2)}
    assert "gpuobs_mig_info" in names[u2]

    run.sim.state.remove_gpu(0)
    run.wait_for(lambda s: one(s, UP).get(u0) == 0, 5, "gpu_up 0 for the removed GPU")
    for _ in range(3):  # several snapshots in a row: nothing cached may keep the old index
        scrape = run.scrape()
        ups = {l["uuid"]: (l["gpu"], v) for n, l, v in scrape if n == UP}
        assert ups == {u0: ("0", 0.0), u1: ("0", 1.0), u2: ("1", 1.0)}
        assert series_of(scrape, u0) == set() and reasons(scrape) == {u0: "lost"}
        for u, index in ((u1, "0"), (u2, "1")):
            assert series_of(scrape, u) == names[u]
            wrong = {(n, l["gpu"]) for n, l, _ in scrape if l.get("uuid") == u and l["gpu"] != index}
            assert not wrong, f"series of {u} with a stale gpu index: {sorted(wrong)}"
        run.next_snapshot()
    assert value(scrape, "gpuobs_gpus_present") == 2 and value(scrape, "gpuobs_gpus_expected") == 3


# ---------------------------------------------------------------------------------------- 4


@pytest.mark.parametrize("count, expected_gpus", [(8, None), (2, 8)])
def test_all_gpus_gone_keeps_expected(exporter, count, expected_gpus):
    run = exporter({"gpus": [{"profile": H100, "count": count}]}, expected_gpus=expected_gpus)
    uuids = {uuid(run, i) for i in range(count)}
    # every GPU read once (a first pass on a busy machine may miss the deadline for some)
    scrape = run.wait_for(lambda s: one(s, UP) == {u: 1.0 for u in uuids}, 10, "every GPU up")
    assert value(scrape, "gpuobs_gpus_present") == count and value(scrape, "gpuobs_gpus_expected") == 8
    for slot in range(count):
        run.sim.state.remove_gpu(slot)
    scrape = run.wait_for(lambda s: value(s, "gpuobs_gpus_present") == 0, 5, "no GPU present")
    assert value(scrape, "gpuobs_gpus_expected") == 8
    assert value(scrape, "gpuobs_nvml_up") == 1
    assert one(scrape, UP) == {u: 0.0 for u in uuids}
    assert {n for n, l, _ in scrape if "uuid" in l} == {UP, UNHEALTHY}, "no value series without GPUs"
    assert reasons(scrape) == {u: "lost" for u in uuids}
    assert run.get("/readyz")[0] == 200  # NVML answers: the node is observable, the alert is on present


# ---------------------------------------------------------------------------------------- 5


def test_driver_missing_at_start_then_appearing(make_sim, start):
    sim = make_sim(TWO, init=False)
    sim.state.fail_init(9)  # NVML_ERROR_DRIVER_NOT_LOADED
    sim.state.reset_calls()
    run = start(sim)
    t0 = time.monotonic()
    status, text = run.get("/metrics")
    assert status == 200
    scrape = run.scrape()
    assert value(scrape, "gpuobs_nvml_up") == 0
    assert value(scrape, "gpuobs_nvml_init_error", reason="DRIVER_NOT_LOADED") == 1
    assert value(scrape, "gpuobs_gpus_present") == 0 and value(scrape, STALE) == 0
    assert not [n for n, l, _ in scrape if "uuid" in l]
    status, reason = run.get("/readyz")
    assert status == 503 and "DRIVER_NOT_LOADED" in reason
    assert run.get("/healthz")[0] == 200

    time.sleep(max(0.0, 1.3 - (time.monotonic() - t0)))  # ~7 passes, but backoff: tries at 0 s and 1 s
    inits = sum(n for name, n in sim.state.calls().items() if name.startswith("nvmlInit"))
    assert 1 <= inits <= 2, f"{inits} nvmlInit calls in 1.3 s: no backoff"
    assert run.exp.sampler.samples >= 4

    sim.state.clear_init_error()  # next try at about 3 s (backoff 1 s, then 2 s)
    scrape = run.wait_for(lambda s: value(s, "gpuobs_nvml_up") == 1 and len(one(s, UP)) == 2, 6,
                          "NVML up after the driver appeared")
    assert time.monotonic() - t0 < 4.5
    assert set(one(scrape, UP).values()) == {1.0} and len(one(scrape, TEMP)) == 2
    assert value(scrape, "gpuobs_nvml_init_error", reason="DRIVER_NOT_LOADED") is None
    assert run.get("/readyz")[0] == 200


# ---------------------------------------------------------------------------------------- 6


def test_unknown_errors_reinitialise_nvml_then_gpus_return(exporter):
    run = exporter(TWO, interval=0.05)
    st = run.sim.state
    u0, u1 = uuid(run, 0), uuid(run, 1)
    assert run.values(REINITS) == {"": 0.0}
    idx = st.fail(None, 999)  # every NVML function answers NVML_ERROR_UNKNOWN
    try:
        scrape = run.wait_for(lambda s: value(s, REINITS) >= 1, 10, "a re-initialisation")
        unknown = {l["call"]: v for n, l, v in scrape if n == ERRORS and l["code"] == "UNKNOWN"}
        assert len(unknown) >= 3, f"errors counted per call: {unknown}"
        assert sum(unknown.values()) >= run.exp.session.reinit_after == 20
        # while the driver still fails, nvmlInit fails too: NVML reported down, with the reason
        scrape = run.wait_for(lambda s: value(s, "gpuobs_nvml_init_error", reason="UNKNOWN") == 1, 5,
                              "the init error")
        assert value(scrape, "gpuobs_nvml_up") == 0
        assert not [n for n, l, _ in scrape if "uuid" in l and n != UP]
    finally:
        st.clear_fault(idx)
    scrape = run.wait_for(lambda s: value(s, "gpuobs_nvml_up") == 1 and one(s, UP) == {u0: 1.0, u1: 1.0}
                          and set(one(s, TEMP)) == {u0, u1}, 8, "GPUs back after the fault cleared")
    assert value(scrape, REINITS) >= 1
    assert value(scrape, "gpuobs_nvml_init_error", reason="UNKNOWN") is None


# ---------------------------------------------------------------------------------------- 7


def test_call_hung_on_one_gpu_withholds_only_that_gpu(exporter):
    run = exporter(TWO, interval=0.2)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    run.next_snapshot(2)
    full = series_of(run.scrape(), u1)
    idx = run.sim.state.fail("nvmlDeviceGetUtilizationRates", 0, gpu=0, hang=True)
    try:
        scrape = run.wait_for(lambda s: reasons(s) == {u0: "timeout"}, 3, "the hung GPU withheld")
        for _ in range(5):  # pass after pass: the other GPU is served, fresh, whole
            run.next_snapshot()
            t = time.monotonic()
            scrape = run.scrape()
            assert time.monotonic() - t < 1.0, "/metrics waited on NVML"
            assert value(scrape, STALE) == 0 and one(scrape, UP) == {u0: 0.0, u1: 1.0}
            assert series_of(scrape, u0) == set(), "values of a hung GPU served"
            assert series_of(scrape, u1) == full
            assert time.time() - value(scrape, "gpuobs_exporter_last_success_timestamp_seconds") < 2 * 0.2 + 0.5
        timeouts = one(scrape, "gpuobs_exporter_gpu_timeouts_total")
        assert timeouts[u0] >= 5 and timeouts[u1] == 0
        assert run.get("/readyz")[0] == 200
    finally:
        run.sim.state.clear_fault(idx)
    scrape = run.wait_for(lambda s: set(one(s, UTIL)) == {u0, u1} and not reasons(s), 5, "recovery")
    assert one(scrape, UP) == {u0: 1.0, u1: 1.0}


def test_wedged_nvml_serves_fast_stale_then_recovers(exporter):
    run = exporter(TWO)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    idx = run.sim.state.fail(None, 0, hang=True)  # every NVML call, node-wide ones too
    try:
        deadline = time.monotonic() + 5
        while True:
            t = time.monotonic()
            scrape = run.scrape()
            assert time.monotonic() - t < 1.0, "/metrics waited on NVML"
            if series_of(scrape, u0) | series_of(scrape, u1):  # values read before the hang: young enough
                read_at = value(scrape, "gpuobs_exporter_last_success_timestamp_seconds")
                assert time.time() - read_at <= 2 * run.exp.config.interval + 0.1
            if value(scrape, STALE) == 1:
                break
            assert time.monotonic() < deadline, "snapshot never went stale"
            time.sleep(0.05)
        stuck = run.exp.sampler.samples
        for _ in range(5):
            t = time.monotonic()
            status, _ = run.get("/metrics")
            assert status == 200 and time.monotonic() - t < 1.0
        scrape = run.scrape()
        assert value(scrape, STALE) == 1
        assert not [n for n, l, _ in scrape if "uuid" in l and n != "gpuobs_exporter_gpu_timeouts_total"], \
            "stale GPU values served as fresh"
        # NVML and GPU state are unknown while the sampler is stuck: not served from the old snapshot
        assert value(scrape, "gpuobs_nvml_up") is None and value(scrape, "gpuobs_gpus_present") is None
        assert value(scrape, "gpuobs_gpus_expected") == 2
        status, reason = run.get("/readyz")
        assert status == 503 and "stale" in reason
        assert run.exp.sampler.samples == stuck, "the sampler was not stuck"
    finally:
        run.sim.state.clear_fault(idx)
    scrape = run.wait_for(lambda s: value(s, STALE) == 0 and set(one(s, UTIL)) == {u0, u1}, 5, "recovery")
    assert one(scrape, UP) == {u0: 1.0, u1: 1.0}
    assert run.get("/readyz")[0] == 200


# ---------------------------------------------------------------------------------------- 8


def test_sentinel_and_impossible_values_are_dropped_and_counted(exporter):
    run = exporter(TWO, interval=0.1)
    st = run.sim.state
    u0, u1 = uuid(run, 0), uuid(run, 1)
    g = st.gpu(0)
    set_val(g.util_gpu, 0xFFFFFFFF)
    set_val(g.temp_gpu, 4294967295)
    set_val(g.power_mw, 50_000_000)  # 50 kW on a 700 W board
    set_val(g.util_mem, 150)
    set_val(g.util_enc, 0xFFFFFFFF)  # an idle encoder is re-read on slow samples only
    set_val(st.gpu(1).util_gpu, 42)
    scrape = run.wait_for(lambda s: UTIL not in series_of(s, u0) and POWER not in series_of(s, u0)
                          and "gpuobs_gpu_encoder_utilization_ratio" not in series_of(s, u0), 5,
                          "impossible values dropped")
    run.next_snapshot(2)
    scrape = run.scrape()
    present = series_of(scrape, u0)
    for name in (UTIL, TEMP, POWER, MEM_UTIL, "gpuobs_gpu_encoder_utilization_ratio"):
        assert name not in present, f"{name} served for an impossible value"
        assert name in series_of(scrape, u1)
    assert one(scrape, UTIL)[u1] == pytest.approx(0.42)
    drops = {(l["metric"], l["reason"]): v for n, l, v in scrape if n == DROPPED}
    for key in (("gpuobs_gpu_utilization_ratio", "sentinel"), ("gpuobs_gpu_temperature_celsius", "sentinel"),
                ("gpuobs_gpu_power_usage_watts", "above_limit"),
                ("gpuobs_gpu_memory_utilization_ratio", "out_of_range"),
                ("gpuobs_gpu_encoder_utilization_ratio", "sentinel")):
        assert drops.get(key, 0) >= 2, f"{key} not counted: {drops}"
    n = drops[("gpuobs_gpu_utilization_ratio", "sentinel")]
    run.next_snapshot(2)
    assert run.values(DROPPED, metric="gpuobs_gpu_utilization_ratio", reason="sentinel")[""] > n
    # nothing served anywhere is out of its metric's range
    for name, labels, v in run.scrape():
        m = c.BY_NAME.get(name.removesuffix("_total").removesuffix("_info"))
        if m is not None and m.kind != "info":
            assert m.valid[0] <= v <= m.valid[1], (name, labels, v)
    set_val(g.temp_gpu, 60)  # a good value is served again at once
    run.wait_for(lambda s: one(s, TEMP).get(u0) == 60, 5, "temperature back")


# ---------------------------------------------------------------------------------------- 9


def test_invalid_utf8_name_is_counted_and_the_gpu_still_served(make_sim, start):
    sim = make_sim(TWO, init=False)
    sim.state.set_name(0, b"NVIDIA \xff\xfe")  # before the first sample
    run = start(sim, interval=0.05)
    u0, u1 = sim.state.gpu(0).uuid.s.decode(), sim.state.gpu(1).uuid.s.decode()
    run.next_snapshot(2)
    scrape = run.scrape()
    assert series_of(scrape, u0) == series_of(scrape, u1)
    info = {l["uuid"]: l for n, l, _ in scrape if n == "gpuobs_gpu_info"}
    assert set(info) == {u0, u1} and info[u1]["name"] == "NVIDIA H100 80GB HBM3"
    bad = value(scrape, ERRORS, call="nvmlDeviceGetName", code="UnicodeDecodeError")
    assert bad is not None and bad >= 1

    # during the run; identity is read once per GPU, so again after NVML re-initialises
    sim.state.set_name(1, b"\xc3\x28 broken")
    sim.state.set_name(0, b"NVIDIA H100 80GB HBM3")
    force_reinit(run)
    scrape = run.wait_for(lambda s: {l["uuid"]: l["name"] for n, l, _ in s if n == "gpuobs_gpu_info"}.get(u0)
                          == "NVIDIA H100 80GB HBM3"
                          and value(s, ERRORS, call="nvmlDeviceGetName", code="UnicodeDecodeError") > bad, 5,
                          "names read again")
    run.next_snapshot(2)
    scrape = run.scrape()
    assert series_of(scrape, u0) == series_of(scrape, u1) and len(series_of(scrape, u1)) > 30
    assert {l["uuid"] for n, l, _ in scrape if n == "gpuobs_gpu_info"} == {u0, u1}
    assert one(scrape, UP) == {u0: 1.0, u1: 1.0}


# ---------------------------------------------------------------------------------------- 10


def _set_procs(g, procs: list[tuple[int, int]]) -> None:
    for i, (pid, used) in enumerate(procs):
        p = g.procs[i]
        p.pid, p.kind, p.used_mem, p.sm_util, p.mem_util = pid, 1, used, pid % 100, 10
        p.gi_id = p.ci_id = 0xFFFFFFFF
        p.name.s, p.name.ret = f"job-{pid}".encode(), 0
    g.proc_count = len(procs)


def test_process_churn_leaves_no_series_of_ended_processes_and_keeps_the_cap(make_sim, start):
    cap = 4
    # a long interval: the test drives the sampler itself, one pass per change
    run = start(make_sim(TWO, init=False), families={"identity", "processes"}, process_cap=cap, interval=30)
    st, sampler = run.sim.state, run.exp.sampler
    uuids = [uuid(run, 0), uuid(run, 1)]
    rng = random.Random(7)
    expected: dict[str, dict[str, float]] = {}
    for step in range(200):
        expected = {}
        for slot in (0, 1):
            pids = rng.sample(range(1000, 1060), rng.randint(0, 9))
            procs = [(pid, (rng.randint(1, 4000) * 1000 + pid) * MIB) for pid in pids]  # distinct sizes
            _set_procs(st.gpu(slot), procs)
            top = sorted(procs, key=lambda p: -p[1])[:cap]
            expected[uuids[slot]] = {str(pid): float(used) for pid, used in top}
        sampler.sample_once()
        if step % 50 == 49:
            scrape = run.scrape()
            got = {u: {l["pid"]: v for n, l, v in scrape if n == PROC_MEM and l["uuid"] == u} for u in uuids}
            assert got == expected, f"step {step}"
            names = {l["pid"]: l["process_name"] for n, l, _ in scrape if n == PROC_MEM}
            assert all(name == f"job-{pid}" for pid, name in names.items())
            for u in uuids:
                sm = {l["pid"] for n, l, _ in scrape if n == PROC_SM and l["uuid"] == u}
                assert sm <= set(expected[u]) and len(sm) <= cap
    # the last state: GPU 0 keeps one new process, GPU 1 has none
    _set_procs(st.gpu(0), [(4242, 7 * MIB)])
    _set_procs(st.gpu(1), [])
    sampler.sample_once()
    scrape = run.scrape()
    assert {(l["uuid"], l["pid"]) for n, l, _ in scrape if n in (PROC_MEM, PROC_SM)} <= {(uuids[0], "4242")}
    assert one(scrape, PROC_MEM) == {uuids[0]: 7.0 * MIB}
    assert sampler.samples >= 200


# ---------------------------------------------------------------------------------------- 11


def test_xid_events_are_counted_once_each(exporter):
    run = exporter(TWO)
    st = run.sim.state
    u0, u1 = uuid(run, 0), uuid(run, 1)
    deadline = time.monotonic() + 5  # events before a GPU is registered are not delivered (as in NVML)
    while st.calls().get("nvmlDeviceRegisterEvents", 0) < 2:
        assert time.monotonic() < deadline, "the XID watcher registered no GPU"
        time.sleep(0.05)
    time.sleep(0.1)
    t0 = time.time()
    for _ in range(3):
        st.xid(0, 79)
    st.xid(0, 48)
    run.wait_for(lambda s: one(s, "gpuobs_gpu_xid_errors_total", xid=79).get(u0) == 3, 5, "3 XID 79 counted")
    run.next_snapshot(3)
    scrape = run.scrape()
    assert one(scrape, "gpuobs_gpu_xid_errors_total", xid=79) == {u0: 3.0}
    assert one(scrape, "gpuobs_gpu_xid_errors_total", xid=48) == {u0: 1.0}
    assert not [l for n, l, _ in scrape if n.startswith("gpuobs_gpu_xid") and l["uuid"] == u1]
    seen = one(scrape, "gpuobs_gpu_xid_last_seen_timestamp_seconds", xid=79)
    assert set(seen) == {u0} and t0 - 1 <= seen[u0] <= time.time() + 1
    st.xid(1, 79)
    scrape = run.wait_for(lambda s: one(s, "gpuobs_gpu_xid_errors_total", xid=79).get(u1) == 1, 5, "XID on GPU 1")
    assert one(scrape, "gpuobs_gpu_xid_errors_total", xid=79) == {u0: 3.0, u1: 1.0}

    # XID 79 comes with the GPU falling off the bus: its counter must stay while the GPU is lost
    st.xid(1, 79)
    st.lose_gpu(1)
    scrape = run.wait_for(lambda s: one(s, "gpuobs_gpu_up").get(u1) == 0
                          and one(s, "gpuobs_gpu_xid_errors_total", xid=79).get(u1) == 2, 5, "XID kept for a lost GPU")
    assert not [n for n, l, _ in scrape if l.get("uuid") == u1 and n == "gpuobs_gpu_power_usage_watts"]


def test_process_memory_counted_once_and_unavailable_memory_dropped(exporter):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb"}],
                    "processes": [{"gpu": 0, "pid": 7001, "type": "C+G", "used_mib": 500, "name": "ffmpeg"},
                                  {"gpu": 0, "pid": 7002, "used_mib": 100, "name": "python"}]},
                   families={"processes"})
    run.sim.state.gpu(0).procs[1].used_mem = 2 ** 64 - 1  # NVML_VALUE_NOT_AVAILABLE
    run.next_snapshot(2)
    scrape = run.scrape()
    mem = {l["pid"]: v for n, l, v in scrape if n == "gpuobs_gpu_process_memory_used_bytes"}
    assert mem == {"7001": 500 * 1024 * 1024}  # once, not once per list; 7002 unknown: absent
    dropped = {(l["metric"], l["reason"]) for n, l, v in scrape if n == "gpuobs_exporter_dropped_values_total"}
    assert ("gpuobs_gpu_process_memory_used_bytes", "not_available") in dropped


def test_graphics_only_gpu_is_not_an_nvml_error(exporter):
    """nvmlDeviceGetProcessUtilization answers NOT_FOUND when no compute process left samples:
    that is an answer (no values), not an error for the alerts on gpuobs_exporter_nvml_errors_total."""
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb"}],
                    "processes": [{"gpu": 0, "pid": 7101, "type": "G", "used_mib": 300, "name": "Xorg"}]},
                   families={"processes"})
    run.next_snapshot(3)
    scrape = run.scrape()
    assert {l["pid"] for n, l, _ in scrape if n == PROC_MEM} == {"7101"}
    assert not [l for n, l, _ in scrape if n == PROC_SM]
    assert run.sim.state.calls().get("nvmlDeviceGetProcessUtilization", 0) >= 1  # asked, and it said NOT_FOUND
    errors = [l for n, l, _ in scrape if n == "gpuobs_exporter_nvml_errors_total"]
    assert not errors, errors


# ---------------------------------------------------------------------------------------- 12


def test_mig_devices_and_device_level_series_once_per_gpu(exporter):
    run = exporter({"gpus": [{"profile": H100, "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]}]}, interval=0.1)
    u = uuid(run, 0)
    scrape = run.wait_for(lambda s: len(one(s, "gpuobs_mig_sm_active_ratio")) > 0
                          and len([1 for n, *_ in s if n == "gpuobs_mig_sm_active_ratio"]) == 3, 5,
                          "per-instance GPM ratios")
    info = [l for n, l, _ in scrape if n == "gpuobs_mig_info"]
    assert len(info) == 3 and all(l["uuid"] == u and l["gpu"] == "0" for l in info)
    by_gi = {l["gpu_instance_id"]: l for l in info}
    assert len(by_gi) == 3 and {l["compute_instance_id"] for l in info} == {"0"}
    assert sorted(l["profile"] for l in info) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert len({l["mig_uuid"] for l in info}) == 3 and all(l["mig_uuid"].startswith("MIG-") for l in info)
    mem = {l["gpu_instance_id"]: v for n, l, v in scrape if n == "gpuobs_mig_memory_total_bytes"}
    assert {by_gi[gi]["profile"]: v / MIB for gi, v in mem.items()} == {"3g.40gb": 40448, "2g.20gb": 20096,
                                                                        "1g.10gb": 9984}
    for metric in c.MIG_GPM_METRICS.values():
        got = {l["gpu_instance_id"]: v for n, l, v in scrape if n == metric.name}
        assert set(got) == set(by_gi), metric.name
        assert all(0 <= v <= 1 for v in got.values())
    assert value(scrape, "gpuobs_gpu_mig_enabled", uuid=u) == 1
    # device-level series: once per physical GPU, never per MIG device
    for name in (POWER, TEMP, "gpuobs_gpu_energy_consumption_joules_total", "gpuobs_gpu_memory_total_bytes"):
        rows = [l for n, l, _ in scrape if n == name]
        assert len(rows) == 1 and set(rows[0]) == {"gpu", "uuid"}, (name, rows)
    seen = {}
    for n, l, _ in scrape:
        key = (n, tuple(sorted(l.items())))
        assert key not in seen, f"duplicate series {key}"
        seen[key] = True
    assert not [l for n, l, _ in scrape if n.startswith("gpuobs_gpu_") and "gpu_instance_id" in l]
    # a healthy MIG GPU: no NVML error (NOT_SUPPORTED for a value it lacks is an answer)
    errors = {(l["call"], l["code"]): v for n, l, v in scrape if n == ERRORS}
    assert errors == {}, errors
    run.next_snapshot(12)  # past a slow sample, when MIG devices are enumerated again
    assert {(l["call"], l["code"]): v for n, l, v in run.scrape() if n == ERRORS} == errors
