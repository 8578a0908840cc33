"""`gpuobs demo` non-interactively: the scripted incident's alerts reach the webhook and resolve,
the command exits 0, and no process it started is left behind."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from conftest import require_tool

EXPECTED = ("GpuHwThermalSlowdown", "GpuAllocatedIdle", "GpuXidRebootRequired", "GpuLost",
            "TrainingCollectiveTimeout", "GpuEccCorrectedRising")


def test_demo_plays_the_incident_and_leaves_nothing_running():
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    out = subprocess.run([sys.executable, "-m", "gpuobs.cli", "demo", "--duration", "0"], capture_output=True,
                         text=True, timeout=400)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "SIMULATED GPUs" in lines[0]
    for name in EXPECTED:
        assert any("FIRING" in line and name in line for line in lines), f"{name} never fired"
        assert any("RESOLVED" in line and name in line for line in lines), f"{name} never resolved"
    assert not any("FIRING" in line and "GpuTemperatureNearSlowdown" in line for line in lines), "inhibited alert paged"
    assert any("GpuHwThermalSlowdown" in line and "GPU 0" in line and "[   pager]" in line for line in lines)
    assert any("GpuEccCorrectedRising" in line and "GPU 3" in line for line in lines)
    assert any("TrainingCollectiveTimeout" in line and "job demo-job rank 1" in line for line in lines)
    # the slowest step, followed from its exemplar to its trace: the trace's spans were received
    slowest = next(i for i, line in enumerate(lines) if "SLOWEST STEP" in line)
    trace = re.search(r"trace ([0-9a-f]{32})", lines[slowest])
    assert trace and f"/trace/{trace[1]}" in lines[slowest], lines[slowest]
    assert "train.step" in lines[slowest + 1], lines[slowest:slowest + 3]
    assert lines[-1].endswith("stopped")
    assert not leftovers(), leftovers()


def leftovers() -> list[dict]:
    """Processes of a demo run: Prometheus and Alertmanager name its work folder in their arguments,
    the exporter its state file and the trainers its job id in their environment."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = p.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            env = {}
        if (any("gpuobs-demo-" in part for part in (p.info["cmdline"] or []))
                or "gpuobs-demo-" in env.get("GPUOBS_SIM_STATE", "") or env.get("GPUOBS_JOB_ID") == "demo-job"):
            found.append(p.info)
    return found


def test_ctrl_c_before_the_incident_is_over_exits_130_and_keeps_the_logs():
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "demo"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    logs = None
    try:
        for line in proc.stdout:
            if found := re.search(r"\blogs\s+(/\S+)", line):
                logs = found[1]
            if "pipeline up" in line:  # the stack runs; the incident has not been played
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130, rest[-2000:]
    assert logs and Path(logs).is_dir(), f"logs of an interrupted run removed: {logs}"
    shutil.rmtree(logs)
    assert not leftovers(), leftovers()
