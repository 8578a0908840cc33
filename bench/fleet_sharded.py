"""Fleet scale on the distributed topology (issue 25, part 4): deploy/fleet/ run on loopback with
10,000 simulated GPUs, faults injected while it runs, one Alertmanager replica killed mid-run.

    .venv/bin/python bench/fleet_sharded.py           # 1,250 nodes, 2 Prometheus shards (about 15 minutes)
    .venv/bin/python bench/fleet_sharded.py --quick   # 125 nodes (about 8 minutes)

What runs, each from its Debian package's binary with the flags of deploy/fleet/default/<name>
(loopback addresses, temporary paths and the retention changed; the shard count 2 instead of 4):

- the multi-target exporter of bench/fleet.py: /metrics?node=N for every node, the gpuobs exporter's
  default-profile body of one simulated 8 x H100 node copied per node (bench.fleet.Node), and
  /inject, which starts a fault on one GPU (gpuobs_gpu_up 0, an XID 79, HW thermal slowdown);
- N Prometheus shards from deploy/fleet/prometheus-shard.yml (hashmod on the node name, the
  node-local rule tier, remote_write to VictoriaMetrics, alerts to every Alertmanager replica);
- VictoriaMetrics single node; vmalert evaluating the global tier on it;
- three Alertmanager replicas clustered by --cluster.peer, running the generated routing
  (gpuobs.alerts.build.alertmanager_config at its shipped timings) with every receiver on a webhook
  in this process (bench scaffolding, outside the data path).

Measured: head series and RSS of every component, each rule group's evaluation duration against its
interval (Prometheus shards and vmalert), remote_write lag, vmalert errors, and from each injected
fault to the first webhook notification that carries its alert (p50/p99), with how often each was
paged. The result goes into bench/last_run.json (``fleet.sharded``) and BENCHMARKS.md is rewritten
from that file, next to the single-Prometheus numbers of the earlier run (``fleet.live``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import fleet  # noqa: E402
from bench.common import cpu_model, cpu_seconds, free_port, pct, version, write_result  # noqa: E402
from bench.fleet import FAULTS, Procs, get, metrics, need, rss_bytes, scalar, total, wait_until  # noqa: E402

DEPLOY = ROOT / "deploy" / "fleet"
LOCAL_TIER, GLOBAL_TIER = ROOT / "alerts" / "gpuobs-local.rules.yml", ROOT / "alerts" / "gpuobs-global.rules.yml"
REPLICAS = 3
# the alert each injected fault must page with (alerts/gpuobs-local.rules.yml)
ALERT_OF = {"lost": "GpuLost", "xid79": "GpuXidRebootRequired", "hw_thermal": "GpuHwThermalSlowdown"}
GOALS = {"head_series": 500_000, "rss_gib": 13.84 / 3, "rw_lag_s": 30.0, "vmalert_errors": 0}
SCRAPE_SERIES = 5   # what Prometheus adds per target: up, scrape_duration_seconds, scrape_samples_scraped, ...
SAMPLE_EVERY = 5.0  # seconds between readings of rule durations, remote_write lag and RSS


# --------------------------------------------------------------------------- the shipped deployment


def shipped(name: str, hosts: dict[str, str], changed: dict[str, str]) -> list[str]:
    """deploy/fleet/default/<name>'s flags (its ARGS= line, split as the shell does) with each host:port
    of `hosts` replaced and each flag of `changed` given its value (added when the file lacks it)."""
    (line,) = [x for x in (DEPLOY / "default" / name).read_text().splitlines() if x.startswith("ARGS=")]
    (value,) = shlex.split(line.removeprefix("ARGS="))
    out = []
    for arg in shlex.split(value):
        for host, local in hosts.items():
            arg = arg.replace(host, local)
        key = arg.split("=", 1)[0]
        out.append(f"{key}={changed[key]}" if key in changed else arg)
    keys = {a.split("=", 1)[0] for a in out}
    return out + [f"{k}={v}" for k, v in changed.items() if k not in keys]


def shard_config(k: int, shards: int, inventory: Path, exporter: str, alertmanagers: list[str], vm: str) -> dict:
    """deploy/fleet/prometheus-shard.yml as shard k of `shards` on loopback: the inventory file, the
    rule path and the addresses are this run's; the target's node name is passed to the one
    multi-target exporter as ?node= after the shipped relabeling has sharded on it. The shipped
    external `cluster` label is dropped: here each node's inventory entry carries its cluster."""
    doc = yaml.safe_load((DEPLOY / "prometheus-shard.yml").read_text())
    doc["global"].pop("external_labels", None)
    doc["rule_files"] = [str(LOCAL_TIER)]
    job = doc["scrape_configs"][0]
    job["file_sd_configs"][0]["files"] = [str(inventory)]
    relabel = job["relabel_configs"]
    mod = next(i for i, r in enumerate(relabel) if r.get("action") == "hashmod")
    relabel[mod]["modulus"] = shards
    relabel[mod + 1]["regex"] = str(k)
    relabel += [  # after the shipped rules: one process serves every node
        {"source_labels": ["node"], "regex": "node-0*([0-9]+)", "target_label": "__param_node", "replacement": "${1}"},
        {"source_labels": ["__address__"], "target_label": "instance"},
        {"target_label": "__address__", "replacement": exporter},
    ]
    doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = alertmanagers
    doc["remote_write"][0]["url"] = f"{vm}/api/v1/write"
    return doc


def inventory(path: Path, nodes: int) -> None:
    """gpuobs-nodes.yml for the fleet: each cluster's nodes as host:port targets (node from the host name)."""
    groups = [{"targets": [f"node-{n:04d}:9445" for n in range(nodes) if n % fleet.CLUSTERS == c],
               "labels": {"cluster": f"cluster-{c}"}} for c in range(fleet.CLUSTERS)]
    path.write_text(yaml.safe_dump(groups))


class Webhook:
    """Every receiver's URL (bench scaffolding): records (arrival time.time(), receiver, body)."""

    def __init__(self):
        self.got: list[tuple[float, str, dict]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                hook.got.append((time.time(), self.path.strip("/"), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, receiver: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/{receiver}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Topology:
    """The running deployment: process handles, URLs, and peak RSS and rule readings kept while it runs."""

    def __init__(self, workdir: Path, nodes: int, shards: int, template: Path, hook: Webhook):
        from gpuobs.alerts.build import RECEIVERS, alertmanager_config

        self.procs, self.nodes, self.shards = Procs(workdir), nodes, shards
        p = {k: free_port() for k in ("exporter", "vm", "vmalert")}
        am_web, am_gossip = [free_port() for _ in range(REPLICAS)], [free_port() for _ in range(REPLICAS)]
        shard_ports = [free_port() for _ in range(shards)]
        self.exporter, self.vm, self.vmalert = (f"http://127.0.0.1:{p[k]}" for k in ("exporter", "vm", "vmalert"))
        self.ams = [f"http://127.0.0.1:{x}" for x in am_web]
        self.proms = [f"http://127.0.0.1:{x}" for x in shard_ports]
        hosts = {f"alertmanager-{i}:{port}": f"127.0.0.1:{ports[i]}" for i in range(REPLICAS)
                 for port, ports in ((9093, am_web), (9094, am_gossip))}
        hosts["victoriametrics:8428"] = f"127.0.0.1:{p['vm']}"
        pids = {"exporter": self.procs.start("fleet-exporter", [sys.executable, str(ROOT / "bench" / "fleet.py"),
                                             "--serve", str(template), "--port", str(p["exporter"]),
                                             "--nodes", str(nodes)]).pid}
        pids["victoria-metrics"] = self.procs.start("victoria-metrics", [need("victoria-metrics"), *shipped(
            "victoria-metrics", hosts, {"-storageDataPath": str(workdir / "vm"), "-retentionPeriod": "1",
                                        "-httpListenAddr": f"127.0.0.1:{p['vm']}", "-loggerLevel": "ERROR"})]).pid
        (workdir / "alertmanager.yml").write_text(
            yaml.safe_dump(alertmanager_config({r: hook.url(r) for r in RECEIVERS})))
        self.am_procs = []
        for i in range(REPLICAS):
            proc = self.procs.start(f"alertmanager-{i}", [need("prometheus-alertmanager"), *shipped(
                "prometheus-alertmanager", hosts, {
                    "--config.file": str(workdir / "alertmanager.yml"), "--storage.path": str(workdir / f"am-{i}"),
                    "--web.listen-address": f"127.0.0.1:{am_web[i]}",
                    "--cluster.listen-address": f"127.0.0.1:{am_gossip[i]}"})])
            self.am_procs.append(proc)
            pids[f"alertmanager-{i}"] = proc.pid
        inventory(workdir / "gpuobs-nodes.yml", nodes)
        for k, port in enumerate(shard_ports):
            cfg = workdir / f"prometheus-shard-{k}.yml"
            cfg.write_text(yaml.safe_dump(shard_config(k, shards, workdir / "gpuobs-nodes.yml",
                                                       f"127.0.0.1:{p['exporter']}",
                                                       [f"127.0.0.1:{x}" for x in am_web], self.vm), sort_keys=False))
            pids[f"prometheus-{k}"] = self.procs.start(f"prometheus-{k}", [need("prometheus"), *shipped(
                "prometheus", hosts, {"--config.file": str(cfg), "--storage.tsdb.path": str(workdir / f"prom-{k}"),
                                      "--web.listen-address": f"127.0.0.1:{port}", "--log.level": "warn"})]).pid
        pids["vmalert"] = self.procs.start("vmalert", [need("vmalert"), *shipped(
            "vmalert", hosts, {"-rule": str(GLOBAL_TIER), "-httpListenAddr": f"127.0.0.1:{p['vmalert']}",
                               "-external.url": f"http://127.0.0.1:{p['vmalert']}", "-loggerLevel": "ERROR"})]).pid
        self.pids = pids
        self.peak_rss = {k: 0 for k in pids}
        self.rule_max: dict[str, float] = {}        # "shard k/group" or "vmalert/group" -> longest evaluation seen (s)
        self.rule_interval: dict[str, float] = {}
        self.rw_lag_max = 0.0

    def stop(self) -> None:
        self.procs.stop()

    def sample(self) -> None:
        """Peak RSS of each process; each rule group's last evaluation duration; remote_write lag."""
        for k, pid in self.pids.items():
            self.peak_rss[k] = max(self.peak_rss[k], rss_bytes(pid))
        for k, prom in enumerate(self.proms):
            m = metrics(f"{prom}/metrics")
            for labels, v in m.get("prometheus_rule_group_last_duration_seconds", []):
                key = f"shard {k}/{labels['rule_group'].split(';')[-1]}"
                self.rule_max[key] = max(self.rule_max.get(key, 0.0), v)
            for labels, v in m.get("prometheus_rule_group_interval_seconds", []):
                self.rule_interval[f"shard {k}/{labels['rule_group'].split(';')[-1]}"] = v
            sent = total(m, "prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
            if sent:
                lag = total(m, "prometheus_remote_storage_highest_timestamp_in_seconds") - sent
                self.rw_lag_max = max(self.rw_lag_max, lag)
        # vmalert: the group's iteration time (its summary's quantile 1: the slowest of the recent ones), else
        # the sum of its rules' last durations (a group evaluates its rules one after the other by default)
        slowest = {f"vmalert/{labels['group']}": v for labels, v in
                   metrics(f"{self.vmalert}/metrics").get("vmalert_iteration_duration_seconds", [])
                   if labels.get("quantile") == "1" and "group" in labels}
        for g in self.vmalert_groups():
            key = f"vmalert/{g['name']}"
            self.rule_interval[key] = float(g.get("interval", 30))
            took = slowest.get(key, sum(float(r.get("lastEvaluationDuration") or 0) for r in g.get("rules", [])))
            self.rule_max[key] = max(self.rule_max.get(key, 0.0), took)

    def vmalert_groups(self) -> list[dict]:
        return json.loads(get(f"{self.vmalert}/api/v1/rules")).get("data", {}).get("groups", [])

    def sample_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.procs.check()
            self.sample()
            time.sleep(SAMPLE_EVERY)

    def targets_up(self) -> list[set[str]]:
        """The nodes each shard has scraped successfully (its `up == 1`)."""
        out = []
        for prom in self.proms:
            r = fleet.api(prom, "/api/v1/query", query='up{job="gpuobs"} == 1')["result"]
            out.append({x["metric"]["node"] for x in r})
        return out


# ----------------------------------------------------------------------------------- fault injection


def candidates(nodes: int, faults_per_kind: int, seed: int = 25) -> list[tuple[str, int, int]]:
    """(fault, node, gpu) to inject: nodes whose GPUs are all busy (no alert of their own, so each
    fault is alone in its Alertmanager group), each node used once, the GPU chosen at random."""
    busy = [n for n in range(nodes) if set(fleet.Node.roles_of(n)) == {"busy"}]
    rng = random.Random(seed)
    picked = rng.sample(busy, len(FAULTS) * faults_per_kind)
    return [(FAULTS[i % len(FAULTS)], n, rng.randrange(fleet.GPUS)) for i, n in enumerate(picked)]


def inject_all(top: Topology, plan: list[tuple[str, int, int]], every: float) -> tuple[list[dict], dict]:
    """Starts each fault of plan `every` seconds apart and SIGKILLs the Alertmanager replica that
    sends (peer position 0) half-way; returns the faults (with their injection time and uuid) and
    what was killed when."""
    done, killed = [], {}
    for i, (fault, node, gpu) in enumerate(plan):
        if i == len(plan) // 2:
            victim = next(j for j, am in enumerate(top.ams) if _position(am) == 0)
            top.am_procs[victim].send_signal(signal.SIGKILL)
            killed = {"replica": f"alertmanager-{victim}", "at": time.time(), "after_faults": i}
            top.procs.procs = [r for r in top.procs.procs if r.proc is not top.am_procs[victim]]
            top.pids.pop(f"alertmanager-{victim}")
        at = time.time()
        q = urllib.parse.urlencode({"node": node, "gpu": gpu, "fault": fault, "at": at})
        changed = int(get(f"{top.exporter}/inject?{q}"))
        if not changed:
            raise RuntimeError(f"injecting {fault} on node {node} GPU {gpu} changed no series")
        done.append({"fault": fault, "node": f"node-{node:04d}", "gpu": str(gpu), "at": at})
        top.sample_for(every)
    return done, killed


def _position(am: str) -> int:
    for line in get(f"{am}/metrics").decode().splitlines():
        if line.startswith("alertmanager_peer_position "):
            return int(float(line.split()[1]))
    return -1


def pages(hook: Webhook, fault: dict) -> list[float]:
    """Arrival times of the pager notifications whose alerts include this fault's alert, firing."""
    name = ALERT_OF[fault["fault"]]
    return [at for at, receiver, body in list(hook.got) if receiver == "pager" and any(
        a["status"] == "firing" and a["labels"].get("alertname") == name and a["labels"].get("node") == fault["node"]
        and a["labels"].get("gpu") == fault["gpu"] for a in body["alerts"])]


def duplicates(hook: Webhook, resend_s: float) -> int:
    """Notifications with the same receiver, group, status and alerts as one less than resend_s earlier."""
    last, dup = {}, 0
    for at, receiver, body in sorted(hook.got, key=lambda x: x[0]):
        if receiver == "watchdog":
            continue
        key = (receiver, body["groupKey"], body["status"],
               frozenset((tuple(sorted(a["labels"].items())), a["status"]) for a in body["alerts"]))
        dup += key in last and at - last[key] < resend_s
        last[key] = at
    return dup


# ------------------------------------------------------------------------------------------ the run


def steady_numbers(top: Topology, window: float) -> dict:
    """Ingest, series, CPU and vmalert numbers over `window` seconds of steady running."""
    before = [metrics(f"{p}/metrics") for p in top.proms]
    v0 = metrics(f"{top.vm}/metrics")
    c0 = {k: cpu_seconds(pid, children=False) for k, pid in top.pids.items()}
    w0 = time.monotonic()
    top.sample_for(window)
    w = time.monotonic() - w0
    after = [metrics(f"{p}/metrics") for p in top.proms]
    v1 = metrics(f"{top.vm}/metrics")
    res = {"window_s": w,
           "cpu_cores": {k: (cpu_seconds(pid, children=False) - c0[k]) / w for k, pid in top.pids.items()}}
    res["head_series"] = [total(m, "prometheus_tsdb_head_series") for m in after]
    res["samples_per_s"] = [(total(m1, "prometheus_tsdb_head_samples_appended_total")
                             - total(m0, "prometheus_tsdb_head_samples_appended_total")) / w
                            for m0, m1 in zip(before, after)]
    res["rw_failed"] = sum(total(m, "prometheus_remote_storage_samples_failed_total") for m in after)
    res["vm_rows_per_s"] = (total(v1, "vm_rows_inserted_total") - total(v0, "vm_rows_inserted_total")) / w
    res["vm_series"] = int(json.loads(get(f"{top.vm}/api/v1/series/count"))["data"][0])
    res["vmalert_rules"] = sum(len(g.get("rules", [])) for g in top.vmalert_groups())
    res["scrape_duration_max_s"] = max(scalar(p, 'max(scrape_duration_seconds{job="gpuobs"})') for p in top.proms)
    return res


def errors_and_misses(top: Topology) -> dict:
    """Rule failures and missed iterations (Prometheus shards), vmalert's errors (counters and each rule's last
    error)."""
    ms = [metrics(f"{p}/metrics") for p in top.proms]
    a = metrics(f"{top.vmalert}/metrics")
    errs = [f"{g['name']}/{r.get('name')}: {str(r.get('lastError'))[:200]}" for g in top.vmalert_groups()
            for r in g.get("rules", []) if r.get("lastError")]
    return {"prom_rule_failures": sum(total(m, "prometheus_rule_evaluation_failures_total") for m in ms),
            "prom_rule_missed": sum(total(m, "prometheus_rule_group_iterations_missed_total") for m in ms),
            "vmalert_errors": (total(a, "vmalert_recording_rules_errors_total")
                               + total(a, "vmalert_alerting_rules_errors_total")),
            "vmalert_rule_errors": errs[:10], "vmalert_rule_error_count": len(errs)}


def sharded_bench(workdir: Path, nodes: int, shards: int, window: float, faults_per_kind: int) -> dict:
    """The whole part: start the topology, wait for every node on exactly one shard, measure a steady
    window, inject faults (one Alertmanager replica killed half-way), wait for their pages."""
    template = workdir / "template.prom"
    template.write_text(fleet.node_template(workdir))
    res: dict = {"nodes": nodes, "gpus": nodes * fleet.GPUS, "shards": shards, "replicas": REPLICAS,
                 "template_series": len(fleet.parse_template(template.read_text())[0])}
    hook = Webhook()
    top = Topology(workdir, nodes, shards, template, hook)
    t0 = time.monotonic()
    try:
        for url in top.proms:
            wait_until("Prometheus ready", lambda url=url: get(f"{url}/-/ready"), 60, top.procs)
        wait_until("every node scraped", lambda: top.sample() or sum(map(len, top.targets_up())) >= nodes,
                   600, top.procs, 5)
        res["first_cycle_s"] = time.monotonic() - t0
        per_shard = top.targets_up()
        res["nodes_per_shard"] = [len(s) for s in per_shard]
        res["nodes_on_two_shards"] = len(set.intersection(*per_shard)) if shards > 1 else 0
        top.sample_for(60)  # one evaluation of every group with all the data, then the steady window
        res.update(steady_numbers(top, window))
        print(f"[sharded] steady: {json.dumps({k: v for k, v in res.items() if k != 'cpu_cores'})}", flush=True)
        plan = candidates(nodes, faults_per_kind)
        injected, res["killed"] = inject_all(top, plan, every=10.0)
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and not all(pages(hook, f) for f in injected):
            top.sample_for(SAMPLE_EVERY)
        top.sample_for(45)   # a replica's duplicate would come within (replicas - 1) x peer timeout (15 s)
        for f in injected:
            got = pages(hook, f)
            f["pages"] = len(got)
            f["latency_s"] = got[0] - f["at"] if got else None
        res["faults"] = injected
        res["duplicates"] = duplicates(hook, resend_s=300.0)
        res["notifications"] = len(hook.got)
        res.update(errors_and_misses(top))
        res["peak_rss_gib"] = {k: v / 2**30 for k, v in top.peak_rss.items()}
        res["rule_max_s"], res["rule_interval_s"] = dict(top.rule_max), dict(top.rule_interval)
        res["rw_lag_max_s"] = top.rw_lag_max
        v = metrics(f"{top.vm}/metrics")   # VictoriaMetrics' own accounting of what it has stored on disk
        res["vm_data_bytes"], res["vm_rows_stored"] = total(v, "vm_data_size_bytes"), total(v, "vm_rows")
        res["part_s"] = time.monotonic() - t0
        return res
    finally:
        top.stop()
        hook.close()


# ---------------------------------------------------------------------------------------- the report


def _met(ok: bool, how: str) -> str:
    return f"**met** ({how})" if ok else f"**missed** ({how})"


def latency_summary(faults: list[dict]) -> dict[str, tuple[float, float, int, int]]:
    """fault kind (and "all") -> (p50 s, p99 s, paged exactly once, injected)."""
    out = {}
    for kind in (*FAULTS, "all"):
        fs = [f for f in faults if kind in ("all", f["fault"])]
        lat = [f["latency_s"] for f in fs if f["latency_s"] is not None]
        out[kind] = (pct(lat, 0.5), pct(lat, 0.99),
                     sum(f["pages"] == 1 for f in fs), len(fs))
    return out


def sharded_report(s: dict, single: dict | None) -> list[str]:
    """The "distributed topology" subsection of BENCHMARKS.md's Fleet scale: goals, then the two runs side by side."""
    L = ["### The distributed topology (deploy/fleet) at fleet scale, next to one Prometheus", ""]
    if "error" in s:
        return L + [f"**Failed** with {s.get('nodes')} nodes: `{s['error']}`", ""]
    L += [f"Re-measured on its own: `{s['cmd']}` on {s['date']} ({s['cpu']}); {s['versions']}.", "",
          f"Method: deploy/fleet as shipped, on loopback: {s['shards']} Prometheus shards (hashmod on the node name; "
          f"each evaluates `alerts/gpuobs-local.rules.yml` and remote-writes to VictoriaMetrics), one VictoriaMetrics, "
          f"vmalert evaluating `alerts/gpuobs-global.rules.yml` on it, {s['replicas']} Alertmanager replicas clustered "
          "by gossip with the generated routing at its shipped timings (group wait 30 s, peer timeout 15 s). Every "
          "binary runs with the flags of deploy/fleet/default/ (scrape and evaluation every 15 s on the shards, 30 s "
          "on vmalert); only addresses, paths and retention differ, and 2 shards instead of the example's 4. The "
          f"nodes are bench/fleet.py's multi-target exporter serving the gpuobs exporter's default profile "
          f"({s['template_series']:,} series per 8 × H100 node), {s['nodes']:,} nodes ({s['gpus']:,} GPUs), all on "
          "this machine's two cores with everything else.", ""]
    L += goal_lines(s)
    L += side_by_side(s, single)
    L += fault_lines(s)
    return L


def goal_lines(s: dict) -> list[str]:
    fmt = fleet.fmt
    head = sum(s["head_series"])
    rss = sum(s["peak_rss_gib"].values())
    slow = {g: x for g, x in s["rule_max_s"].items() if x > s["rule_interval_s"].get(g, 30)}
    worst = max(s["rule_max_s"].items(), key=lambda kv: kv[1] / s["rule_interval_s"].get(kv[0], 30))
    lat = latency_summary(s["faults"])["all"]
    once = lat[2] == lat[3] and not s["duplicates"]
    errs = s["vmalert_errors"] + s["vmalert_rule_error_count"]
    return [
        "Goals:", "",
        f"- Head series ≤ {GOALS['head_series']:,} for {s['gpus']:,} GPUs: " + _met(
            head <= GOALS["head_series"],
            f"{head:,.0f} over the shards: " + " + ".join(f"{x:,.0f}" for x in s["head_series"])
            + (f"; over by {head - GOALS['head_series']:,.0f}, {100 * (head / GOALS['head_series'] - 1):.0f} %"
               if head > GOALS["head_series"] else "")),
        f"- Summed RSS ≤ 1/3 of 13.84 GiB ({fmt(GOALS['rss_gib'])} GiB): " + _met(
            rss <= GOALS["rss_gib"], f"{fmt(rss)} GiB, the sum of every process's peak, the node simulator included"),
        "- Every rule group's evaluation ≤ its interval: " + _met(
            not slow, f"slowest against its interval {worst[0]} {fmt(worst[1], 2)} s of "
            f"{s['rule_interval_s'].get(worst[0], 30):g} s"
            + (f"; over: {', '.join(f'{g} {fmt(x, 1)} s' for g, x in sorted(slow.items()))}" if slow else "")
            + f"; {s['prom_rule_missed']:.0f} iterations missed"),
        f"- remote_write lag ≤ {GOALS['rw_lag_s']:g} s: " + _met(
            s["rw_lag_max_s"] <= GOALS["rw_lag_s"],
            f"worst reading {fmt(s['rw_lag_max_s'], 1)} s, every {SAMPLE_EVERY:g} s "
            f"over the run; {s['rw_failed']:.0f} samples failed"),
        "- 0 vmalert errors: " + _met(
            errs == 0, f"{s['vmalert_errors']:.0f} counted, {s['vmalert_rule_error_count']} rules "
            f"with a last error, of {s['vmalert_rules']}"),
        "- Every injected fault paged exactly once, one Alertmanager replica killed: " + _met(
            once, f"{lat[2]} of {lat[3]} paged once, {s['duplicates']} duplicate notifications; fault to webhook "
            f"p50 {fmt(lat[0], 1)} s, p99 {fmt(lat[1], 1)} s"),
        "",
        *head_breakdown(s, head),
    ]


def head_breakdown(s: dict, head: float) -> list[str]:
    """Where the head series come from: the nodes' own series, Prometheus' per-target series, and the rest
    (the local tier's records and ALERTS), with what is left to cut when the goal is missed."""
    served, auto = s["nodes"] * s["template_series"], s["nodes"] * SCRAPE_SERIES
    rest = head - served - auto
    line = (f"Head series by origin: {served:,} served by the nodes ({s['template_series']} per 8-GPU node: 40 per GPU "
            f"and the exporter's self-health), {auto:,} that Prometheus adds per target (`up` and the "
            f"`scrape_*` series), {rest:,.0f} recorded by the local tier (5 per GPU for the degradation trends and "
            "allocation, about 16 per node for the node panels) and `ALERTS`.")
    if head > GOALS["head_series"]:
        line += (f" The exporters alone serve {served:,} ({served / s['gpus']:.1f} per GPU); the goal is missed by the "
                 f"records. Each per-GPU record is the input of a degradation alert that compares it with its own "
                 "past (a median over hours), which a record that skips zeros would change, so they stay.")
    return [line, ""]


def side_by_side(s: dict, single: dict | None) -> list[str]:
    """The measures of this run next to the single-Prometheus run's (bench/fleet.py's live part)."""
    fmt = fleet.fmt
    o = single or {}
    rows = [
        ("GPUs; series per node served", f"{o.get('gpus', 0):,}; 1,885 (then the default)",
         f"{s['gpus']:,}; {s['template_series']:,}"),
        ("Prometheus servers; rule files", "1; gpuobs.rules.yml (every rule)",
         f"{s['shards']}; local tier (shards) + global tier (vmalert)"),
        ("head series (sum over Prometheus servers)", f"{o.get('prom_head_series', 0):,.0f}",
         f"{sum(s['head_series']):,.0f}"),
        ("ingest, samples/s (sum)", fmt(o.get("prom_samples_per_s"), 0), fmt(sum(s["samples_per_s"]), 0)),
        ("first scrape of every node done after (s)", fmt(o.get("first_cycle_s"), 0), fmt(s["first_cycle_s"], 0)),
        ("longest rule group evaluation (s)", fmt(max(o.get("prom_rule_groups", {0: 0}).values()), 1),
         fmt(max(s["rule_max_s"].values()), 1)),
        ("missed rule iterations", f"{o.get('prom_rule_missed', 0):.0f}", f"{s['prom_rule_missed']:.0f}"),
        ("remote_write lag (s)", fmt(o.get("rw_lag_s"), 1), fmt(s["rw_lag_max_s"], 1)),
        ("VictoriaMetrics series", f"{o.get('vm_series', 0):,}", f"{s['vm_series']:,}"),
        ("vmalert errors", f"{len(o.get('vmalert_rule_errors', []))}", f"{s['vmalert_rule_error_count']}"),
        ("peak RSS, GiB: Prometheus (sum)", fmt(o.get("peak_rss_gib", {}).get("prometheus")),
         fmt(sum(v for k, v in s["peak_rss_gib"].items() if k.startswith("prometheus")))),
        ("peak RSS, GiB: VictoriaMetrics; vmalert", f"{fmt(o.get('peak_rss_gib', {}).get('victoria-metrics'))}; "
         f"{fmt(o.get('peak_rss_gib', {}).get('vmalert'))}",
         f"{fmt(s['peak_rss_gib']['victoria-metrics'])}; {fmt(s['peak_rss_gib']['vmalert'])}"),
        ("peak RSS, GiB: Alertmanager (sum of replicas); node simulator",
         f"n/a; {fmt(o.get('peak_rss_gib', {}).get('exporter'))}",
         f"{fmt(sum(v for k, v in s['peak_rss_gib'].items() if k.startswith('alertmanager')))}; "
         f"{fmt(s['peak_rss_gib']['exporter'])}"),
        ("peak RSS, GiB: all", fmt(sum(o.get("peak_rss_gib", {}).values())), fmt(sum(s["peak_rss_gib"].values()))),
        ("CPU cores in the steady window: Prometheus (sum); VM; vmalert",
         f"{fmt(o.get('cpu_cores', {}).get('prometheus'))}; {fmt(o.get('cpu_cores', {}).get('victoria-metrics'))}; "
         f"{fmt(o.get('cpu_cores', {}).get('vmalert'))}",
         f"{fmt(sum(v for k, v in s['cpu_cores'].items() if k.startswith('prometheus')))}; "
         f"{fmt(s['cpu_cores']['victoria-metrics'])}; {fmt(s['cpu_cores']['vmalert'])}"),
    ]
    return ["| measure | one Prometheus (fleet.live, " + (o.get("date") or "earlier run")
            + ") | distributed (this run) |",
            "|---|---:|---:|", *[f"| {a} | {b} | {c} |" for a, b, c in rows], "",
            "Rule groups, longest evaluation seen over the run (s) / interval (s): " + ", ".join(
                f"{g} {fmt(x, 2)}/{s['rule_interval_s'].get(g, 30):g}"
                for g, x in sorted(s["rule_max_s"].items())) + ".", ""]


def fault_lines(s: dict) -> list[str]:
    fmt = fleet.fmt
    lat = latency_summary(s["faults"])
    k = s["killed"]
    L = [f"Faults: {len(s['faults'])} injected 10 s apart on GPUs of nodes that had no alert of their own (so each "
         "is alone in its Alertmanager group); the exporter serves the fault from the injection on. "
         f"{k.get('replica')} (the replica at peer position 0, the one that sends) was SIGKILLed before fault "
         f"{k.get('after_faults', 0) + 1}. Latency is from the injection to the first pager notification carrying the "
         "fault's alert: a scrape (≤ 15 s), the rule's `for` (1 m for GpuLost and GpuHwThermalSlowdown, none for "
         "XID 79) and evaluation (≤ 30 s), the group wait (30 s), and after the kill the survivors' peer timeout.", "",
         "| fault | alert | injected | paged exactly once | p50 (s) | p99 (s) |", "|---|---|---:|---:|---:|---:|"]
    for kind in FAULTS:
        p50, p99, once, n = lat[kind]
        L.append(f"| {kind} | {ALERT_OF[kind]} | {n} | {once} | {fmt(p50, 1)} | {fmt(p99, 1)} |")
    p50, p99, once, n = lat["all"]
    L += [f"| all | | {n} | {once} | {fmt(p50, 1)} | {fmt(p99, 1)} |", ""]
    unpaged = [f for f in s["faults"] if f["pages"] != 1]
    if unpaged:
        L += ["Not paged exactly once: " + ", ".join(f"{f['fault']} on {f['node']} GPU {f['gpu']} ({f['pages']} pages)"
                                                     for f in unpaged), ""]
    if s["vmalert_rule_error_count"]:
        L += ["vmalert rule errors: " + "; ".join(f"`{e}`" for e in s["vmalert_rule_errors"]), ""]
    return L


def single_run(fleet_result: dict) -> dict | None:
    """The single-Prometheus live numbers of a bench/fleet.py result, with that run's date."""
    live = fleet_result.get("live")
    return {**live, "date": fleet_result.get("date")} if live and "error" not in live else None


def main() -> None:
    from bench.run import write_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="125 nodes, fewer faults")
    ap.add_argument("--nodes", type=int, help="nodes of 8 GPUs (default 1250, quick 125)")
    ap.add_argument("--shards", type=int, default=2, help="Prometheus shards (default 2)")
    ap.add_argument("--no-save", action="store_true",
                    help="print the section; leave bench/last_run.json and BENCHMARKS.md")
    ap.add_argument("--save", action="store_true", help="with --quick or --nodes: replace the committed "
                    "bench/last_run.json and BENCHMARKS.md anyway (a full run does by default)")
    a = ap.parse_args()
    nodes = a.nodes or (125 if a.quick else 1250)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuobs-sharded-") as tmp:
        try:
            res = sharded_bench(Path(tmp), nodes, a.shards, window=30 if a.quick else 60,
                                faults_per_kind=2 if a.quick else 4)
        except Exception as e:  # noqa: BLE001 - reported in the section, with the traceback on stderr
            import traceback

            traceback.print_exc()
            res = {"nodes": nodes, "error": f"{type(e).__name__}: {e}"[:1500]}
    res.update(cmd=".venv/bin/python bench/fleet_sharded.py" + (" --quick" if a.quick else "")
               + (f" --nodes {a.nodes}" if a.nodes else ""),
               date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               cpu=f"{cpu_model()}, {os.cpu_count()} logical cores", elapsed=time.monotonic() - started,
               versions="; ".join(version([need(b), f], p) for b, f, p in (
                   ("prometheus", "--version", "prometheus"), ("victoria-metrics", "-version", "victoria-metrics"),
                   ("prometheus-alertmanager", "--version", "prometheus-alertmanager"))))
    saved = ROOT / "bench" / "last_run.json"
    run = json.loads(saved.read_text())
    print("\n".join(sharded_report(res, single_run(run.get("fleet", {})))))
    if a.no_save or ((a.quick or a.nodes) and not a.save):  # a smaller run never replaces the committed one
        print("not saved: bench/last_run.json and BENCHMARKS.md left as they are" + ("" if a.no_save else
              " (a --quick or --nodes run; --save replaces them)"))
        return
    run.setdefault("fleet", {})["sharded"] = res
    report = write_report(run, run["cmd"])  # rendered before either write: a failure writes nothing
    write_result(saved, json.dumps(run, indent=1, default=str))
    write_result(ROOT / "BENCHMARKS.md", report)


if __name__ == "__main__":
    main()
