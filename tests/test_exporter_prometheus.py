"""A real Prometheus (the Debian package) scrapes the exporter on loopback: the target is up and
PromQL returns the simulated values."""

from __future__ import annotations

import time

from conftest import REPO
from gpuobs.sim import scenario


def test_prometheus_scrapes_the_exporter(exporter, prometheus):
    run = exporter(scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml"), interval=0.5)
    query = prometheus([f"127.0.0.1:{run.exp.http.port}"])
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
