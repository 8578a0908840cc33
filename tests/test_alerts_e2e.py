"""End to end: simulated faults -> gpuobs exporter -> real Prometheus (fast rule profile) -> real
Alertmanager -> a local webhook receiver. Exactly the expected alerts arrive, inhibited ones do
not, and each resolves after its fault is cleared."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml
from conftest import REPO, free_port, require_tool, stop

from gpuobs.alerts.build import RECEIVERS, alertmanager_config, write_fast_rules
from gpuobs.demo import OnCall
from gpuobs.sim.state import set_counter, set_val

GIB = 1024 ** 3
NODE = {"gpus": [{"profile": "h100-sxm-80gb", "count": 4}]}


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_tool("prometheus-alertmanager")
    hook = OnCall(echo=False)
    config = tmp_path / "alertmanager.yml"
    urls = {name: f"{hook.url}/{name}" for name in RECEIVERS}
    config.write_text(yaml.safe_dump(alertmanager_config(urls, fast=True)))
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    yield f"127.0.0.1:{port}", hook
    stop(proc)
    hook.server.shutdown()


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for: {what() if callable(what) else what}")


def test_faults_page_the_right_alerts_and_resolve(exporter, prometheus, alertmanager, tmp_path):
    am, hook = alertmanager
    run = exporter(NODE, interval=0.5)
    st = run.sim.state
    uuids = [st.gpu(i).uuid.s.decode() for i in range(4)]
    for i in range(4):  # a busy node: every GPU computing and holding memory
        set_val(st.gpu(i).util_gpu, 90)
        set_val(st.gpu(i).mem_used, 40 * GIB)
    query = prometheus([f"127.0.0.1:{run.exp.http.port}"], rule_files=(str(write_fast_rules(tmp_path)),),
                       alertmanager=am)
    wait_until(lambda: hook.first("Watchdog") is not None, 30, "the Watchdog notification")
    run.next_snapshot(3)  # the exporter has seen all four GPUs: expected = 4

    t0 = time.monotonic()
    g0, g2 = st.gpu(0), st.gpu(2)
    set_val(g0.clock_events, 0x40)  # GPU 0: HW thermal slowdown ...
    set_val(g0.temp_gpu, 86)  # ... and hot (a warning the critical alert inhibits)
    st.xid(1, 79)  # GPU 1: XID 79, then it falls off the bus
    run.wait_for(lambda s: any(n == "gpuobs_gpu_xid_errors_total" and l["uuid"] == uuids[1] for n, l, _ in s), 10,
                 "XID 79 counted")
    st.lose_gpu(1)
    set_val(g2.util_gpu, 0)  # GPU 2: allocated (40 GiB held) but idle

    # a GPU that fell off the bus is still counted by the driver: GpuLost, not GpuMissing
    expected = {("GpuHwThermalSlowdown", uuids[0]), ("GpuXidRebootRequired", uuids[1]), ("GpuLost", uuids[1]),
                ("GpuAllocatedIdle", uuids[2])}
    wait_until(lambda: expected <= {k for k, v in hook.firing().items() if v == "firing"}, 90,
               f"notifications for {sorted(expected)}; got {hook.firing()}")
    for name, _ in sorted(expected):
        print(f"{name}: notified {hook.first(name) - t0:.1f} s after its fault")

    # GpuTemperatureNearSlowdown is active in Prometheus but inhibited by the critical thermal alert
    active = {r["metric"]["alertname"] for r in query('ALERTS{alertstate="firing"}')}
    assert "GpuTemperatureNearSlowdown" in active
    time.sleep(3)  # give Alertmanager time to (not) send it
    arrived = {k for k, v in hook.firing().items() if v == "firing"}
    assert arrived == expected | {("Watchdog", "")}, arrived
    routes = {(name, path) for path, name, status, _, _ in hook.notifications() if status == "firing"}
    assert ("GpuHwThermalSlowdown", "pager") in routes and ("GpuAllocatedIdle", "ticket") in routes
    assert ("Watchdog", "watchdog") in routes
    labels = next(l for _, n, _, l, _ in hook.notifications() if n == "GpuHwThermalSlowdown")
    assert labels["severity"] == "critical" and labels["node"] == "sim-node" and labels["cluster"] == "test"
    assert labels["gpu"] == "0" and labels["scope"] == "gpu" and labels["family"] == "thermal"

    # clear every fault: each alert resolves
    t1 = time.monotonic()
    set_val(g0.clock_events, 0)
    set_val(g0.temp_gpu, 60)
    st.lose_gpu(1, False)
    set_val(g2.util_gpu, 80)
    wait_until(lambda: all(hook.firing().get(k) == "resolved" for k in expected), 120,
               f"resolved notifications for {sorted(expected)}")
    for name, _ in sorted(expected):
        print(f"{name}: resolved {hook.first(name, 'resolved') - t1:.1f} s after the fix")
    assert hook.firing()[("Watchdog", "")] == "firing"


def _trainer(tmp_path, port: int, fault_file) -> subprocess.Popen:
    """The example trainer as rank 1 (local rank 0: it serves on port itself) of job e2e-job, playing the faults
    written to fault_file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SLURM", "TORCHELASTIC", "GPUOBS_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "JOB_ID", "KUBERNETES_SERVICE_HOST", "POD_NAME")}
    env.update(RANK="1", LOCAL_RANK="0", WORLD_SIZE="2", GPUOBS_JOB_ID="e2e-job", GPUOBS_PROMETHEUS_PORT=str(port),
               GPUOBS_PROMETHEUS_ADDR="127.0.0.1", PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, str(REPO / "examples" / "train.py"), "--steps", "1000000",
                             "--compute-ms", "10", "--fault-file", str(fault_file)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(360)  # the ECC trend needs a minute of its own quiet baseline first
def test_nccl_timeout_and_climbing_ecc_page_through_alertmanager(exporter, prometheus, alertmanager, tmp_path):
    """A rank's NCCL watchdog timeout (a real log record through gpuobs.logs, counted by the trainer)
    and one GPU's corrected ECC errors climbing (against its own quiet baseline) reach the webhook
    through the real Alertmanager, each on its route; nothing else of the kind fires, and both
    resolve once the faults stop."""
    am, hook = alertmanager
    run = exporter(NODE, interval=0.5)
    st = run.sim.state
    uuids = [st.gpu(i).uuid.s.decode() for i in range(4)]
    for i in range(4):
        set_val(st.gpu(i).util_gpu, 90)
        set_val(st.gpu(i).mem_used, 40 * GIB)
    faults = tmp_path / "faults"
    faults.touch()
    train_port = free_port()
    trainer = _trainer(tmp_path, train_port, faults)
    try:
        query = prometheus([f"127.0.0.1:{run.exp.http.port}", f"127.0.0.1:{train_port}"],
                           rule_files=(str(write_fast_rules(tmp_path)),), alertmanager=am)
        quiet_until = time.monotonic() + 45  # GPU 3's own quiet baseline, which the trend compares with
        wait_until(lambda: query('gpuobs_log_pattern_matches_total{pattern="collective_timeout"}'), 60,
                   "the trainer's pattern counters scraped")
        wait_until(lambda: hook.first("Watchdog") is not None, 30, "the Watchdog notification")
        time.sleep(max(0.0, quiet_until - time.monotonic()))
        t0 = time.monotonic()
        for counter in (0, 1):  # GPU 3: corrected ECC errors, volatile and aggregate, 2 a second
            set_counter(st.gpu(3).ecc[counter], rate=2.0)
        with open(faults, "a") as f:
            f.write("collective_timeout\n")
        expected = {("TrainingCollectiveTimeout", ""), ("GpuEccCorrectedRising", uuids[3])}
        # each fires in its own time: the timeout at once (and resolves once the window has passed it),
        # the trend once the GPU has a minute of quiet baseline behind the climb
        wait_until(lambda: all(hook.first(name) is not None for name, _ in expected), 150,
                   lambda: f"notifications for {sorted(expected)}; got {hook.firing()}; Prometheus alerts: "
                           f"{sorted((r['metric']['alertname'], r['metric']['alertstate']) for r in query('ALERTS'))}")
        for name, _ in sorted(expected):
            print(f"{name}: notified {hook.first(name) - t0:.1f} s after its fault")
        timeout = next(l for _, n, _, l, _ in hook.notifications() if n == "TrainingCollectiveTimeout")
        assert timeout["job_id"] == "e2e-job" and timeout["rank"] == "1" and timeout["severity"] == "critical"
        rising = {l.get("uuid") for _, n, _, l, _ in hook.notifications() if n == "GpuEccCorrectedRising"}
        assert rising == {uuids[3]}, rising  # the other GPUs' flat counters stay quiet
        routes = {(name, path) for path, name, status, _, _ in hook.notifications() if status == "firing"}
        assert ("TrainingCollectiveTimeout", "job-owner") in routes, routes
        assert any(name == "GpuEccCorrectedRising" and path in ("ticket", "pager") for name, path in routes), routes

        for counter in (0, 1):  # the GPU is replaced; the job restarted from its checkpoint
            set_counter(st.gpu(3).ecc[counter], rate=0.0)
        wait_until(lambda: all(hook.firing().get(k) == "resolved" for k in expected), 150,
                   f"resolved notifications for {sorted(expected)}; got {hook.firing()}")
    finally:
        stop(trainer)
