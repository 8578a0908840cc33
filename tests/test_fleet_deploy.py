"""deploy/fleet/: the distributed deployment (Prometheus shards by node evaluating the local rule
tier and remote-writing to VictoriaMetrics, vmalert evaluating the global tier there, a 3-replica
Alertmanager cluster that every evaluator sends to), checked with the real tools and run on
loopback from the shipped files.

- Config checks: promtool (the shard config), amtool (the Alertmanager config the replicas load),
  vmalert and vmagent dry runs with the shipped flags, every shipped flag known to its binary, and
  the README's command lines equal to the shipped flags.
- Alertmanager HA: three real replicas clustered by --cluster.peer, alerts posted to all three
  again and again as Prometheus does, one replica SIGKILLed mid-run (the one sending, or another):
  every alert reaches the webhook, no notification twice.
- The topology end to end: two Prometheus shards (hashmod on node, modulus 2) over four fake nodes,
  one VictoriaMetrics, vmalert, the Alertmanager cluster; every node on exactly one shard, all in
  VictoriaMetrics, each injected lost GPU notified once although three replicas received it.

Every process runs from its Debian package's binary with the flags of deploy/fleet/default/<name>;
the test changes only what loopback needs (host names to 127.0.0.1 ports, paths to tmp) and the
timings a test cannot wait for, each named where it is set. The fake node targets and the webhook
are test scaffolding, outside the data path.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import shlex
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import REPO, free_port, require_tool, serve_static, stop

FLEET = REPO / "deploy" / "fleet"
SHARD = FLEET / "prometheus-shard.yml"
INSTALLED = "/etc/gpuobs/"  # where deploy/fleet/default/* expect the checkout's alerts/ and deploy/fleet/
LOCAL_TIER, GLOBAL_TIER = REPO / "alerts" / "gpuobs-local.rules.yml", REPO / "alerts" / "gpuobs-global.rules.yml"
BINARIES = {"prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager",
            "victoria-metrics": "victoria-metrics", "vmalert": "vmalert", "vmagent": "vmagent"}
REPLICAS = 3
# Test timings (the shipped ones are Alertmanager's defaults and the generated config's): a replica
# at position P waits P x PEER_TIMEOUT before notifying, so a duplicate would come within
# (REPLICAS - 1) x PEER_TIMEOUT of the first notification; a legitimate second notification of a
# group comes GROUP_INTERVAL or more later.
PEER_TIMEOUT = 2.0  # shipped: 15s
GROUP_WAIT, GROUP_INTERVAL = 1, 8  # generated: 30s and 5m (the fast profile: 1s and 1s)
QUIET = (REPLICAS - 1) * PEER_TIMEOUT + 1.5  # how long to keep watching for a duplicate


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


# --- the shipped flags ------------------------------------------------------------------------

def shipped_args(name: str) -> list[str]:
    """The flags of deploy/fleet/default/<name>: its ARGS="..." line, split as the shell (Debian's
    init scripts) and systemd's $ARGS split it."""
    (line,) = [ln for ln in (FLEET / "default" / name).read_text().splitlines() if ln.startswith("ARGS=")]
    (value,) = shlex.split(line.removeprefix("ARGS="))
    return shlex.split(value)


def flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def values(args: list[str], name: str) -> list[str]:
    """Every value of flag `name` (as written, with its dashes) in args."""
    return [a.split("=", 1)[1] for a in args if flag(a) == name]


def localized(name: str, hosts: dict[str, str], changed: dict[str, str]) -> list[str]:
    """The shipped flags of `name` as this machine runs them: each host:port of `hosts` replaced by
    its loopback address, the flags of `changed` given its value (added when the file lacks them)."""
    out = []
    for arg in shipped_args(name):
        for host, local in hosts.items():
            arg = arg.replace(host, local)
        out.append(f"{flag(arg)}={changed[flag(arg)]}" if flag(arg) in changed else arg)
    out += [f"{k}={v}" for k, v in changed.items() if k not in {flag(a) for a in out}]
    return out


def in_checkout(path: str) -> Path:
    """A path the shipped flags name under /etc/gpuobs/, in this checkout."""
    assert path.startswith(INSTALLED), path
    return REPO / path.removeprefix(INSTALLED)


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' hashmod relabeling: the last 8 bytes of the value's MD5, big-endian, modulo."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


# --- config checks ----------------------------------------------------------------------------

def shard_relabeling(doc: dict) -> tuple[list[dict], dict, dict]:
    """(relabel_configs, the hashmod rule, the keep rule after it) of a shard config's gpuobs job."""
    relabel = doc["scrape_configs"][0]["relabel_configs"]
    mod = next(r for r in relabel if r.get("action") == "hashmod")
    return relabel, mod, relabel[relabel.index(mod) + 1]


def test_fleet_files_cover_each_component():
    """One file per component: the shard config, the flags of each Debian package's service, the
    vmagent alternative; each says what the topology needs."""
    assert {p.name for p in (FLEET / "default").iterdir()} == set(BINARIES)
    shard = yaml.safe_load(SHARD.read_text())
    assert shard["rule_files"] == ["../../alerts/gpuobs-local.rules.yml"]
    assert set(shard["global"]["external_labels"]) == {"cluster"}  # no shard label: README.md says why
    relabel, mod, keep = shard_relabeling(shard)
    assert mod["source_labels"] == ["node"] and mod["modulus"] > 1 and mod["target_label"] == "__tmp_hash"
    assert relabel.index(next(r for r in relabel if r.get("target_label") == "node")) < relabel.index(mod)
    assert keep == {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"}
    (am,) = shard["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": [f"alertmanager-{i}:9093" for i in range(REPLICAS)]}]
    (remote,) = shard["remote_write"]
    assert remote["url"] == "http://victoriametrics:8428/api/v1/write"
    vmagent = yaml.safe_load((FLEET / "vmagent-scrape.yml").read_text())["scrape_configs"][0]
    assert vmagent["relabel_configs"] == relabel[:1]  # the same node label as the shards
    assert (FLEET / vmagent["file_sd_configs"][0]["files"][0]).is_file()
    assert (FLEET / shard["scrape_configs"][0]["file_sd_configs"][0]["files"][0]).is_file()

    prometheus, am_args = shipped_args("prometheus"), shipped_args("prometheus-alertmanager")
    assert in_checkout(values(prometheus, "--config.file")[0]) == SHARD
    assert in_checkout(values(am_args, "--config.file")[0]) == REPO / "alerts" / "alertmanager.yml"
    assert values(am_args, "--cluster.peer") == [f"alertmanager-{i}:9094" for i in range(REPLICAS)]
    vmalert = shipped_args("vmalert")
    assert in_checkout(values(vmalert, "-rule")[0]) == GLOBAL_TIER
    for name in ("-datasource.url", "-remoteWrite.url", "-remoteRead.url"):
        assert values(vmalert, name) == ["http://victoriametrics:8428"], name
    assert values(vmalert, "-notifier.url") == [f"http://alertmanager-{i}:9093" for i in range(REPLICAS)]
    vmagent_args = shipped_args("vmagent")
    assert in_checkout(values(vmagent_args, "-promscrape.config")[0]) == FLEET / "vmagent-scrape.yml"
    for name in ("membersCount", "memberNum", "replicationFactor"):
        assert values(vmagent_args, f"-promscrape.cluster.{name}"), name
    assert "-dedup.minScrapeInterval=15s" in shipped_args("victoria-metrics")
    assert shard["global"]["scrape_interval"] == "15s"  # what -dedup.minScrapeInterval must equal


def test_units_run_the_shipped_flags():
    """Debian's victoria-metrics package has no unit for vmalert or vmagent: ours run the binary with
    $ARGS from /etc/default/<name>, as the package's own victoria-metrics.service does."""
    import configparser

    for name in ("vmalert", "vmagent"):
        unit = configparser.ConfigParser(interpolation=None)
        unit.optionxform = str
        unit.read(FLEET / "systemd" / f"{name}.service")
        assert unit["Service"]["ExecStart"] == f"/usr/bin/{name} $ARGS"
        assert unit["Service"]["EnvironmentFile"] == f"/etc/default/{name}"
        assert unit["Service"]["User"] == "_victoria-metrics"


def test_readme_command_lines_are_the_shipped_flags():
    """README.md shows one command line per component: exactly the binary and its shipped flags."""
    text = re.sub(r"\\\n\s*", "", (FLEET / "README.md").read_text())
    for name, binary in BINARIES.items():
        assert f"{binary} {' '.join(shipped_args(name))}" in text, f"README.md's {binary} line differs from default/{name}"
    assert "docs/scale.md" in text


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_every_shipped_flag_is_known_to_its_binary(name):
    binary = require_tool(BINARIES[name])
    result = run([binary, "--help" if name.startswith("prometheus") else "-help"])
    known = set(re.findall(r"^\s+(--?[A-Za-z0-9_.-]+)", result.stdout + result.stderr, re.M))
    unknown = [a for a in shipped_args(name) if flag(a) not in known]
    assert not unknown, f"{BINARIES[name]} does not know {unknown}"


def test_shard_config_checks_with_promtool(tmp_path):
    """promtool checks the shard config as shipped, with the local tier it loads (rule files and
    relabeling included); every shard K of N, made by the README's edit, checks too."""
    promtool = require_tool("promtool")
    if not LOCAL_TIER.is_file():
        pytest.skip("alerts/gpuobs-local.rules.yml is not generated yet (`gpuobs generate`)")
    result = run([promtool, "check", "config", str(SHARD)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and re.search(r"\d+ rules found", result.stdout)
    doc = yaml.safe_load(SHARD.read_text())
    _, mod, keep = shard_relabeling(doc)
    mod["modulus"], keep["regex"] = 3, "2"  # shard 2 of 3
    doc["rule_files"] = [str(LOCAL_TIER)]
    doc["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(FLEET / "gpuobs-nodes.yml")]
    (tmp_path / "shard-2.yml").write_text(yaml.safe_dump(doc))
    result = run([promtool, "check", "config", str(tmp_path / "shard-2.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_the_replicas_load_checks_with_amtool():
    amtool = require_tool("amtool")
    config = in_checkout(values(shipped_args("prometheus-alertmanager"), "--config.file")[0])
    result = run([amtool, "check-config", str(config)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_vmalert_dry_run_loads_the_global_tier_with_the_shipped_flags(tmp_path):
    """Debian's vmalert 1.79 checks the global tier and the shipped flags (-dryRun parses both),
    and refuses a broken rule, so the check can fail."""
    vmalert = require_tool("vmalert")
    if not GLOBAL_TIER.is_file():
        pytest.skip("alerts/gpuobs-global.rules.yml is not generated yet (`gpuobs generate`)")
    args = [a if flag(a) != "-rule" else f"-rule={GLOBAL_TIER}" for a in shipped_args("vmalert")]
    result = run([vmalert, "-dryRun", "-loggerLevel=ERROR", *args])
    assert result.returncode == 0, "vmalert 1.79 refuses the global tier:\n" + result.stderr[-3000:]
    bad = tmp_path / "bad.rules.yml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(\n")
    assert run([vmalert, "-dryRun", "-loggerLevel=ERROR", f"-rule={bad}"]).returncode != 0


def test_vmagent_dry_run_checks_the_alternative_scraper(tmp_path):
    vmagent = require_tool("vmagent")
    args = [a if flag(a) != "-promscrape.config" else f"-promscrape.config={FLEET / 'vmagent-scrape.yml'}"
            for a in shipped_args("vmagent")]
    result = run([vmagent, "-dryRun", "-loggerLevel=ERROR", *args])
    assert result.returncode == 0, result.stderr[-3000:]
    bad = tmp_path / "bad.yml"
    bad.write_text("scrape_configs:\n- job_name: gpuobs\n  static_config: []\n")  # a typo'd field
    assert run([vmagent, "-dryRun", "-loggerLevel=ERROR", f"-promscrape.config={bad}"]).returncode != 0


# --- processes, the webhook and the Alertmanager cluster --------------------------------------

class Procs:
    """The processes a test starts, each logging to <tmp>/<name>.log; all stopped at the end."""

    def __init__(self, logdir: Path):
        self.logdir, self.running = logdir, {}

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.logdir)
        log.close()
        self.running[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")[-3000:]

    def check(self) -> None:
        """Fail with its log if a process has exited."""
        for name, proc in self.running.items():
            if proc.poll() is not None and proc.returncode != -9:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def stop_all(self, grace: float = 5) -> None:
        """Terminate in the reverse order of starting (a Prometheus flushes its remote-write queue
        to a VictoriaMetrics still there), killing what outlives grace seconds."""
        for proc in reversed(list(self.running.values())):
            if proc.poll() is None:
                stop(proc, grace)


@pytest.fixture
def procs(tmp_path):
    started = Procs(tmp_path)
    yield started
    started.stop_all()


@dataclass
class Notification:
    """One webhook request from Alertmanager: when it arrived, and its JSON body."""
    at: float
    receiver: str
    body: dict

    @property
    def content(self) -> tuple:
        """What makes two notifications the same: receiver, group, status and each alert with its
        status (not the times, which every resend moves)."""
        alerts = frozenset((tuple(sorted(a["labels"].items())), a["status"]) for a in self.body["alerts"])
        return self.receiver, self.body["groupKey"], self.body["status"], alerts

    @property
    def sender_port(self) -> int:
        """The web port of the replica that sent it (its externalURL: http://<host>:<port>)."""
        return urllib.parse.urlsplit(self.body["externalURL"]).port

    def has(self, alertname: str, status: str = "firing", **labels) -> bool:
        return any(a["status"] == status and a["labels"]["alertname"] == alertname
                   and all(a["labels"].get(k) == v for k, v in labels.items()) for a in self.body["alerts"])


class Webhook:
    """The receiving end of every route (test scaffolding): records each notification."""

    def __init__(self):
        self.notifications: list[Notification] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                hook.notifications.append(Notification(time.monotonic(), self.path.strip("/"), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, receiver: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/{receiver}"

    def wait(self, what: str, predicate, timeout: float, procs: Procs) -> float:
        """Wait until a notification satisfies predicate; its arrival time (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [n for n in list(self.notifications) if predicate(n)]
            if found:
                return found[0].at
            procs.check()
            time.sleep(0.1)
        pytest.fail(f"no notification {what} within {timeout} s; got {[n.content[:3] for n in self.notifications]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("5s", "8s", "1h") in seconds."""
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def alertmanager_yml(webhook: Webhook) -> dict:
    """The generated routing (gpuobs.alerts.build.alertmanager_config, fast profile) with every
    receiver on the webhook, at the test's group wait and interval."""
    from gpuobs.alerts.build import RECEIVERS, alertmanager_config

    config = alertmanager_config({name: webhook.url(name) for name in RECEIVERS}, fast=True)
    config["route"].update(group_wait=f"{GROUP_WAIT}s", group_interval=f"{GROUP_INTERVAL}s")
    return config


def resend_after(config: dict) -> dict[str, float]:
    """{receiver: seconds}: the soonest Alertmanager may send a group's same notification again, the
    smaller of its route's group interval and repeat interval (the watchdog's repeats sooner)."""
    root = config["route"]
    return {route["receiver"]: min(seconds(route.get("group_interval", root["group_interval"])),
                                   seconds(route.get("repeat_interval", root["repeat_interval"])))
            for route in [root, *root["routes"]]}


def assert_no_duplicates(notifications: list[Notification], config: dict) -> None:
    """No notification with the same receiver, group, status and alerts as another sooner than
    its route lets Alertmanager send it again (resend_after): a replica's duplicate comes within
    (REPLICAS - 1) x PEER_TIMEOUT."""
    window = resend_after(config)
    last: dict[tuple, float] = {}
    for n in sorted(notifications, key=lambda n: n.at):
        if n.content in last:
            gap = n.at - last[n.content]
            assert gap >= window[n.receiver], f"duplicate after {gap:.1f} s: {n.content}"
        last[n.content] = n.at


@dataclass
class Replica:
    """One Alertmanager of the cluster: its web port and process."""
    name: str
    port: int
    proc: subprocess.Popen = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return r.read().decode()

    def position(self) -> int:
        """The replica's place in the cluster (alertmanager_peer_position): position P waits
        P x peer-timeout before notifying."""
        return int(re.search(r"^alertmanager_peer_position (\d+)", self.get("/metrics"), re.M).group(1))


def start_alertmanagers(procs: Procs, tmp_path: Path, webhook: Webhook, wait: bool = True) -> list[Replica]:
    """Three replicas with the shipped flags, clustered by their --cluster.peer flags, running the
    generated routing (alertmanager_config, receivers on the webhook) at test timings; with wait,
    returns once each sees a cluster of three, settled."""
    binary = require_tool("prometheus-alertmanager")
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_yml(webhook)))
    web = [free_port() for _ in range(REPLICAS)]
    gossip = [free_port() for _ in range(REPLICAS)]
    hosts = {f"alertmanager-{i}:{p}": f"127.0.0.1:{ports[i]}" for i in range(REPLICAS)
             for p, ports in ((9093, web), (9094, gossip))}
    replicas = []
    for i in range(REPLICAS):
        args = localized("prometheus-alertmanager", hosts, {
            "--config.file": str(tmp_path / "alertmanager.yml"), "--storage.path": str(tmp_path / f"am-{i}"),
            "--web.listen-address": f"127.0.0.1:{web[i]}", "--cluster.listen-address": f"127.0.0.1:{gossip[i]}",
            "--cluster.peer-timeout": f"{PEER_TIMEOUT:g}s",
            "--cluster.settle-timeout": "2s"})  # shipped 1m: how long a new replica waits for gossip before notifying
        replicas.append(Replica(f"alertmanager-{i}", web[i], procs.start(f"alertmanager-{i}", [binary, *args])))
    if wait:
        wait_for_cluster(replicas, procs)
    return replicas


def wait_for_cluster(replicas: list[Replica], procs: Procs, timeout: float = 30) -> None:
    """Until every replica reports every replica as a peer (/api/v2/status) and is ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check()
        try:
            status = [json.loads(r.get("/api/v2/status"))["cluster"] for r in replicas]
        except OSError:
            status = []
        if status and all(len(s["peers"]) == len(replicas) and s["status"] == "ready" for s in status):
            return
        time.sleep(0.2)
    pytest.fail(f"the Alertmanager cluster did not form: {status}")


# --- Alertmanager HA ----------------------------------------------------------------------------

def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


class Resender:
    """Posts the alerts firing (and those just resolved) to every replica every half second, as a
    Prometheus with several alertmanagers does on each evaluation; connection errors from a dead
    replica are counted, as Prometheus logs them, and sending goes on."""

    def __init__(self, replicas: list[Replica]):
        self.replicas, self.alerts, self.errors = replicas, {}, 0
        self.first_sent: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def fire(self, key: str, labels: dict) -> None:
        self.alerts[key] = {"labels": labels, "annotations": {"summary": key},
                            "startsAt": iso(datetime.now(timezone.utc)), "generatorURL": "http://shard:9090/graph"}
        self.first_sent.setdefault(key, time.monotonic())

    def resolve(self, key: str) -> None:
        """From now on the alert goes out resolved: endsAt now, as Prometheus sends a resolved alert."""
        self.alerts[key] = {**self.alerts[key], "endsAt": iso(datetime.now(timezone.utc))}
        self.first_sent[key + ":resolved"] = time.monotonic()

    def loop(self) -> None:
        while not self.stop.wait(0.5):
            until = iso(datetime.now(timezone.utc) + timedelta(seconds=10))  # Prometheus: 4 resend intervals
            body = json.dumps([{"endsAt": until, **a} for a in self.alerts.values()]).encode()
            for replica in self.replicas:
                try:
                    request = urllib.request.Request(replica.url + "/api/v2/alerts", body,
                                                     {"Content-Type": "application/json"})
                    urllib.request.urlopen(request, timeout=2).close()
                except (OSError, http.client.HTTPException):
                    self.errors += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def gpu_alert(name: str, node: str, **extra) -> dict:
    """An alert of the pack as a shard would send it: its rule labels (severity, scope, family) from
    gpuobs.alerts.rules, a GPU's identity and the shard's external label cluster."""
    from gpuobs.alerts.rules import FAST, alerts

    (a,) = [a for a in alerts(FAST) if a.name == name]
    return {"alertname": name, "severity": a.severity, "scope": a.scope, "family": a.family, "cluster": "example",
            "node": node, "gpu": "0", "uuid": f"GPU-{node}-0", "instance": f"{node}:9445", "job": "gpuobs", **extra}


HA_ALERTS = {"lost": gpu_alert("GpuLost", "gpu-node-01"),
             "xid": gpu_alert("GpuXidRebootRequired", "gpu-node-02", xid="79"),
             "thermal": gpu_alert("GpuHwThermalSlowdown", "gpu-node-03")}


def firing(key: str):
    labels = HA_ALERTS[key]
    return lambda n: n.has(labels["alertname"], node=labels["node"])


@pytest.mark.parametrize("victim", ["sender", "follower"])
def test_alertmanager_cluster_with_a_replica_killed_notifies_each_alert_once(victim, webhook, procs, tmp_path):
    """Three replicas, every alert posted to all three; phase 1: two groups fire and are notified
    by the replica at position 0; then one replica is SIGKILLed (that one, `sender`, or the one at
    position 2, `follower`) and sending goes on to all three (one refusing); phase 2: a new group
    fires and an old one resolves. Every alert reaches the webhook, the survivors notify what the
    dead one had not, and no notification arrives twice: the notification log is gossiped."""
    replicas = start_alertmanagers(procs, tmp_path, webhook)
    by_position = {r.position(): r for r in replicas}
    assert sorted(by_position) == list(range(REPLICAS)), by_position
    killed = by_position[0] if victim == "sender" else by_position[REPLICAS - 1]
    sender = Resender(replicas)
    try:
        latency = {}
        for key in ("lost", "xid"):
            sender.fire(key, HA_ALERTS[key])
        for key in ("lost", "xid"):
            latency[key] = webhook.wait(key, firing(key), 15, procs) - sender.first_sent[key]
        time.sleep(QUIET)  # the other replicas' turns pass: they find the notification in the gossiped log
        phase1 = list(webhook.notifications)
        assert {n.sender_port for n in phase1} == {by_position[0].port}, "position 0 sends"
        killed.proc.kill()
        killed.proc.wait()
        sender.fire("thermal", HA_ALERTS["thermal"])
        sender.resolve("xid")
        latency["thermal"] = webhook.wait("thermal", firing("thermal"), 20, procs) - sender.first_sent["thermal"]
        latency["xid resolved"] = webhook.wait("xid resolved", lambda n: n.has(
            "GpuXidRebootRequired", "resolved"), GROUP_INTERVAL + 15, procs) - sender.first_sent["xid:resolved"]
        time.sleep(QUIET)
    finally:
        sender.close()
    phase2 = webhook.notifications[len(phase1):]
    assert phase2 and killed.port not in {n.sender_port for n in phase2}
    assert sender.errors > 0  # the dead replica refused, as Prometheus would see it
    counts = {}
    for n in webhook.notifications:
        counts[n.content] = counts.get(n.content, 0) + 1
    assert all(c == 1 for c in counts.values()), [(c[:3], k) for c, k in counts.items() if k > 1]
    assert_no_duplicates(webhook.notifications, alertmanager_yml(webhook))
    groups = {n.body["groupKey"] for n in webhook.notifications}
    assert len(groups) == 3 and all(n.receiver == "pager" for n in webhook.notifications)
    print(f"\n{victim} killed: {len(webhook.notifications)} notifications for 3 groups, none twice; from first send "
          f"to webhook: " + ", ".join(f"{k} {v:.1f} s" for k, v in latency.items()))


# --- the topology end to end ------------------------------------------------------------------

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04")
SHARDS = 2


class FakeNodes:
    """One HTTP server per node serving a gpuobs exporter's /metrics body (gpuobs.docs.render_node on
    two simulated L40S), its UUIDs made the node's own; GPU 1 of each node in `lost` reports
    gpuobs_gpu_up 0. Test scaffolding: the targets the shards scrape."""

    def __init__(self, nodes: tuple[str, ...], lost: set[str]):
        from gpuobs.docs import render_node

        template = render_node({"gpus": [{"profile": "l40s-pcie", "count": 2}]})
        self.servers = {}
        for node in nodes:
            body = template.replace('uuid="GPU-', f'uuid="GPU-{node}-')
            if node in lost:
                body = re.sub(r'^(gpuobs_gpu_up\{gpu="1",[^}]*\}) 1\.0$', r"\1 0.0", body, flags=re.M)
                assert ' 0.0' in [ln for ln in body.splitlines() if ln.startswith('gpuobs_gpu_up{gpu="1"')][0]
            self.servers[node] = serve_static(body.encode())

    def inventory(self) -> list[dict]:
        """The file_sd inventory of deploy/fleet/gpuobs-nodes.yml's shape: a target and node per node."""
        return [{"targets": [f"127.0.0.1:{s.server_port}"], "labels": {"node": node}} for node, s in self.servers.items()]

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


def query(base: str, promql: str) -> list[dict]:
    """An instant query (POST, for long selectors) to Prometheus' or VictoriaMetrics' API."""
    data = urllib.parse.urlencode({"query": promql}).encode()
    with urllib.request.urlopen(base + "/api/v1/query", data, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def tier_rules(tmp_path: Path) -> tuple[Path, Path]:
    """The fast profile's (local, global) tier files (gpuobs.alerts.build.write_fast_rules)."""
    from gpuobs.alerts.build import write_fast_rules

    try:
        return write_fast_rules(tmp_path, tier="local"), write_fast_rules(tmp_path, tier="global")
    except TypeError:
        pytest.skip("gpuobs.alerts.build.write_fast_rules writes no tiers yet (docs/rule-tiers.md)")


def wait_until(what: str, check, procs: Procs, timeout: float = 30):
    """Poll check() until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        procs.check()
        try:
            last = check()
        except (OSError, KeyError, http.client.HTTPException) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}: {last!r}")


def start_victoriametrics(procs: Procs, tmp_path: Path) -> str:
    binary = require_tool("victoria-metrics")
    port = free_port()
    procs.start("victoria-metrics", [binary, *localized("victoria-metrics", {}, {
        "-storageDataPath": str(tmp_path / "vm"), "-httpListenAddr": f"127.0.0.1:{port}",
        "-dedup.minScrapeInterval": "1s",  # the test's scrape interval, as the shipped 15s is the shards'
        "-search.latencyOffset": "1s",  # default 30s: what a query at `now` leaves out, too long to wait here
        "-loggerLevel": "ERROR"})])
    base = f"http://127.0.0.1:{port}"
    wait_until("VictoriaMetrics", lambda: urllib.request.urlopen(base + "/health", timeout=2).status == 200, procs)
    return base


def start_shards(procs: Procs, tmp_path: Path, hosts: dict[str, str], rules: Path, inventory: Path) -> list[str]:
    """SHARDS Prometheus from deploy/fleet/prometheus-shard.yml and default/prometheus: shard K of
    SHARDS by the README's edit (modulus, keep regex), host names to loopback, the fast local tier,
    the test's inventory, and 1 s scrape, evaluation and remote-write deadlines."""
    binary = require_tool("prometheus")
    text = SHARD.read_text()
    for host, local in hosts.items():
        text = text.replace(host, local)
    bases = []
    for k in range(SHARDS):
        doc = yaml.safe_load(text)
        _, mod, keep = shard_relabeling(doc)
        mod["modulus"], keep["regex"] = SHARDS, str(k)
        doc["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        doc["rule_files"] = [str(rules)]
        doc["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(inventory)]
        doc["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
        (tmp_path / f"shard-{k}.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        port = free_port()
        procs.start(f"prometheus-shard-{k}", [binary, *localized("prometheus", hosts, {
            "--config.file": str(tmp_path / f"shard-{k}.yml"), "--storage.tsdb.path": str(tmp_path / f"shard-{k}"),
            "--web.listen-address": f"127.0.0.1:{port}",
            "--rules.alert.resend-delay": "1s"})])  # default 1m, as conftest's Prometheus
        bases.append(f"http://127.0.0.1:{port}")
    return bases


def start_vmalert(procs: Procs, hosts: dict[str, str], rules: Path) -> str:
    binary = require_tool("vmalert")
    port = free_port()
    procs.start("vmalert", [binary, *localized("vmalert", hosts, {
        "-rule": str(rules), "-httpListenAddr": f"127.0.0.1:{port}",
        "-remoteWrite.flushInterval": "1s",  # default 5s
        "-loggerLevel": "ERROR"})])
    return f"http://127.0.0.1:{port}"


def nodes_by(base: str, promql: str) -> dict[str, int]:
    return {r["metric"].get("node", ""): int(float(r["value"][1])) for r in query(base, promql)}


def rule_names(path: Path, kind: str = "record") -> list[str]:
    return [r[kind] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if kind in r]


def test_sharded_topology_end_to_end(webhook, procs, tmp_path):
    """Two shards (hashmod on node, modulus 2) over four nodes, each with the local tier and
    remote_write; VictoriaMetrics; vmalert with the global tier writing its records back; the
    3-replica Alertmanager cluster, which every evaluator sends to. A lost GPU on one node of each
    shard pages once each; vmalert's Watchdog arrives too."""
    local, global_ = tier_rules(tmp_path)
    on_shard = {node: hashmod(node, SHARDS) for node in NODES}
    assert set(on_shard.values()) == set(range(SHARDS)), on_shard
    lost = {next(n for n in NODES if on_shard[n] == k) for k in range(SHARDS)}  # one lost GPU per shard
    targets = FakeNodes(NODES, lost)
    try:
        (tmp_path / "nodes.yml").write_text(yaml.safe_dump(targets.inventory()))
        t0 = time.monotonic()
        replicas = start_alertmanagers(procs, tmp_path, webhook, wait=False)
        vm = start_victoriametrics(procs, tmp_path)
        hosts = {"victoriametrics:8428": vm.removeprefix("http://"),
                 **{f"alertmanager-{i}:9093": f"127.0.0.1:{r.port}" for i, r in enumerate(replicas)}}
        shards = start_shards(procs, tmp_path, hosts, local, tmp_path / "nodes.yml")
        vmalert = start_vmalert(procs, hosts, global_)
        wait_for_cluster(replicas, procs)
        arrived = {node: webhook.wait(f"GpuLost on {node}", lambda n, node=node: n.has("GpuLost", node=node, gpu="1"),
                                      40, procs) - t0 for node in sorted(lost)}
        webhook.wait("Watchdog (vmalert)", lambda n: n.receiver == "watchdog" and n.has("Watchdog"), 20, procs)
        check_the_data(procs, shards, vm, vmalert, on_shard, local, global_)
        check_every_evaluator_sends_to_every_replica(shards, vmalert, replicas)
        time.sleep(QUIET)
    finally:
        targets.close()
    check_the_notifications(webhook, {node: shards[on_shard[node]] for node in lost})
    print(f"\nGpuLost from start to webhook: {', '.join(f'{n} {s:.1f} s' for n, s in arrived.items())}; "
          f"{len(webhook.notifications)} notifications, none twice")


def check_the_data(procs: Procs, shards: list[str], vm: str, vmalert: str, on_shard: dict[str, int],
                   local: Path, global_: Path) -> None:
    """Every node on exactly the shard hashmod names, and whole in VictoriaMetrics with the
    cluster label; the local tier's records of every node and the global tier's records there too."""
    up = 'count by (node) (up{job="gpuobs"} == 1)'

    def on_each_shard():
        held = [nodes_by(base, up) for base in shards]
        return held if all(held) and sum(map(len, held)) >= len(on_shard) else None

    for k, nodes in enumerate(wait_until("both shards scraping every node", on_each_shard, procs)):
        assert nodes == {n: 1 for n, s in on_shard.items() if s == k}, (k, nodes)

    def in_vm():
        got = nodes_by(vm, 'count by (node) (gpuobs_gpu_up{cluster="example", job="gpuobs"})')
        return got if set(got) == set(on_shard) else None

    assert wait_until("every node in VictoriaMetrics", in_vm, procs) == {n: 2 for n in on_shard}
    # once each, whatever shard wrote it
    wait_until("every node's up once in VictoriaMetrics", lambda: nodes_by(vm, up) == {n: 1 for n in on_shard}, procs)
    local_records = "|".join(rule_names(local))
    wait_until("the local tier's records of every node in VictoriaMetrics", lambda: set(on_shard) <= set(
        nodes_by(vm, f'count by (node) ({{__name__=~"{local_records}", node!=""}})')), procs)
    check_the_global_tier(procs, vm, vmalert, global_)


def check_the_global_tier(procs: Procs, vm: str, vmalert: str, global_: Path) -> None:
    """vmalert's fleet-wide records, computed on VictoriaMetrics from both shards' series and local
    records, are written back there (-remoteWrite.url): 2 GPUs lost, 8 expected (a local record
    summed); vmalert loaded every group of the global tier and no rule it evaluated has an error."""
    def value(record: str):
        got = query(vm, f'{record}{{cluster="example"}}')
        return float(got[0]["value"][1]) if got else None

    wait_until("2 lost GPUs recorded by vmalert", lambda: value("cluster:gpuobs_gpus_lost:count") == 2, procs)
    wait_until("8 GPUs expected, from the shards' node records", lambda: value("cluster:gpuobs_gpus_expected:sum") == 8,
               procs)
    with urllib.request.urlopen(vmalert + "/api/v1/rules", timeout=5) as r:
        groups = json.load(r)["data"]["groups"]
    assert {g["name"] for g in groups} == {g["name"] for g in yaml.safe_load(global_.read_text())["groups"]}
    rules = [rule for g in groups for rule in g["rules"]]
    assert len(rules) == len(rule_names(global_)) + len(rule_names(global_, "alert"))
    assert not [(r["name"], r["lastError"]) for r in rules if r["lastError"]]


def sent_to(base: str, metric: str, label: str) -> dict[int, float]:
    """{Alertmanager web port: alerts sent} from an evaluator's own counter (its /metrics)."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {urllib.parse.urlsplit(url).port: float(v)
            for url, v in re.findall(rf'^{metric}{{{label}="([^"]+)"}} (\S+)$', text, re.M)}


def check_every_evaluator_sends_to_every_replica(shards: list[str], vmalert: str, replicas: list[Replica]) -> None:
    """Each shard and vmalert sent alerts to each of the three replicas, with no error."""
    ports = {r.port for r in replicas}
    for base in shards:
        sent = sent_to(base, "prometheus_notifications_sent_total", "alertmanager")
        assert set(sent) == ports and all(sent.values()), (base, sent)
        assert not any(sent_to(base, "prometheus_notifications_errors_total", "alertmanager").values())
    sent = sent_to(vmalert, "vmalert_alerts_sent_total", "addr")
    assert set(sent) == ports and all(sent.values()), sent


def check_the_notifications(webhook: Webhook, lost: dict[str, str]) -> None:
    """Each lost GPU in exactly one notification, of one group, raised by the shard holding its
    node (the alert's generatorURL); nothing notified twice."""
    notifications = webhook.notifications
    for node, shard in lost.items():
        pages = [n for n in notifications if n.has("GpuLost", node=node, gpu="1")]
        assert len(pages) == 1, [(n.receiver, n.body["groupKey"]) for n in pages]
        assert pages[0].receiver == "pager" and pages[0].body["groupLabels"] == {
            "alertname": "GpuLost", "cluster": "example", "node": node}
        (alert,) = pages[0].body["alerts"]
        assert urllib.parse.urlsplit(alert["generatorURL"]).port == urllib.parse.urlsplit(shard).port
    assert_no_duplicates(notifications, alertmanager_yml(webhook))
