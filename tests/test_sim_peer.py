"""nvitop-exporter, our benchmark peer, runs unchanged on the simulator and reports every GPU."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO, free_port

EXPORTER = shutil.which("nvitop-exporter", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
pytestmark = pytest.mark.skipif(EXPORTER is None, reason="nvitop-exporter is not installed")


def scrape_until(port: int, proc, want, timeout: float = 30.0) -> str:
    """Scrape until want(text) is true; fail with the exporter's output if it exits or times out."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"nvitop-exporter exited {proc.returncode}: {proc.stdout.read()}")
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            if want(text):
                return text
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"no complete scrape in {timeout}s; last:\n{text[-2000:]}")


def values(text: str, metric: str) -> dict[str, float]:
    out = {}
    for labels, value in re.findall(rf"^{metric}\{{(.*?)\}} (\S+)$", text, flags=re.M):
        out[re.search(r'uuid="([^"]+)"', labels).group(1)] = float(value)
    return out


def run_peer(scenario: str, want):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "sim", "exec", "--scenario", scenario, "--",
                             EXPORTER, "--port", str(port), "--interval", "0.5", "--hostname", "sim"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return scrape_until(port, proc, want)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_nvitop_exporter_reports_all_eight_gpus():
    text = run_peer(str(REPO / "examples/scenarios/8xh100.yaml"),
                    lambda t: len(values(t, "gpu_nvlink_total_tx_throughput_MiBps")) == 8
                    and not any(math.isnan(v) for v in values(t, "gpu_nvlink_total_tx_throughput_MiBps").values()))
    for metric in ("gpu_utilization_Percentage", "gpu_power_usage_W", "gpu_memory_total_MiB",
                   "gpu_temperature_C", "gpu_clock_sm_MHz", "gpu_pcie_tx_throughput_MiBps"):
        vals = values(text, metric)
        assert len(vals) == 8 and not any(math.isnan(v) for v in vals.values()), metric
    assert all(v == 81559 for v in values(text, "gpu_memory_total_MiB").values())
    assert all(500 < v <= 700 for v in values(text, "gpu_power_usage_W").values())  # steady: ~85 % of 700 W
    assert re.search(r'process_gpu_memory_MiB\{.*pid="21001".*\} 61440', text)


def test_nvitop_exporter_sees_mig_devices(tmp_path):
    scenario = tmp_path / "mig.yaml"
    scenario.write_text("gpus:\n  - {profile: h100-sxm-80gb, mig: [3g.40gb, 1g.10gb]}\n  - {profile: h100-sxm-80gb}\n")
    text = run_peer(str(scenario), lambda t: len(values(t, "gpu_memory_total_MiB")) == 4)
    names = re.findall(r'gpu_memory_total_MiB\{.*?devicename="([^"]+)"', text)
    assert sum(" MIG 3g.40gb" in n for n in names) == 1 and sum(" MIG 1g.10gb" in n for n in names) == 1
