"""Shared fixtures: a simulated node that this process's pynvml talks to, an in-process exporter
on it, and a real Prometheus scraping whatever the test starts."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pynvml
import pytest

from gpuobs.demo import OTLPReceiver  # noqa: F401  (tests import it from here)
from gpuobs.ports import free_port, free_port_run  # noqa: F401  (tests import them from here)
from gpuobs.sim import Simulator

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO.parent / "shared" / "captures"


@pytest.fixture
def make_sim(tmp_path):
    """Factory: make_sim(spec_dict) -> Simulator, activated and with NVML initialised."""
    made: list[Simulator] = []

    def factory(spec: dict, init: bool = True) -> Simulator:
        sim = Simulator(spec, base=REPO, directory=tmp_path / f"node{len(made)}").activate()
        made.append(sim)
        if init:
            pynvml.nvmlInit()
        return sim

    yield factory
    for sim in made:
        sim.state.clear_faults()
        sim.state.clear_init_error()
    while True:  # drop every reference this test took, so the next test maps its own state
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            break
    for sim in made:
        sim.close()


@pytest.fixture
def h100x2(make_sim):
    """Two idle H100s with a process each; NVML initialised."""
    return make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}],
                     "processes": [{"gpu": 0, "pid": 1111, "name": "python train.py", "used_mib": 1024,
                                    "sm_util": 77, "mem_util": 33}]})


class RunningExporter:
    """An in-process exporter on a simulated node, scraped over real HTTP."""

    def __init__(self, sim, exporter):
        self.sim, self.exp = sim, exporter
        self.url = f"http://127.0.0.1:{exporter.http.port}"

    def get(self, path: str = "/metrics", **kw):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=5, **kw) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def scrape(self) -> list[tuple[str, dict, float]]:
        """[(sample name, labels, value)] of one /metrics scrape."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.get()
        assert status == 200, text
        return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]

    def values(self, name: str, **match) -> dict[str, float]:
        """{uuid (or label 'key' value): value} of one metric, filtered by label values."""
        return {labels.get("uuid", ""): v for n, labels, v in self.scrape() if n == name
                and all(labels.get(k) == str(val) for k, val in match.items())}

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition"):
        """Scrape until predicate(scrape) is true; return that scrape or fail."""
        import time

        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.scrape()
            if predicate(last):
                return last
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}; last scrape had {len(last or [])} samples")

    def next_snapshot(self, n: int = 1):
        """Wait until n more snapshots have been taken."""
        import time

        target = self.exp.sampler.samples + n
        deadline = time.monotonic() + 10
        while self.exp.sampler.samples < target and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.exp.sampler.samples >= target, "sampler made no progress"


@pytest.fixture
def start(make_sim):
    """start(sim, **ExporterConfig fields) -> RunningExporter on a simulator made beforehand (so that
    faults can be in place before the exporter's first nvmlInit). Stopped after the test."""
    import time

    from gpuobs.collect import REGISTRY
    from gpuobs.exporter import Exporter, ExporterConfig

    running = []

    def factory(sim, **config) -> RunningExporter:
        config.setdefault("listen_address", "127.0.0.1")
        config.setdefault("port", 0)
        config.setdefault("interval", 0.2)
        config.setdefault("families", set(REGISTRY))
        config.setdefault("profile", "full")  # every series of every family; the default profile's tests say so
        config.setdefault("kernel_log", "off")  # tests never read the host's kernel log or write its state
        exp = Exporter(ExporterConfig(**config)).start()
        running.append(exp)
        deadline = time.monotonic() + 10  # the first pass (not "one more": it may be done already)
        while exp.renderer.snapshot is None:
            assert time.monotonic() < deadline, "the exporter took no snapshot"
            time.sleep(0.01)
        return RunningExporter(sim, exp)

    yield factory
    for exp in running:
        exp.stop()


@pytest.fixture
def exporter(make_sim, start):
    """Factory: exporter(spec, **ExporterConfig fields) -> RunningExporter on a new simulated node."""
    return lambda spec, **config: start(make_sim(spec, init=False), **config)


def require_tool(name: str) -> str:
    """Path of a command-line tool the test needs: skipped when missing locally, a failure in CI
    (.ci/run installs it, so a missing tool there is a broken CI, not a reason to skip)."""
    import os
    import shutil

    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (see .ci/run)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path



def prometheus_query(port: int):
    """query(promql) -> the result vector of an instant query to the Prometheus on 127.0.0.1:port
    (OSError until it listens; AssertionError naming the error when the query fails)."""
    def query(promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]
    return query

@pytest.fixture
def prometheus(tmp_path):
    """Factory: prometheus(["host:port", ...], rule_files=(), alertmanager="host:port", exemplars=False)
    -> query(promql), for a real Prometheus scraping those targets every second (labels: job gpuobs,
    node sim-node; external label cluster=test), evaluating the rule files, with exemplar storage
    when exemplars=True (query.url is its base URL, for the other APIs); waits until one target is up."""
    procs = []
    prometheus_bin = require_tool("prometheus")

    def start(targets: list[str], rule_files: tuple[str, ...] = (), alertmanager: str | None = None,
              exemplars: bool = False):
        port = free_port()
        config = tmp_path / "prometheus.yml"
        text = ("global: {scrape_interval: 1s, evaluation_interval: 1s, external_labels: {cluster: test}}\n"
                "scrape_configs:\n"
                "  - job_name: gpuobs\n"
                f"    static_configs: [{{targets: {targets!r}, labels: {{node: sim-node}}}}]\n")
        if rule_files:
            text += f"rule_files: {list(rule_files)!r}\n"
        if alertmanager:
            text += f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{alertmanager}']}}]}}]}}\n"
        config.write_text(text)
        proc = subprocess.Popen([prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}",
                                 # alerts firing before Alertmanager is discovered are re-sent after
                                 # this delay (1m by default): keep it short for tests
                                 "--rules.alert.resend-delay=1s"]
                                + (["--enable-feature=exemplar-storage"] if exemplars else []),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(proc)

        query = prometheus_query(port)
        query.url = f"http://127.0.0.1:{port}"
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
        stop(proc)


def serve_static(body: bytes):
    """A standard-library HTTP server on a free loopback port answering every GET with `body` as
    Prometheus text (a scrape target's fixed exposition); serving in a daemon thread. The caller
    shuts it down."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # one line per scrape otherwise
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a server the test started; kill it if it does not exit in time."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()




# The live training tests run real multi-rank jobs (each file about 20 torch processes for two
# minutes): run side by side on the two workers, their ~40 processes starve each other on a 2-core
# machine and their alert timing slips past the watch. One xdist scope for all: under `--dist
# loadfile` they run one after the other on one worker while the other worker runs the rest.
SERIAL_SCOPES = {"tests/test_training_alerts_live.py": "live-training",
                 "tests/test_training_acceptance_live.py": "live-training",
                 "tests/test_slowdown_live.py": "live-training"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's loadfile scheduler with the files of SERIAL_SCOPES sharing a scope; None (xdist's own)
    for another --dist mode."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SerialLiveScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SERIAL_SCOPES.get(scope, scope)

    return SerialLiveScheduling(config, log)
