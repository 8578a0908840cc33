"""Liveness, readiness and shutdown with NVML wedged (every call hanging, as the simulator's
fail(None, 0, hang=True) makes it): /healthz fails once sampling has stalled for the liveness
timeout, the OTLP push sends no GPU value of a stale snapshot, SIGTERM ends the process in bounded
time, and the Kubernetes probes match those bounds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml
from conftest import REPO, OTLPReceiver, free_port

from gpuobs import catalog as c
from gpuobs.exporter import LIVENESS_MIN_S, STOP_TIMEOUT_S, liveness_timeout
from gpuobs.exporter.render import SELF_FAMILIES

TWO = {"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}
INTERVAL = 0.2
# What the OTLP push names each catalog metric (an info metric by its exposed _info name)
OTLP_NAMES = {m.exposed_name if m.kind == "info" else m.name: m for m in c.ALL}
UNKNOWN_WHEN_STALE = {c.NVML_UP, c.GPUS_PRESENT, c.NVML_INFO, c.NVML_INIT_ERROR}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def wedged(state):
    """Every NVML call hangs (nvmlInit included) until the block ends."""
    idx = state.fail(None, 0, hang=True)
    try:
        yield time.monotonic()
    finally:
        state.clear_fault(idx)


# ------------------------------------------------------------------------------------ liveness


def test_default_liveness_timeout_is_six_intervals_and_at_least_30s():
    assert LIVENESS_MIN_S == 30
    assert liveness_timeout(0.2) == 30 and liveness_timeout(5) == 30
    assert liveness_timeout(10) == 60 and liveness_timeout(60) == 360
    assert liveness_timeout(5, 12.5) == 12.5


def test_healthz_fails_when_sampling_stalls_for_the_liveness_timeout_then_recovers(make_sim, start):
    bound = 1.5
    run = start(make_sim(TWO, init=False), interval=INTERVAL, families={"power", "utilization"},
                liveness_timeout=bound)
    assert run.exp.liveness_timeout == bound
    assert run.get("/healthz") == (200, "ok\n")
    run.next_snapshot(2)
    with wedged(run.sim.state) as t0:
        status, reason = wait(lambda: (r := run.get("/healthz"))[0] != 200 and r, bound + 5, "/healthz to fail")
        failed_after = time.monotonic() - t0
        # no earlier than the bound after the last completed pass (at most one interval before t0)
        assert failed_after >= bound - INTERVAL - 0.05, f"/healthz failed after {failed_after:.2f}s"
        assert status == 503 and "sampling stalled" in reason and f"{bound:g}s" in reason, reason
        assert run.get("/readyz")[0] == 503
        assert run.get("/metrics")[0] == 200  # still served (self-health only), never waiting on NVML
        stuck = run.exp.sampler.samples
    wait(lambda: run.get("/healthz")[0] == 200, 5, "/healthz to recover")
    wait(lambda: run.get("/readyz")[0] == 200, 5, "/readyz to recover")
    assert run.exp.sampler.samples > stuck


# ---------------------------------------------------------------------------------------- OTLP


class _Points:
    """Every data point the OTLP receiver got: (metric, catalog metric, time in s, attributes, value)."""

    def __init__(self):
        self.points: list[tuple[str, c.Metric, float, dict, float]] = []
        self.requests = 0
        self.lock = threading.Lock()

    def add(self, request) -> None:
        found = []
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in (getattr(m, kind).data_points if kind else ()):
                        attrs = {a.key: a.value.string_value for a in p.attributes}
                        value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                        found.append((m.name, OTLP_NAMES[m.name], p.time_unix_nano / 1e9, attrs, value))
        with self.lock:
            self.points.extend(found)
            self.requests += 1

    def since(self, t: float) -> list[tuple[str, c.Metric, float, dict, float]]:
        with self.lock:
            return [p for p in self.points if p[2] > t]


@pytest.fixture
def otlp_receiver():
    # requested before `start`, so that it closes after the exporter's final export
    points = _Points()
    receiver = OTLPReceiver(on_metrics=points.add)
    yield points, f"{receiver.url}/v1/metrics"
    receiver.close()


def _gpu_values(points) -> list[tuple[str, dict]]:
    """Data points that carry GPU (or NVML) state: anything but the exporter's own health."""
    return [(name, attrs) for name, metric, _, attrs, _ in points
            if metric.family not in SELF_FAMILIES or metric in UNKNOWN_WHEN_STALE]


def _stale_flags(points) -> list[float]:
    return [v for name, _, _, _, v in points if name == c.SNAPSHOT_STALE.name]


def test_otlp_sends_no_gpu_values_while_the_snapshot_is_stale(otlp_receiver, make_sim, start):
    rec, endpoint = otlp_receiver
    run = start(make_sim(TWO, init=False), interval=INTERVAL, families={"power", "utilization"},
                otlp_endpoint=endpoint)
    wait(lambda: any(n == "gpuobs_gpu_power_usage_watts" for n, *_ in rec.since(0)), 15, "GPU values over OTLP")
    assert 0.0 in _stale_flags(rec.since(0))
    with wedged(run.sim.state):
        wait(lambda: not run.exp.fresh(), 5, "the snapshot to go stale")
        last = run.exp.renderer.snapshot
        # the same rule as /metrics: nothing exported after 2 intervals past the values may carry them
        bound = last.time + 2 * INTERVAL + 0.1
        after = wait(lambda: (p := rec.since(bound)) and len({t for _, _, t, _, _ in p}) >= 5 and p, 10,
                     "five exports after the freshness bound")
        assert not _gpu_values(after), f"stale GPU values sent with fresh timestamps: {_gpu_values(after)[:5]}"
        flags = _stale_flags(after)
        assert flags and set(flags) == {1.0}
        names = {n for n, *_ in after}
        assert {c.GPUS_EXPECTED.name, c.SAMPLES.name} <= names, names  # self-health still sent
        assert run.exp.renderer.snapshot is last, "the sampler was not stuck"
    t = time.time()

    def power_uuids(points):
        return {a["uuid"] for n, _, _, a, _ in points if n == "gpuobs_gpu_power_usage_watts"}

    # the first pass after the release may still count the GPU whose call hung as timed out (values withheld for
    # that pass), so recovery is both GPUs' values within a few passes, not necessarily in the first export
    back = wait(lambda: (p := rec.since(t)) and len(power_uuids(p)) == 2 and p, 10, "both GPUs' values over OTLP again")
    assert 0.0 in _stale_flags(back)


# ------------------------------------------------------------------------------------ shutdown


def test_sigterm_ends_the_exporter_in_bounded_time_with_nvml_wedged(make_sim, tmp_path):
    """The case a liveness restart leads to: NVML is still wedged when the new process starts, its
    first nvmlInit hangs (holding the session), /healthz fails, and Kubernetes sends SIGTERM."""
    sim = make_sim(TWO, init=False)
    port = free_port()
    env = {k: v for k, v in sim.env().items() if not k.startswith(("GPUOBS_", "OTEL_"))
           or k in ("GPUOBS_SIM_STATE", "GPUOBS_CACHE_DIR")}
    err = tmp_path / "stderr.log"
    url = f"http://127.0.0.1:{port}"
    with wedged(sim.state), open(err, "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                                 "--port", str(port), "--interval", str(INTERVAL), "--liveness-timeout", "1",
                                 "--kubelet-socket", ""], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err_f)
        try:
            def healthz():
                assert proc.poll() is None, f"exporter exited {proc.returncode}: {err.read_text()}"
                try:
                    return get(url + "/healthz")
                except OSError:
                    return None
            wait(healthz, 20, "the exporter to listen")
            wait(lambda: any(n.startswith("nvmlInit") for n in sim.state.calls()), 10, "nvmlInit to be called (and hang)")
            status, reason = wait(lambda: (r := healthz()) and r[0] == 503 and r, 10, "/healthz to fail")
            assert "sampling stalled" in reason
            assert get(url + "/readyz")[0] == 503
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=STOP_TIMEOUT_S + 5)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {STOP_TIMEOUT_S + 5:g}s after SIGTERM: {err.read_text()[-2000:]}")
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert code == 0, err.read_text()[-2000:]
    assert took < STOP_TIMEOUT_S + 3, f"exit took {took:.1f}s"
    lines = [json.loads(line) for line in err.read_text().splitlines()]  # every line is JSON, flushed
    stopping = next(i for i, r in enumerate(lines) if r["message"] == "stopping")
    abandoned = [r for r in lines[stopping:] if r["message"].startswith("shutdown abandoned")]
    assert abandoned and abandoned[0]["level"] == "WARNING", lines[stopping:]
    assert abandoned[0]["step"] == "nvml-shutdown" and abandoned[0]["abandoned"] == ["nvml-shutdown"]


def test_cli_liveness_timeout_option():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUOBS_", "OTEL_"))}
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--help"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--liveness-timeout" in r.stdout
    # at most 2 intervals would fail a healthy exporter between passes
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--interval", "5", "--port", "0"], cwd=REPO,
                       env={**env, "GPUOBS_LIVENESS_TIMEOUT": "10"}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--liveness-timeout" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------- Kubernetes


def test_kubernetes_probes_match_the_exporter_bounds():
    (ds,) = [d for d in yaml.safe_load_all((REPO / "exporters/kubernetes/daemonset.yaml").read_text())
             if d and d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert not {"--interval", "--liveness-timeout"} & set(container.get("args", []))
    assert not {"GPUOBS_INTERVAL", "GPUOBS_LIVENESS_TIMEOUT"} & {e["name"] for e in container["env"]}
    interval = 5.0  # the default
    bound = liveness_timeout(interval)
    live, ready = container["livenessProbe"], container["readinessProbe"]
    assert live["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert ready["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # /healthz fails only after `bound` seconds without progress: one failure means wedged, and the
    # threshold only rides out a slow answer; the restart comes within bound + period x threshold
    restart_after = bound + live.get("initialDelaySeconds", 0) + live["periodSeconds"] * live["failureThreshold"]
    assert restart_after <= 90, restart_after
    assert live["timeoutSeconds"] >= 2 and live.get("successThreshold", 1) == 1
    # readiness follows freshness (2 intervals): checked at least once per freshness bound
    assert ready["periodSeconds"] <= 2 * interval and ready["periodSeconds"] * ready["failureThreshold"] <= 3 * interval
    # SIGTERM ends the process within the stop bound: the grace period leaves room for it
    grace = pod["terminationGracePeriodSeconds"]
    assert STOP_TIMEOUT_S + 5 <= grace <= 30
