"""`gpuobs demo`: the whole stack on loopback, without Docker, and a scripted incident.

A simulated node (4 H100s), the exporter, the example trainer on two ranks, Prometheus with the
fast alert profile, Alertmanager, and a webhook receiver that prints notifications as on-call
sees them. The incident: GPU 0 throttles for HW thermal reasons, GPU 2 is held but idle, GPU 1
reports XID 79 and falls off the bus; then every fault is cleared and the alerts resolve.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from .alerts.build import alertmanager_config, write_fast_rules
from .ports import free_port, free_port_run
from .sim import Simulator
from .sim.state import set_val

REPO = Path(__file__).resolve().parents[1]
GIB = 1024 ** 3
NODE = {"gpus": [{"profile": "h100-sxm-80gb", "count": 4}]}
EXPECTED = ("GpuHwThermalSlowdown", "GpuAllocatedIdle", "GpuXidRebootRequired", "GpuLost")


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


class Demo:
    """Starts everything, plays the incident, and stops everything it started."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.sim: Simulator | None = None
        self.on_call: OnCall | None = None

    def _spawn(self, name: str, cmd: list[str], **kw) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    @staticmethod
    def _need(binary: str) -> str:
        path = shutil.which(binary)
        if path is None:
            raise DemoError(f"{binary} is not installed: apt-get install prometheus prometheus-alertmanager")
        return path

    def start(self) -> dict[str, str]:
        prometheus, alertmanager = self._need("prometheus"), self._need("prometheus-alertmanager")
        ports = {name: free_port() for name in ("exporter", "prometheus", "alertmanager")}
        train_base = free_port_run(2)  # the two ranks serve on base + local rank
        self.on_call = OnCall()
        self.sim = Simulator(NODE, directory=self.workdir / "node")
        for i in range(4):  # a busy node: every GPU computing and holding memory
            set_val(self.sim.state.gpu(i).util_gpu, 90)
            set_val(self.sim.state.gpu(i).mem_used, 40 * GIB)
        py = sys.executable
        self._spawn("exporter", [py, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                                 "--port", str(ports["exporter"]), "--interval", "1"], env=self.sim.env())
        for rank in (0, 1):
            env = {"PATH": "/usr/bin:/bin", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "GPUOBS_JOB_ID": "demo-job", "GPUOBS_PROMETHEUS_PORT": str(train_base)}
            self._spawn(f"trainer{rank}", [py, str(REPO / "examples" / "train.py"), "--steps", "1000000",
                                           "--compute-ms", str(20 + 25 * rank)], env=env)
        am_config = self.workdir / "alertmanager.yml"
        urls = {name: f"{self.on_call.url}/{name}" for name in ("pager", "ticket", "watchdog")}
        am_config.write_text(yaml.safe_dump(alertmanager_config(urls, fast=True)))
        self._spawn("alertmanager", [alertmanager, f"--config.file={am_config}",
                                     f"--storage.path={self.workdir / 'am'}",
                                     f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
                                     "--cluster.listen-address="])
        targets = [f"127.0.0.1:{ports['exporter']}", f"127.0.0.1:{train_base}", f"127.0.0.1:{train_base + 1}"]
        prom_config = self.workdir / "prometheus.yml"
        prom_config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": {"cluster": "demo"}},
            "rule_files": [str(write_fast_rules(self.workdir))],  # built here: not committed
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
            "scrape_configs": [{"job_name": "gpuobs", "static_configs": [
                {"targets": targets[:1], "labels": {"node": "demo-node"}}]},
                {"job_name": "training", "static_configs": [{"targets": targets[1:], "labels": {"node": "demo-node"}}]}],
        }))
        self._spawn("prometheus", [prometheus, f"--config.file={prom_config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                                   "--rules.alert.resend-delay=1s"])
        return {"Prometheus": f"http://127.0.0.1:{ports['prometheus']}/alerts",
                "Alertmanager": f"http://127.0.0.1:{ports['alertmanager']}",
                "exporter": f"http://127.0.0.1:{ports['exporter']}/metrics",
                "trainer (rank 0)": f"http://127.0.0.1:{train_base}/metrics",
                "logs": f"{self.workdir} (removed on a clean exit; --keep-logs keeps it)"}

    def _wait(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise DemoError(f"{proc.args[0]} exited early (code {proc.returncode}); see {self.workdir}")
            if predicate():
                return True
            time.sleep(0.5)
        return False

    def incident(self) -> bool:
        """Play the incident; True when every expected alert fired and then resolved."""
        assert self.sim and self.on_call
        st, on_call = self.sim.state, self.on_call
        if not self._wait(lambda: "Watchdog" in on_call.status, 60):
            raise DemoError(f"no Watchdog notification: the alert pipeline is not up (see {self.workdir})")
        _say("pipeline up (Watchdog received); letting the exporter learn the node for a few seconds")
        _say("rank 1 of the trainer computes 45 ms per step against rank 0's 20 ms, on purpose: "
             "TrainingStragglerRank arrives as a ticket and stays while the demo runs")
        time.sleep(5)
        _say("INCIDENT: GPU 0 overheats (HW thermal slowdown), GPU 2 sits idle while allocated, "
             "GPU 1 reports XID 79 and falls off the bus")
        set_val(st.gpu(0).clock_events, 0x40)
        set_val(st.gpu(0).temp_gpu, 86)
        set_val(st.gpu(2).util_gpu, 0)
        st.xid(1, 79)
        time.sleep(3)  # the XID is counted before the GPU disappears
        st.lose_gpu(1)
        fired = self._wait(lambda: all(on_call.status.get(n) == "firing" for n in EXPECTED), 90)
        _say("all expected alerts fired" if fired else "not every expected alert fired in 90 s")
        _say("FIX: GPU 0 cooled, GPU 1 back after a reset, GPU 2 busy again")
        set_val(st.gpu(0).clock_events, 0)
        set_val(st.gpu(0).temp_gpu, 60)
        st.lose_gpu(1, False)
        set_val(st.gpu(2).util_gpu, 80)
        resolved = self._wait(lambda: all(on_call.status.get(n) == "resolved" for n in EXPECTED), 90)
        _say("all incident alerts resolved (TrainingStragglerRank stays: rank 1 is slow on purpose)" if resolved
             else "not every incident alert resolved in 90 s")
        return fired and resolved

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.on_call:
            self.on_call.server.shutdown()
        if self.sim:
            self.sim.close()


def run(duration: float | None = None, keep_logs: bool = False) -> int:
    """Run the demo. duration: exit once the incident is over and this many seconds have passed,
    instead of waiting for Ctrl-C. Returns 0 when the incident's alerts fired and resolved, 1 when
    some did not, 2 when a component is missing or failed, 130 when Ctrl-C ends it before the
    incident is over (the logs are kept unless that exit was clean)."""
    workdir = Path(tempfile.mkdtemp(prefix="gpuobs-demo-"))
    demo = Demo(workdir)
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: interrupted.set())
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
            interrupted.wait()
        else:
            interrupted.wait(max(0.0, duration - (time.monotonic() - started)))
    except KeyboardInterrupt:
        if ok is None:  # before the incident was over: not a run that showed anything
            code = 130
    except DemoError as e:
        _say(f"error: {e}")
        code = 2
    finally:
        signal.signal(signal.SIGTERM, previous)
        demo.stop()
        if not keep_logs and code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        _say("stopped")
    return code
