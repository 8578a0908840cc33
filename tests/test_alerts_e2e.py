"""End to end: simulated faults -> gpuobs exporter -> real Prometheus (fast rule profile) -> real
Alertmanager -> a local webhook receiver. Exactly the expected alerts arrive, inhibited ones do
not, and each resolves after its fault is cleared."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from conftest import free_port, require_tool, stop
from gpuobs.alerts.build import alertmanager_config, write_fast_rules
from gpuobs.demo import OnCall
from gpuobs.sim.state import set_val

GIB = 1024 ** 3
NODE = {"gpus": [{"profile": "h100-sxm-80gb", "count": 4}]}


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_tool("prometheus-alertmanager")
    hook = OnCall(echo=False)
    config = tmp_path / "alertmanager.yml"
    urls = {name: f"{hook.url}/{name}" for name in ("pager", "ticket", "watchdog")}
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
    pytest.fail(f"timed out after {timeout}s waiting for: {what}")


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
