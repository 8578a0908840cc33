"""`gpuobs demo`: the whole stack on loopback, without Docker, and a scripted incident.

A simulated node (4 H100s), the exporter, the example trainer on two ranks (rank 0 on GPU 3, rank 1
on GPU 0, each told its GPU's UUID; traces to an OTLP receiver here), Prometheus with the fast alert
profile and exemplar storage, Alertmanager, and a webhook receiver that prints notifications as
on-call sees them. The incident: GPU 0 throttles for HW thermal reasons and rank 1, which runs on
it, computes 1.4x as long per step (one straggler ticket, naming GPU 0 and cause thermal), GPU 2 is
held but idle, GPU 1 reports XID 79 and falls off the bus, rank 1 logs an NCCL watchdog timeout,
and GPU 3's corrected ECC errors climb; then `gpuobs explain demo-job` prints the diagnosis while
the straggler fires, the slowest step is followed from its exemplar to its trace, every fault is
cleared (rank 1 computes at full speed again) and the alerts resolve, the straggler's included.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from . import catalog as c
from .alerts.build import RECEIVERS, alertmanager_config, write_fast_rules
from .ports import free_port, free_port_run
from .sim import Simulator
from .sim.state import set_counter, set_val

REPO = Path(__file__).resolve().parents[1]
GIB = 1024 ** 3
NODE = {"gpus": [{"profile": "h100-sxm-80gb", "count": 4}]}
EXPECTED = ("GpuHwThermalSlowdown", "GpuAllocatedIdle", "GpuXidRebootRequired", "GpuLost",
            "TrainingCollectiveTimeout", "GpuEccCorrectedRising", "TrainingStragglerRank")
STEADY = ("Watchdog",)  # the alert that stays while the demo runs: the dead man's switch
JOB_ID = "demo-job"  # the trainer's job id (GPUOBS_JOB_ID), which `gpuobs explain` takes
# The host name the ranks see (NODE_NAME) and the `node` label Prometheus puts on every target: the
# slowdown records join a rank to its node's GPUs through it (and to its own GPU by UUID)
NODE_NAME = "demo-node"
RANK_GPUS = (3, 0)  # the simulated GPU slot each rank drives (GPUOBS_GPU_UUID): rank 1 on GPU 0, which overheats
COMPUTE_MS = 20  # each rank's compute per step, unthrottled
# Rank 1's compute per step while its GPU throttles, x its own: over the straggler threshold (1.2x the
# other rank), while the job's median step (the mean of 2 ranks' medians, data waits included) stays
# under the step-time regression's 1.2x, so the straggler is the one training notification
THROTTLED = 1.4
EXPLAIN_WINDOW = "1m"  # what `gpuobs explain` reads: the incident's last minute, the straggler firing
JAEGER = "http://localhost:16686"  # docker-compose.yml's Jaeger: where the printed trace link points
STEP_BUCKETS = c.STEP_DURATION.prometheus_samples[0]  # the step-duration histogram's _bucket series
ECC_CLIMB_PER_S = 2.0  # GPU 3's corrected ECC errors a second during the incident (none before)


class DemoError(RuntimeError):
    """A component is missing or did not start; the message says what to do."""


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)


class OnCall:
    """The webhook receiver Alertmanager notifies: records every notification as (receiver, alertname,
    status, labels, monotonic time) and, with echo, prints it as on-call would see it."""

    def __init__(self, echo: bool = True):
        self.echo = echo
        self.events: list[tuple[str, str, str, dict, float]] = []
        self.lock = threading.Lock()
        on_call = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                for alert in body.get("alerts", []):
                    on_call.notify(self.path.strip("/"), alert)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notify(self, receiver: str, alert: dict) -> None:
        """Record one alert of an Alertmanager webhook body (receiver: the webhook path, alert: its
        `alerts[]` entry with labels, status and annotations) and, when echoing, print it on one line."""
        labels, status = alert.get("labels", {}), alert.get("status", "?")
        name = labels.get("alertname", "?")
        with self.lock:
            self.events.append((receiver, name, status, labels, time.monotonic()))
        if not self.echo or name == "Watchdog":
            return
        where = labels.get("node", "")
        if labels.get("gpu"):
            where += f" GPU {labels['gpu']} ({labels.get('uuid', '')})"
        if labels.get("job_id"):
            where += f" job {labels['job_id']} rank {labels.get('rank', '')}"
        if labels.get("cause"):  # the slowdown alerts' most likely cause, and the GPU it was found on
            where += f" cause {labels['cause']}" + (f" on {labels['cause_gpu']}" if labels.get("cause_gpu") else "")
        summary = alert.get("annotations", {}).get("summary", "")
        _say(f"[{receiver:>8}] {status.upper():8} {labels.get('severity', ''):8} {name:22} {where}  {summary}")

    @property
    def status(self) -> dict[str, str]:
        """Latest status per alert name: 'firing' or 'resolved'."""
        return {name: status for _, name, status, _, _ in self.notifications()}

    def notifications(self) -> list[tuple[str, str, str, dict, float]]:
        """Every notification so far, oldest first."""
        with self.lock:
            return list(self.events)

    def firing(self) -> dict[tuple[str, str], str]:
        """Latest status per (alertname, GPU UUID or '')."""
        return {(name, labels.get("uuid", "")): status for _, name, status, labels, _ in self.notifications()}

    def first(self, name: str, status: str = "firing") -> float | None:
        """Monotonic time of the first notification of that alert in that status."""
        return next((t for _, n, s, _, t in self.notifications() if n == name and s == status), None)


class OTLPReceiver:
    """An OTLP/HTTP receiver on loopback, standing in for a tracing backend: POST /v1/traces and
    /v1/metrics with protobuf bodies (gzip or not), decoded with opentelemetry-proto into .traces
    and .metrics (and passed to on_metrics); other paths answer 404.

    keep: the most requests of each kind kept (oldest dropped), None for all; the demo runs for
    hours and keeps the last few thousand, tests keep everything. on_traces: called with each
    trace request too (`gpuobs traces` prints them). host, port: where it listens (port 0: any free
    one; .url says which)."""

    def __init__(self, on_metrics=None, keep: int | None = None, on_traces=None, host: str = "127.0.0.1",
                 port: int = 0):
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.traces: collections.deque = collections.deque(maxlen=keep)
        self.metrics: collections.deque = collections.deque(maxlen=keep)
        self.paths: collections.deque = collections.deque(maxlen=keep)
        # path -> (request message, response message, where requests are kept)
        kinds: dict[str, tuple[Any, Any, collections.deque]] = {
            "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest,
                           trace_service_pb2.ExportTraceServiceResponse, self.traces),
            "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest,
                            metrics_service_pb2.ExportMetricsServiceResponse, self.metrics)}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.paths.append(self.path)
                if self.path not in kinds:
                    self.send_response(404)
                    self.end_headers()
                    return
                request_type, response_type, sink = kinds[self.path]
                message = request_type()
                message.ParseFromString(body)
                sink.append(message)
                if on_metrics is not None and sink is receiver.metrics:
                    on_metrics(message)
                if on_traces is not None and sink is receiver.traces:
                    on_traces(message)
                reply = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self, trace_id: str) -> list:
        """The received spans (opentelemetry.proto Span messages) of one trace (32 hex digits)."""
        wanted = bytes.fromhex(trace_id)
        return [span for request in list(self.traces) for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans if span.trace_id == wanted]

    def close(self) -> None:
        """Stop serving and release the port; what was received stays readable."""
        self.server.shutdown()
        self.server.server_close()


def span_lines(request) -> list[str]:
    """One line per span of an OTLP ExportTraceServiceRequest, as `gpuobs traces` prints them:
    service name, trace id (32 hex digits), span name indented under a parent, duration in ms,
    status and attributes (key=value). Values come from the request as received."""
    out = []
    for rs in request.resource_spans:
        service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "?")
        for ss in rs.scope_spans:
            for span in ss.spans:
                name = f"  {span.name}" if span.parent_span_id else span.name
                ms = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
                attrs = " ".join(f"{a.key}={_any_value(a.value)}" for a in span.attributes)
                status = " ERROR" if span.status.code == 2 else ""
                out.append(f"{service:12} {span.trace_id.hex()} {name:28} {ms:9.2f} ms{status}  {attrs}".rstrip())
    return out


def _any_value(value) -> str:
    """An OTLP AnyValue as text (its set field; lists and maps as protobuf prints them)."""
    field = value.WhichOneof("value")
    return "" if field is None else str(getattr(value, field)).replace("\n", " ")


def serve_traces(host: str = "127.0.0.1", port: int = 4318, out=None) -> OTLPReceiver:
    """`gpuobs traces`: an OTLP/HTTP receiver on host:port (loopback and 4318, OTLP/HTTP's port, by
    default) that prints each span it receives to out (default stdout) as span_lines() formats it,
    and accepts metrics without printing them. Returns the running receiver (close() stops it);
    raises OSError when the port is taken."""
    out = out or sys.stdout
    lock = threading.Lock()

    def show(request) -> None:
        lines = span_lines(request)
        with lock:
            out.write("".join(f"{line}\n" for line in lines))
            out.flush()
    return OTLPReceiver(keep=0, on_traces=show, host=host, port=port)


def slowest_exemplar(prometheus: str, query: str, window_s: float, end: float | None = None) -> dict | None:
    """The exemplar with the largest value among those Prometheus stored for `query` over the
    window_s seconds before `end` (Unix s; None: now), through its exemplar API (GET
    /api/v1/query_exemplars): a dict with value (float, the observation), labels (its series') and
    trace_id/span_id (hex); None when there is none. Raises OSError or ValueError when Prometheus
    does not answer or answers garbage."""
    now = time.time() if end is None else end
    params = urllib.parse.urlencode({"query": query, "start": now - window_s, "end": now})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_exemplars?{params}", timeout=5) as r:
        data = json.load(r)["data"]
    found = [{"value": float(e["value"]), "labels": series["seriesLabels"], **e["labels"]}
             for series in data for e in series["exemplars"] if "trace_id" in e["labels"]]
    return max(found, key=lambda e: e["value"], default=None)


MARKER_VAR = "GPUOBS_DEMO_RUN"  # in every child's environment: a unique token per run (tests find strays by it)
PR_SET_PDEATHSIG = 1  # prctl(2)
# The guard: the first child, leader of the process group every other child joins. It ignores the
# stop signals and blocks reading a pipe whose only writer is the demo; end of file means the demo
# is gone (killed hard, even with SIGKILL) or done stopping, and it then kills the whole group,
# grandchildren included (a trainer behind a shell or a torchrun-like launcher), and itself.
GUARD = ("import os, signal\n"
         "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\n"
         "while os.read(0, 1): pass\n"
         "os.killpg(0, signal.SIGKILL)\n")


def _child_setup(pgid: int, pdeathsig: bool):
    """A preexec_fn putting the child in process group pgid (0: a new one it leads) and, with
    pdeathsig on Linux, asking the kernel to SIGKILL it when the demo dies (prctl PR_SET_PDEATHSIG;
    skipped elsewhere or without libc). Done here rather than with Popen(process_group=), which
    needs Python 3.11. libc is loaded here, in the parent: the child runs only the calls. The signal
    follows the *thread* that forked, so children are started from the main thread only. A demo that
    died before the call leaves the child orphaned already: it then exits at once."""
    prctl = None
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None
    parent = os.getpid()

    def preexec() -> None:
        os.setpgid(0, pgid)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
    return preexec


class Children:
    """The processes the demo starts, in one process group it owns (the guard's, see GUARD), each but the guard
    with the parent-death signal, stdin from /dev/null and MARKER_VAR=token in its environment.
    stop() ends them all: SIGTERM to the group, a wait, SIGKILL to what is left, then the guard
    sweeps the group once more."""

    def __init__(self, token: str):
        self.token = token
        self.procs: list[subprocess.Popen] = []
        read_end, guard_pipe = os.pipe()
        self._guard_pipe: int | None = guard_pipe  # None once stopped
        os.set_inheritable(guard_pipe, False)
        # no parent-death signal for the guard: it must outlive the demo to sweep the group
        self.guard = subprocess.Popen([sys.executable, "-c", GUARD], stdin=read_end,
                                      env={**os.environ, MARKER_VAR: token},
                                      preexec_fn=_child_setup(0, pdeathsig=False))
        os.close(read_end)
        self.pgid = self.guard.pid
        self._preexec = _child_setup(self.pgid, pdeathsig=True)

    def spawn(self, cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
        """Start cmd in the group, its output to log_path; env None inherits the demo's environment."""
        assert threading.current_thread() is threading.main_thread(), "PR_SET_PDEATHSIG follows the forking thread"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=self._preexec,
                                    env={**(os.environ if env is None else env), MARKER_VAR: self.token})
        self.procs.append(proc)
        return proc

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate every process of the group, wait up to grace_s for the ones started, kill what
        is left, and let the guard sweep the group (grandchildren that ignored SIGTERM). Idempotent."""
        if self._guard_pipe is None:
            return
        try:
            os.killpg(self.pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        os.close(self._guard_pipe)  # end of file: the guard kills the group and itself
        self._guard_pipe = None
        try:
            self.guard.wait(5)
        except subprocess.TimeoutExpired:
            self.guard.kill()
            self.guard.wait()


def _get_json(url: str) -> dict | list | None:
    """The JSON answer of a GET, None when the server does not answer or answers an error."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def _answers(url: str) -> bool:
    """Whether a GET of url answers 2xx (the exporter's /readyz: a sampling pass completed)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (OSError, ValueError):
        return False


def _all_up(prometheus: str, n: int) -> bool:
    """Whether Prometheus's /api/v1/targets lists n active targets, each scraped up."""
    found = _get_json(f"{prometheus}/api/v1/targets?state=active")
    active = (found if isinstance(found, dict) else {}).get("data", {}).get("activeTargets", [])
    return len(active) == n and all(t.get("health") == "up" for t in active)


def _rule_groups(prometheus: str) -> int:
    """How many rule groups Prometheus has loaded (/api/v1/rules); 0 when it does not answer."""
    found = _get_json(f"{prometheus}/api/v1/rules")
    return len((found if isinstance(found, dict) else {}).get("data", {}).get("groups", []))


def active_alerts(alertmanager: str) -> set[str] | None:
    """The names of the alerts Alertmanager holds as not resolved, whether active, inhibited,
    silenced or not yet processed (GET /api/v2/alerts: it leaves resolved alerts out); None when it
    does not answer."""
    params = urllib.parse.urlencode({"active": "true", "inhibited": "true", "silenced": "true",
                                     "unprocessed": "true"})
    found = _get_json(f"{alertmanager}/api/v2/alerts?{params}")
    if not isinstance(found, list):
        return None
    return {a.get("labels", {}).get("alertname", "?") for a in found}


class Demo:
    """Starts everything, plays the incident, and stops everything it started."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.children: Children | None = None  # started with start()
        self.procs: list[subprocess.Popen] = []
        self.sim: Simulator | None = None
        self.on_call: OnCall | None = None
        self.tracing: OTLPReceiver | None = None
        self.prometheus = ""  # its base URL, once started
        self.alertmanager = ""  # its base URL, once started

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        if self.children is None:
            # the caller's token when it set one (tests find a run's processes by it), else a new one
            self.children = Children(os.environ.get(MARKER_VAR) or f"{self.workdir.name}-{os.getpid()}")
        proc = self.children.spawn(cmd, self.workdir / f"{name}.log", env)
        self.procs.append(proc)
        return proc

    @staticmethod
    def _need(binary: str) -> str:
        path = shutil.which(binary)
        if path is None:
            raise DemoError(f"{binary} is not installed: apt-get install prometheus prometheus-alertmanager")
        return path

    def start(self) -> dict[str, str]:
        """Start the simulator, exporter, trainers, Alertmanager and Prometheus; return their URLs by
        name. Prometheus evaluates the alert rules only once it has scraped every target up (_arm):
        rules evaluated before the first scrapes see an absent exporter, an exporter before its first
        pass (NVML not up yet) or trainers not serving yet, and the fast profile's `for:` of seconds
        would page for that."""
        prometheus, alertmanager = self._need("prometheus"), self._need("prometheus-alertmanager")
        ports = {name: free_port() for name in ("exporter", "prometheus", "alertmanager")}
        train_base = free_port_run(2)  # the two ranks serve on base + local rank
        self.on_call = OnCall()
        self.tracing = OTLPReceiver(keep=300)  # about the last 10 minutes of spans
        self._start_node(ports["exporter"], train_base)
        am_config = self.workdir / "alertmanager.yml"
        urls = {name: f"{self.on_call.url}/{name}" for name in RECEIVERS}
        am_config.write_text(yaml.safe_dump(alertmanager_config(urls, fast=True)))
        self._spawn("alertmanager", [alertmanager, f"--config.file={am_config}",
                                     f"--storage.path={self.workdir / 'am'}",
                                     f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
                                     "--cluster.listen-address="])
        self.alertmanager = f"http://127.0.0.1:{ports['alertmanager']}"
        targets = [f"127.0.0.1:{ports['exporter']}", f"127.0.0.1:{train_base}", f"127.0.0.1:{train_base + 1}"]
        prom_config = self.workdir / "prometheus.yml"
        self._write_prometheus_config(prom_config, targets, f"127.0.0.1:{ports['alertmanager']}", rules=None)
        prom = self._spawn("prometheus", [prometheus, f"--config.file={prom_config}",
                                          f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                                          "--rules.alert.resend-delay=1s", "--enable-feature=exemplar-storage"])
        self.prometheus = f"http://127.0.0.1:{ports['prometheus']}"
        self._arm(prom, prom_config, targets, f"127.0.0.1:{ports['alertmanager']}")
        return {"Prometheus": f"{self.prometheus}/alerts", "Alertmanager": self.alertmanager,
                "exporter": f"http://127.0.0.1:{ports['exporter']}/metrics",
                "trainer (rank 0)": f"http://127.0.0.1:{train_base}/metrics",
                "logs": f"{self.workdir} (removed on a clean exit; --keep-logs keeps it)"}

    def _start_node(self, exporter_port: int, train_base: int) -> None:
        """The simulated node (every GPU busy), its exporter, and the two trainer ranks."""
        self.sim = Simulator(NODE, directory=self.workdir / "node")
        for i in range(4):  # a busy node: every GPU computing and holding memory
            set_val(self.sim.state.gpu(i).util_gpu, 90)
            set_val(self.sim.state.gpu(i).mem_used, 40 * GIB)
        py = sys.executable
        self._spawn("exporter", [py, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                                 "--port", str(exporter_port), "--interval", "1"], env=self.sim.env())
        assert self.tracing is not None, "start() creates the receiver first"
        for rank in (0, 1):
            # PYTHONPATH: the trainer imports the gpuobs the demo runs from
            env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": "2", "GPUOBS_JOB_ID": JOB_ID, "GPUOBS_PROMETHEUS_PORT": str(train_base),
                   "NODE_NAME": NODE_NAME, "GPUOBS_GPU_UUID": self._uuid(RANK_GPUS[rank]),
                   "OTEL_EXPORTER_OTLP_ENDPOINT": self.tracing.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
            self._fault_file(rank).touch()
            self._spawn(f"trainer{rank}", [py, str(REPO / "examples" / "train.py"), "--steps", "1000000",
                                           "--compute-ms", str(COMPUTE_MS), "--throttled", str(THROTTLED),
                                           "--fault-file", str(self._fault_file(rank))], env=env)

    def _uuid(self, slot: int) -> str:
        """The NVML UUID of the simulated GPU in slot (what the exporter's `uuid` label holds)."""
        assert self.sim is not None, "start() creates the simulator first"
        return self.sim.state.gpu(slot).uuid.s.decode()

    def _write_prometheus_config(self, path: Path, targets: list[str], alertmanager: str, rules: Path | None) -> None:
        """Prometheus's configuration: 1 s scrapes of the exporter (job gpuobs) and the trainers (job
        training), Alertmanager, and the rule file when given (None: no rules yet)."""
        path.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": {"cluster": "demo"}},
            "rule_files": [str(rules)] if rules else [],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": some, "labels": {"node": NODE_NAME}}]}
                               for job, some in (("gpuobs", targets[:1]), ("training", targets[1:]))],
        }))

    def _arm(self, prom: subprocess.Popen, config: Path, targets: list[str], alertmanager: str) -> None:
        """Wait until Prometheus has scraped every target up and the exporter has completed a sampling
        pass (its /readyz), then load the fast rules (built here, not committed) by SIGHUP, Prometheus's
        reload, and wait until they are loaded. Raises DemoError when that takes over 90 s."""
        exporter = f"http://{targets[0]}/readyz"
        if not self._wait(lambda: _answers(exporter) and _all_up(self.prometheus, len(targets)), 90):
            raise DemoError(f"the exporter or the trainers did not come up in 90 s (see {self.workdir})")
        self._write_prometheus_config(config, targets, alertmanager, rules=write_fast_rules(self.workdir))
        prom.send_signal(signal.SIGHUP)
        if not self._wait(lambda: _rule_groups(self.prometheus) > 0, 30):
            raise DemoError(f"Prometheus did not load the alert rules (see {self.workdir / 'prometheus.log'})")

    def _fault_file(self, rank: int) -> Path:
        """The file a trainer rank reads faults to play from (examples/train.py --fault-file)."""
        return self.workdir / f"faults-rank{rank}"

    def _wait(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    what = proc.args[0] if isinstance(proc.args, list) else proc.args  # the demo passes lists
                    raise DemoError(f"{what!s} exited early (code {proc.returncode}); see {self.workdir}")
            if predicate():
                return True
            time.sleep(0.5)
        return False

    def incident(self) -> bool:
        """Play the incident; True when every expected alert fired and then resolved."""
        assert self.sim and self.on_call
        on_call = self.on_call
        if not self._wait(lambda: "Watchdog" in on_call.status, 60):
            raise DemoError(f"no Watchdog notification: the alert pipeline is not up (see {self.workdir})")
        _say("pipeline up (Watchdog received); letting the exporter learn the node for a few seconds")
        _say(f"job {JOB_ID}: rank 0 runs on GPU {RANK_GPUS[0]} ({self._uuid(RANK_GPUS[0])}), rank 1 on GPU "
             f"{RANK_GPUS[1]} ({self._uuid(RANK_GPUS[1])}), both computing {COMPUTE_MS} ms per step: no straggler")
        time.sleep(5)
        self._break()
        # each in its own time: the timeout at once, the straggler once its compute ratio and cause hold
        # for the rule's `for`, the ECC trend after a minute of quiet baseline
        fired = self._wait(lambda: all(on_call.first(n) is not None for n in EXPECTED), 150)
        _say("all expected alerts fired" if fired else "not every expected alert fired in 150 s")
        self._explain()
        self._follow_slowest_step()
        self._fix()
        resolved = self._wait(self._all_resolved, 150)
        if resolved:
            _say("all incident alerts resolved, as Alertmanager and on-call see it "
                 "(TrainingStragglerRank too: rank 1 is as fast as rank 0 again)")
        else:
            _say(f"not every incident alert resolved in 150 s: Alertmanager still has "
                 f"{sorted(active_alerts(self.alertmanager) or ['(no answer)'])}")
        return fired and resolved

    def _all_resolved(self) -> bool:
        """Whether the incident is over: Alertmanager has none of its alerts left (active_alerts;
        STEADY ones aside), and on-call got a resolved notification for each alert it was paged or
        ticketed for (alert and GPU), including every one of EXPECTED."""
        active = active_alerts(self.alertmanager)
        if active is None or active - set(STEADY):
            return False
        assert self.on_call is not None, "start() creates on-call first"
        latest = self.on_call.firing()
        seen = {name for name, _ in latest}
        return set(EXPECTED) <= seen and all(status == "resolved" for (name, _), status in latest.items()
                                             if name not in STEADY)

    def _break(self) -> None:
        assert self.sim is not None, "start() creates the simulator first"
        st = self.sim.state
        _say(f"INCIDENT: GPU 0 overheats (HW thermal slowdown) and rank 1, which runs on it, computes {THROTTLED:g}x "
             "as long per step; GPU 2 sits idle while allocated, GPU 1 reports XID 79 and falls off the bus, "
             "rank 1 logs an NCCL watchdog timeout, "
             f"GPU 3's corrected ECC errors start climbing ({ECC_CLIMB_PER_S:g}/s; a degradation alert "
             "needs a minute of its own baseline)")
        set_val(st.gpu(0).clock_events, 0x40)
        set_val(st.gpu(0).temp_gpu, 86)
        set_val(st.gpu(2).util_gpu, 0)
        for counter in (0, 1):  # corrected volatile and aggregate: ecc[error type * 2 + counter]
            set_counter(st.gpu(3).ecc[counter], rate=ECC_CLIMB_PER_S)
        with open(self._fault_file(1), "a") as f:  # its GPU's clocks held down: the rank computes slower
            f.write("gpu_throttled\ncollective_timeout\n")
        st.xid(1, 79)
        time.sleep(3)  # the XID is counted before the GPU disappears
        st.lose_gpu(1)

    def _fix(self) -> None:
        assert self.sim is not None, "start() creates the simulator first"
        st = self.sim.state
        _say("FIX: GPU 0 cooled (rank 1 computes at full speed again), GPU 1 back after a reset, GPU 2 busy "
             f"again, GPU 3 drained and replaced (no new ECC errors), {JOB_ID} restarted from its checkpoint "
             "(no new timeouts)")
        # the rank first, then its GPU: the straggler's ratio falls while its cause still reads thermal,
        # so it resolves as it fired instead of changing its cause label on the way out
        with open(self._fault_file(1), "a") as f:
            f.write("gpu_recovered\n")
        set_val(st.gpu(0).clock_events, 0)
        set_val(st.gpu(0).temp_gpu, 60)
        st.lose_gpu(1, False)
        set_val(st.gpu(2).util_gpu, 80)
        for counter in (0, 1):
            set_counter(st.gpu(3).ecc[counter], rate=0.0)

    def _explain(self) -> None:
        """Print what `gpuobs explain JOB_ID` prints now, while the straggler fires: the command on-call
        would run, in a child of the group (Children), as the fast profile's rules read it over
        EXPLAIN_WINDOW. Its failure is said, not raised: the alerts are the demo's outcome."""
        assert self.children is not None, "start() spawns the children first"
        cmd = [sys.executable, "-m", "gpuobs.cli", "explain", JOB_ID, "--prometheus", self.prometheus,
               "--profile", "fast", "--window", EXPLAIN_WINDOW]
        _say(f"EXPLAIN: gpuobs {' '.join(cmd[3:])}")
        log = self.workdir / "explain.log"
        proc = self.children.spawn(cmd, log)  # not in self.procs: it is meant to exit
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for line in log.read_text(errors="replace").splitlines():
            print(f"    {line}", flush=True)
        if proc.returncode != 0:
            _say(f"gpuobs explain exited {proc.returncode} (see {log})")

    def _follow_slowest_step(self) -> None:
        """Print the slowest step of the last minutes as on-call would follow it: the exemplar Prometheus
        stored on the step-duration histogram, the trace it names, and that trace's spans."""
        query = f'{STEP_BUCKETS}{{job_id="{JOB_ID}"}}'
        try:
            slowest = slowest_exemplar(self.prometheus, query, 300)
        except (OSError, ValueError, KeyError) as e:
            _say(f"no exemplar: the Prometheus exemplar API did not answer ({e})")
            return
        if slowest is None:
            _say("no exemplar stored yet for the step-duration histogram")
            return
        trace_id = slowest["trace_id"]
        assert self.tracing is not None, "start() creates the receiver first"
        # the step (the trace's root) first, then its children as they started
        spans = sorted(self.tracing.spans(trace_id), key=lambda span: (bool(span.parent_span_id),
                                                                         span.start_time_unix_nano))
        _say(f"SLOWEST STEP: {slowest['value'] * 1000:.0f} ms on rank {slowest['labels'].get('rank', '?')}; "
             f"its exemplar names trace {trace_id} (in docker compose: {JAEGER}/trace/{trace_id})")
        for span in spans[:8]:
            name = f"  {span.name}" if span.parent_span_id else span.name
            _say(f"    {name:28} {(span.end_time_unix_nano - span.start_time_unix_nano) / 1e6:8.1f} ms")
        if not spans:
            _say("    (its spans have not reached the OTLP receiver yet)")

    def stop(self) -> None:
        """Stop every process started (Children.stop) and the receivers and simulator."""
        if self.children is not None:
            self.children.stop()
        if self.on_call:
            self.on_call.server.shutdown()
        if self.tracing:
            self.tracing.close()
        if self.sim:
            self.sim.close()


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM or SIGHUP (a closed terminal), as Ctrl-C raises
    KeyboardInterrupt: the demo stops everything it started on its way out. BaseException, so no
    `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_stopped(signum: int, _frame) -> None:
    raise Stopped(signum)


def run(duration: float | None = None, keep_logs: bool = False) -> int:
    """Run the demo. duration: exit once the incident is over and this many seconds have passed,
    instead of waiting for Ctrl-C. Returns 0 when the incident's alerts fired and resolved, 1 when
    some did not, 2 when a component is missing or failed, 130 when Ctrl-C (128 + the signal for
    SIGTERM or SIGHUP) ends it before the incident is over (the logs are kept unless that exit was
    clean). Every signal of STOP_SIGNALS stops every process it started; a demo killed hard takes
    them with it (Children)."""
    workdir = Path(tempfile.mkdtemp(prefix="gpuobs-demo-"))
    demo = Demo(workdir)
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    code = 0
    ok: bool | None = None  # the incident's outcome, once it is over
    started = time.monotonic()
    try:
        urls = demo.start()
        _say("gpuobs demo: SIMULATED GPUs (4x H100), exporter, trainer (2 ranks), Prometheus, Alertmanager")
        for name, url in urls.items():
            _say(f"  {name:18} {url}")
        ok = demo.incident()
        code = 0 if ok else 1
        if duration is None:
            _say("the stack keeps running: Ctrl-C stops everything")
        forever = threading.Event()
        forever.wait(None if duration is None else max(0.0, duration - (time.monotonic() - started)))
    except (KeyboardInterrupt, Stopped) as e:
        if ok is None:  # before the incident was over: not a run that showed anything
            code = 128 + getattr(e, "signum", signal.SIGINT)
    except DemoError as e:
        _say(f"error: {e}")
        code = 2
    finally:
        for sig in STOP_SIGNALS:  # a second signal must not cut the stopping short
            previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, signal.SIG_IGN)
        demo.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep_logs and code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        _say("stopped")
    return code
