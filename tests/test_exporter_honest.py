"""The exporter tells the truth under faults that public bug reports describe (issue 13): NVML
"not available" markers in counters, GPUs that need a reset or whose handle fails, capability
answers (NO_PERMISSION, NOT_SUPPORTED) that change at run time, collectors that raise, process
records that cannot be true, and a slow driver. Each runs on the simulator, over real HTTP."""

from __future__ import annotations

import logging
import os
import time

from test_exporter_faults import DROPPED, TEMP, TWO, UP, UTIL, one, reasons, series_of, uuid, value

from gpuobs.collect.processes import pid_max
from gpuobs.collect.thermal import Thermal
from gpuobs.sim.state import set_val

H100 = "h100-sxm-80gb"
ECC = "gpuobs_gpu_ecc_errors_total"
UNAVAILABLE = "gpuobs_exporter_nvml_unavailable_calls"
ERRORS = "gpuobs_exporter_nvml_errors_total"
SUCCESS = "gpuobs_exporter_collector_success"
COLLECTOR_ERRORS = "gpuobs_exporter_collector_errors_total"
PROC_MEM = "gpuobs_gpu_process_memory_used_bytes"
LAST = "gpuobs_exporter_last_success_timestamp_seconds"
NO_PERMISSION, RESET_REQUIRED, UNKNOWN = 4, 16, 999


def drops(scrape, metric: str) -> dict[str, float]:
    return {labels["reason"]: v for n, labels, v in scrape if n == DROPPED and labels["metric"] == metric}


def not_running_pid() -> int:
    """A possible PID (below the kernel's pid_max) no process has here."""
    pid = pid_max() - 1
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_ecc_counter_sentinel_is_dropped_and_counted_not_served(exporter):
    # one uncorrectable-ECC read of 2^64-1 (NVML's "not available") used to be served as 1.8e19
    # errors and page GpuEccUncorrectable
    run = exporter(TWO, interval=0.1)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    set_val(run.sim.state.gpu(0).ecc[2], 0xFFFFFFFFFFFFFFFF)  # [uncorrected * 2 + volatile]
    scrape = run.wait_for(lambda s: drops(s, "gpuobs_gpu_ecc_errors").get("sentinel", 0) >= 2, 5, "sentinel counted")
    uncorrected = one(scrape, ECC, error_type="uncorrected", counter_type="volatile")
    assert u0 not in uncorrected and uncorrected[u1] == 0
    assert max(v for n, _, v in scrape if n == ECC) < 1e6
    set_val(run.sim.state.gpu(0).ecc[2], 3)
    run.wait_for(lambda s: one(s, ECC, error_type="uncorrected", counter_type="volatile").get(u0) == 3, 5,
                 "a real count served again")


def test_gpu_that_needs_a_reset_is_unhealthy_and_the_others_served(exporter):
    run = exporter(TWO, interval=0.1)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    run.next_snapshot(2)  # GPM ratios need two samples
    full = series_of(run.scrape(), u1)
    idx = run.sim.state.fail(None, RESET_REQUIRED, gpu=0)
    scrape = run.wait_for(lambda s: reasons(s) == {u0: "reset_required"}, 5, "reset required reported")
    assert one(scrape, UP) == {u0: 0.0, u1: 1.0}
    assert series_of(scrape, u0) == set() and series_of(scrape, u1) == full
    run.sim.state.clear_fault(idx)
    run.wait_for(lambda s: one(s, UP) == {u0: 1.0, u1: 1.0} and not reasons(s), 5, "GPU back after the reset")


def test_gpu_whose_handle_fails_from_the_start_is_accounted_for(make_sim, start):
    sim = make_sim(TWO, init=False)
    sim.state.fail("nvmlDeviceGetUUID", UNKNOWN, gpu=1)  # before the exporter ever saw it
    run = start(sim, interval=0.1)
    u0 = uuid(run, 0)
    scrape = run.wait_for(lambda s: len([1 for n, _, _ in s if n == UP]) == 2, 5, "both GPUs accounted for")
    ups = {(labels["gpu"], labels.get("uuid", "")): v for n, labels, v in scrape if n == UP}
    assert ups == {("0", u0): 1.0, ("1", ""): 0.0}
    assert value(scrape, "gpuobs_gpus_present") == 2
    assert {labels["gpu"]: labels["reason"] for n, labels, _ in scrape if n == "gpuobs_gpu_unhealthy"} == \
        {"1": "unreadable"}


def test_no_permission_is_a_capability_answer_logged_once(exporter, caplog):
    run = exporter(TWO, interval=0.1)
    _u0, u1 = uuid(run, 0), uuid(run, 1)
    with caplog.at_level(logging.INFO, logger="gpuobs.nvml"):
        run.sim.state.fail("nvmlDeviceGetTemperature", NO_PERMISSION, gpu=0)
        scrape = run.wait_for(lambda s: set(one(s, TEMP)) == {u1}, 5, "temperature withheld")
        run.next_snapshot(5)
        scrape = run.scrape()
    gauge = {(labels["call"], labels["reason"]): v for n, labels, v in scrape if n == UNAVAILABLE}
    assert gauge[("nvmlDeviceGetTemperature", "no_permission")] == 1
    assert not [labels for n, labels, _ in scrape if n == ERRORS and labels["call"] == "nvmlDeviceGetTemperature"]
    said = [r for r in caplog.records if getattr(r, "call", "") == "nvmlDeviceGetTemperature"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and said[0].reason == "no_permission"


def test_unsupported_value_comes_back_without_a_restart(exporter):
    run = exporter(TWO, interval=0.1)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    run.exp.session.reprobe_after = 1.0
    g = run.sim.state.gpu(0)
    set_val(g.temp_gpu, None)  # NOT_SUPPORTED, as a value the driver does not give yet
    run.wait_for(lambda s: set(one(s, TEMP)) == {u1}, 5, "the value withheld")
    set_val(g.temp_gpu, 61)
    start = time.monotonic()
    scrape = run.wait_for(lambda s: one(s, TEMP).get(u0) == 61, 5, "the value re-probed")
    assert time.monotonic() - start < 1.0 + 1.0  # reprobe_after plus a pass or two
    assert run.exp.session.reinits == 0
    assert value(scrape, UNAVAILABLE, call="nvmlDeviceGetTemperature", reason="not_supported") is None


def test_mig_mode_change_forgets_what_the_gpu_answered(exporter):
    run = exporter({"gpus": [{"profile": H100, "count": 1}]}, interval=0.05)
    u0 = uuid(run, 0)
    session = run.exp.session
    session.reprobe_after = 3600  # only the MIG change may bring it back
    g = run.sim.state.gpu(0)
    set_val(g.temp_gpu, None)
    run.wait_for(lambda s: u0 not in one(s, TEMP), 5, "the value withheld")
    assert session.is_unavailable(u0, "nvmlDeviceGetTemperature:")
    set_val(g.temp_gpu, 50)
    set_val(g.mig_current, 1)  # MIG enabled (the mig family reads the mode on slow samples)
    run.wait_for(lambda s: one(s, TEMP).get(u0) == 50, 5, "re-probed after the MIG mode change")


def test_collector_that_raises_is_counted_and_the_rest_served(exporter, monkeypatch, caplog):
    run = exporter(TWO, interval=0.05)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    assert value(run.scrape(), SUCCESS, collector="thermal") == 1

    def broken(self, gpu):
        raise RuntimeError("a bug in one collector")

    with caplog.at_level(logging.ERROR, logger="gpuobs.sampler"):
        monkeypatch.setattr(Thermal, "collect", broken)
        scrape = run.wait_for(lambda s: value(s, SUCCESS, collector="thermal") == 0, 5, "collector failure reported")
        run.next_snapshot(10)
        scrape = run.scrape()
    assert value(scrape, COLLECTOR_ERRORS, collector="thermal") >= 20  # 2 GPUs x 10 passes
    assert value(scrape, SUCCESS, collector="memory") == 1 and value(scrape, SUCCESS, collector="sampler") == 1
    assert set(one(scrape, UTIL)) == {u0, u1} and TEMP not in series_of(scrape, u0)
    logged = [r for r in caplog.records if r.getMessage() == "collector failed"]
    assert len(logged) == 1, "one log record per minute, not one per GPU and pass"
    monkeypatch.undo()
    run.wait_for(lambda s: value(s, SUCCESS, collector="thermal") == 1 and set(one(s, TEMP)) == {u0, u1}, 5,
                 "collector back")


def test_impossible_process_records_are_dropped_and_counted(exporter):
    alive, gone = os.getpid(), not_running_pid()
    run = exporter({"gpus": [{"profile": H100, "count": 2}],
                    "processes": [{"gpu": 0, "pid": alive, "name": "python train.py", "used_mib": 1000},
                                  {"gpu": 0, "pid": 0, "name": "?", "used_mib": 10},
                                  {"gpu": 0, "pid": gone, "name": "ended", "used_mib": 20},
                                  # GPU 1: more memory in processes than the GPU has (80 GB)
                                  {"gpu": 1, "pid": alive, "name": "python a.py", "used_mib": 60000},
                                  {"gpu": 1, "pid": alive + 0, "name": "python a.py", "used_mib": 60000, "type": "G"},
                                  {"gpu": 1, "pid": 1, "name": "init", "used_mib": 50000}]},
                   interval=0.1, families={"identity", "memory", "processes"})
    u0, _u1 = uuid(run, 0), uuid(run, 1)
    scrape = run.wait_for(lambda s: PROC_MEM in series_of(s, u0), 5, "process series")
    served = {(labels["uuid"], labels["pid"]) for n, labels, _ in scrape if n == PROC_MEM}
    assert served == {(u0, str(alive))}
    counted = drops(scrape, "gpuobs_gpu_process_memory_used_bytes")
    assert counted.get("invalid_pid", 0) >= 1 and counted.get("not_running", 0) >= 1
    assert counted.get("out_of_range", 0) >= 2


def test_processes_are_read_per_mig_device(exporter):
    alive = os.getpid()
    run = exporter({"gpus": [{"profile": H100, "mig": ["3g.40gb", "2g.20gb"]}]}, interval=0.1,
                   families={"identity", "memory", "mig", "processes"})
    scrape = run.wait_for(lambda s: any(n == "gpuobs_mig_info" for n, _, _ in s), 5, "MIG devices")
    ids = sorted((labels["gpu_instance_id"], labels["compute_instance_id"]) for n, labels, _ in scrape
                 if n == "gpuobs_mig_info")
    g = run.sim.state.gpu(0)
    for slot, (gi, ci) in enumerate(ids):
        p = g.procs[slot]
        p.pid, p.kind, p.gi_id, p.ci_id, p.used_mem = alive, 1, int(gi), int(ci), (slot + 1) * 1024 ** 3
    g.proc_count = len(ids)
    scrape = run.wait_for(lambda s: len([1 for n, _, _ in s if n == PROC_MEM]) == len(ids), 5, "per-instance records")
    got = {(labels["gpu_instance_id"], labels["compute_instance_id"]): v for n, labels, v in scrape if n == PROC_MEM}
    assert got == {ids[i]: float((i + 1) * 1024 ** 3) for i in range(len(ids))}


def test_values_served_are_never_older_than_the_bound_with_a_slow_driver(exporter):
    interval = 0.5
    run = exporter(TWO, interval=interval)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    # every read of GPU 0's utilization takes 250 ms, GPU 1's 300 ms: passes take most of the
    # interval, and the values in them were read at its start
    run.sim.state.fail("nvmlDeviceGetUtilizationRates", 0, gpu=0, delay_ms=250)
    run.sim.state.fail("nvmlDeviceGetUtilizationRates", 0, gpu=1, delay_ms=300)
    served, worst = 0, 0.0
    end = time.monotonic() + 4
    while time.monotonic() < end:
        # the age at the time the request was sent: a lower bound of the age at serving, so a busy
        # machine's delay in parsing the answer is not counted as staleness the exporter served
        asked = time.time()
        scrape = run.scrape()
        if series_of(scrape, u0) or series_of(scrape, u1):
            served += 1
            worst = max(worst, asked - value(scrape, LAST))
        time.sleep(0.03)
    assert served > 50
    assert worst <= 2 * interval, f"values {worst:.2f} s old served as fresh"
    assert set(one(scrape, UTIL)) == {u0, u1}  # slow, but inside the deadline: served


def test_log_records_dropped_by_fluentd_show_on_the_exporters_metrics(exporter):
    from conftest import free_port

    from gpuobs.logs import FluentdHandler, records_dropped_total

    run = exporter(TWO, interval=0.1)
    before = records_dropped_total()
    assert value(run.scrape(), "gpuobs_telemetry_log_records_dropped_total") == before
    # nothing listens on this port: every record is given up within the delivery timeout
    handler = FluentdHandler("127.0.0.1", free_port(), timeout=0.2, connect_timeout=0.1, delivery_timeout=0.5)
    logger = logging.getLogger("gpuobs.test.dropped")
    logger.addHandler(handler)
    try:
        for i in range(20):
            logger.warning("record %d", i)
        scrape = run.wait_for(lambda s: value(s, "gpuobs_telemetry_log_records_dropped_total") == before + 20, 10,
                              "the drops on /metrics")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert value(scrape, "gpuobs_telemetry_log_records_dropped_total") == records_dropped_total()


def test_one_driver_failure_is_one_reinitialisation_and_no_gpu_is_up_without_nvml(exporter):
    # every GPU's thread sees the failure; only the first error streak may re-initialise, and the
    # pass in which NVML went down must not report GPUs up with the values it cached before
    run = exporter({"gpus": [{"profile": H100, "count": 8}]}, interval=0.1)
    run.next_snapshot(2)
    idx = run.sim.state.fail(None, UNKNOWN)  # nvmlInit fails too: NVML stays down
    try:
        end = time.monotonic() + 3
        while time.monotonic() < end:
            scrape = run.scrape()
            if value(scrape, "gpuobs_nvml_up") == 0:
                assert not [labels for n, labels, v in scrape if n == UP and v == 1], "a GPU up while NVML is down"
                assert not series_of(scrape, uuid(run, 0)), "cached values served while NVML is down"
        assert run.exp.session.reinits == 1
        assert value(scrape, "gpuobs_exporter_nvml_reinits_total") == 1
    finally:
        run.sim.state.clear_fault(idx)
    run.wait_for(lambda s: len([v for n, _, v in s if n == UP and v == 1]) == 8, 10, "GPUs back")


def test_gpu_whose_every_call_fails_is_unreadable_not_served_from_cache(exporter):
    run = exporter(TWO, interval=0.1)
    u0, u1 = uuid(run, 0), uuid(run, 1)
    run.exp.session.reinit_after = 10 ** 9  # errors of one GPU: not a driver failure here
    run.next_snapshot(2)
    assert "gpuobs_gpu_max_clock_hertz" in series_of(run.scrape(), u0)  # a value read on slow passes only
    idx = run.sim.state.fail(None, UNKNOWN, gpu=0)
    try:
        scrape = run.wait_for(lambda s: reasons(s) == {u0: "unreadable"}, 5, "the GPU unreadable")
        run.next_snapshot(3)
        scrape = run.scrape()
        assert reasons(scrape) == {u0: "unreadable"} and series_of(scrape, u0) == set()
        assert one(scrape, UP) == {u0: 0.0, u1: 1.0} and TEMP in series_of(scrape, u1)
    finally:
        run.sim.state.clear_fault(idx)
    run.wait_for(lambda s: one(s, UP) == {u0: 1.0, u1: 1.0} and not reasons(s), 5, "the GPU back")


def test_nvlink_fabric_that_comes_up_later_is_served_without_a_restart(make_sim, start):
    sim = make_sim({"gpus": [{"profile": H100, "count": 1}]}, init=False)
    g = sim.state.gpu(0)
    links = g.link_count
    assert links > 0
    g.link_count = 0  # no links yet: the link count answers NOT_SUPPORTED
    run = start(sim, interval=0.1, families={"identity", "nvlink"})
    run.exp.session.reprobe_after = 1.0
    run.next_snapshot(3)
    assert not [n for n, _, _ in run.scrape() if n == "gpuobs_gpu_nvlink_link_up"]
    g.link_count = links
    run.wait_for(lambda s: len([1 for n, _, _ in s if n == "gpuobs_gpu_nvlink_link_up"]) == links, 5,
                          "the links after a re-probe")
    assert run.exp.session.reinits == 0
