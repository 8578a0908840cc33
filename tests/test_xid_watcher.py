"""The XID watcher on a simulated node: MIG instance labels, its health gauge and error counter,
supervision (a dead thread is restarted, with back-off), the fallback to nvmlEventSetWait on an
older driver, and rate-limited logs."""

from __future__ import annotations

import ctypes
import logging
import time

import pynvml
import pytest

from gpuobs.sim.state import EVENT_XID

H100 = "h100-sxm-80gb"
TWO = {"gpus": [{"profile": H100, "count": 2}]}
MIG = {"gpus": [{"profile": H100, "mig": ["3g.40gb", "1g.10gb"]}]}
XIDS = "gpuobs_gpu_xid_errors_total"
UP = "gpuobs_exporter_xid_watcher_up"
ERRORS = "gpuobs_exporter_xid_watcher_errors_total"
FAST = {"interval": 0.1}


def series(scrape, name: str, **match) -> dict[tuple, float]:
    """{(uuid, xid, gpu_instance_id, compute_instance_id): value} of one metric."""
    return {(l.get("uuid"), l.get("xid"), l.get("gpu_instance_id"), l.get("compute_instance_id")): v
            for n, l, v in scrape if n == name and all(l.get(k) == str(x) for k, x in match.items())}


def gauge(scrape, name: str, **match) -> float | None:
    got = [v for n, l, v in scrape if n == name and all(l.get(k) == str(x) for k, x in match.items())]
    return got[0] if got else None


def errors(scrape, code: str) -> float:
    return gauge(scrape, ERRORS, code=code) or 0.0


def registered(run, n: int) -> None:
    """Wait until the watcher registered n GPUs (events before that are not delivered, as in NVML)."""
    deadline = time.monotonic() + 10
    while run.sim.state.calls().get("nvmlDeviceRegisterEvents", 0) < n:
        assert time.monotonic() < deadline, "the XID watcher registered no GPU"
        time.sleep(0.05)
    time.sleep(0.1)


def uuid(run, slot: int) -> str:
    return run.sim.state.gpu(slot).uuid.s.decode()


def mig_instances(run) -> list[str]:
    scrape = run.wait_for(lambda s: any(n == "gpuobs_mig_info" for n, _, _ in s), 10, "MIG devices")
    return sorted({l["gpu_instance_id"] for n, l, _ in scrape if n == "gpuobs_mig_info"})


class V1Driver:
    """An older driver's nvmlEventSetWait (the simulator has only the _v2 call): pynvml's
    nvmlEventSetWait_v2 answers FUNCTION_NOT_FOUND, and the symbol nvmlEventSetWait fills the
    pre-NVML-11 nvmlEventData_t (no MIG instance ids) from the simulator's events."""

    class Data(ctypes.Structure):
        _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong)]

    PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)

    def __init__(self, monkeypatch):
        self.calls = 0
        self.v2_calls = 0
        real_v2, real_lookup = pynvml.nvmlEventSetWait_v2, pynvml._nvmlGetFunctionPointer

        def wait(set_addr, data_addr, timeout_ms):
            self.calls += 1
            try:
                ev = real_v2(ctypes.c_void_p(set_addr), timeout_ms)
            except pynvml.NVMLError as e:
                return e.value
            out = self.Data.from_address(data_addr)
            out.device = ctypes.cast(ev.device, ctypes.c_void_p).value
            out.eventType, out.eventData = ev.eventType, ev.eventData
            return pynvml.NVML_SUCCESS

        self.symbol = self.PROTO(wait)  # kept referenced for as long as it may be called

        def missing_v2(*_args):
            self.v2_calls += 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", missing_v2)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer",
                            lambda name: self.symbol if name == "nvmlEventSetWait" else real_lookup(name))


def test_mig_instance_xids_carry_instance_ids(exporter):
    run = exporter(MIG, **FAST)
    st, u = run.sim.state, uuid(run, 0)
    gis = mig_instances(run)
    assert len(gis) == 2
    registered(run, 1)
    st.queue_event(0, EVENT_XID, 43, int(gis[0]), 0)
    st.queue_event(0, EVENT_XID, 43, int(gis[0]), 0)
    st.queue_event(0, EVENT_XID, 43, int(gis[1]), 0)
    st.xid(0, 79)  # names no instance (0xFFFFFFFF)
    want = {(u, "43", gis[0], "0"): 2.0, (u, "43", gis[1], "0"): 1.0, (u, "79", "", ""): 1.0}
    scrape = run.wait_for(lambda s: series(s, XIDS) == want, 5, "XIDs per MIG instance")
    assert set(series(scrape, "gpuobs_gpu_xid_last_seen_timestamp_seconds")) == set(want)
    gpu_label = {l["gpu"] for n, l, _ in scrape if n == XIDS}
    assert gpu_label == {"0"}  # the GPU's identity, not a MIG device's


def test_mig_xids_carry_the_mig_uuid_of_the_named_device(exporter):
    """mig_uuid: the device of the GPU and compute instance named; for a GPU instance split into
    two compute instances and an event naming only it, both UUIDs joined (one series, counted
    once); empty for an event naming no instance or an instance not listed."""
    run = exporter({"gpus": [{"profile": H100, "mig": ["3g.40gb", "1g.10gb", "1g.10gb"]}]}, **FAST)
    st, u = run.sim.state, uuid(run, 0)
    split, single = 2, 9
    migs = st.create_migs(0, [split, split, single], [0, 1, 0])
    run.wait_for(lambda s: {l["mig_uuid"] for n, l, _ in s if n == "gpuobs_mig_info"} == set(migs), 10,
                 "the new MIG layout listed")
    registered(run, 1)
    st.xid(0, 43, gi=split, ci=1)
    st.xid(0, 43, gi=single, ci=0)
    st.xid(0, 31, gi=split)  # the GPU instance only: compute instance 0xFFFFFFFF
    st.xid(0, 13, gi=5, ci=0)  # an instance the listing does not have
    st.xid(0, 79)
    want = {("43", str(split), "1"): migs[1], ("43", str(single), "0"): migs[2],
            ("31", str(split), ""): f"{migs[0]},{migs[1]}", ("13", "5", "0"): "", ("79", "", ""): ""}

    def mig_uuids(scrape):
        return {(l["xid"], l["gpu_instance_id"], l["compute_instance_id"]): l["mig_uuid"]
                for n, l, _ in scrape if n == XIDS and l["uuid"] == u}

    scrape = run.wait_for(lambda s: mig_uuids(s) == want, 5, "XIDs with their MIG UUIDs")
    assert sum(series(scrape, XIDS, xid=31).values()) == 1.0  # the split instance's event, once
    assert {l["mig_uuid"] for n, l, _ in scrape if n == "gpuobs_gpu_xid_last_seen_timestamp_seconds"} == \
        set(want.values())


def test_watcher_health_follows_a_failing_event_wait(exporter):
    run = exporter(TWO, **FAST)
    st = run.sim.state
    run.wait_for(lambda s: gauge(s, UP) == 1.0, 10, "the XID watcher up")
    assert errors(run.scrape(), "UNKNOWN") == 0
    fault = st.fail("nvmlEventSetWait_v2", 999)  # NVML_ERROR_UNKNOWN, every call
    run.wait_for(lambda s: gauge(s, UP) == 0.0 and errors(s, "UNKNOWN") >= 2, 10, "the XID watcher down")
    run.next_snapshot(3)
    assert gauge(run.scrape(), UP) == 0.0  # it keeps failing: stays down
    # ... and the exporter is not ready while it does (its waits failing for over two intervals)
    deadline = time.monotonic() + 5
    while (ready := run.get("/readyz"))[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready[0] == 503 and "xid watcher failing (UNKNOWN)" in ready[1], ready
    st.clear_fault(fault)
    run.wait_for(lambda s: gauge(s, UP) == 1.0, 15, "the XID watcher up again")
    assert run.get("/readyz") == (200, "ready\n")
    st.xid(1, 31)  # and it counts again
    run.wait_for(lambda s: series(s, XIDS).get((uuid(run, 1), "31", "", "")) == 1.0, 5, "an XID after recovery")


@pytest.mark.parametrize("call", ["nvmlEventSetCreate", "nvmlDeviceRegisterEvents"])
def test_watcher_down_while_it_cannot_watch(make_sim, start, call):
    sim = make_sim(TWO, init=False)
    fault = sim.state.fail(call, 999)  # NVML_ERROR_UNKNOWN: no set, or no GPU registered
    run = start(sim, **FAST)
    run.wait_for(lambda s: errors(s, "UNKNOWN") >= 1, 10, f"{call} failures counted")
    run.next_snapshot(2)
    assert gauge(run.scrape(), UP) == 0.0
    sim.state.clear_fault(fault)  # retried with back-off: watches once it can
    run.wait_for(lambda s: gauge(s, UP) == 1.0, 15, "the XID watcher up")
    sim.state.xid(0, 79)
    run.wait_for(lambda s: series(s, XIDS).get((uuid(run, 0), "79", "", "")) == 1.0, 5, "an XID counted")


def test_a_dead_watcher_thread_is_restarted_with_backoff(exporter, monkeypatch):
    class Crash(BaseException):
        """Escapes any `except Exception`: the thread dies."""

    real_wait = pynvml.nvmlEventSetWait_v2
    mode = {"raise": Crash}

    def wait(event_set, timeout_ms):
        if mode["raise"] is not None:
            time.sleep(0.01)
            raise mode["raise"]("injected")
        return real_wait(event_set, timeout_ms)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
    run = exporter(TWO, **FAST)
    run.wait_for(lambda s: errors(s, "restarted") >= 1, 10, "a restart")
    time.sleep(2.0)  # a crash loop: restarted at once, then after 1 s, 2 s, ... not every pass
    scrape = run.scrape()
    assert 1 <= errors(scrape, "restarted") <= 3, errors(scrape, "restarted")
    assert errors(scrape, "Crash") >= errors(scrape, "restarted")
    assert gauge(scrape, UP) == 0.0
    status, reason = run.get("/readyz")  # dead between restarts, or failing: not ready either way
    assert status == 503 and "xid watcher" in reason and "Crash" in reason, (status, reason)

    # an ordinary exception does not kill the thread: counted, and the thread carries on
    mode["raise"] = RuntimeError
    run.wait_for(lambda s: errors(s, "RuntimeError") >= 1, 15, "a RuntimeError counted")
    restarts = errors(run.scrape(), "restarted")
    mode["raise"] = None
    run.wait_for(lambda s: gauge(s, UP) == 1.0, 15, "the XID watcher up after the restart")
    registered(run, 2)
    st = run.sim.state
    st.xid(0, 79)
    st.xid(0, 79)
    scrape = run.wait_for(lambda s: series(s, XIDS).get((uuid(run, 0), "79", "", "")) == 2.0, 5,
                          "XIDs counted after the restart")
    assert errors(scrape, "restarted") == restarts  # no restart while it lived
    assert run.exp.watcher.alive


def test_falls_back_to_the_older_event_wait(make_sim, start, monkeypatch):
    sim = make_sim(MIG, init=False)
    driver = V1Driver(monkeypatch)
    run = start(sim, **FAST)
    gis = mig_instances(run)
    registered(run, 1)
    u = uuid(run, 0)
    sim.state.queue_event(0, EVENT_XID, 43, int(gis[0]), 0)  # the v1 event has no instance ids
    sim.state.xid(0, 79)
    scrape = run.wait_for(lambda s: series(s, XIDS) == {(u, "43", "", ""): 1.0, (u, "79", "", ""): 1.0}, 5,
                          "XIDs through nvmlEventSetWait")
    assert driver.calls > 0
    assert driver.v2_calls == 1  # probed once, then the older call only
    assert gauge(scrape, UP) == 1.0
    assert errors(scrape, "FUNCTION_NOT_FOUND") == 0  # a fallback, not an error


def test_watcher_logs_are_rate_limited(exporter, caplog):
    caplog.set_level(logging.WARNING, logger="gpuobs.xid")
    run = exporter(TWO, **FAST)
    st = run.sim.state
    registered(run, 2)
    run.wait_for(lambda s: gauge(s, UP) == 1.0, 10, "the XID watcher up")
    caplog.clear()
    fault = st.fail("nvmlEventSetWait_v2", 999)
    run.wait_for(lambda s: errors(s, "UNKNOWN") >= 4, 15, "4 failed waits counted")  # each one counted
    st.clear_fault(fault)
    warnings = [r for r in caplog.records if r.name == "gpuobs.xid" and r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]

    # a flood of XIDs: every one counted, the per-event error records bounded
    run.wait_for(lambda s: gauge(s, UP) == 1.0, 15, "the XID watcher up again")
    caplog.clear()
    for _ in range(150):
        st.xid(0, 13)
    run.wait_for(lambda s: series(s, XIDS).get((uuid(run, 0), "13", "", "")) == 150.0, 15, "150 XIDs counted")
    records = [r for r in caplog.records if r.name == "gpuobs.xid" and r.getMessage().startswith("xid error")]
    assert 1 <= len(records) <= 100, len(records)


def test_a_stopped_watcher_frees_its_event_set(make_sim, start):
    """The driver holds a limited number of event sets (the simulator 64, per process): an exporter
    stopped and started again, as tests and embedding programs do, must give its set back."""
    sim = make_sim(TWO, init=False)
    for i in range(3):
        run = start(sim, **FAST)
        registered(run, 2 * (i + 1))  # this exporter's set exists: both GPUs registered in it
        creates = sim.state.calls().get("nvmlEventSetCreate", 0)
        run.exp.stop()
        assert sim.state.calls().get("nvmlEventSetFree", 0) == creates
