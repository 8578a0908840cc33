"""Liveness that matches reality, against the running exporter (a child process on the simulator):
- before the first sampling pass (nvmlInit slow, or hung for good) every /metrics answer is a valid
  body in the negotiated format (prometheus_client's text and OpenMetrics parsers, promtool) holding
  self-health only, /readyz is 503, /healthz fails after the liveness timeout when init never ends;
- NvmlDown fires for the hung initialisation and stays quiet for the slow one, on Prometheus and on
  VictoriaMetrics + vmalert (the fast rule profile);
- the "Unknown Error" zombie (every call and re-init answering UNKNOWN) fails /healthz after the
  NVML-down timeout (and not with the check off);
- process records with a PID at or above the kernel's pid_max are dropped even when the exporter
  cannot see the host's PIDs (tests/test_xid_watcher.py has the XID watcher's part of readiness)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from conftest import REPO, free_port, require_tool, stop
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from rule_subset import subset

from gpuobs import catalog as c
from gpuobs.alerts.build import write_fast_rules
from gpuobs.collect.processes import pid_max
from gpuobs.exporter.render import SELF_FAMILIES

TWO = {"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}
UNKNOWN = 999  # NVML_ERROR_UNKNOWN
# What Prometheus sends (OpenMetrics preferred, gzip), and what curl or an old scraper sends
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
ASKS = [(PROMETHEUS_ACCEPT, "gzip"), (PROMETHEUS_ACCEPT, None), ("text/plain;version=0.0.4", "gzip"), (None, None)]
SELF_NAMES = {m.name for m in c.ALL if m.family in SELF_FAMILIES} | {m.exposed_name for m in c.ALL
                                                                     if m.family in SELF_FAMILIES}


def http(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of a GET; HTTP errors are answers too."""
    req = urllib.request.Request(url, headers={k: v for k, v in (headers or {}).items() if v is not None})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def spawn(sim, tmp_path, *args: str, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """The exporter CLI as a child process on `sim` (interval 0.2 s, loopback, `port` or a free one);
    (process, base URL) once it answers HTTP."""
    port = port or free_port()
    env = {k: v for k, v in sim.env().items() if not k.startswith(("GPUOBS_", "OTEL_"))
           or k in ("GPUOBS_SIM_STATE", "GPUOBS_CACHE_DIR")}
    log = open(tmp_path / f"exporter-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                             "--port", str(port), "--interval", "0.2", "--kubelet-socket", "", "--kernel-log", "off",
                             *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"exporter exited {proc.returncode}"
        try:
            http(url + "/healthz")
            return proc, url
        except OSError:
            assert time.monotonic() < deadline, "the exporter never listened"
            time.sleep(0.05)


def wait(predicate, timeout: float, what):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = predicate()
        except OSError:  # a server not listening yet
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.1)


def check_scrape(url: str, accept: str | None, encoding: str | None, promtool: str) -> dict[str, list]:
    """One /metrics scrape with these headers: 200, a body valid in the format it says it is (parsed by
    prometheus_client's parser of that format; text bodies by promtool too). {sample name: [(labels, value)]}."""
    status, headers, body = http(url + "/metrics", {"Accept": accept, "Accept-Encoding": encoding})
    assert status == 200 and body, (status, body)
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    text = body.decode()
    if headers["Content-Type"].startswith("application/openmetrics-text"):
        assert text.endswith("# EOF\n"), text[-200:]
        families = list(parse_openmetrics(text))
    else:
        families = list(parse_text(text))
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr  # parse errors and lint problems alike
    out: dict[str, list] = {}
    for fam in families:
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scrape_all_ways(url: str, promtool: str, until: float) -> list[dict]:
    """Scrapes from 4 threads, each asking its own way (ASKS), until `until` (monotonic); every one checked."""
    got, errors = [], []

    def scraper(accept, encoding):
        while time.monotonic() < until:
            try:
                got.append(check_scrape(url, accept, encoding, promtool))
            except Exception as e:  # noqa: BLE001 - reported below, with the thread's headers
                errors.append(f"{accept} / {encoding}: {e!r}")
                return
    threads = [threading.Thread(target=scraper, args=ask) for ask in ASKS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return got


def initializing(scrape: dict) -> bool:
    """The scrape is the self-health an exporter serves before its first pass."""
    return scrape.get(c.NVML_UP.name) == [({}, 0.0)] and \
        scrape.get(c.NVML_INIT_ERROR.name) == [({"reason": "initializing"}, 1.0)]


# ------------------------------------------------------------------------- before the first pass


def test_hung_init_serves_valid_self_health_is_not_ready_and_fails_liveness(make_sim, tmp_path):
    promtool = require_tool("promtool")
    sim = make_sim(TWO, init=False)
    hang = sim.state.slow_init(hang=True)
    proc, url = spawn(sim, tmp_path, "--liveness-timeout", "2")
    try:
        wait(lambda: any(n.startswith("nvmlInit") for n in sim.state.calls()), 10, "nvmlInit to be called (and hang)")
        scrapes = scrape_all_ways(url, promtool, time.monotonic() + 1.5)
        assert len(scrapes) >= 8, len(scrapes)
        for scrape in scrapes:
            assert initializing(scrape), scrape
            assert set(scrape) <= SELF_NAMES, set(scrape) - SELF_NAMES  # no GPU value, nothing stale
            assert scrape[c.BUILD_INFO.exposed_name][0][0]["version"]
            assert scrape[c.SNAPSHOT_STALE.name] == [({}, 1.0)]
        status, _, reason = http(url + "/readyz")
        assert status == 503 and b"initializing" in reason, (status, reason)
        status, _, reason = wait(lambda: (r := http(url + "/healthz"))[0] == 503 and r, 10, "/healthz to fail")
        assert b"never did" in reason, reason
        assert initializing(check_scrape(url, PROMETHEUS_ACCEPT, "gzip", promtool))  # still served meanwhile

        for index in hang:  # the driver comes back: the first pass completes, GPU values and readiness follow
            sim.state.clear_fault(index)
        wait(lambda: http(url + "/readyz")[0] == 200, 15, "/readyz 200 after init completed")
        scrape = check_scrape(url, PROMETHEUS_ACCEPT, None, promtool)
        assert scrape[c.NVML_UP.name] == [({}, 1.0)] and c.NVML_INIT_ERROR.name not in scrape
        assert len(scrape[c.GPU_UP.name]) == 2 and http(url + "/healthz")[0] == 200
    finally:
        stop(proc)


def test_slow_init_answers_at_once_and_is_live_throughout(make_sim, tmp_path):
    promtool = require_tool("promtool")
    sim = make_sim(TWO, init=False)
    sim.state.slow_init(delay_ms=3000, times=1)
    proc, url = spawn(sim, tmp_path)  # default liveness timeout: 30 s
    try:
        seen = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and http(url + "/readyz")[0] != 200:
            t = time.monotonic()
            status, _, _ = http(url + "/metrics")
            seen.append((time.monotonic() - t, check_scrape(url, PROMETHEUS_ACCEPT, "gzip", promtool)))
            assert status == 200 and http(url + "/healthz")[0] == 200
            time.sleep(0.1)
        assert http(url + "/readyz")[0] == 200, "init never completed"
        during = [s for _, s in seen if initializing(s)]
        assert len(during) >= 5, len(seen)  # answered while nvmlInit slept, each quickly
        assert min(d for d, _ in seen) < 0.5
        scrape = check_scrape(url, None, None, promtool)
        assert scrape[c.NVML_UP.name] == [({}, 1.0)] and len(scrape[c.GPU_UP.name]) == 2
    finally:
        stop(proc)


# ------------------------------------------------------------------ the alert, on both rule engines


class _Sink(BaseHTTPRequestHandler):
    """vmalert's notifier: accepts and drops its alerts (the test reads vmalert's own API)."""

    def do_POST(self):  # noqa: N802 (the standard library's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _vm_stack(tmp_path, targets: list[str], rules) -> tuple[list[subprocess.Popen], str, str, ThreadingHTTPServer]:
    """VictoriaMetrics scraping `targets` every second (labels as the Prometheus fixture's) and vmalert
    evaluating `rules` over it; (processes, VictoriaMetrics' URL, vmalert's URL, the notifier sink)."""
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    scrape = tmp_path / "vm-scrape.yml"
    scrape.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "gpuobs", "static_configs": [{"targets": targets, "labels": {"node": "sim-node",
                                                                                  "cluster": "test"}}]}]}))
    vm, vmalert = free_port(), free_port()
    procs = []
    for tool, args in (("victoria-metrics", [f"-storageDataPath={tmp_path / 'vm'}", "-retentionPeriod=1",
                                             f"-httpListenAddr=127.0.0.1:{vm}", f"-promscrape.config={scrape}",
                                             "-search.latencyOffset=1s", "-search.disableCache",
                                             "-loggerLevel=ERROR"]),
                       ("vmalert", [f"-rule={rules}", f"-datasource.url=http://127.0.0.1:{vm}",
                                    f"-notifier.url=http://127.0.0.1:{sink.server_port}", "-evaluationInterval=1s",
                                    f"-httpListenAddr=127.0.0.1:{vmalert}", "-loggerLevel=ERROR"])):
        log = open(tmp_path / f"{tool}.log", "w")
        procs.append(subprocess.Popen([require_tool(tool), *args], stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs, f"http://127.0.0.1:{vm}", f"http://127.0.0.1:{vmalert}", sink


def vm_query(base: str, promql: str) -> list[dict]:
    """An instant query's result on VictoriaMetrics."""
    with urllib.request.urlopen(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=10) as r:
        return json.load(r)["data"]["result"]


def _vmalert_alerts(base: str) -> list[dict]:
    try:
        with urllib.request.urlopen(base + "/api/v1/alerts", timeout=5) as r:
            return json.load(r)["data"]["alerts"] or []  # null while none is active
    except OSError:
        return []  # not listening yet


@pytest.mark.timeout(240)
def test_nvml_down_fires_for_a_hung_init_only_on_prometheus_and_vmalert(make_sim, prometheus, tmp_path):
    require_tool("promtool")
    hung_sim, slow_sim = make_sim(TWO, init=False), make_sim(TWO, init=False)
    hung_sim.state.slow_init(hang=True)
    slow_sim.state.slow_init(delay_ms=3000, times=1)  # under the fast profile's for_short (5 s)
    rules = write_fast_rules(tmp_path)
    groups = [{k: v for k, v in g.items()} for g in yaml.safe_load(rules.read_text())["groups"]]
    vm_rules = tmp_path / "nvmldown.rules.yml"
    vm_rules.write_text(yaml.safe_dump({"groups": subset(groups, [], ("NvmlDown",))}))
    procs = []
    try:
        hung, hung_url = spawn(hung_sim, tmp_path, "--liveness-timeout", "600")  # nothing restarts it here
        procs.append(hung)
        slow_port = free_port()
        targets = [urllib.parse.urlsplit(hung_url).netloc, f"127.0.0.1:{slow_port}"]
        vm_procs, vm, vmalert, sink = _vm_stack(tmp_path, targets, vm_rules)
        procs += vm_procs
        query = prometheus(targets, rule_files=(str(rules),))  # returns once the hung exporter is scraped
        wait(lambda: vm_query(vm, f'up{{instance="{targets[0]}"}} == 1'), 30, "VictoriaMetrics scraping")
        slow, _ = spawn(slow_sim, tmp_path, port=slow_port)  # started under both engines' eyes
        procs.append(slow)
        firing = 'ALERTS{alertname="NvmlDown", alertstate="firing", instance="%s"}'
        vm_firing: dict[str, int] = {}

        def fired_on_both():
            for a in _vmalert_alerts(vmalert):
                if a["name"] == "NvmlDown" and a["state"] == "firing":
                    vm_firing[a["labels"]["instance"]] = vm_firing.get(a["labels"]["instance"], 0) + 1
            return query(firing % targets[0]) and targets[0] in vm_firing

        wait(fired_on_both, 90, lambda: f"NvmlDown firing for the hung init on both (vmalert: {vm_firing}; "
                                        f"Prometheus: {query('ALERTS')})")
        wait(lambda: query(f'{c.NVML_UP.name}{{instance="{targets[1]}"}} == 1'), 30, "the slow init to complete")
        time.sleep(6)  # longer than for_short after the slow target's first scrape: it had every chance to fire
        fired_on_both()
        assert not query(f"max_over_time({firing % targets[1]}[5m])"), "NvmlDown fired for a slow init on Prometheus"
        assert targets[1] not in vm_firing, f"NvmlDown fired for a slow init on vmalert: {vm_firing}"
        # ... though both engines saw its initialisation (NVML down) and its end: quiet, not blind
        slow_up = f'{c.NVML_UP.name}{{instance="{targets[1]}"}}'
        for ask in (query, lambda q: vm_query(vm, q)):
            assert ask(f"min_over_time({slow_up}[5m]) == 0") and ask(f"{slow_up} == 1"), ask(slow_up)
        assert query(f'{c.NVML_INIT_ERROR.name}{{reason="initializing", instance="{targets[0]}"}} == 1')
        sink.shutdown()
    finally:
        for proc in reversed(procs):
            stop(proc)


# ------------------------------------------------------------------------------- the zombie


def test_unknown_error_zombie_fails_healthz_after_the_nvml_down_timeout(make_sim, tmp_path):
    sim = make_sim(TWO, init=False)
    proc, url = spawn(sim, tmp_path, "--nvml-down-timeout", "3")
    try:
        wait(lambda: http(url + "/readyz")[0] == 200, 15, "the exporter to be ready")
        time.sleep(4)  # healthy NVML for longer than the timeout: still live
        assert http(url + "/healthz")[0] == 200
        sim.state.fail(None, UNKNOWN)  # every call ...
        sim.state.fail_init(UNKNOWN)  # ... and every re-initialisation
        t0 = time.monotonic()
        status, _, reason = wait(lambda: (r := http(url + "/healthz"))[0] == 503 and r, 20, "/healthz to fail")
        took = time.monotonic() - t0
        assert b"nvml down" in reason and b"UNKNOWN" in reason, reason
        assert 3 <= took <= 15, took
        body = http(url + "/metrics")[2].decode()
        assert 'gpuobs_nvml_init_error{reason="UNKNOWN"} 1.0' in body and "gpuobs_nvml_up 0.0" in body

        sim.state.clear_faults()  # the driver answers again (in a restarted container, as a rule)
        sim.state.clear_init_error()
        wait(lambda: http(url + "/healthz")[0] == 200, 60, "/healthz to recover")
    finally:
        stop(proc)


def test_a_node_without_a_driver_is_not_restarted(make_sim, tmp_path):
    """DRIVER_NOT_LOADED is the node's state: a restart cannot cure it, so /healthz stays 200 past the
    NVML-down timeout and the exporter keeps serving gpuobs_nvml_up 0 (NvmlDown pages)."""
    sim = make_sim(TWO, init=False)
    sim.state.fail_init(9)  # NVML_ERROR_DRIVER_NOT_LOADED
    proc, url = spawn(sim, tmp_path, "--nvml-down-timeout", "1")
    try:
        wait(lambda: b"DRIVER_NOT_LOADED" in http(url + "/metrics")[2], 15, "the failed init served")
        time.sleep(2)
        assert http(url + "/healthz")[0] == 200 and http(url + "/readyz")[0] == 503
    finally:
        stop(proc)


def test_zero_nvml_down_timeout_turns_the_check_off(make_sim, tmp_path):
    sim = make_sim(TWO, init=False)
    sim.state.fail_init(UNKNOWN)
    proc, url = spawn(sim, tmp_path, "--nvml-down-timeout", "0")
    try:
        wait(lambda: b"UNKNOWN" in http(url + "/metrics")[2], 15, "the failed init served")
        time.sleep(1.5)
        assert http(url + "/healthz")[0] == 200  # passes complete; the down check is off
        assert http(url + "/readyz")[0] == 503
    finally:
        stop(proc)


# ------------------------------------------------------------------------------ impossible PIDs


def test_pids_at_or_above_pid_max_are_dropped_without_a_host_pid_view(exporter):
    """NVML's records name host PIDs; in a container without hostPID none of them is in /proc, so
    whether a process runs cannot be judged, but a PID the kernel cannot hand out still can."""
    limit = pid_max()
    possible = next(pid for pid in range(limit - 1, 1, -1) if not os.path.exists(f"/proc/{pid}"))
    impossible = [limit, 1258291200]  # pid_max itself is never handed out either
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}],
                    "processes": [{"gpu": 0, "pid": possible, "name": "python train.py", "used_mib": 1000}]
                    + [{"gpu": 0, "pid": pid, "name": "?", "used_mib": 10} for pid in impossible]},
                   interval=0.1, families={"identity", "memory", "processes"})
    name = c.PROCESS_MEMORY.name
    scrape = run.wait_for(lambda s: any(n == name for n, _, _ in s), 5, "process series")
    assert {labels["pid"] for n, labels, _ in scrape if n == name} == {str(possible)}  # not on this host: kept
    dropped = {labels["reason"]: v for n, labels, v in scrape
               if n == c.DROPPED.exposed_name and labels["metric"] == name}
    assert dropped.get("invalid_pid", 0) >= 2 and "not_running" not in dropped, dropped
