"""A real Prometheus (the Debian package) scrapes the exporter on loopback: the target is up and
PromQL returns the simulated values."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import REPO, require_tool
from gpuobs.sim import scenario


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path):
    """Factory: prometheus(target_port) -> query(promql) function, for a Prometheus scraping the target."""
    procs = []
    prometheus_bin = require_tool("prometheus")

    def start(target_port: int):
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: gpuobs\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}'], labels: {{node: sim-node}}}}]\n")
        proc = subprocess.Popen([prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(proc)

        def query(promql: str) -> list[dict]:
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
            assert body["status"] == "success", body
            return body["data"]["result"]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {proc.stderr.read()[-2000:]}")
            try:
                if query('up{job="gpuobs"} == 1'):
                    return query
            except OSError:
                pass
            time.sleep(0.3)
        pytest.fail("prometheus never saw the exporter target up")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_prometheus_scrapes_the_exporter(exporter, prometheus):
    run = exporter(scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml"), interval=0.5)
    query = prometheus(run.exp.http.port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(query("gpuobs_gpu_sm_active_ratio")) < 8:
        time.sleep(0.5)
    assert len(query("gpuobs_gpu_up == 1")) == 8
    assert float(query("sum(gpuobs_gpu_memory_total_bytes)")[0]["value"][1]) == 8 * 81559 * 1024 * 1024
    assert float(query("count(gpuobs_gpu_power_usage_watts > 500 < 700)")[0]["value"][1]) == 8  # steady load
    assert float(query("gpuobs_gpus_expected")[0]["value"][1]) == 8
    info = query("gpuobs_gpu_info")
    assert {r["metric"]["name"] for r in info} == {"NVIDIA H100 80GB HBM3"} and len(info) == 8
    assert all(r["metric"]["node"] == "sim-node" for r in info)
    assert len(query("gpuobs_gpu_sm_active_ratio > 0.5")) == 8
    # counters are counters: irate() over the energy counter gives the power draw (~595 W each)
    time.sleep(2)
    rate = query("sum(irate(gpuobs_gpu_energy_consumption_joules_total[5s]))")
    assert rate and 8 * 500 < float(rate[0]["value"][1]) < 8 * 700
    assert query('scrape_samples_scraped{job="gpuobs"}')[0]["value"][1] != "0"
