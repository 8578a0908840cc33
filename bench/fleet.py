"""Fleet-scale benchmark (issue 8, deliverable 5): one Prometheus, VictoriaMetrics and vmalert on
loopback, fed with the real gpuobs exposition of a simulated 8 x H100 node multiplied into a fleet.

    .venv/bin/python bench/fleet.py            # full: 1,250 live nodes, 125 in the 6 h history (about 7 minutes)
    .venv/bin/python bench/fleet.py --quick    # 125 live nodes, 20 in the history (2 to 3 minutes)

Three parts, run one after the other so they do not share the two CPUs:

1. Template: the gpuobs exporter on one simulated node (``gpuobs.sim``), scraped once. Every fleet
   series is a copy of one of its series, with per-node UUIDs, target labels and values that move
   (utilization waves, power and temperature following it, counters increasing); a few GPUs are
   idle, allocated-but-idle, throttling, reporting XIDs or lost, so the rules have work to do.
2. Live ingest: one process (standard-library WSGI server) answers ``/metrics?node=N`` for every
   node, rendering that node's body at request time; one Prometheus scrapes every node, evaluates
   ``alerts/gpuobs.rules.yml`` and remote-writes to a VictoriaMetrics single node, where vmalert
   evaluates the same rule file. Numbers come from each server's own ``/metrics``.
3. Six hours of history: OpenMetrics text with timestamps for every series the fleet dashboards and
   the recording rules read, turned into blocks by ``promtool tsdb create-blocks-from openmetrics``;
   the recording rules are backfilled with ``promtool tsdb create-blocks-from rules``; then every
   query of each fleet dashboard runs over 6 h as written (recording rules) and with each recorded
   name replaced by its expression.

``fleet_bench(quick, workdir)`` returns the numbers, ``fleet_report(result)`` the Markdown section.
Needs the prometheus, promtool, victoria-metrics, vmalert and prometheus-alertmanager binaries.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from operator import add
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Running, cpu_seconds, free_port, version  # noqa: E402
from gpuobs import catalog as c  # noqa: E402
from gpuobs.alerts.rules import DEFAULT, _seconds  # noqa: E402
from gpuobs.nvml import pynvml as N  # noqa: E402
from gpuobs.dashboards.common import interpolate  # noqa: E402
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RULES = ROOT / "alerts" / "gpuobs.rules.yml"
RULE_INTERVAL_S = _seconds(DEFAULT.eval_interval)  # of every group in alerts/gpuobs.rules.yml
FLEET_DASHBOARDS = ("fleet-overview", "exporter-health")   # the fleet-wide ones; node, job and model ones are not
CLUSTERS = 5
GPUS = 8
HISTORY_HOURS = 6
BLOCK_S = 2 * 3600          # promtool writes 2 h blocks; one input file per block keeps it to one parse each
T0 = 1_700_000_000.0        # counters count from here (seconds), so they are positive and increasing
XID_PERIOD = 5400.0         # an XID GPU reports one more XID 79 every 90 minutes

# ----------------------------------------------------------------------------------------- helpers


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise RuntimeError(f"{tool} not found on PATH (Debian: apt-get install prometheus victoria-metrics "
                           "prometheus-alertmanager)")
    return path


class Procs:
    """Servers started for one part (bench.common.Running, each in its own process group), all stopped by stop()."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[Running] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `cmd` in the repository root, logging to <logdir>/<name>.log; its Popen."""
        run = Running(cmd, env, self.logdir / f"{name}.log", term_wait=20)
        self.procs.append(run)
        return run.proc

    def check(self) -> None:
        """RuntimeError with its log tail if any server has exited."""
        for run in self.procs:
            run.check()

    def stop(self) -> None:
        """Stop every server, the last started first."""
        for run in reversed(self.procs):
            run.stop()
        self.procs.clear()


def get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def api(base: str, path: str, timeout: float = 120, **params) -> dict:
    """A Prometheus-API GET; raises with the server's error message."""
    url = f"{base}{path}?" + urllib.parse.urlencode(params)
    try:
        body = json.loads(get(url, timeout))
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: {e.code} {e.read()[:500]!r}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def scalar(base: str, promql: str, **params) -> float:
    """An instant query's single value (NaN when empty)."""
    r = api(base, "/api/v1/query", query=promql, **params)["result"]
    return float(r[0]["value"][1]) if r else float("nan")


def metrics(url: str) -> dict[str, list[tuple[dict, float]]]:
    """A server's own /metrics, parsed: sample name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(get(url).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(m: dict, name: str, **match) -> float:
    return sum(v for labels, v in m.get(name, []) if all(labels.get(k) == x for k, x in match.items()))


def wait_until(what: str, predicate, timeout: float, procs: Procs | None = None, every: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if procs:
            procs.check()
        try:
            v = predicate()
            if v:
                return v
        except (OSError, RuntimeError, ValueError) as e:
            last = e
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last error: {last})" if last else ""))


def rss_bytes(pid: int) -> int:
    """VmRSS of one process, in bytes (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------------------------ the template


def node_template(workdir: Path) -> str:
    """The gpuobs exporter's /metrics body for one simulated node of 8 H100s (steady behaviour)."""
    from gpuobs.sim import Simulator

    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb", "count": GPUS, "behaviour": "steady"}]},
                    directory=str(workdir / "sim"))
    procs = Procs(workdir)
    port = free_port()
    try:
        procs.start("exporter", [sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                                 "--port", str(port), "--interval", "1", "--kubelet-socket", ""],
                    env=sim.env())
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until("the template exporter", lambda: c.UTILIZATION.name.encode() in get(url), 60, procs, 0.2)
        time.sleep(2.5)  # a couple of sampling passes, so counters and rates have moved
        return get(url).decode()
    finally:
        procs.stop()
        sim.close()


class Series:
    __slots__ = ("family", "kind", "name", "labels", "value", "gpu")

    def __init__(self, family, kind, name, labels, value):
        self.family, self.kind, self.name, self.labels, self.value = family, kind, name, labels, value
        self.gpu = int(labels["gpu"]) if "gpu" in labels else -1


def parse_template(text: str) -> tuple[list[Series], dict[str, tuple[str, str]]]:
    """Series of the template in exposition order, and family -> (type, help)."""
    from prometheus_client.parser import text_string_to_metric_families

    series, fams = [], {}
    for fam in text_string_to_metric_families(text):
        fams[fam.name] = (fam.type, fam.documentation)
        for s in fam.samples:
            series.append(Series(fam.name, fam.type, s.name, dict(s.labels), s.value))
    # XIDs exist only once a GPU has reported one; the steady template has none, the fleet has some
    fams[c.XID_ERRORS.name] = ("counter", "XID errors reported by the driver, per XID code.")
    fams[c.XID_LAST_SEEN.name] = ("gauge", "Unix time the XID code was last reported.")
    return series, fams


def _gpm(metric_id: str) -> str:
    """The catalog name of a GPM ratio, by its NVML_GPM_METRIC_* suffix."""
    return c.GPM_METRICS[getattr(N, f"NVML_GPM_METRIC_{metric_id}")].name


# Gauges that follow the GPU's utilization wave: name -> (base, amplitude) at utilization 0..1.
FOLLOW = {
    c.UTILIZATION.name: (0, 1.0), _gpm("SM_UTIL"): (0, 0.85), _gpm("SM_OCCUPANCY"): (0, 0.5),
    _gpm("ANY_TENSOR_UTIL"): (0, 0.6), _gpm("DRAM_BW_UTIL"): (0, 0.5), _gpm("FP16_UTIL"): (0, 0.5),
    _gpm("FP32_UTIL"): (0, 0.2), _gpm("FP64_UTIL"): (0, 0.02), _gpm("GRAPHICS_UTIL"): (0, 0.9),
    c.MEMORY_UTILIZATION.name: (0, 0.6), c.POWER_USAGE.name: (70, 600), c.TEMPERATURE.name: (30, 45),
    c.MEMORY_TEMPERATURE.name: (35, 45),
}
# Counters with a steady rate per second (bytes, joules, passes).
RATE = {
    c.ENERGY.exposed_name: 400.0, c.PCIE_TX.exposed_name: 2e9,
    c.PCIE_RX.exposed_name: 2e9, c.NVLINK_TX.exposed_name: 5e8,
    c.NVLINK_RX.exposed_name: 5e8, c.SAMPLES.exposed_name: 0.2,
}
ROLES = ("busy", "idle", "allocated_idle", "throttled", "xid", "lost")
ROLE_P = (0.92, 0.03, 0.02, 0.02, 0.008, 0.002)


class Node:
    """One fleet node: its series (prefix text) and the arrays that give their values at time t:
    value = base + amp * utilization(gpu, t) + rate * (t - T0) + step * floor((t - T0 + phase) / XID_PERIOD)."""

    def __init__(self, n: int, template: list[Series], fams: dict, target_labels: bool, keep: set[str] | None = None):
        rng = np.random.default_rng(n)
        self.node = f"node-{n:04d}"
        self.cluster = f"cluster-{n % CLUSTERS}"
        self.roles = [ROLES[i] for i in rng.choice(len(ROLES), size=GPUS, p=ROLE_P)]
        self.busy = np.array([r in ("busy", "throttled", "xid") for r in self.roles], dtype=float)
        self.phase = rng.uniform(0, 2 * math.pi, size=(2, GPUS))
        uuids = [f"GPU-{n:08x}-{g:04x}-4{rng.integers(0, 4096):03x}-8000-{rng.integers(0, 2**47):012x}"
                 for g in range(GPUS)]
        extra = {"cluster": self.cluster, "instance": f"{self.node}:9445", "job": "gpuobs", "node": self.node}
        rows = []  # (family, name, labels, gpu, base, amp, rate, step)
        for s in template:
            if keep is not None and s.name not in keep:
                continue
            labels = dict(s.labels)
            if "uuid" in labels:
                labels["uuid"] = uuids[s.gpu]
            role = self.roles[s.gpu] if s.gpu >= 0 else "busy"
            base, amp, rate, step = s.value, 0.0, 0.0, 0.0
            if s.name in FOLLOW:
                base, amp = FOLLOW[s.name]
            elif s.name in RATE:
                rate = RATE[s.name]
                base = s.value
            elif s.name == c.LAST_SUCCESS.name:
                base, rate = T0, 1.0
            elif s.name == c.MEMORY_USED.name:
                base = {"busy": 6.0e10, "allocated_idle": 4.0e10, "idle": 5.0e8}.get(role, 6.0e10)
            elif s.name == c.GPU_UP.name:
                base = 0.0 if role == "lost" else 1.0
            elif s.name == c.GPUS_PRESENT.name:
                base = GPUS - self.roles.count("lost")
            elif s.name == c.CLOCK_EVENT_ACTIVE.name:
                r = labels.get("reason")
                base = float((r == "gpu_idle" and role in ("idle", "allocated_idle"))
                             or (r == "sw_power_cap" and role == "throttled" and s.gpu % 2 == 0)
                             or (r == "hw_thermal_slowdown" and role == "throttled" and s.gpu % 2 == 1))
            elif s.name == c.CLOCK_EVENT_DURATION.exposed_name:
                if role == "throttled" and labels.get("reason") in ("sw_power_cap", "hw_thermal_slowdown"):
                    rate = 0.5
            rows.append((s.family, s.name, labels, s.gpu, base, amp, rate, step))
        for g, role in enumerate(self.roles):
            if role == "xid":
                lab = {"gpu": str(g), "uuid": uuids[g], "xid": "79"}
                if keep is None or c.XID_ERRORS.exposed_name in keep:
                    rows.append((c.XID_ERRORS.name, c.XID_ERRORS.exposed_name, lab, g, 1.0, 0, 0, 1.0))
                if keep is None or c.XID_LAST_SEEN.name in keep:
                    rows.append((c.XID_LAST_SEEN.name,
                                 c.XID_LAST_SEEN.name, dict(lab), g, T0, 0, 0, 0))
        if target_labels:
            # what Prometheus adds on a scrape; present in the history, absent from a served body
            rows.append(("up", "up", {}, -1, 1.0, 0, 0, 0))
            rows.append(("scrape_duration_seconds", "scrape_duration_seconds", {}, -1, 0.02, 0, 0, 0))
            fams.setdefault("up", ("gauge", ""))
            fams.setdefault("scrape_duration_seconds", ("gauge", ""))
        # grouped by family in first-seen order: the exposition formats want families contiguous
        order = {f: i for i, f in enumerate(dict.fromkeys(r[0] for r in rows))}
        rows.sort(key=lambda r: order[r[0]])
        self.families = [r[0] for r in rows]
        self.prefix = []
        for fam, name, labels, *_ in rows:
            if target_labels:
                labels = {**labels, **extra}
            body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            self.prefix.append(f"{name}{{{body}}} " if body else f"{name} ")
        arr = np.array([r[3:] for r in rows], dtype=float)
        self.gpu = arr[:, 0].astype(int)
        self.base, self.amp, self.rate, self.step = arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4]
        self.xphase = rng.uniform(0, XID_PERIOD, size=len(rows))

    def utilization(self, t: np.ndarray) -> np.ndarray:
        """(GPUS, len(t)) utilization in 0..1: a slow wave and a faster ripple; idle roles stay at 0."""
        w = 2 * math.pi * t[None, :]
        u = 0.62 + 0.3 * np.sin(w / 2820 + self.phase[0][:, None]) + 0.08 * np.sin(w / 420 + self.phase[1][:, None])
        return np.clip(u, 0.05, 1.0) * self.busy[:, None]

    def values(self, t: np.ndarray) -> np.ndarray:
        """(series, len(t)) values, rounded to 3 decimals (as an exporter's float text would vary)."""
        u = self.utilization(t)
        ug = np.where(self.gpu[:, None] >= 0, u[np.maximum(self.gpu, 0)], 0.0)
        dt = t[None, :] - T0
        v = (self.base[:, None] + self.amp[:, None] * ug + self.rate[:, None] * dt
             + self.step[:, None] * np.floor((dt + self.xphase[:, None]) / XID_PERIOD))
        return np.round(v, 3)

    def body(self, t: float, fams: dict) -> bytes:
        """This node's text exposition (format 0.0.4) at time t."""
        vals = self.values(np.array([t]))[:, 0].tolist()
        out, last = [], None
        for fam, prefix, v in zip(self.families, self.prefix, vals):
            if fam != last:
                kind, doc = fams[fam]
                out.append(f"# HELP {fam if kind != 'counter' else fam + '_total'} {doc}\n"
                           f"# TYPE {fam if kind != 'counter' else fam + '_total'} {kind}\n")
                last = fam
            out.append(f"{prefix}{v!r}\n")
        return "".join(out).encode()


# --------------------------------------------------------------------------- the multi-target exporter


def serve(template_path: Path, port: int, nodes: int) -> None:
    """Answers /metrics?node=N for N in 0..nodes-1 (standard-library WSGI server, one thread per request)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    series, fams = parse_template(template_path.read_text())
    cache: dict[int, Node] = {}

    def app(environ, start_response):
        q = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        try:
            n = int(q["node"][0])
            assert 0 <= n < nodes
        except (KeyError, ValueError, AssertionError):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"unknown node\n"]
        node = cache.get(n)
        if node is None:
            node = cache[n] = Node(n, series, fams, target_labels=False)
        body = node.body(time.time(), fams)
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),
                                  ("Content-Length", str(len(body)))])
        return [body]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        request_queue_size = 256

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):  # one line per scrape otherwise
            pass

    make_server("127.0.0.1", port, app, server_class=Server, handler_class=Quiet).serve_forever()


# -------------------------------------------------------------------------------------- live ingest


def vm_rule_file(dst: Path) -> list[str]:
    """The rule file as vmalert 1.79 can load it: it rejects keep_firing_for (newer vmalert reads it),
    so that key is dropped and nothing else changes. Returns the alerts that had it."""
    doc = yaml.safe_load(RULES.read_text())
    dropped = []
    for g in doc["groups"]:
        for r in g["rules"]:
            if r.pop("keep_firing_for", None) is not None:
                dropped.append(r["alert"])
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dropped


def live_bench(workdir: Path, template_path: Path, nodes: int, interval: int, window: float) -> dict:
    """Prometheus scraping `nodes` targets every `interval` s, remote-writing to VictoriaMetrics, with
    vmalert on VM; measured over `window` seconds after every target has been scraped once."""
    res: dict = {"nodes": nodes, "gpus": nodes * GPUS, "scrape_interval_s": interval}
    procs = Procs(workdir)
    ports = {k: free_port() for k in ("exporter", "prom", "vm", "vmalert", "am")}
    prom, vm, vma = (f"http://127.0.0.1:{ports[k]}" for k in ("prom", "vm", "vmalert"))
    try:
        exporter = procs.start("fleet-exporter", [sys.executable, str(Path(__file__).resolve()), "--serve",
                                                  str(template_path), "--port", str(ports["exporter"]),
                                                  "--nodes", str(nodes)])
        vmp = procs.start("victoria-metrics", [need("victoria-metrics"), f"-storageDataPath={workdir / 'vm'}",
                                               f"-httpListenAddr=127.0.0.1:{ports['vm']}", "-retentionPeriod=1",
                                               # the default 300k would refuse the per-link NVLink rules at this size
                                               "-search.maxUniqueTimeseries=10000000", "-loggerLevel=ERROR"])
        am_cfg = workdir / "alertmanager.yml"
        am_cfg.write_text(yaml.safe_dump({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
        procs.start("alertmanager", [need("prometheus-alertmanager"), f"--config.file={am_cfg}",
                                     f"--storage.path={workdir / 'am'}", f"--web.listen-address=127.0.0.1:{ports['am']}",
                                     "--cluster.listen-address="])
        groups = [{"targets": [f"node-{n:04d}" for n in range(nodes) if n % CLUSTERS == c],
                   "labels": {"cluster": f"cluster-{c}"}} for c in range(CLUSTERS)]
        cfg = {
            "global": {"scrape_interval": f"{interval}s", "scrape_timeout": f"{max(10, interval - 5)}s",
                       "evaluation_interval": "30s"},
            "rule_files": [str(RULES)],
            "remote_write": [{"url": f"{vm}/api/v1/write"}],
            "scrape_configs": [{
                "job_name": "gpuobs", "static_configs": groups,
                # one exporter process serves every node: the target name becomes ?node=, node and instance
                "relabel_configs": [
                    {"source_labels": ["__address__"], "regex": "node-0*([0-9]+)", "target_label": "__param_node",
                     "replacement": "${1}"},
                    {"source_labels": ["__address__"], "target_label": "node"},
                    {"source_labels": ["__address__"], "target_label": "instance", "replacement": "${1}:9445"},
                    {"target_label": "__address__", "replacement": f"127.0.0.1:{ports['exporter']}"},
                ]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        promp = procs.start("prometheus", [need("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                                           f"--storage.tsdb.path={workdir / 'prom-live'}",
                                           f"--web.listen-address=127.0.0.1:{ports['prom']}", "--log.level=warn"])
        dropped = vm_rule_file(workdir / "vm.rules.yml")
        res["vmalert_dropped_keep_firing_for"] = len(dropped)
        vmap = procs.start("vmalert", [need("vmalert"), f"-rule={workdir / 'vm.rules.yml'}", f"-datasource.url={vm}",
                                       f"-remoteWrite.url={vm}", f"-notifier.url=http://127.0.0.1:{ports['am']}",
                                       f"-httpListenAddr=127.0.0.1:{ports['vmalert']}", "-evaluationInterval=30s",
                                       "-loggerLevel=ERROR"])
        pids = {"prometheus": promp.pid, "victoria-metrics": vmp.pid, "vmalert": vmap.pid, "exporter": exporter.pid}
        peak = {k: 0 for k in pids}

        def sample_rss():
            for k, pid in pids.items():
                peak[k] = max(peak[k], rss_bytes(pid))

        t_start = time.monotonic()
        wait_until("Prometheus ready", lambda: get(f"{prom}/-/ready"), 60, procs)
        wait_until("VictoriaMetrics ready", lambda: get(f"{vm}/health"), 60, procs)

        def all_up():
            sample_rss()
            return scalar(prom, 'count(up{job="gpuobs"} == 1)') >= nodes

        wait_until(f"all {nodes} targets scraped", all_up, 6 * interval + 60, procs, 2)
        res["first_cycle_s"] = time.monotonic() - t_start
        # steady window: one full cycle in, the series exist; count appends and CPU over the window
        time.sleep(interval)
        m0, v0, a0 = metrics(f"{prom}/metrics"), metrics(f"{vm}/metrics"), metrics(f"{vma}/metrics")
        c0 = {k: cpu_seconds(p, children=False) for k, p in pids.items()}
        w0 = time.monotonic()
        while time.monotonic() - w0 < window:
            procs.check()
            sample_rss()
            time.sleep(2)
        w = time.monotonic() - w0
        m1, v1, a1 = metrics(f"{prom}/metrics"), metrics(f"{vm}/metrics"), metrics(f"{vma}/metrics")
        res["window_s"] = w
        res["cpu_cores"] = {k: (cpu_seconds(p, children=False) - c0[k]) / w for k, p in pids.items()}
        res["peak_rss_gib"] = {k: v / 2**30 for k, v in peak.items()}
        res["prom_head_series"] = total(m1, "prometheus_tsdb_head_series")
        res["prom_rss_gib"] = total(m1, "process_resident_memory_bytes") / 2**30
        res["prom_samples_per_s"] = (total(m1, "prometheus_tsdb_head_samples_appended_total")
                                     - total(m0, "prometheus_tsdb_head_samples_appended_total")) / w
        res["targets_up"] = int(scalar(prom, 'count(up{job="gpuobs"} == 1)'))
        res["scrape_duration_avg_s"] = scalar(prom, 'avg(scrape_duration_seconds{job="gpuobs"})')
        res["scrape_duration_max_s"] = scalar(prom, 'max(scrape_duration_seconds{job="gpuobs"})')
        res["prom_rule_groups"] = {l["rule_group"].split(";")[-1]: v for l, v in
                                   m1.get("prometheus_rule_group_last_duration_seconds", [])}
        res["prom_rule_failures"] = total(m1, "prometheus_rule_evaluation_failures_total")
        res["prom_rule_missed"] = total(m1, "prometheus_rule_group_iterations_missed_total")
        rw = "prometheus_remote_storage_samples_total"
        res["rw_samples_per_s"] = (total(m1, rw) - total(m0, rw)) / w
        res["rw_failed"] = total(m1, "prometheus_remote_storage_samples_failed_total")
        res["rw_pending"] = total(m1, "prometheus_remote_storage_samples_pending")
        hi = total(m1, "prometheus_remote_storage_highest_timestamp_in_seconds")
        sent = total(m1, "prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
        res["rw_lag_s"] = hi - sent if sent else float("nan")
        res["vm_rows_per_s"] = (total(v1, "vm_rows_inserted_total") - total(v0, "vm_rows_inserted_total")) / w
        res["vm_rss_gib"] = total(v1, "process_resident_memory_bytes") / 2**30
        res["vm_series"] = int(json.loads(get(f"{vm}/api/v1/series/count"))["data"][0])
        res["vmalert_recording_errors"] = total(a1, "vmalert_recording_rules_errors_total")
        res["vmalert_alerting_errors"] = total(a1, "vmalert_alerting_rules_errors_total")
        res["vmalert_evaluations"] = total(a1, "vmalert_iteration_total") - total(a0, "vmalert_iteration_total")
        # per-group evaluation time: the summary's sum and count over the window
        its = {}
        for labels, v in a1.get("vmalert_iteration_duration_seconds_sum", []):
            its.setdefault(labels.get("group"), [0, 0])[0] += v
        for labels, v in a1.get("vmalert_iteration_duration_seconds_count", []):
            its.setdefault(labels.get("group"), [0, 0])[1] += v
        res["vmalert_group_s"] = {g: s / c for g, (s, c) in its.items() if c}
        groups_doc = None
        for path in ("/api/v1/groups", "/api/v1/rules"):
            try:
                groups_doc = json.loads(get(f"{vma}{path}"))
                break
            except urllib.error.HTTPError:
                continue
        errs, nrules = [], 0
        for g in (groups_doc or {}).get("data", {}).get("groups", []):
            for r in g.get("alerting_rules", []) + g.get("recording_rules", []) + g.get("rules", []):
                nrules += 1
                if r.get("last_error") or r.get("lastError"):
                    errs.append(f"{g.get('name')}/{r.get('name')}: {(r.get('last_error') or r.get('lastError'))[:200]}")
        res["vmalert_rules"] = nrules
        res["vmalert_rule_errors"] = errs[:10]
        res["vmalert_rule_error_count"] = len(errs)
        return res
    finally:
        procs.stop()
        for d in ("vm", "prom-live", "am"):
            shutil.rmtree(workdir / d, ignore_errors=True)


# ---------------------------------------------------------------------------------- six-hour history


def rule_pairs() -> list[tuple[str, str]]:
    """(record, expr) of every recording rule, in file order."""
    doc = yaml.safe_load(RULES.read_text())
    return [(r["record"], r["expr"]) for g in doc["groups"] for r in g["rules"] if "record" in r]


NAME = r"(?<![\w:]){}(?![\w:])"


def expand(expr: str, pairs: list[tuple[str, str]]) -> str:
    """expr with each recording-rule name replaced by its expression, in parentheses, until none is
    left. Label matchers on a recorded name are dropped when they cannot filter anything (=~".*",
    what Grafana sends for All); any other matcher, or a range on a recorded name, is refused."""
    rules = dict(pairs)
    for _ in range(10):
        hit = False
        for name, body in rules.items():
            pat = re.compile(NAME.format(re.escape(name)) + r"(\{[^{}]*\})?(\s*\[)?")

            def one(m: re.Match) -> str:
                if m.group(2):
                    raise ValueError(f"range on recorded name {name} in {expr}")
                for matcher in filter(None, (m.group(1) or "{}")[1:-1].split(",")):
                    if not re.fullmatch(r'\s*\w+\s*=~\s*"\.\*"\s*', matcher):
                        raise ValueError(f"matcher {matcher} on recorded name {name} cannot be expanded")
                # right after group_left/group_right a "(" opens their label list: give them an empty one
                grouping = re.search(r"\bgroup_(left|right)\s*$", m.string[:m.start()])
                return f"{'() ' if grouping else ''}({body})"

            new = pat.sub(one, expr)
            hit |= new != expr
            expr = new
        if not hit:
            return expr
    raise ValueError(f"recording rules nest too deep: {expr}")


def dashboard_queries(name: str) -> list[dict]:
    """Every target of a generated dashboard: panel, expr, instant."""
    d = json.loads((ROOT / "dashboards" / f"{name}.json").read_text())
    out = []
    for p in d["panels"]:
        for q in [p, *(p.get("panels") or [])]:
            if q.get("type") == "row":
                continue
            for t in q.get("targets", []):
                if t.get("expr"):
                    out.append({"panel": q.get("title", ""), "expr": t["expr"], "instant": bool(t.get("instant"))})
    return out


def needed_names(pairs) -> set[str]:
    """Sample names the fleet dashboards and the recording rules read."""
    text = " ".join(q["expr"] for d in FLEET_DASHBOARDS for q in dashboard_queries(d)) + " " + \
        " ".join(e for _, e in pairs)
    return set(re.findall(r"[a-zA-Z_:][\w:]*", text))


def write_history(path: Path, nodes: list[Node], fams: dict, ts: np.ndarray) -> int:
    """One OpenMetrics file (timestamps in seconds) for the given times; returns the sample count."""
    tails = [f" {int(t)}\n" for t in ts]
    vals = [nd.values(ts) for nd in nodes]
    count = 0
    with open(path, "w", buffering=1 << 22) as f:
        order = list(dict.fromkeys(fam for nd in nodes for fam in nd.families))
        index = [{} for _ in nodes]
        for i, nd in enumerate(nodes):
            for j, fam in enumerate(nd.families):
                index[i].setdefault(fam, []).append(j)
        for fam in order:
            kind = fams[fam][0]
            f.write(f"# TYPE {fam} {kind if kind in ('counter', 'gauge') else 'unknown'}\n")
            for i, nd in enumerate(nodes):
                v = vals[i]
                for j in index[i].get(fam, ()):
                    row = v[j]
                    if row[0] == row[-1] and (row == row[0]).all():
                        s = nd.prefix[j] + repr(float(row[0]))
                        f.write(s + s.join(tails))      # constant: str.join does the work in C
                    else:
                        f.write("".join(map(add, (nd.prefix[j] + x for x in map(repr, row.tolist())), tails)))
                    count += len(ts)
        f.write("# EOF\n")
    return count


def history_bench(workdir: Path, template: str, hnodes: int, step: int, scrape: int, runs: int) -> dict:
    series, fams = parse_template(template)
    pairs = rule_pairs()
    keep = needed_names(pairs)
    nodes = [Node(n, series, fams, target_labels=True, keep=keep) for n in range(hnodes)]
    res: dict = {"nodes": hnodes, "gpus": hnodes * GPUS, "scrape_s": scrape, "step_s": step, "runs": runs,
                 "series_per_node": len(nodes[0].prefix), "series": sum(len(n.prefix) for n in nodes),
                 "template_series": len(series)}
    end = int(time.time()) // BLOCK_S * BLOCK_S     # aligned, so each file is exactly one 2 h block
    start = end - HISTORY_HOURS * 3600
    res["start"], res["end"] = start, end
    data = workdir / "prom-hist"
    data.mkdir()
    procs = Procs(workdir)
    try:
        # generate block k+1 while promtool converts block k
        t0 = time.monotonic()
        samples, bytes_, running, gen_s = 0, 0, [], 0.0
        for k in range(HISTORY_HOURS * 3600 // BLOCK_S):
            ts = np.arange(start + k * BLOCK_S, start + (k + 1) * BLOCK_S, scrape, dtype=float)
            path = workdir / f"history-{k}.om"
            g0 = time.monotonic()
            samples += write_history(path, nodes, fams, ts)
            gen_s += time.monotonic() - g0
            bytes_ += path.stat().st_size
            while len(running) >= 2:   # two cores
                p, pth = running.pop(0)
                if p.wait() != 0:
                    raise RuntimeError(f"promtool failed on {pth.name}: see {workdir}/promtool-{pth.stem}.log")
                pth.unlink()
            running.append((procs.start(f"promtool-{path.stem}", [need("promtool"), "tsdb", "create-blocks-from",
                                                                   "openmetrics", "-q", str(path), str(data)]), path))
        for p, pth in running:
            if p.wait() != 0:
                log = (workdir / f"promtool-{pth.stem}.log").read_text()[-2000:]
                raise RuntimeError(f"promtool failed on {pth.name}: {log}")
            pth.unlink()
        procs.stop()   # all exited: closes their logs
        res["samples"], res["text_gib"] = samples, bytes_ / 2**30
        res["generate_s"], res["backfill_s"] = gen_s, time.monotonic() - t0

        port = free_port()
        prom = f"http://127.0.0.1:{port}"
        pcmd = [need("prometheus"), f"--config.file={workdir / 'empty.yml'}", f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=30d",
                "--query.max-samples=500000000", "--query.timeout=10m"]
        (workdir / "empty.yml").write_text("global: {scrape_interval: 1h}\n")
        procs.start("prometheus-hist", pcmd)
        wait_until("Prometheus on the history", lambda: get(f"{prom}/-/ready"), 120, procs)

        # recording rules over the same range; rules read other rules' output, which promtool cannot
        # see while backfilling, so each rule's expression is expanded to raw series first
        rdoc = {"groups": [{"name": "gpuobs-recording-backfill", "interval": f"{scrape}s",
                            "rules": [{"record": r, "expr": expand(e, [p for p in pairs if p[0] != r])}
                                      for r, e in pairs]}]}
        (workdir / "backfill.rules.yml").write_text(yaml.safe_dump(rdoc, sort_keys=False))
        rdir = workdir / "rules-out"
        t1 = time.monotonic()
        rb = subprocess.run([need("promtool"), "tsdb", "create-blocks-from", "rules", f"--start={start}",
                             f"--end={end}", f"--url={prom}", f"--output-dir={rdir}", f"--eval-interval={scrape}s",
                             str(workdir / "backfill.rules.yml")], capture_output=True, text=True, timeout=900)
        if rb.returncode != 0:
            raise RuntimeError(f"promtool create-blocks-from rules failed: {rb.stderr[-2000:]}")
        res["rules_backfill_s"] = time.monotonic() - t1
        procs.stop()
        for b in rdir.iterdir():
            if b.is_dir():
                shutil.move(str(b), str(data / b.name))
        procs.start("prometheus-hist", pcmd)
        wait_until("Prometheus on history and rules", lambda: get(f"{prom}/-/ready"), 120, procs)
        # promtool writes one block per rule and 2 h range, all overlapping the raw blocks; Prometheus
        # merges overlapping blocks at its first compaction, a minute after start. Queries are timed
        # on the merged blocks, the state a Prometheus that recorded the rules itself would be in.
        ranges = HISTORY_HOURS * 3600 // BLOCK_S
        res["blocks_before_compaction"] = total(metrics(f"{prom}/metrics"), "prometheus_tsdb_blocks_loaded")
        t2 = time.monotonic()
        wait_until("Prometheus to merge the backfilled blocks",
                   lambda: total(metrics(f"{prom}/metrics"), "prometheus_tsdb_blocks_loaded") <= ranges, 300, procs, 2)
        res["compaction_wait_s"] = time.monotonic() - t2
        m0 = metrics(f"{prom}/metrics")
        res["blocks"] = total(m0, "prometheus_tsdb_blocks_loaded")
        res["recorded_ok"] = scalar(prom, "count(cluster:gpuobs_gpus_expected:sum)", time=end) == CLUSTERS

        values = {"cluster": ".*", "node": ".*", "model": ".*", "job": ".*", "__rate_interval": f"{4 * scrape}s",
                  "__interval": f"{step}s", "__range": f"{HISTORY_HOURS}h"}
        dashes = {}
        for d in FLEET_DASHBOARDS:
            rows = []
            for q in dashboard_queries(d):
                raw = interpolate(q["expr"], values)
                rows.append({**q, "with": raw, "without": expand(raw, pairs),
                             "uses_rules": expand(raw, pairs) != raw, "t_with": [], "t_without": []})
            dashes[d] = rows
        # a warm-up pass (page cache) then `runs` timed passes, with and without interleaved per query
        for r in range(runs + 1):
            for d, rows in dashes.items():
                for row in rows:
                    for key in ("with", "without"):
                        params = {"query": row[key]}
                        if row["instant"]:
                            path, params["time"] = "/api/v1/query", end
                        else:
                            path = "/api/v1/query_range"
                            params.update(start=start, end=end, step=step)
                        q0 = time.perf_counter()
                        out = api(prom, path, timeout=600, **params)
                        dt = time.perf_counter() - q0
                        if r:
                            row["t_" + key].append(dt)
                        else:
                            row["n_" + key] = len(out["result"])
        m1 = metrics(f"{prom}/metrics")
        res["compactions_during_queries"] = (total(m1, "prometheus_tsdb_compactions_total")
                                             - total(m0, "prometheus_tsdb_compactions_total"))
        res["prom_rss_gib"] = total(m1, "process_resident_memory_bytes") / 2**30
        out = {}
        for d, rows in dashes.items():
            for row in rows:
                row["t_with"] = float(np.median(row["t_with"]))
                row["t_without"] = float(np.median(row["t_without"]))
            rr = [r for r in rows if r["uses_rules"]]
            out[d] = {
                "queries": len(rows), "rule_queries": len(rr),
                "total_with": sum(r["t_with"] for r in rows), "total_without": sum(r["t_without"] for r in rows),
                "max_with": max(r["t_with"] for r in rows), "max_without": max(r["t_without"] for r in rows),
                "rule_total_with": sum(r["t_with"] for r in rr), "rule_total_without": sum(r["t_without"] for r in rr),
                "slowest_with": max(rows, key=lambda r: r["t_with"])["panel"],
                "slowest_without": max(rows, key=lambda r: r["t_without"])["panel"],
                "empty_with": [r["panel"] for r in rows if not r.get("n_with")],
                "rows": [{k: r[k] for k in ("panel", "instant", "uses_rules", "t_with", "t_without", "n_with",
                                            "n_without")} for r in rows],
            }
        res["dashboards"] = out
        return res
    finally:
        procs.stop()
        for p in workdir.glob("history-*.om"):
            p.unlink()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(workdir / "rules-out", ignore_errors=True)


# ----------------------------------------------------------------------------------------- the bench


def fleet_bench(quick: bool, workdir: Path, nodes: int | None = None, history_nodes: int | None = None) -> dict:
    """Runs the three parts; returns every number as a JSON-serialisable dict. Leaves no server
    running and deletes what it generated under workdir (the directory itself is kept)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for tool in ("prometheus", "promtool", "victoria-metrics", "vmalert", "prometheus-alertmanager"):
        need(tool)
    live_nodes = nodes or (125 if quick else 1250)
    hist_nodes = history_nodes or (20 if quick else 125)
    t0 = time.monotonic()
    res: dict = {"quick": quick, "versions": {
        "prometheus": version([need("prometheus"), "--version"], "prometheus"),
        "victoria-metrics": version([need("victoria-metrics"), "-version"], "victoria-metrics"),
    }}
    template = node_template(workdir)
    tpath = workdir / "template.prom"
    tpath.write_text(template)
    try:
        res["template_series"] = len(parse_template(template)[0])
        print(f"[fleet] live ingest: {live_nodes} nodes ...", flush=True)
        try:
            t1 = time.monotonic()
            res["live"] = live_bench(workdir, tpath, live_nodes, interval=10 if quick else 30,
                                     window=20 if quick else 60)
            res["live"]["part_s"] = time.monotonic() - t1
        except Exception as e:  # report, and still run the history part
            res["live"] = {"nodes": live_nodes, "error": f"{type(e).__name__}: {e}"[:1500]}
            traceback.print_exc()
        print(f"[fleet] live: {res['live']}", flush=True)
        print(f"[fleet] six-hour history: {hist_nodes} nodes ...", flush=True)
        try:
            t1 = time.monotonic()
            res["history"] = history_bench(workdir, template, hist_nodes, step=60, scrape=60, runs=3 if quick else 2)
            res["history"]["part_s"] = time.monotonic() - t1
        except Exception as e:
            res["history"] = {"nodes": hist_nodes, "error": f"{type(e).__name__}: {e}"[:1500]}
            traceback.print_exc()
        print(f"[fleet] history: { {k: v for k, v in res['history'].items() if k != 'dashboards'} }", flush=True)
    finally:
        tpath.unlink(missing_ok=True)
        shutil.rmtree(workdir / "sim", ignore_errors=True)
    res["elapsed_s"] = time.monotonic() - t0
    return res


# ---------------------------------------------------------------------------------------- the report


def fmt(x, d: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{d}f}"


def fleet_report(result: dict) -> str:
    """The "## Fleet scale" section of BENCHMARKS.md, from fleet_bench()'s result."""
    L = ["## Fleet scale", ""]
    v = result.get("versions", {})
    L.append(f"Run {'quick' if result.get('quick') else 'full'} in {fmt(result.get('elapsed_s'), 0)} s; "
             f"{v.get('prometheus', '?')}; {v.get('victoria-metrics', '?')} (vmalert from the same package).")
    L.append("")
    L.append(f"Series come from the gpuobs exporter on one simulated 8 × H100 node ({result.get('template_series', 0):,} "
             "series), copied per node with its own UUIDs, target labels (cluster, node, instance, job) and values "
             "that move: a utilization wave per GPU that power, temperature and the activity ratios follow, "
             "counters that increase. Per GPU, about 3 % are idle, 2 % allocated but idle, 2 % throttling "
             "(power cap or HW thermal), 0.8 % report XID 79 and 0.2 % are lost. Five clusters.")
    L.append("")
    live = result.get("live", {})
    L.append("### Live ingest: Prometheus, remote_write to VictoriaMetrics, vmalert")
    L.append("")
    if "error" in live:
        L.append(f"**Failed** with {live['nodes']} nodes: `{live['error']}`")
    else:
        L.append(f"Method: one process (standard-library WSGI server) serves `/metrics?node=N` for {live['nodes']:,} "
                 f"nodes ({live['gpus']:,} GPUs), rendering each body at request time; one Prometheus scrapes every "
                 f"node every {live['scrape_interval_s']} s, evaluates `alerts/gpuobs.rules.yml` and remote-writes "
                 "everything to one VictoriaMetrics, where vmalert evaluates the same rules every 30 s. All on "
                 f"this machine's two cores. After every target had been scraped once and one more cycle, the "
                 f"numbers below were taken over {fmt(live['window_s'], 0)} s from each server's own `/metrics`.")
        L.append("")
        L.append("| measure | value |")
        L.append("|---|---:|")
        pr = live.get("prom_rule_groups", {})
        rows = [
            ("targets up", f"{live['targets_up']:,} / {live['nodes']:,}"),
            ("first scrape of every target done after (s)", fmt(live["first_cycle_s"], 0)),
            ("Prometheus active series (`prometheus_tsdb_head_series`)", f"{live['prom_head_series']:,.0f}"),
            ("Prometheus ingest, samples/s (`prometheus_tsdb_head_samples_appended_total`)", fmt(live["prom_samples_per_s"], 0)),
            ("Prometheus RSS, GiB (`process_resident_memory_bytes`, end; peak VmRSS)",
             f"{fmt(live['prom_rss_gib'])}; {fmt(live['peak_rss_gib']['prometheus'])}"),
            ("scrape duration, avg / max (s)", f"{fmt(live['scrape_duration_avg_s'], 3)} / {fmt(live['scrape_duration_max_s'], 3)}"),
            ("Prometheus rule groups, last duration (s)", ", ".join(f"{g} {fmt(x, 2)}" for g, x in sorted(pr.items()))),
            ("Prometheus rule failures / missed iterations", f"{live['prom_rule_failures']:.0f} / {live['prom_rule_missed']:.0f}"),
            ("remote_write sent, samples/s (with the first cycle's backlog); failed; pending; lag (s)",
             f"{fmt(live['rw_samples_per_s'], 0)}; {live['rw_failed']:.0f}; {live['rw_pending']:.0f}; {fmt(live['rw_lag_s'], 1)}"),
            ("VictoriaMetrics rows inserted/s (`vm_rows_inserted_total`)", fmt(live["vm_rows_per_s"], 0)),
            ("VictoriaMetrics series (`/api/v1/series/count`)", f"{live['vm_series']:,}"),
            ("VictoriaMetrics RSS, GiB (end; peak)", f"{fmt(live['vm_rss_gib'])}; {fmt(live['peak_rss_gib']['victoria-metrics'])}"),
            ("vmalert rules loaded; evaluation errors (recording / alerting)",
             f"{live['vmalert_rules']}; {live['vmalert_recording_errors']:.0f} / {live['vmalert_alerting_errors']:.0f}"),
            ("vmalert mean group evaluation (s)", ", ".join(f"{g} {fmt(x, 2)}" for g, x in sorted(live["vmalert_group_s"].items()))),
            ("vmalert peak RSS, GiB", fmt(live["peak_rss_gib"]["vmalert"])),
            ("multi-target exporter peak RSS, GiB", fmt(live["peak_rss_gib"]["exporter"])),
            ("sum of the four peak RSS, GiB", fmt(sum(live["peak_rss_gib"].values()))),
            ("wall time of this part (s)", fmt(live.get("part_s"), 0)),
            ("CPU cores used (Prometheus, VM, vmalert, exporter)", ", ".join(fmt(live["cpu_cores"][k]) for k in
                                                                          ("prometheus", "victoria-metrics", "vmalert", "exporter"))),
        ]
        L += [f"| {a} | {b} |" for a, b in rows]
        L.append("")
        if live["vmalert_rule_error_count"]:
            L.append(f"vmalert rule errors ({live['vmalert_rule_error_count']}): " +
                     "; ".join(f"`{e}`" for e in live["vmalert_rule_errors"]))
        else:
            L.append(f"vmalert: every rule of every group evaluated without an error ({live['vmalert_rules']} rules).")
        slow = {g: x for g, x in pr.items() if x > RULE_INTERVAL_S}
        if slow or live["prom_rule_missed"]:
            L.append(f"Prometheus rule groups slower than their {RULE_INTERVAL_S:g} s interval on this machine: " +
                     (", ".join(f"{g} {fmt(x, 1)} s" for g, x in sorted(slow.items())) or "none at the end") +
                     f"; {live['prom_rule_missed']:.0f} iteration(s) missed. The two cores are shared by Prometheus, "
                     "VictoriaMetrics, vmalert and the exporter. gpuobs-links and gpuobs-recording-links read every "
                     "per-link NVLink series (72 per GPU here); they are groups of their own so that the others, "
                     "which Prometheus evaluates concurrently, keep their interval. A production Prometheus for "
                     "10,000 GPUs would have more cores.")
        L.append(f"vmalert 1.79 refuses `keep_firing_for` (an unknown field to it), so it loads a copy of the rule "
                 f"file without that key ({live['vmalert_dropped_keep_firing_for']} alerts carry it); everything "
                 "else is the committed file. Prometheus loads the committed file as is.")
    L.append("")
    h = result.get("history", {})
    L.append("### Six hours of history: fleet dashboards with and without the recording rules")
    L.append("")
    if "error" in h:
        L.append(f"**Failed** with {h['nodes']} nodes: `{h['error']}`")
        return "\n".join(L) + "\n"
    L.append(f"Method: {h['nodes']:,} nodes ({h['gpus']:,} GPUs), every series the fleet dashboards "
             f"({', '.join(FLEET_DASHBOARDS)}) and the recording rules read ({h['series_per_node']:,} of the "
             f"template's {h['template_series']:,} series per node, {h['series']:,} in all, plus `up` and "
             f"`scrape_duration_seconds`), one sample every {h['scrape_s']} s for {HISTORY_HOURS} h: "
             f"{h['samples']:,} samples, {fmt(h['text_gib'])} GiB of OpenMetrics text written in {fmt(h['generate_s'], 0)} s, "
             f"turned into blocks by `promtool tsdb create-blocks-from openmetrics` ({fmt(h['backfill_s'], 0)} s "
             f"including the writing). The recording rules were backfilled over the same range with `promtool tsdb "
             f"create-blocks-from rules` at a {h['scrape_s']} s evaluation interval ({fmt(h['rules_backfill_s'], 0)} s; "
             "rules that read other rules were expanded to raw series for that, since promtool cannot read what it "
             "is writing) and Prometheus restarted on both. Each dashboard query then ran over the 6 h as Grafana "
             f"sends it with every variable at All (`.*`): `query_range` with a {h['step_s']} s step "
             f"(Grafana's own for a 6 h panel would be coarser), `$__rate_interval` = {4 * h['scrape_s']} s, "
             "table panels as instant queries (`$__range` = 6h). \"Without\" is the same query with each recorded "
             "name replaced by its expression. One warm-up pass, then the median of "
             f"{h['runs']} timed passes, wall time at the client.")
    L.append("")
    L.append("| dashboard | queries (reading rules) | total with (s) | total without (s) | max with (s) | max without (s) | without / with (all) | without / with (rule queries) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for d, x in h["dashboards"].items():
        ratio = x["total_without"] / x["total_with"] if x["total_with"] else float("nan")
        rr = x["rule_total_without"] / x["rule_total_with"] if x["rule_total_with"] else float("nan")
        L.append(f"| {d} | {x['queries']} ({x['rule_queries']}) | {fmt(x['total_with'], 3)} | {fmt(x['total_without'], 3)} "
                 f"| {fmt(x['max_with'], 3)} | {fmt(x['max_without'], 3)} | {fmt(ratio, 1)}× | {fmt(rr, 1)}× |")
    L.append("")
    L.append(f"Prometheus RSS after the queries: {fmt(h['prom_rss_gib'])} GiB; wall time of this part: "
             f"{fmt(h.get('part_s'), 0)} s, of which {fmt(h['compaction_wait_s'], 0)} s waiting for Prometheus to merge "
             f"the {h['blocks_before_compaction']:.0f} backfilled blocks into {h['blocks']:.0f} (its first compaction "
             "runs a minute after start; the queries are timed on the merged blocks).")
    L.append("")
    L.append("Targets, per fleet dashboard:")
    L.append("")
    for d, x in h["dashboards"].items():
        ok1 = x["max_with"] <= 1.0
        ratio = x["total_without"] / x["total_with"] if x["total_with"] else float("nan")
        rr = x["rule_total_without"] / x["rule_total_with"] if x["rule_total_with"] else float("nan")
        L.append(f"- {d}: ≤ 1 s per query with the rules (the slowest query, not the total): "
                 + (f"**met** (slowest {fmt(x['max_with'], 3)} s, {x['slowest_with']})" if ok1 else
                    f"**missed** by {fmt(x['max_with'] - 1.0, 3)} s (slowest {fmt(x['max_with'], 3)} s, {x['slowest_with']})")
                 + "; ≥ 10× faster with than without over the whole dashboard: "
                 + (f"**met** ({fmt(ratio, 1)}×)" if ratio >= 10 else f"**missed** ({fmt(ratio, 1)}×, {fmt(10 / ratio, 1)}× short)")
                 + f"; over the {x['rule_queries']} queries that read recording rules {fmt(rr, 1)}× "
                 + ("(met)" if rr >= 10 else "(missed)")
                 + (f", the slowest of them {fmt(max(r['t_with'] for r in x['rows'] if r['uses_rules']), 3)} s with the rules."
                    if x["rule_queries"] else "."))
    L.append("")
    L.append("A query that reads no recording rule is the same text with and without, so any difference between its two "
             "times is noise (other work on the machine, the page cache).")
    L.append("")
    for d, x in h["dashboards"].items():
        rows = sorted(x["rows"], key=lambda r: -r["t_with"])
        raw_with = sum(r["t_with"] for r in x["rows"] if not r["uses_rules"])
        nvlink = any("NVLink" in r["panel"] for r in rows[:3] if not r["uses_rules"])
        L.append(f"Why, {d}: {x['queries'] - x['rule_queries']} of its {x['queries']} queries read no recording rule"
                 + (" (raw per-GPU and per-link series, NVLink above all: 18 links and 3 error types per GPU)" if nvlink else "")
                 + ", "
                 f"so they cost the same with and without; they take {fmt(raw_with, 3)} s of the {fmt(x['total_with'], 3)} s "
                 f"({fmt(100 * raw_with / x['total_with'], 0) if x['total_with'] else 'n/a'} %) with the rules. Slowest with the rules:")
        L.append("")
        L.append("| panel | reads a rule | kind | with (s) | without (s) |")
        L.append("|---|---|---|---:|---:|")
        for r in rows[:6]:
            L.append(f"| {r['panel']} | {'yes' if r['uses_rules'] else 'no'} | {'instant' if r['instant'] else 'range'} "
                     f"| {fmt(r['t_with'], 3)} | {fmt(r['t_without'], 3)} |")
        L.append("")
    scale = 1250 / h["nodes"]
    if scale > 1:
        L.append(f"Scale: the history holds {h['nodes']:,} of the 1,250 nodes. Writing it took {fmt(h['text_gib'] / h['nodes'] * 1024, 0)} MiB "
                 f"of text per node and about {fmt(h['backfill_s'] / h['nodes'], 2)} s per node on this machine, so 1,250 nodes would need "
                 f"about {fmt(h['text_gib'] * scale, 0)} GiB and {fmt(h['backfill_s'] * scale / 60, 0)} minutes (projected from this run, "
                 "not measured): beyond this benchmark's time and disk. The recording-rule series do not grow with the "
                 "number of nodes except `cluster_node:*` (one per node) and `uuid:gpuobs_gpu_allocated:bool` (one per GPU); "
                 f"queries over raw per-GPU series grow about linearly with it, so at 1,250 nodes expect the \"without\" "
                 f"times and the rule-less panels to be roughly {fmt(scale, 0)}× the times above (an estimate, not a measurement).")
        L.append("")
    if h.get("compactions_during_queries"):
        L.append(f"Note: Prometheus compacted {h['compactions_during_queries']:.0f} time(s) while the queries ran.")
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="125 live nodes and a smaller history (2 to 3 minutes)")
    ap.add_argument("--nodes", type=int, help="live-ingest nodes (default 1250, quick 125)")
    ap.add_argument("--history-nodes", type=int, help="nodes in the 6 h history (default 125, quick 20)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--serve", type=Path, help=argparse.SUPPRESS)   # internal: the multi-target exporter
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.port, a.nodes)
        return
    with tempfile.TemporaryDirectory(prefix="gpuobs-fleet-") as tmp:
        res = fleet_bench(a.quick, Path(tmp), a.nodes, a.history_nodes)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    print(fleet_report(res))


if __name__ == "__main__":
    main()
