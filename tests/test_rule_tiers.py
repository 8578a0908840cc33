"""The rule pack's two tiers (gpuobs/alerts/tiers.py, docs/rule-tiers.md): every rule in exactly one,
the local tier within one node, the global tier loadable by Debian's vmalert, and, live, the local tier
on a Prometheus holding half the nodes firing the same alerts for them as on one holding all, and the
global tier's records on vmalert over VictoriaMetrics equal to the same records on Prometheus."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import REPO, free_port, require_tool, stop

from gpuobs.alerts import tiers
from gpuobs.alerts.build import prometheus_rule, rule_groups, rules_file, write_fast_rules
from gpuobs.alerts.rules import DEFAULT, FAST
from gpuobs.records import WEEKLY_GROUP

ALERTS = REPO / "alerts"
# what alerts/gpuobs.rules.yml, gpuobs-local.rules.yml and gpuobs-global.rules.yml hold (tests/test_generate.py
# checks the committed files are these)
PACK = {tier: yaml.safe_load(rules_file(DEFAULT, tier))["groups"] for tier in (None, *tiers.TIERS)}


def groups_of(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


def names_in(groups: list[dict]) -> list[str]:
    return [tiers.rule_name(r) for g in groups for r in g["rules"]]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


# ----------------------------------------------------------------------------------- the files, statically
def test_every_rule_is_in_exactly_one_tier_and_the_tiers_make_the_pack():
    whole, local, global_ = (PACK[k] for k in (None, tiers.LOCAL, tiers.GLOBAL))
    assert not set(names_in(local)) & set(names_in(global_))
    assert sorted(names_in(local) + names_in(global_)) == sorted(names_in(whole))
    placed = tiers.placements(DEFAULT)
    assert set(placed) == set(names_in(whole))
    assert {n for n, p in placed.items() if p.tier == tiers.LOCAL} == set(names_in(local))
    # group for group, in order: each tier's rules are the whole group's rules of that tier, as they
    # are there (the global tier without keep_firing_for, which vmalert 1.79 refuses)
    parts = {g["name"]: g for g in whole}
    for tier, groups in ((tiers.LOCAL, local), (tiers.GLOBAL, global_)):
        for g in groups:
            full = parts[g["name"]]
            assert g["interval"] == full["interval"]
            expected = [{k: v for k, v in r.items() if tier == tiers.LOCAL or k not in tiers.VMALERT_UNSUPPORTED}
                        for r in full["rules"] if placed[tiers.rule_name(r)].tier == tier]
            assert g["rules"] == expected, g["name"]
    assert all("keep_firing_for" not in r for g in global_ for r in g["rules"])
    assert any("keep_firing_for" in r for g in local for r in g["rules"])  # kept where Prometheus runs it
    dropped = tiers.vmalert_dropped(DEFAULT)
    assert dropped and all(placed[n].tier == tiers.GLOBAL for n in dropped)


def test_a_local_rule_reads_no_global_record():
    global_records = {r["record"] for g in PACK[tiers.GLOBAL] for r in g["rules"] if "record" in r}
    for g in PACK[tiers.LOCAL]:
        for r in g["rules"]:
            read = {name for name, _ in tiers.parse(r["expr"]).selectors}
            assert not read & global_records, (tiers.rule_name(r), read & global_records)
    placed = tiers.placements(DEFAULT)
    for p in placed.values():
        if any(placed[r].tier == tiers.GLOBAL for r in p.records):
            assert p.tier == tiers.GLOBAL, p


def test_every_aggregation_and_match_of_a_local_rule_keeps_node():
    """Statically, on the local tier's file: each `by`/`on` list names node, no `without`/`ignoring`
    list does, no aggregation lacks a grouping (a fleet-wide sum), no absent() or vector(), and every
    series read is the exporter's, its target's up, or a local record."""
    exporter = tiers.exporter_series()
    local_records = {r["record"] for g in PACK[tiers.LOCAL] for r in g["rules"] if "record" in r}
    for g in PACK[tiers.LOCAL]:
        assert g["name"] != f"gpuobs-{WEEKLY_GROUP}"
        for r in g["rules"]:
            parsed = tiers.parse(r["expr"])
            assert not parsed.fleet, (tiers.rule_name(r), parsed.fleet)
            for kind, labels in parsed.clauses:
                if kind in ("by", "on"):
                    assert "node" in labels, (tiers.rule_name(r), kind, labels)
                elif kind in ("without", "ignoring"):
                    assert "node" not in labels, (tiers.rule_name(r), kind, labels)
            for name, matchers in parsed.selectors:
                assert name in exporter | local_records or name == "up" and 'job="gpuobs"' in matchers, \
                    (tiers.rule_name(r), name)


PLACED = tiers.placements(DEFAULT)


@pytest.mark.parametrize("expr, tier", [
    ("gpuobs_gpu_up == 0", tiers.LOCAL),
    ("sum by (cluster, node) (gpuobs_gpu_power_usage_watts)", tiers.LOCAL),
    ("sum without (link) (rate(gpuobs_gpu_ecc_errors_total[5m]))", tiers.LOCAL),
    ('label_replace(gpuobs_gpu_info, "peer", "$1", "uuid", "(.+)") and on (cluster, node, uuid) gpuobs_gpu_up',
     tiers.LOCAL),
    ("rate(gpuobs_exporter_gpu_timeouts_total[1h]) / ignoring (gpu, uuid) group_left "
     "rate(gpuobs_exporter_samples_total[1h]) > 0.05", tiers.LOCAL),
    ('up{job="gpuobs"} == 0', tiers.LOCAL),
    ("sum by (cluster) (gpuobs_gpu_power_usage_watts)", tiers.GLOBAL),
    ("sum(gpuobs_gpu_power_usage_watts) by (node)", tiers.GLOBAL),  # postfix grouping: read conservatively
    ("max without (node) (gpuobs_gpu_temperature_celsius)", tiers.GLOBAL),
    ("gpuobs_gpu_up and on () count(gpuobs_gpu_up)", tiers.GLOBAL),
    ("gpuobs_gpu_up * ignoring (node) gpuobs_gpu_up", tiers.GLOBAL),
    ('absent(up{job="gpuobs"})', tiers.GLOBAL),
    ("vector(1)", tiers.GLOBAL),
    ("up == 0", tiers.GLOBAL),  # every job's targets: training processes are on no node shard
    ("time() - gpuobs_training_step_last_timestamp_seconds > 600", tiers.GLOBAL),
    ('kube_namespace_labels{label_team!=""}', tiers.GLOBAL),
    ("cluster:gpuobs_gpus_idle:count > 0", tiers.GLOBAL),
    ("cluster_node:gpuobs_gpus_present:sum < 8", tiers.LOCAL),
])
def test_the_reading_of_promql(expr, tier):
    place = tiers.judge(expr, DEFAULT, PLACED)
    assert place.tier == tier, place.reasons


def test_known_rules_land_in_their_tier():
    placed = tiers.placements(DEFAULT)
    local = {"GpuLost", "GpuHwThermalSlowdown", "GpuXidRebootRequired", "GpuExporterDown", "NvmlDown",
             "GpuMissing", "cluster_node:gpuobs_gpus_present:sum", "uuid:gpuobs_gpu_allocated:bool"}
    global_ = {"Watchdog", "GpuExporterAbsent", "GpuExporterGone", "GpuFleetIdleCapacity", "TrainingRankLost",
               "TrainingStragglerRank", "InferenceErrorRate", "cluster:gpuobs_gpus_present:sum",
               "cluster_team:gpuobs_gpus_allocated:count", "cluster_hpc_job:gpuobs_gpus_allocated:count",
               "cluster_namespace:gpuobs_gpus_requested_pending:sum"}
    assert {n for n in local if placed[n].tier != tiers.LOCAL} == set()
    assert {n for n in global_ if placed[n].tier != tiers.GLOBAL} == set()
    weekly = [p for p in placed.values() if p.group == WEEKLY_GROUP]
    assert weekly and all(p.tier == tiers.GLOBAL for p in weekly)
    assert all(p.reasons for p in placed.values() if p.tier == tiers.GLOBAL)


def keep_regex(path: Path) -> re.Pattern:
    """The `keep` regex on __name__ of a Prometheus config's first remote_write (anchored, as Prometheus does)."""
    remote = yaml.safe_load(path.read_text())["remote_write"][0]
    (keep,) = [r for r in remote["write_relabel_configs"]
               if r["action"] == "keep" and r["source_labels"] == ["__name__"]]
    return re.compile(f"^(?:{keep['regex']})$")


def test_every_input_of_the_global_tier_is_remote_written():
    """No global rule silently lacks its inputs: every series it reads, and every local record, passes
    the remote-write filter of the sharded and the remote-write configs."""
    placed = tiers.placements(DEFAULT)
    needed = {s for p in placed.values() if p.tier == tiers.GLOBAL for s in p.series}
    needed |= {p.name for p in placed.values() if p.kind == "record" and p.tier == tiers.LOCAL}
    for config in ("sharded.yml", "remote-write.yml"):
        keep = keep_regex(REPO / "exporters" / "prometheus" / config)
        assert sorted(n for n in needed if not keep.match(n)) == [], config
    sharded = yaml.safe_load((REPO / "exporters/prometheus/sharded.yml").read_text())
    assert sharded["rule_files"] == ["../../alerts/gpuobs-local.rules.yml"]


def test_tier_files_check_with_promtool_and_vmalert(tmp_path):
    promtool = require_tool("promtool")
    fast = [write_fast_rules(tmp_path, tier) for tier in tiers.TIERS]
    files = {}
    for tier in (None, *tiers.TIERS):
        files[tier] = tmp_path / f"{tier or 'whole'}.rules.yml"
        files[tier].write_text(rules_file(DEFAULT, tier))
    for path in (files[tiers.LOCAL], files[tiers.GLOBAL], *fast):
        out = run([promtool, "check", "rules", str(path)])
        assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    assert fast[0].name == "gpuobs-fast-local.rules.yml" and "(profile fast, tier local" in fast[0].read_text()
    vmalert = require_tool("vmalert")
    for path in (files[tiers.GLOBAL], fast[1]):
        out = run([vmalert, "-dryRun", f"-rule={path}", "-loggerLevel=ERROR"])
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # the check does fail where it should: the whole pack carries keep_firing_for
    assert run([vmalert, "-dryRun", f"-rule={files[None]}", "-loggerLevel=ERROR"]).returncode != 0
    with pytest.raises(ValueError):
        rules_file(FAST, "regional")


def test_tier_prometheusrules_and_the_kustomization():
    kustomization = yaml.safe_load((ALERTS / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["prometheusrule.yaml"]  # one copy of every rule in `kubectl apply -k`
    for tier in tiers.TIERS:
        assert (ALERTS / f"prometheusrule-{tier}.yaml").is_file()
        doc = yaml.safe_load(prometheus_rule(DEFAULT, tier))
        assert doc["metadata"]["name"] == f"gpuobs-{tier}"
        assert doc["metadata"]["labels"]["role"] == f"alert-rules-{tier}"
        assert doc["spec"]["groups"] == PACK[tier]
    whole = yaml.safe_load(prometheus_rule(DEFAULT))
    assert whole["metadata"]["labels"]["role"] == "alert-rules" and whole["spec"]["groups"] == rule_groups(DEFAULT)


def test_the_tiers_doc_lists_every_rule_in_its_tier():
    assert (REPO / tiers.DOC_PATH).is_file()
    text = tiers.markdown(DEFAULT)
    local, global_ = text.split("## Local tier")[1].split("## Global tier")
    for p in tiers.placements(DEFAULT).values():
        assert f"| `{p.name}` |" in (local if p.tier == tiers.LOCAL else global_), p.name
    assert "(docs/rule-tiers.md)" in (REPO / "README.md").read_text()


# --------------------------------------------------------------------------------------------- live
NODES_PER_SHARD = 2
GPUS = 4
# The global tier's live check runs FAST with windows short enough to be left behind within the test
# (series born at its start are then older than every window: MetricsQL's increase() counts a counter
# born within its window from 0, PromQL's does not; the window sums carry no start-up state), groups
# at 2 s, which vmalert keeps up with on two cores beside two Prometheus, and weekly steps of two
# evaluations.
GLOBAL_PROFILE = dataclasses.replace(FAST, profile="fast-short", eval_interval="2s", long_window="8s",
                                     weekly_window="8s", weekly_interval="4s")
CLUSTER = "c1"


def hashmod(value: str, modulus: int) -> int:
    """Prometheus's hashmod relabel action: the last 8 bytes of the value's MD5, big-endian, modulo."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def node_names() -> tuple[list[str], list[str]]:
    """(nodes hashmod 2 keeps on shard 0, the others): NODES_PER_SHARD of each."""
    kept, other = [], []
    for k in range(100):
        name = f"gpu-node-{k:02d}"
        (kept if hashmod(name, 2) == 0 else other).append(name)
    return kept[:NODES_PER_SHARD], other[:NODES_PER_SHARD]


def render_templates() -> dict[str, str]:
    """The exporter's /metrics of a simulated node of GPUS H100s, without and with an XID 79 on GPU 0
    (gpuobs.docs.render_node, in a child process: NVML state of its own)."""
    code = ("import json, sys; from gpuobs.docs import render_node; "
            f"spec = {{'gpus': [{{'profile': 'h100-sxm-80gb', 'count': {GPUS}}}]}}; "
            "json.dump({'plain': render_node(spec), 'xid': render_node(spec, xids=(79,))}, sys.stdout)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _set(lines: list[str], metric: str, matches: tuple[str, ...], value: str) -> list[str]:
    """The sample lines of `metric` whose labels hold every string of matches, with value instead."""
    return [f"{line.rsplit(' ', 1)[0]} {value}" if line.startswith(metric + "{") and all(m in line for m in matches)
            else line for line in lines]


XID_NOW = "XID_NOW"  # replaced by the time of each scrape: the XID stays recent


def node_body(templates: dict[str, str], index: int) -> str:
    """Node `index`'s exposition: its own UUIDs, GPU 1 lost, GPU 2 in HW thermal slowdown, an XID 79
    on GPU 0 of even nodes, GPUs 0 and 3 held (a Kubernetes pod on even nodes, a Slurm job on odd
    ones: GPU 0 busy, GPU 3 holding memory while idle)."""
    text = templates["xid" if index % 2 == 0 else "plain"]
    uuids = list(dict.fromkeys(re.findall(r'uuid="(GPU-[0-9a-f-]+)"', text)))
    for i, uuid in enumerate(uuids):
        text = text.replace(uuid, f"GPU-{index:04d}{i:04d}-{uuid[13:]}")
    lines = text.splitlines()
    lines = _set(lines, "gpuobs_gpu_up", ('gpu="1"',), "0.0")
    lines = _set(lines, "gpuobs_gpu_clock_event_reason_active", ('gpu="2"', 'reason="hw_thermal_slowdown"'), "1.0")
    lines = _set(lines, "gpuobs_gpu_xid_last_seen_timestamp_seconds", ('xid="79"',), XID_NOW)
    lines = _set(lines, "gpuobs_gpu_utilization_ratio", ('gpu="0"',), "0.6")
    lines = _set(lines, "gpuobs_gpu_memory_used_bytes", ('gpu="3"',), "4e+09")
    holder = f'k8s_namespace="ml",k8s_pod="train-{index}",k8s_container="main",' if index % 2 == 0 \
        else f'hpc_job="{4000 + index}",'
    lines = [line.replace("{", "{" + holder, 1) if not line.startswith("#") and "uuid=" in line
             and ('gpu="0"' in line or 'gpu="3"' in line) else line for line in lines]
    return "\n".join(lines) + "\n"


KSM = "\n".join([
    'kube_namespace_labels{namespace="ml",label_team="vision"} 1',
    'kube_pod_status_phase{namespace="ml",pod="pending-0",phase="Pending"} 1',
    'kube_pod_container_resource_requests{namespace="ml",pod="pending-0",container="main",'
    'resource="nvidia_com_gpu",unit="integer"} 2']) + "\n"


class Targets(ThreadingHTTPServer):
    """Every simulated node's /metrics?node=NAME, kube-state-metrics' /ksm, and a sink for vmalert's
    notifications (any POST), on one port, in a thread of the test."""
    daemon_threads = True

    def __init__(self, bodies: dict[str, str]):
        self.bodies = bodies
        super().__init__(("127.0.0.1", 0), _Handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the standard library's name)
        url = urllib.parse.urlsplit(self.path)
        node = urllib.parse.parse_qs(url.query).get("node", [""])[0]
        body = KSM if url.path == "/ksm" else self.server.bodies.get(node)
        if body is None:
            self.send_error(404)
            return
        data = body.replace(XID_NOW, f"{time.time():.3f}").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):  # one line per scrape otherwise
        pass


def _die_with_parent() -> None:
    """In the child before exec: killed when the test process dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def scrape_config(port: int, shard: int | None) -> dict:
    """The gpuobs job: each target a node name that becomes node, instance and ?node= of the one
    server; with shard, only the nodes hashmod 2 puts there (as exporters/prometheus/sharded.yml)."""
    relabel = [{"source_labels": ["__address__"], "target_label": "__param_node"},
               {"source_labels": ["__address__"], "target_label": "node"},
               {"source_labels": ["__address__"], "target_label": "instance", "replacement": "${1}:9445"},
               {"target_label": "__address__", "replacement": f"127.0.0.1:{port}"}]
    if shard is not None:
        relabel += [{"source_labels": ["node"], "modulus": 2, "target_label": "__tmp_hash", "action": "hashmod"},
                    {"source_labels": ["__tmp_hash"], "regex": str(shard), "action": "keep"}]
    return {"job_name": "gpuobs", "static_configs": [{"targets": [], "labels": {"cluster": CLUSTER}}],
            "relabel_configs": relabel}


class Stack:
    """Prometheus A (every node, both fast tiers, remote-writing all but the global records to
    VictoriaMetrics), Prometheus B (shard 0 of 2, the fast local tier), VictoriaMetrics and vmalert
    (the fast global tier, its records written back to VictoriaMetrics)."""

    def __init__(self, workdir: Path):
        self.workdir, self.procs = workdir, []
        self.kept, self.other = node_names()
        nodes = self.kept + self.other
        templates = render_templates()
        self.targets = Targets({n: node_body(templates, i) for i, n in enumerate(nodes)})
        self.rules = {tiers.LOCAL: write_fast_rules(workdir, tiers.LOCAL), tiers.GLOBAL: workdir / "global.rules.yml"}
        self.rules[tiers.GLOBAL].write_text(rules_file(GLOBAL_PROFILE, tiers.GLOBAL))
        self.global_records = [r["record"] for g in groups_of(self.rules[tiers.GLOBAL]) for r in g["rules"]
                               if "record" in r]
        self.ports = {k: free_port() for k in ("a", "b", "vm", "vmalert")}
        self.a, self.b, self.vm = (f"http://127.0.0.1:{self.ports[k]}" for k in ("a", "b", "vm"))

    def start(self) -> "Stack":
        """Start every server; return once A sees every target up and VictoriaMetrics answers."""
        self._run("victoria-metrics", [f"-storageDataPath={self.workdir / 'vm'}", "-retentionPeriod=1",
                                       f"-httpListenAddr=127.0.0.1:{self.ports['vm']}", "-search.latencyOffset=1s",
                                       "-search.disableCache", "-loggerLevel=ERROR"])
        self._prometheus("a", None, (self.rules[tiers.LOCAL], self.rules[tiers.GLOBAL]))
        self._prometheus("b", 0, (self.rules[tiers.LOCAL],))
        self.b_proc = self.procs[-1]
        self._run("vmalert", [f"-rule={self.rules[tiers.GLOBAL]}", f"-datasource.url={self.vm}",
                              f"-remoteWrite.url={self.vm}", "-remoteWrite.flushInterval=1s",
                              f"-notifier.url=http://127.0.0.1:{self.targets.port}",
                              f"-httpListenAddr=127.0.0.1:{self.ports['vmalert']}", "-loggerLevel=ERROR"])
        self.wait(lambda: len(query(self.a, 'up{job="gpuobs"} == 1')) == 2 * NODES_PER_SHARD
                  and len(query(self.b, 'up{job="gpuobs"} == 1')) == NODES_PER_SHARD
                  and query(self.vm, "vector(1)"), 60, "every target up and VictoriaMetrics answering")
        return self

    def _run(self, tool: str, args: list[str]) -> None:
        log = open(self.workdir / f"{tool}-{len(self.procs)}.log", "w")
        self.procs.append(subprocess.Popen([require_tool(tool), *args], stdout=log, stderr=subprocess.STDOUT,
                                           preexec_fn=_die_with_parent))
        log.close()

    def _prometheus(self, name: str, shard: int | None, rule_files: tuple[Path, ...]) -> None:
        job = scrape_config(self.targets.port, shard)
        job["static_configs"][0]["targets"] = self.kept + self.other
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(p) for p in rule_files], "scrape_configs": [job]}
        if shard is None:
            config["scrape_configs"].append({
                "job_name": "kube-state-metrics", "metrics_path": "/ksm",
                "static_configs": [{"targets": [f"127.0.0.1:{self.targets.port}"], "labels": {"cluster": CLUSTER}}]})
            drop = "|".join(re.escape(r) for r in self.global_records) + "|ALERTS.*"
            config["remote_write"] = [{"url": f"{self.vm}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"},
                                       "write_relabel_configs": [{"source_labels": ["__name__"], "regex": drop,
                                                                  "action": "drop"}]}]
        path = self.workdir / f"prometheus-{name}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self._run("prometheus", [f"--config.file={path}", f"--storage.tsdb.path={self.workdir / name}",
                                 f"--web.listen-address=127.0.0.1:{self.ports[name]}", "--log.level=warn"])

    def wait(self, predicate, timeout: float, what: str, every: float = 0.5):
        """Poll predicate every `every` s until it returns something true; fail with the servers' logs."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            for proc in self.procs:
                assert proc.poll() is None or proc is self.b_proc, f"{proc.args[0]} exited:\n{self.logs()}"
            try:
                value = predicate()
                if value:
                    return value
            except (OSError, AssertionError) as e:
                last = e
            time.sleep(every)
        pytest.fail(f"timed out waiting for {what} (last error: {last})\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.workdir.glob("*.log")))

    def stop_b(self) -> None:
        """Stop Prometheus B (the shard) before the rest."""
        self.b_proc.terminate()
        self.b_proc.wait(10)

    def stop(self) -> None:
        """Stop every server, the last started first, and the targets."""
        for proc in reversed(self.procs):
            stop(proc)
        self.targets.shutdown()
        self.targets.server_close()


def query(base: str, promql: str) -> list[dict]:
    """An instant query's result on a Prometheus-API server."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{promql}: {e.code} {e.read()[:300]!r}") from None
    assert body["status"] == "success", body
    return body["data"]["result"]


def labelled(result: list[dict]) -> dict[frozenset, float]:
    """{label set: value} of an instant query's result."""
    return {frozenset(r["metric"].items()): float(r["value"][1]) for r in result}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    for tool in ("prometheus", "victoria-metrics", "vmalert"):
        require_tool(tool)
    running = Stack(tmp_path_factory.mktemp("tiers"))
    try:
        yield running.start()
    finally:
        running.stop()


def local_names(kind: str) -> set[str]:
    return {p.name for p in tiers.placements(FAST).values() if p.tier == tiers.LOCAL and p.kind == kind}


def test_the_local_tier_on_half_the_nodes_fires_as_on_all(stack):
    """The same firing alerts (names and label sets) and local records (label sets and values) for
    shard 0's nodes on B, which holds only them, as on A, which holds every node."""
    nodes = "|".join(stack.kept)
    alerts = local_names("alert")
    expected = {"GpuLost", "GpuHwThermalSlowdown", "GpuXidRebootRequired", "GpuAllocatedIdle"}

    def firing(base: str) -> frozenset:
        result = query(base, f'ALERTS{{alertstate="firing",node=~"{nodes}"}}')
        return frozenset(frozenset(r["metric"].items()) for r in result if r["metric"]["alertname"] in alerts)

    seen = []

    def settled():
        a, b = firing(stack.a), firing(stack.b)
        seen.append((a, b))
        names = {dict(x)["alertname"] for x in a}
        return a == b and expected <= names and len(seen) > 1 and seen[-2] == (a, b)

    stack.wait(settled, 60, "the same alerts on A and B for B's nodes")
    a, b = seen[-1]
    assert {dict(x)["node"] for x in a} == set(stack.kept)
    assert all(dict(x)["node"] in stack.kept for x in labelled(query(stack.b, "ALERTS")))  # B has no other node
    # A fired for the other half too, which B never sees
    assert {r["metric"]["node"] for r in query(stack.a, 'ALERTS{alertname="GpuLost"}')} == set(stack.kept + stack.other)
    records = "|".join(re.escape(r) for r in local_names("record"))
    on_b = labelled(query(stack.b, f'{{__name__=~"{records}"}}'))
    on_a = labelled(query(stack.a, f'{{__name__=~"{records}",node=~"{nodes}"}}'))
    assert on_b and all(dict(k).get("node") in stack.kept for k in on_b), "a local record lost its node"
    assert on_a.keys() == on_b.keys()
    assert all(math.isclose(on_a[k], on_b[k], rel_tol=1e-6, abs_tol=1e-9) for k in on_a), \
        {dict(k)["__name__"]: (on_a[k], on_b[k]) for k in on_a if not math.isclose(on_a[k], on_b[k], rel_tol=1e-6)}
    stack.stop_b()  # not needed any more: its CPU goes to the global tier's evaluators


def sample_counting(t) -> set[str]:
    """tiers.sample_counting(t) and every record reading one of them: values that count evaluations
    of a record vmalert wrote (docs/rule-tiers.md)."""
    placed = tiers.placements(t)
    counted = set(tiers.sample_counting(t))
    while more := {p.name for p in placed.values() if set(p.records) & counted} - counted:
        counted |= more
    return counted


def test_the_global_tier_on_vmalert_gives_the_records_of_prometheus(stack):
    """vmalert over VictoriaMetrics (fed by A's remote write, A's own global records left out) writes
    the global records A evaluates: the same label sets and values (within 0.1 %), except that the
    records counting evaluations of another record (sample_counting: the weekly step averages and
    GPU-hour sums, and what reads them) need only be there on both: on vmalert they miss the
    evaluations not yet readable (docs/rule-tiers.md), here often one of the two a step holds."""
    counted = sample_counting(GLOBAL_PROFILE)
    wanted = {"cluster:gpuobs_gpus_expected:sum", "cluster:gpuobs_gpus_lost:count",
              "cluster:gpuobs_gpu_power_usage_watts:sum", "cluster_xid:gpuobs_gpu_xid_errors:increase",
              "cluster_namespace:gpuobs_gpus_allocated:count", "cluster_team:gpuobs_gpus_used:sum", "cluster_hpc_job:gpuobs_gpus_wasted:count",
              "cluster_namespace:gpuobs_gpus_requested_pending:sum", "uuid:gpuobs_gpu_mig_profile:smallest_fit",
              "cluster_node_model:gpuobs_gpu_hours_up:sum", "cluster_class:gpuobs_gpu_failures:per_1000_gpu_hours",
              "cluster_team:gpuobs_gpu_hours_allocated:sum"}
    state, seen = {}, set()
    last = "cluster_class:gpuobs_gpu_failures:per_1000_gpu_hours"  # the end of the longest chain of records

    def compare():
        # a cheap look first: each full comparison is hundreds of queries, on the CPUs vmalert needs
        assert query(stack.vm, last) and query(stack.a, last), f"{last} not there yet"
        diffs, present = [], set()
        for record in stack.global_records:
            on_a, on_vm = labelled(query(stack.a, record)), labelled(query(stack.vm, record))
            present |= {record} if on_a else set()
            if record in counted:  # seen on VictoriaMetrics at some look, if A has it
                seen.update({record} if on_vm else ())
                if on_a and record not in seen:
                    diffs.append((record, "never there", len(on_a)))
            elif on_a.keys() != on_vm.keys():
                diffs.append((record, "labels", sorted(map(sorted, on_a.keys() ^ on_vm.keys()))[:2]))
            elif not all(math.isclose(on_a[k], on_vm[k], rel_tol=1e-3, abs_tol=1e-9) for k in on_a):
                diffs.append((record, "values", [(on_a[k], on_vm[k]) for k in on_a][:3]))
        state.update(diffs=diffs, present=present)
        assert not diffs and wanted <= present, (diffs[:6], sorted(wanted - present))
        return True

    stack.wait(compare, 60, "vmalert's records equal to A's", every=2)
    assert len(state["present"]) > len(wanted)
    assert {p.name for p in tiers.placements(GLOBAL_PROFILE).values() if p.tier == tiers.GLOBAL} == \
        {p.name for p in tiers.placements(FAST).values() if p.tier == tiers.GLOBAL}  # windows never move a rule
