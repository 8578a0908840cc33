"""A real Prometheus (the Debian package) scrapes the exporter on loopback: the target is up and
PromQL returns the simulated values."""

from __future__ import annotations

import subprocess
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


def _series(lines) -> set[tuple]:
    """(name, sorted labels) of every sample line of a text-format body; empty labels left out, as
    Prometheus leaves them out."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)))
            for fam in text_string_to_metric_families(lines) for s in fam.samples}


def test_prometheus_gets_openmetrics_and_gzip_curl_gets_plain_text(exporter, prometheus):
    run = exporter(scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml"), interval=0.5)
    url = f"http://127.0.0.1:{run.exp.http.port}/metrics"
    query = prometheus([f"127.0.0.1:{run.exp.http.port}"])
    served = 'gpuobs_exporter_scrapes_total{format="openmetrics",encoding="gzip"}'
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not [r for r in query(served) if float(r["value"][1]) >= 2]:
        time.sleep(0.5)
    # what Prometheus asked for: OpenMetrics, gzip-compressed (and only that)
    by_kind = {(r["metric"]["format"], r["metric"]["encoding"]): float(r["value"][1])
               for r in query("gpuobs_exporter_scrapes_total")}
    assert by_kind[("openmetrics", "gzip")] >= 2 and by_kind[("text", "identity")] == 0
    # curl, as it is used by hand: text 0.0.4, not compressed
    plain = subprocess.run(["curl", "-sS", "-D", "-", url], capture_output=True, text=True, timeout=10, check=True)
    head, _, body = plain.stdout.partition("\n\n")
    assert "content-type: text/plain; version=0.0.4; charset=utf-8" in head.lower()
    assert "content-encoding" not in head.lower() and body.rstrip().endswith("gpuobs_exporter_snapshot_stale 0.0")
    # curl --compressed asks for gzip, and gets it (curl inflates it); the text is the same series
    packed = subprocess.run(["curl", "-sS", "--compressed", "-D", "-", url], capture_output=True, text=True,
                            timeout=10, check=True)
    head2, _, body2 = packed.stdout.partition("\n\n")
    assert "content-encoding: gzip" in head2.lower() and _series(body2) == _series(body)
    # and what Prometheus parsed from OpenMetrics + gzip is every series curl saw as text
    ingested = query('{job="gpuobs", __name__=~"gpuobs_.+"}')
    seen = {(r["metric"]["__name__"], tuple(sorted((k, v) for k, v in r["metric"].items()
                                                   if k not in ("__name__", "job", "instance", "node"))))
            for r in ingested}
    ignore = ("gpuobs_exporter_",)  # self-health series come and go with scrapes and passes
    text_series = {s for s in _series(body) if not s[0].startswith(ignore)}
    assert text_series and text_series <= seen
