"""`gpuobs demo` non-interactively: the scripted incident's alerts reach the webhook and resolve,
the slow rank's one straggler ticket and `gpuobs explain` name its throttled GPU and the cause,
the narration says so only once Alertmanager does, the start-up pages nobody, the command exits 0,
and no process it started is left behind: not after a clean exit, not after SIGHUP (a closed
terminal), not after SIGKILL; grandchildren included."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import REPO, require_tool

from gpuobs import demo

EXPECTED = ("GpuHwThermalSlowdown", "GpuAllocatedIdle", "GpuXidRebootRequired", "GpuLost",
            "TrainingCollectiveTimeout", "GpuEccCorrectedRising", "TrainingStragglerRank")


# ------------------------------------------------------------------------------ processes of a run


def descendants(pid: int) -> set[int]:
    """Every process below pid, by /proc/<pid>/task/*/children (a walk: children of children too)."""
    found, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += kids - found
            found |= kids
    return found


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie no one reaped yet does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def marked(token: str) -> set[int]:
    """Living processes whose environment holds MARKER_VAR=token: a run's processes even once they
    were orphaned and reparented."""
    want = f"{demo.MARKER_VAR}={token}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and want in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return {pid for pid in found if alive(pid)}


def kill_tree(proc: subprocess.Popen, token: str | None = None) -> None:
    """SIGKILL proc and every process below it (found before the kill) or marked with token."""
    doomed = descendants(proc.pid) | (marked(token) if token else set())
    for pid in [proc.pid, *doomed]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def gone_within(pids: set[int], token: str, seconds: float) -> set[int]:
    """The processes of pids, or marked with token, still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = {pid for pid in pids if alive(pid)} | marked(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def start_demo(*args: str) -> tuple[subprocess.Popen, str]:
    """`gpuobs demo` with a run token of its own; (the process, the token)."""
    token = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, demo.MARKER_VAR: token})
    return proc, token


# ----------------------------------------------------------------------------------------- the run


@pytest.mark.timeout(330)  # about 140 s: the ECC trend needs a minute of baseline, its rate alert a minute to clear
def test_demo_plays_the_incident_and_leaves_nothing_running():
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    proc, token = start_demo("--duration", "0")
    try:
        stdout = proc.communicate(timeout=300)[0]
    finally:
        kill_tree(proc, token)  # on a timeout (or pytest-timeout's): the whole tree, not only the demo
    print(stdout)
    assert proc.returncode == 0, stdout[-5000:]
    lines = stdout.splitlines()
    assert "SIMULATED GPUs" in lines[0]
    for name in EXPECTED:
        assert any("FIRING" in line and name in line for line in lines), f"{name} never fired"
        assert any("RESOLVED" in line and name in line for line in lines), f"{name} never resolved"
    assert not any("FIRING" in line and "GpuTemperatureNearSlowdown" in line for line in lines), "inhibited alert paged"
    assert any("GpuHwThermalSlowdown" in line and "GPU 0" in line and "[   pager]" in line for line in lines)
    assert any("GpuEccCorrectedRising" in line and "GPU 3" in line for line in lines)
    assert any("TrainingCollectiveTimeout" in line and "job demo-job rank 1" in line for line in lines)
    _straggler_names_its_throttled_gpu(lines)
    # the slowest step, followed from its exemplar to its trace: the trace's spans were received
    slowest = next(i for i, line in enumerate(lines) if "SLOWEST STEP" in line)
    trace = re.search(r"trace ([0-9a-f]{32})", lines[slowest])
    assert trace and f"/trace/{trace[1]}" in lines[slowest], lines[slowest]
    assert "train.step" in lines[slowest + 1], lines[slowest:slowest + 3]
    # "resolved" is said once every alert that fired resolved, never before one of them
    said = next(i for i, line in enumerate(lines) if "all incident alerts resolved" in line)
    fired = {m[1] for line in lines if (m := re.search(r"FIRING +\S+ +(\w+)", line)) and m[1] not in demo.STEADY}
    resolved_before = {m[1] for line in lines[:said] if (m := re.search(r"RESOLVED +\S+ +(\w+)", line))}
    assert fired <= resolved_before, f"said resolved before {sorted(fired - resolved_before)} resolved"
    assert not [line for line in lines[said:] if "RESOLVED" in line], "an alert resolved after the narration"
    assert lines[-1].endswith("stopped")
    workdir = re.search(r"\blogs\s+(/\S+)", stdout)[1]
    assert not leftovers(token, workdir), leftovers(token, workdir)


def _straggler_names_its_throttled_gpu(lines: list[str]) -> None:
    """Rank 1 runs on GPU 0, which throttles during the incident: one straggler ticket, sent after the
    incident began, names rank 1, cause thermal and GPU 0's UUID (as GPU 0's own page prints it), and
    resolves after the fix; `gpuobs explain`, printed meanwhile, names the same cause and GPU first."""
    gpu0 = next(m[1] for line in lines if "GpuHwThermalSlowdown" in line
                and (m := re.search(r" GPU 0 \((GPU-[0-9a-fA-F-]+)\)", line)))
    incident = next(i for i, line in enumerate(lines) if "INCIDENT" in line)
    fix = next(i for i, line in enumerate(lines) if "FIX" in line)
    fired = [i for i, line in enumerate(lines) if "FIRING" in line and "TrainingStragglerRank" in line]
    assert len(fired) == 1, [lines[i] for i in fired]
    assert incident < fired[0] < fix, (incident, fired, fix)
    assert "[  ticket]" in lines[fired[0]] and "job demo-job rank 1" in lines[fired[0]], lines[fired[0]]
    assert f"cause thermal on {gpu0}" in lines[fired[0]], (gpu0, lines[fired[0]])
    assert any("RESOLVED" in line and "TrainingStragglerRank" in line for line in lines[fix:])
    explain = next(i for i, line in enumerate(lines) if "EXPLAIN: gpuobs explain demo-job" in line)
    assert explain < fix
    first = next((line for line in lines[explain:fix] if re.match(r"\s+1\. ", line)), None)
    assert first is not None, "\n".join(lines[explain:fix])
    assert re.match(rf"\s+1\. thermal on rank 1, GPU {gpu0}\b", first), first


def leftovers(token: str, workdir: str | None = None) -> list[dict]:
    """Processes of one demo run (not of another running beside it): the ones marked with its token,
    and, given its work folder, the ones naming it in their arguments (Prometheus, Alertmanager) or
    their state file (the exporter)."""
    found, ours = [], marked(token)
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = p.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            env = {}
        if p.info["pid"] in ours or (workdir and (
                any(workdir in part for part in (p.info["cmdline"] or []))
                or workdir in env.get("GPUOBS_SIM_STATE", ""))):
            found.append(p.info)
    return found


def test_ctrl_c_before_the_incident_is_over_exits_130_and_keeps_the_logs():
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    proc, token = start_demo()
    logs, seen = None, []
    try:
        for line in proc.stdout:
            seen.append(line)
            if found := re.search(r"\blogs\s+(/\S+)", line):
                logs = found[1]
            if "pipeline up" in line:  # the stack runs; the incident has not been played
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=60)[0]
    finally:
        kill_tree(proc, token)
    assert proc.returncode == 130, ("".join(seen) + rest)[-3000:]
    assert logs and Path(logs).is_dir(), f"logs of an interrupted run removed: {logs}"
    shutil.rmtree(logs)
    assert not leftovers(token, logs), leftovers(token, logs)


def _up_to_pipeline(proc: subprocess.Popen) -> tuple[str, str]:
    """Read the demo's output until its pipeline is up; (Prometheus's base URL, its logs folder)."""
    prometheus = logs = ""
    for line in proc.stdout:
        if found := re.search(r"Prometheus\s+(http://\S+)/alerts", line):
            prometheus = found[1]
        if found := re.search(r"\blogs\s+(/\S+)", line):
            logs = found[1]
        if "pipeline up" in line:
            return prometheus, logs
    raise AssertionError(f"the demo ended before its pipeline was up (code {proc.wait()})")


def _alerts_so_far(prometheus: str) -> set[str]:
    """Every alert Prometheus held pending or firing since it started (the ALERTS series), by name."""
    now = time.time()
    params = urllib.parse.urlencode({"query": "ALERTS", "start": now - 600, "end": now, "step": 1})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=10) as r:
        return {s["metric"]["alertname"] for s in json.load(r)["data"]["result"]}


def test_a_closed_terminal_sighup_stops_everything_and_the_start_up_is_quiet():
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    proc, token = start_demo()
    try:
        prometheus, logs = _up_to_pipeline(proc)
        # the start-up window: nothing pending or firing but the steady alerts (no false page)
        assert _alerts_so_far(prometheus) <= set(demo.STEADY), _alerts_so_far(prometheus)
        below = descendants(proc.pid)
        assert len(below) >= 6 and below <= marked(token) | {p for p in below if not alive(p)}
        proc.send_signal(signal.SIGHUP)
        rest = proc.communicate(timeout=60)[0]
    finally:
        kill_tree(proc, token)
    assert proc.returncode == 128 + signal.SIGHUP, rest[-2000:]
    assert rest.splitlines()[-1].endswith("stopped")
    assert not gone_within(below, token, 5)
    shutil.rmtree(logs, ignore_errors=True)


def test_a_demo_killed_hard_takes_its_children_with_it():
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    proc, token = start_demo()
    try:
        _, logs = _up_to_pipeline(proc)
        below = descendants(proc.pid)
        assert len(below) >= 6
        proc.kill()
        proc.wait()
        assert not gone_within(below, token, 10)
    finally:
        kill_tree(proc, token)
    shutil.rmtree(logs, ignore_errors=True)


# ------------------------------------------------------------------ grandchildren (demo.Children)

OWNER = """
import sys, time
from pathlib import Path
from gpuobs.demo import Children
children = Children(sys.argv[1])
# a trainer behind a shell, as a launcher starts it: the grandchild ignores SIGTERM
children.spawn(["sh", "-c", "trap '' TERM; sleep 300 & wait"], Path(sys.argv[2]) / "wrapped.log")
children.spawn(["sleep", "300"], Path(sys.argv[2]) / "plain.log")
print("started", flush=True)
if sys.argv[3] == "stop":
    time.sleep(0.5)
    children.stop(grace_s=1)
    print("stopped", flush=True)
time.sleep(300)
"""


def _owner(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, str, set[int]]:
    token = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-c", OWNER, token, str(tmp_path), mode], stdout=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 5
    while len(marked(token)) < 4 and time.monotonic() < deadline:  # guard, shell, its sleep, sleep
        time.sleep(0.05)
    return proc, token, descendants(proc.pid)


def test_a_killed_owner_takes_grandchildren_with_it(tmp_path):
    proc, token, below = _owner(tmp_path, "wait")
    try:
        assert len(below) >= 4, below
        proc.kill()
        proc.wait()
        assert not gone_within(below, token, 5)
    finally:
        kill_tree(proc, token)


def test_stop_ends_grandchildren_that_ignore_sigterm(tmp_path):
    proc, token, below = _owner(tmp_path, "stop")
    try:
        assert len(below) >= 4, below
        assert proc.stdout.readline().strip() == "stopped"
        assert not gone_within(below, token, 1)
    finally:
        kill_tree(proc, token)


# ------------------------------------------------------------------------------- the narration


class FakeAlertmanager:
    """GET /api/v2/alerts answering .alerts (a list of alert names)."""

    def __init__(self):
        self.alerts: list[str] = []
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                fake.queries.append(self.path)
                body = json.dumps([{"labels": {"alertname": n}, "status": {"state": "active"}}
                                   for n in fake.alerts]).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_resolved_is_said_only_when_alertmanager_and_on_call_agree(tmp_path):
    am = FakeAlertmanager()
    d = demo.Demo(tmp_path)
    d.alertmanager, d.on_call = am.url, demo.OnCall(echo=False)
    try:
        for name in (*EXPECTED, "GpuEccCorrectedRate"):
            d.on_call.notify("ticket", {"status": "firing", "labels": {"alertname": name}})
        for name in EXPECTED:  # every expected alert resolved at on-call...
            d.on_call.notify("ticket", {"status": "resolved", "labels": {"alertname": name}})
        am.alerts = ["Watchdog", "GpuEccCorrectedRate"]
        assert demo.active_alerts(am.url) == set(am.alerts)
        assert not d._all_resolved()  # ...but Alertmanager still holds one
        assert all(f"{k}=true" in am.queries[-1] for k in ("active", "inhibited", "silenced"))
        am.alerts = ["Watchdog"]
        assert not d._all_resolved()  # Alertmanager let go, on-call has not had the resolution yet
        d.on_call.notify("ticket", {"status": "resolved", "labels": {"alertname": "GpuEccCorrectedRate"}})
        assert d._all_resolved()
        am.server.shutdown()
        am.server.server_close()
        assert demo.active_alerts(am.url) is None and not d._all_resolved()  # no answer: not resolved
    finally:
        d.on_call.server.shutdown()


def test_on_call_prints_a_slowdown_alerts_cause_and_its_gpu(capsys):
    on_call = demo.OnCall(echo=True)
    labels = {"alertname": "TrainingStragglerRank", "severity": "warning", "node": "n1", "job_id": "j", "rank": "1"}
    try:
        on_call.notify("ticket", {"status": "firing", "labels": {**labels, "cause": "thermal", "cause_gpu": "GPU-ab"}})
        on_call.notify("ticket", {"status": "firing", "labels": {**labels, "rank": "2", "cause": "none",
                                                                 "cause_gpu": ""}})
        on_call.notify("ticket", {"status": "firing", "labels": {**labels, "rank": "3"}})  # no cause labels
    finally:
        on_call.server.shutdown()
    thermal, none, plain = capsys.readouterr().out.splitlines()
    assert "n1 job j rank 1 cause thermal on GPU-ab" in thermal, thermal
    assert none.rstrip().endswith("job j rank 2 cause none"), none  # no GPU to name
    assert "rank 3" in plain and "cause" not in plain, plain


def test_the_example_trainer_computes_slower_while_its_fault_file_says_its_gpu_throttles(tmp_path):
    """examples/train.py's FaultFile, which the demo writes to: gpu_throttled scales the compute per
    step by the given factor until gpu_recovered; a fault in the same write as another plays too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_train_example", REPO / "examples" / "train.py")
    assert spec and spec.loader
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    path = tmp_path / "faults"
    path.touch()
    faults = train.FaultFile(str(path), throttled=1.7)
    faults.play(rank=1, step=1)
    assert faults.compute_scale == 1.0
    path.write_text("gpu_throttled\ncollective_timeout\n")
    faults.play(rank=1, step=2)
    assert faults.compute_scale == 1.7
    faults.play(rank=1, step=3)  # nothing new: unchanged
    assert faults.compute_scale == 1.7
    with open(path, "a") as f:
        f.write("gpu_recovered\n")
    faults.play(rank=1, step=4)
    assert faults.compute_scale == 1.0
