"""`gpuobs explain` against two real Prometheus servers, one evaluating the fast rule profile and one
without rules, both scraping the same simulated node (6 H100s, its exporter in a child process) and
three 2-rank jobs served as OpenMetrics by a small server here (counters growing with wall time, the
slow steps' exemplars on the step-duration histogram). Each rank is joined to its own GPU by UUID.

- thermal-job: rank 1 computes 1.65x as long per step and its GPU is in HW thermal slowdown;
- loader-job: rank 1 waits 10x as long for data (and computes as fast as rank 0);
- compute-job: rank 1 computes 1.65x as long on a healthy GPU: no GPU cause, "look at the host".
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from conftest import REPO, free_port, prometheus_query, require_tool, stop

from gpuobs import catalog as c
from gpuobs import explain, records, report
from gpuobs.alerts.build import write_fast_rules
from gpuobs.alerts.rules import FAST
from gpuobs.cli import main
from gpuobs.sim import Simulator
from gpuobs.sim.state import set_val

HW_THERMAL = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
STEP_S = 0.42  # every rank's step: a synchronous job's ranks wait for each other
# job -> per rank (compute, data wait, collective wait) seconds per step, and its GPU index on the node
JOBS = {
    "thermal-job": [((0.20, 0.02, 0.20), 0), ((0.33, 0.02, 0.07), 1)],
    "loader-job": [((0.20, 0.02, 0.20), 2), ((0.20, 0.20, 0.02), 3)],
    "compute-job": [((0.20, 0.02, 0.20), 4), ((0.33, 0.02, 0.07), 5)],
}
WINDOW = "15s"


def exposition(uuids: dict[int, str], elapsed: float) -> bytes:
    """The ranks' series after `elapsed` seconds of steps, as OpenMetrics (exemplars need it)."""
    from prometheus_client.core import (
        CollectorRegistry,
        CounterMetricFamily,
        Exemplar,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.openmetrics.exposition import generate_latest

    steps = elapsed / STEP_S
    run = ["rank", "job_id"]
    counters = {m: CounterMetricFamily(m.name, m.help, labels=list(m.labels)) for m in
                (c.STEPS, c.COMPUTE, c.COLLECTIVE_WAIT, c.BADPUT)}
    info = GaugeMetricFamily(c.RANK_INFO.name, c.RANK_INFO.help, labels=list(c.RANK_INFO.labels))
    p50 = GaugeMetricFamily(c.QUANTILES[c.STEP_DURATION].name, "p50", labels=run + ["quantile"])
    hist = HistogramMetricFamily(c.STEP_DURATION.name, c.STEP_DURATION.help, labels=run)
    for job, ranks in JOBS.items():
        for rank, ((compute, data, coll), gpu) in enumerate(ranks):
            labels = [str(rank), job]
            counters[c.STEPS].add_metric(labels, steps)
            counters[c.COMPUTE].add_metric(labels, steps * compute)
            counters[c.COLLECTIVE_WAIT].add_metric(labels, steps * coll)
            counters[c.BADPUT].add_metric(labels + ["data_wait"], steps * data)
            values = {"rank": str(rank), "job_id": job, "host": "sim-node", "uuid": uuids[gpu]}
            info.add_metric([values.get(k, "") for k in c.RANK_INFO.labels], 1)
            p50.add_metric(labels + ["0.5"], STEP_S)
            slow = Exemplar({"trace_id": f"{rank + 1:02x}{job.encode().hex()}".ljust(32, "0")[:32]},
                            STEP_S * (2 + rank), time.time())
            hist.add_metric(labels, [("0.5", steps, None), ("1.0", steps, None), ("+Inf", steps, slow)],
                            steps * STEP_S)

    class Ranks:
        def collect(self):
            return [*counters.values(), info, p50, hist]

    registry = CollectorRegistry()
    registry.register(Ranks())  # type: ignore[arg-type]
    return generate_latest(registry)


def serve_ranks(uuids: dict[int, str]) -> ThreadingHTTPServer:
    start = time.time()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = exposition(uuids, time.time() - start)
            self.send_response(200)
            self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_prometheus(directory, targets: list[str], rules: bool) -> tuple[subprocess.Popen, str]:
    """A real Prometheus scraping targets every second (label node=sim-node), with exemplar storage,
    evaluating the fast rule profile when rules; (its process, its base URL)."""
    directory.mkdir()
    port = free_port()
    text = ("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n  - job_name: gpuobs\n"
            f"    static_configs: [{{targets: {targets!r}, labels: {{node: sim-node}}}}]\n")
    if rules:
        text += f"rule_files: ['{write_fast_rules(directory)}']\n"
    (directory / "prometheus.yml").write_text(text)
    proc = subprocess.Popen([require_tool("prometheus"), f"--config.file={directory / 'prometheus.yml'}",
                             f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--enable-feature=exemplar-storage"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def _wait(query, promql: str, enough, what: str, timeout: float = 40) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = query(promql)
            if enough(result):
                return result
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """{"rules": URL, "raw": URL, "uuids": {gpu index: UUID}} once both have a few seconds of data."""
    tmp = tmp_path_factory.mktemp("explain")
    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb", "count": 6}]}, base=REPO, directory=tmp / "sim",
                    node="sim-node")
    set_val(sim.state.gpu(1).clock_events, HW_THERMAL)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                               "--port", str(port), "--interval", "0.5"], env=sim.env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    uuids = {i: sim.state.gpu(i).uuid.s.decode() for i in range(6)}
    watts = {i: sim.state.gpu(i).energy_mj.amp / 1000 for i in range(6)}  # the energy counters' rates (mW)
    server = serve_ranks(uuids)
    try:
        targets = [f"127.0.0.1:{port}", f"127.0.0.1:{server.server_address[1]}"]
        urls = {}
        for name, rules in (("rules", True), ("raw", False)):
            proc, urls[name] = start_prometheus(tmp / name, targets, rules)
            procs.append(proc)
        ruled = prometheus_query(int(urls["rules"].rsplit(":", 1)[1]))
        _wait(ruled, c.GPU_INFO.exposed_name, lambda r: {s["metric"]["uuid"] for s in r} == set(uuids.values()),
              "the exporter's six GPUs, by the simulator's UUIDs")
        _wait(ruled, f"count_over_time(count({records.RANK_CAUSE.name})[{WINDOW}:1s]) >= 8",
              lambda r: bool(r), "8 s of the cause records")
        yield {**urls, "uuids": uuids, "watts": watts}
    finally:
        for proc in procs:
            stop(proc)
        server.shutdown()
        sim.close()


def _first_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("  1. "))


@pytest.mark.parametrize("source", ["rules", "raw"])
def test_a_thermally_throttled_gpu_is_named_first(node, source):
    d = explain.diagnose(node[source], "thermal-job", window=WINDOW, thresholds=FAST)
    assert d.source == (explain.RULES if source == "rules" else explain.INLINED)
    top = d.findings[0]
    assert (top.cause, top.rank, top.gpu, top.node) == ("thermal", "1", node["uuids"][1], "sim-node")
    assert {r.rank: r.gpus for r in d.ranks} == {"0": [node["uuids"][0]], "1": [node["uuids"][1]]}
    gpu = next(g for g in d.gpus if g.uuid == node["uuids"][1])
    assert gpu.clock_events["hw_thermal_slowdown"] > 0.5 and "thermal" in gpu.causes
    assert d.ranks[1].compute_to_others == pytest.approx(0.33 / 0.20, rel=0.05)
    text = explain.render(d)
    assert f"thermal on rank 1, GPU {node['uuids'][1]}, node sim-node" in _first_line(text)
    assert "nvidia-smi -q -d PERFORMANCE,TEMPERATURE" in text  # the runbook's confirm line
    # its energy: the simulated watts of its two GPUs (each rank's own, by UUID), a step every STEP_S
    watts = node["watts"][0] + node["watts"][1]
    assert watts > 100 and d.energy is not None and d.energy.watts == pytest.approx(watts, rel=0.05)
    # J/step: watts over the steps' rate; these series are younger than the rate window, whose rate reads
    # low (see below), so the mean over the window is above watts * STEP_S, never below (the sum of the
    # two ranks' rates would halve it)
    assert d.energy.joules_per_step is not None and d.energy.joules_per_step >= 0.95 * watts * STEP_S
    assert d.energy.joules_per_token is None  # these ranks report no tokens
    assert f"Energy: {d.energy.watts:.0f} W on its GPUs" in text
    if source == "rules":  # the exemplar store: the slowest step's trace (rank 1's, 3 steps long)
        assert d.trace_rank == "1" and d.trace_seconds == pytest.approx(3 * STEP_S) and d.trace_id in text


@pytest.mark.parametrize("source", ["rules", "raw"])
def test_a_slow_data_loader_is_named_before_the_gpus(node, source):
    d = explain.diagnose(node[source], "loader-job", window=WINDOW, thresholds=FAST)
    top = d.findings[0]
    assert (top.cause, top.rank, top.gpu) == ("data_loader", "1", "")
    # rates are too low while the series are younger than the rate window; their ratios are exact
    assert d.ranks[1].data_wait_to_others == pytest.approx(0.20 / 0.02, rel=0.1)
    assert d.ranks[1].compute_to_others == pytest.approx(1, rel=0.05)
    assert "data_loader on rank 1" in _first_line(explain.render(d))


@pytest.mark.parametrize("source", ["rules", "raw"])
def test_plain_compute_slowness_names_no_gpu_cause(node, source):
    d = explain.diagnose(node[source], "compute-job", window=WINDOW, thresholds=FAST)
    top = d.findings[0]
    assert (top.cause, top.rank, top.gpu) == ("none", "1", "")  # rank 1: the straggler, first among equals
    assert all(f.cause == "none" for f in d.findings)
    assert "look at the host" in _first_line(explain.render(d))


def test_the_cli_prints_the_diagnosis_and_refuses_an_unknown_job(node):
    runner = CliRunner()
    ok = runner.invoke(main, ["explain", "thermal-job", "--prometheus", node["rules"], "--window", WINDOW,
                              "--profile", "fast"])
    assert ok.exit_code == 0, ok.output
    assert "thermal on rank 1" in _first_line(ok.output)
    unknown = runner.invoke(main, ["explain", "no-such-job", "--prometheus", node["rules"], "--window", WINDOW])
    assert unknown.exit_code == 1
    assert "no training job 'no-such-job'" in unknown.output and "thermal-job" in unknown.output
    assert "Traceback" not in unknown.output
    down = runner.invoke(main, ["explain", "thermal-job", "--prometheus", f"http://127.0.0.1:{free_port()}"])
    assert down.exit_code == 2 and "cannot query Prometheus" in down.output and "Traceback" not in down.output
    bad = runner.invoke(main, ["explain", "thermal-job", "--prometheus", node["rules"], "--at", "yesterday"])
    assert bad.exit_code == 1 and "not a time" in bad.output


def test_the_report_lists_the_slow_jobs_with_their_cause(node):
    now = time.time()
    section = explain.section_slow_jobs(report.Prometheus(node["rules"]), report.Window(now - 15, now, 1),
                                        report.Settings(), FAST)
    rows = report.read_rows(f'<section id="{section.key}">{section.body}</section>')
    causes = {key: cells[1] for (_, key), cells in rows.items()}
    assert causes == {"thermal-job": "thermal", "loader-job": "data_loader", "compute-job": "none"}
