"""The Grafana dashboards: the generator writes every file (their drift: tests/test_generate.py),
every panel follows the conventions (lint), the dashboards cover the catalog, and every panel
query, run against a real Prometheus scraping a realistic fleet (three simulated nodes, two
training ranks, an inference server), parses and returns data."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import REPO, free_port, free_port_run, require_tool, serve_static, stop
from test_attribution import kubelet  # noqa: F401 - a fixture: node-a's pod attribution

from gpuobs import catalog as c
from gpuobs import records
from gpuobs.alerts.build import write_fast_rules
from gpuobs.collect import REGISTRY
from gpuobs.dashboards import common as k
from gpuobs.dashboards.build import DASHBOARDS, dashboard_json, outputs
from gpuobs.dashboards.common import (
    DATASOURCE,
    MAX_PANEL_ID,
    SCHEMA_VERSION,
    UIDS,
    VARIABLE,
    Layout,
    PanelIdError,
    interpolate,
    panel_id,
    panel_identity,
    sel,
)
from gpuobs.generated import write
from gpuobs.sim import Simulator, scenario
from gpuobs.sim.state import set_val

GIB = 1024 ** 3
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "state-timeline", "heatmap"}
ANGULAR = {"graph", "singlestat", "table-old", "heatmap-old", "grafana-piechart-panel", "grafana-worldmap-panel",
           "natel-discrete-panel", "flant-statusmap-panel", "grafana-singlestat-panel", "text-old"}
BUILTINS = {"__rate_interval", "__range", "__interval"}
# samples rate()/increase() may read: counters (with _total) and histogram series, from the catalog's kinds
COUNTERS = {m.exposed_name for m in c.ALL if m.kind == "counter"} | {
    s for m in c.ALL if m.kind == "histogram" for s in m.prometheus_samples}
GAUGES = {m.exposed_name for m in c.ALL if m.kind in ("gauge", "info")}
RATE_CALL = re.compile(r"(?<![\w:])(rate|irate|increase)\s*\(")
RATE_ARG = re.compile(r"(rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)\s*(\{[^{}]*\})?\s*\[([^\]]+)\]\s*\)")


def load() -> dict[str, dict]:
    """The dashboards as generated now, by file name."""
    return {name: json.loads(content) for name, content in
            ((p.stem, t) for p, t in outputs(REPO).items() if p.suffix == ".json")}


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def queries(dashboard: dict) -> list[tuple[dict, dict]]:
    return [(p, t) for p in panels(dashboard) if p["type"] != "row" for t in p["targets"]]


# ---------------------------------------------------------------------------------------- drift
def test_generator_writes_every_file_in_dashboards_only(tmp_path):
    import yaml

    assert set(DASHBOARDS) == {"fleet-overview", "node", "training-job", "inference-service", "exporter-health",
                               "fleet-efficiency"}
    written = write(outputs(tmp_path))
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        *(f"dashboards/{n}.json" for n in DASHBOARDS), "dashboards/provisioning/dashboards.yaml",
        "dashboards/provisioning/datasources.yaml", "dashboards/kustomization.yaml"}
    kustomization = yaml.safe_load((tmp_path / "dashboards" / "kustomization.yaml").read_text())
    assert [g["files"] for g in kustomization["configMapGenerator"]] == [[f"{n}.json"] for n in sorted(DASHBOARDS)]


def test_provisioning_files():
    import yaml

    provider = yaml.safe_load((REPO / "dashboards" / "provisioning" / "dashboards.yaml").read_text())
    assert provider["providers"][0]["type"] == "file" and provider["providers"][0]["options"]["path"]
    ds = yaml.safe_load((REPO / "dashboards" / "provisioning" / "datasources.yaml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["uid"] == "prometheus" and ds["jsonData"]["timeInterval"]


# ----------------------------------------------------------------------------------------- lint
def rate_violations(expr: str) -> list[str]:
    """rate/irate/increase calls that are not fn(counter{...}[$__rate_interval])."""
    problems = []
    calls = RATE_CALL.findall(expr)
    args = RATE_ARG.findall(expr)
    if len(args) != len(calls):
        problems.append(f"a rate()/increase() whose argument is not a plain range selector: {expr}")
    for fn, name, _, window in args:
        if name in GAUGES:
            problems.append(f"{fn}() over the gauge {name}")
        elif name not in COUNTERS:
            problems.append(f"{fn}() over {name}, which is not a catalog counter or histogram series")
        if window != "$__rate_interval":
            problems.append(f"{fn}({name}[{window}]) instead of [$__rate_interval]")
    return problems


def test_rate_lint_catches_mistakes():
    assert rate_violations("sum(rate(gpuobs_gpu_pcie_replays_total{a=\"b\"}[$__rate_interval]))") == []
    assert rate_violations("rate(gpuobs_gpu_temperature_celsius[$__rate_interval])")
    assert rate_violations("increase(gpuobs_gpu_pcie_replays_total[5m])")
    assert rate_violations("rate(job_id:gpuobs_training_tokens:rate[$__rate_interval])")
    assert rate_violations("rate(sum(gpuobs_gpu_pcie_replays_total)[5m:])")
    assert rate_violations("rate(gen_ai_server_request_duration_seconds_bucket[$__rate_interval])") == []


def overlaps(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def _variable_problems(variables: dict[str, dict]) -> list[str]:
    return [f"variable {v['name']}: not label_values() on ${{datasource}}" for v in variables.values()
            if v["type"] == "query" and (v["datasource"] != DATASOURCE or not v["query"].startswith("label_values("))]


def _grid_problems(every: list[dict]) -> list[str]:
    """Panels outside the 24 columns, overlapping, or sharing an id."""
    problems = []
    ids = [p["id"] for p in every]
    if len(ids) != len(set(ids)):
        problems.append(f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}")
    for i, p in enumerate(every):
        g = p["gridPos"]
        if not (0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0 and g["y"] >= 0):
            problems.append(f"{p['title']}: grid position {g} outside the 24 columns")
        problems += [f"{p['title']} {g} overlaps {q['title']} {q['gridPos']}" for q in every[i + 1:]
                     if overlaps(g, q["gridPos"])]
    return problems


def _panel_problems(p: dict) -> list[str]:
    """A panel's type, unit, datasource, queries' refIds and links."""
    title, problems = p["title"], []
    if p["type"] in ANGULAR or p["type"] not in PANEL_TYPES:
        problems.append(f"{title}: panel type {p['type']} (Angular or not allowed)")
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
    if not unit or unit == "none":
        problems.append(f"{title}: no unit")
    if p["type"] == "heatmap" and p["options"]["yAxis"].get("unit") != unit:
        problems.append(f"{title}: heatmap y axis without the unit")
    if p["datasource"] != DATASOURCE:
        problems.append(f"{title}: datasource {p['datasource']} is not ${{datasource}}")
    if not p["targets"]:
        problems.append(f"{title}: no query")
    refs = [t["refId"] for t in p["targets"]]
    if len(refs) != len(set(refs)):
        problems.append(f"{title}: duplicate refIds")
    problems += [f"{title}: link to an unknown dashboard: {link['url']}"
                 for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])
                 if not any(f"/d/{uid}/" in link["url"] for uid in UIDS.values())]
    return problems


def _target_problems(title: str, t: dict, variables: dict[str, dict]) -> list[str]:
    """A query's datasource, rate() windows and template variables."""
    problems = [f"{title}: {x}" for x in rate_violations(t["expr"])]
    if t["datasource"] != DATASOURCE:
        problems.append(f"{title}: target {t['refId']} datasource is not ${{datasource}}")
    problems += [f"{title}: unknown variable ${var}" for var in (a or b for a, b in VARIABLE.findall(t["expr"]))
                 if var not in variables and var not in BUILTINS]
    return problems


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_lint(name):
    d = load()[name]
    assert d["uid"] in UIDS.values() and d["schemaVersion"] >= SCHEMA_VERSION >= 39
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    every = panels(d)
    problems = _variable_problems(variables) + _grid_problems(every)
    for p in every:
        if p["type"] != "row":
            problems += _panel_problems(p)
            problems += [x for t in p["targets"] for x in _target_problems(p["title"], t, variables)]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------- panel ids
def _by_identity(dashboard: dict) -> dict[tuple[str | None, str], dict]:
    """{(row title, panel title): panel}, rows as (None, title): every panel by its identity."""
    out, row = {}, ""
    for p in panels(dashboard):
        key = (None, p["title"]) if p["type"] == "row" else (row, p["title"])
        row = p["title"] if p["type"] == "row" else row
        assert key not in out, f"two panels {key}"
        out[key] = p
    return out


def _ids(dashboard: dict) -> dict[tuple[str | None, str], int]:
    return {key: p["id"] for key, p in _by_identity(dashboard).items()}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_are_unique_positive_32_bit_integers(name):
    ids = list(_ids(load()[name]).values())
    assert len(ids) == len(set(ids)) > 1
    assert all(isinstance(i, int) and 1 <= i <= MAX_PANEL_ID < 2**31 for i in ids)


def _built_with_an_extra_panel(name: str, monkeypatch) -> dict:
    """Dashboard `name` built with, before each row after its first, an extra row of one panel, and a
    panel more at the start of that row (so every panel after them moves)."""
    row = Layout.row

    def extra(self, title):
        self.add(k.stat(title, [k.target("vector(1)")], "short"), 24, 3)

    def extra_row_and_row(self, title, key=None):
        if self.panels:
            row(self, f"Extra row before {title}")
            extra(self, f"Extra panel before {title}")
        row(self, title, key)
        if len(self.identities) > 1:
            extra(self, f"Extra panel in {title}")

    monkeypatch.setattr(Layout, "row", extra_row_and_row)
    return json.loads(dashboard_json(DASHBOARDS[name]()))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_inserting_panels_changes_no_other_panels_id(name, monkeypatch):
    before = json.loads(dashboard_json(DASHBOARDS[name]()))
    after = _built_with_an_extra_panel(name, monkeypatch)
    old, new = _ids(before), _ids(after)
    assert {key: new[key] for key in old} == old  # every panel kept its id...
    placed = _by_identity(after)
    moved = [key for key, p in _by_identity(before).items() if p["gridPos"] != placed[key]["gridPos"]]
    assert moved, "the extra panels moved no other panel: the test proves nothing"  # ...though others moved
    added = set(new) - set(old)
    assert len(added) >= 2 and not {new[key] for key in added} & set(old.values())


def _layout(*titles: str) -> Layout:
    L = Layout()
    L.row("Row")
    for title in titles:
        L.add(k.stat(title, [k.target("vector(1)")], "short"), 6, 4)
    return L


def test_two_panels_of_one_identity_fail_the_build():
    with pytest.raises(PanelIdError, match="two panels in row 'Row' titled 'Twice'.*explicit key"):
        k.dashboard("t", "node", "", _layout("Once", "Twice", "Twice"), [], [])
    L = _layout("Once", "Twice")
    L.add(k.stat("Twice", [k.target("vector(1)")], "short"), 6, 4, key="Twice, the second")  # a key resolves it
    assert len({p.id for p in k.dashboard("t", "node", "", L, [], []).panels}) == 4
    L.row("Row")
    with pytest.raises(PanelIdError, match="two rows titled 'Row'"):
        k.dashboard("t", "node", "", L, [], [])
    L = _layout("Once")
    L.row("Another row")
    L.add(k.stat("Once", [k.target("vector(1)")], "short"), 6, 4)  # the same title in another row: its own id
    assert len({p.id for p in k.dashboard("t", "node", "", L, [], []).panels}) == 4


def test_a_hash_collision_fails_the_build():
    seen: dict[int, str] = {}
    for i in itertools.count():  # birthday bound: about 58,000 titles to two alike in 2^31 ids
        title = f"panel {i}"
        pid = panel_id(panel_identity(UIDS["node"], "Row", title))
        if pid in seen:
            break
        seen[pid] = title
    with pytest.raises(PanelIdError, match=f"hash to the same id {pid}"):
        k.dashboard("t", "node", "", _layout(seen[pid], title), [], [])


def _data_links(d: dict) -> str:
    return " ".join(link["url"] for p in panels(d) for link in p.get("fieldConfig", {}).get("defaults", {})
                    .get("links", []))


def test_links_fleet_to_node_to_job():
    ds = load()
    assert f"/d/{UIDS['node']}/" in _data_links(ds["fleet-overview"])
    assert f"/d/{UIDS['training']}/" in _data_links(ds["node"]) and "var-job_id=" in _data_links(ds["node"])
    assert f"/d/{UIDS['node']}/" in _data_links(ds["training-job"])
    for d in ds.values():
        assert {link["url"].split("/")[2] for link in d["links"]} <= set(UIDS.values())


def _link_target(url: str) -> tuple[str, dict[str, str]]:
    """(dashboard uid, {query parameter: value}) of a /d/<uid>/<slug>?... link."""
    path, _, query = url.partition("?")
    return path.split("/")[2], dict(p.partition("=")[::2] for p in query.split("&"))


def test_gpu_metrics_at_this_time_links_training_series_to_their_nodes():
    """The step-time panels link each series to the node dashboard for its node, the same cluster and
    the same time range; every variable the link sets exists there, and the series carry `node`
    (the live test below checks each one gets a value)."""
    ds = load()
    node_vars = {v["name"] for v in ds["node"]["templating"]["list"]}
    linked = [(p, link) for p in panels(ds["training-job"])
              for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])
              if link["title"].startswith("GPU metrics at this time")]
    assert {p["title"] for p, _ in linked} >= {"Step time p50 by rank", "Step time p99 by rank",
                                               "Slow steps: p99 by rank with exemplars"}
    for p, link in linked:
        uid, params = _link_target(link["url"])
        assert uid == UIDS["node"] and ds["node"]["uid"] == uid
        assert params.pop("${__url_time_range}") == ""  # Grafana expands it to from=...&to=...
        assert params == {"var-datasource": "${datasource}", "var-cluster": "${__field.labels.cluster}",
                          "var-node": "${__field.labels.node}"}
        assert {k.removeprefix("var-") for k in params} <= node_vars
        assert all(re.search(r"by \(rank, node(, le)?\)", t["expr"]) for t in p["targets"]), p["targets"]


def test_exemplars_on_the_step_time_and_request_latency_buckets():
    """exemplar: true exactly on queries of the histograms that carry exemplars (their buckets), and
    on the step-time and request-latency panels of the training and inference dashboards."""
    from gpuobs.instrument.providers import EXEMPLAR_METRICS

    buckets = {f"{m.name}_bucket" for m in EXEMPLAR_METRICS}
    on = {(name, p["title"]) for name, d in load().items() for p, t in queries(d) if t.get("exemplar")}
    assert on == {("training-job", "Step time distribution"),
                  ("training-job", "Slow steps: p99 by rank with exemplars"),
                  ("inference-service", "Latency distribution"),
                  ("inference-service", "Slow requests: p99 with exemplars")}
    for name, d in load().items():
        for p, t in queries(d):
            if t.get("exemplar"):
                assert any(b in t["expr"] for b in buckets), (name, p["title"], t["expr"])


def test_prometheus_datasource_links_exemplar_trace_ids_to_jaeger(monkeypatch):
    import yaml

    from gpuobs.dashboards.build import TRACING_URL, datasource_file
    from gpuobs.dashboards.build import outputs as generated

    by_name = {d["name"]: d for d in yaml.safe_load(
        (REPO / "dashboards" / "provisioning" / "datasources.yaml").read_text())["datasources"]}
    jaeger = by_name["Jaeger"]
    assert jaeger["type"] == "jaeger" and jaeger["uid"] == "jaeger" and jaeger["url"] == TRACING_URL
    assert by_name["Prometheus"]["jsonData"]["exemplarTraceIdDestinations"] == [
        {"name": "trace_id", "datasourceUid": "jaeger"}]  # the label gpuobs.instrument.exemplars writes
    monkeypatch.setenv("GPUOBS_TRACING_DATASOURCE_UID", "tempo")  # the uid is configurable
    text = generated(REPO)[REPO / "dashboards" / "provisioning" / "datasources.yaml"]
    assert text == datasource_file(trace_uid="tempo")
    assert {d["uid"] for d in yaml.safe_load(text)["datasources"]} == {"prometheus", "tempo"}
    assert "datasourceUid: tempo" in text


def _exprs(d: dict) -> str:
    return "\n".join(t["expr"] for _, t in queries(d)) + "\n" + "\n".join(
        v["query"] for v in d["templating"]["list"])


@pytest.mark.parametrize("name, families", [
    ("node", set(REGISTRY)), ("exporter-health", {"exporter"}), ("training-job", {"training", "telemetry"}),
    ("inference-service", {"inference"})])
def test_dashboards_cover_the_catalog(name, families):
    """The node dashboard shows every per-GPU family, the others every metric of theirs."""
    text = _exprs(load()[name])
    missing = [m.name for m in c.ALL if m.family in families
               if not any(re.search(rf"\b{re.escape(s)}\b", text) for s in m.prometheus_samples)]
    assert not missing, f"{name} shows nothing of {missing}"


def test_fleet_reads_the_recording_rules():
    from gpuobs.alerts.rules import DEFAULT
    from gpuobs.records import recording_rules

    text = _exprs(load()["fleet-overview"])
    used = {r.record for r in recording_rules(DEFAULT) if r.record in text}
    assert {"cluster:gpuobs_gpus_expected:sum", "cluster:gpuobs_gpus_present:sum", "cluster:gpuobs_gpus_lost:count",
            "cluster:gpuobs_gpu_utilization_ratio:avg", "cluster:gpuobs_gpu_sm_active_ratio:avg",
            "cluster:gpuobs_gpus_allocated_idle:count", "cluster_reason:gpuobs_gpu_clock_event_reason_active:sum",
            "cluster:gpuobs_gpu_power_usage_watts:sum", "cluster:gpuobs_gpu_power_limit_watts:sum",
            "cluster_xid:gpuobs_gpu_xid_errors:increase", "cluster:gpuobs_gpu_ecc_uncorrected:increase"} <= used
    records = {r.record for r in recording_rules(DEFAULT)}
    for d in load().values():  # a recording rule a dashboard names must exist
        for name in re.findall(r"\b[a-z_]+:[a-z_0-9]+:[a-z_0-9]+\b", _exprs(d)):
            assert name in records, f"{d['title']} reads {name}, which no recording rule defines"


# -------------------------------------------------------------------------------- query against data
# Values the template variables take in the scenario below (multi-valued ones as Grafana writes a
# multi-selection: a regex alternation; All is .*).
VALUES = {
    "fleet-overview": {"cluster": "east", "node": "node-a", "model": "NVIDIA H200"},
    "node": {"cluster": "east", "node": "node-a", "gpu": ".*"},
    "training-job": {"job_id": "example-job", "rank": "(0|1)"},
    "inference-service": {"model": "llama-3-8b", "operation": "chat"},
    "exporter-health": {"job": "gpuobs", "cluster": "east", "node": "(node-a|node-c)"},
    "fleet-efficiency": {"cluster": "east"},
}
BUILTIN_VALUES = {"__rate_interval": "1m", "__range": "1m", "__interval": "15s"}
# Targets that are legitimately empty in this scenario: (dashboard, panel title, refId) -> why.
EXEMPT = {
    ("training-job", "Non-finite values", "A"): "the example's loss stays finite: the counter is never created",
}
SERVER = """
import random, time
from gpuobs import instrument
instrument.configure(service_name="gpuobs-test-serve")
rng = random.Random(0)
while True:
    try:
        with instrument.request(model="llama-3-8b", operation="chat", batch_size=rng.choice([1, 2, 4, 8])) as r:
            time.sleep(0.004)
            r.first_token()
            time.sleep(0.01)
            if rng.random() < 0.1:
                raise TimeoutError("deadline exceeded")
            r.tokens(input=512, output=64)
    except TimeoutError:
        pass
"""


def substitute(expr: str, values: dict[str, str]) -> str:
    return interpolate(expr, {**BUILTIN_VALUES, **values})


class Prometheus:
    """A real Prometheus with one scrape job per kind of target, each target labelled with its
    cluster and node as a service-discovery relabelling would, evaluating the fast rule profile."""

    def __init__(self, tmp_path, jobs: dict[str, list[tuple[str, str, str]]]):
        binary = require_tool("prometheus")
        self.port = free_port()
        lines = ["global: {scrape_interval: 1s, evaluation_interval: 1s}",
                 f"rule_files: ['{write_fast_rules(tmp_path)}']", "scrape_configs:"]
        for job, targets in jobs.items():
            lines += [f"  - job_name: {job}", "    static_configs:"]
            lines += [f"      - {{targets: ['{t}'], labels: {{cluster: {cl}, node: {n}}}}}" for t, cl, n in targets]
        config = tmp_path / "prometheus.yml"
        config.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'prom'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def query(self, promql: str) -> list[dict]:
        """Instant query; raises AssertionError with Prometheus's message if it does not parse."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            try:
                body = json.load(e)
            except ValueError:  # no API answer (a starting Prometheus's 503 page): an OSError, ready() retries
                raise e from None
            raise AssertionError(f"{body.get('errorType')}: {body.get('error')}\n  {promql}") from None
        assert body["status"] == "success", body
        return body["data"]["result"]

    def ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if self.query('up{job="gpuobs"} == 1'):
                    return
            except OSError:
                pass
            time.sleep(0.3)
        pytest.fail("prometheus never saw an exporter up")


def variable_queries(d: dict, values: dict[str, str]) -> list[tuple[str, str, str]]:
    """(variable, label, PromQL) for each label_values(selector, label) variable."""
    out = []
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            selector, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]).groups()
            out.append((v["name"], label, f"count by ({label}) ({substitute(selector, values)})"))
    return out


def _node_a(exporter, tmp_path, kubelet_socket: str):
    """node-a, a mixed node with faults whose exporter runs in this process on the simulator: H200 /
    H100 with MIG / A100 (with pre-Ampere style page retirement) / L40S / RTX, plus an A100 to lose,
    and Slurm job and (from the kubelet at kubelet_socket) pod attribution."""
    spec = scenario.load(REPO / "examples" / "scenarios" / "mixed-faults.yaml")
    spec["gpus"][2]["overrides"] = {"retired_pages": {"sbe": 2, "dbe": 0, "pending": 0}}
    spec["gpus"][0]["overrides"] = {"fabric": {"health_mask": 0}}  # the H200's fabric reports health (v2 call)
    spec["gpus"].append({"profile": "a100-40gb"})
    jobs = tmp_path / "slurm-jobs"  # Slurm job attribution on node-a, for the attribution panels
    jobs.mkdir()
    (jobs / "0").write_text("4242\n")
    (jobs / "3").write_text("4242\n")  # job 4242 also holds the L40S: a pair without NVLink (placement panel)
    kernel_log = tmp_path / "kern.log"  # node-a's kernel log, a file standing in for /dev/kmsg
    kernel_log.touch()
    run = exporter(spec, interval=0.5, slurm_job_dir=str(jobs), kernel_log=str(kernel_log), kernel_log_state="",
                   kubelet_socket=kubelet_socket, attribution_refresh=0.5)
    st = run.sim.state
    bus = st.gpu(2).bus_id.s.decode()[4:-2]  # NVML's 00000000:18:00.0 as the kernel writes it: 0000:18:00
    with open(kernel_log, "a") as f:  # an XID the NVML events missed, and an NVLink message
        f.write(f"NVRM: Xid (PCI:{bus}): 48, pid=1, name=python, An uncorrectable double bit error\n"
                f"NVRM: GPU at PCI:{bus}: NVLink: fatal error detected on link 3\n")
    set_val(st.gpu(0).clock_events, 0x4)  # H200 held at its power cap
    set_val(st.gpu(0).gpm[scenario.GPM_SLOT["sm_util"]], 40.0)  # ...at 40 % SM activity: a MIG candidate
    set_val(st.gpu(3).mem_used, 20 * GIB)  # L40S allocated but idle
    set_val(st.gpu(3).util_gpu, 0)
    set_val(st.gpu(2).util_enc, 150)  # an impossible value: dropped and counted
    st.fail("nvmlDeviceGetEncoderUtilization", 999, gpu=3)  # a failing NVML call, counted by call and code
    return run


# kube-state-metrics and Kueue as their documentation names their series: a team label on one of
# node-a's pod namespaces, a pod pending with 2 GPUs, a cluster queue using 2 GPUs of a quota of 4
CLUSTER_STATE = {
    "kube-state-metrics": """\
# HELP kube_namespace_labels Kubernetes labels converted to Prometheus labels.
# TYPE kube_namespace_labels gauge
kube_namespace_labels{namespace="ml-research",label_team="ml"} 1
kube_namespace_labels{namespace="sandbox"} 1
# HELP kube_pod_status_phase The pods current phase.
# TYPE kube_pod_status_phase gauge
kube_pod_status_phase{namespace="sandbox",pod="queued-0",uid="u-1",phase="Pending"} 1
kube_pod_status_phase{namespace="sandbox",pod="queued-0",uid="u-1",phase="Running"} 0
# HELP kube_pod_container_resource_requests The number of requested request resource by a container.
# TYPE kube_pod_container_resource_requests gauge
kube_pod_container_resource_requests{namespace="sandbox",pod="queued-0",uid="u-1",container="main",\
resource="nvidia_com_gpu",unit="integer"} 2
""",
    "kueue": """\
# HELP kueue_pending_workloads The number of pending workloads, per 'cluster_queue' and 'status'.
# TYPE kueue_pending_workloads gauge
kueue_pending_workloads{cluster_queue="research",status="active"} 1
kueue_pending_workloads{cluster_queue="research",status="inadmissible"} 0
# HELP kueue_cluster_queue_resource_usage Reports the cluster_queue's total resource usage.
# TYPE kueue_cluster_queue_resource_usage gauge
kueue_cluster_queue_resource_usage{cohort="all",cluster_queue="research",flavor="h100",resource="nvidia.com/gpu"} 2
# HELP kueue_cluster_queue_nominal_quota Reports the cluster_queue's resource nominal quota.
# TYPE kueue_cluster_queue_nominal_quota gauge
kueue_cluster_queue_nominal_quota{cohort="all",cluster_queue="research",flavor="h100",resource="nvidia.com/gpu"} 4
"""}


def _serve_cluster_state(servers: list) -> dict[str, list[tuple[str, str, str]]]:
    """Serve CLUSTER_STATE's static expositions (stdlib HTTP servers, appended to servers); their scrape jobs."""
    jobs = {}
    for job, text in CLUSTER_STATE.items():
        server = serve_static(text.encode())
        servers.append(server)
        jobs[job] = [(f"127.0.0.1:{server.server_address[1]}", "east", "node-a")]
    return jobs


def _start_targets(nodes: list[Simulator], procs: list, node_a: int,
                   rank_gpu: str = "") -> dict[str, list[tuple[str, str, str]]]:
    """Start the exporters of node-b and node-c, two training ranks (rank 1 the straggler, both on the
    GPU of UUID rank_gpu, for the slowdown-cause panels) and an inference server, appending each
    process to procs; the scrape jobs: (target, cluster, node)."""
    exporters = {}
    for name, sim, extra in (("node-b", nodes[0], []), ("node-c", nodes[1], ["--expected-gpus", "2"])):
        exporters[name] = port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1", "--port", str(port),
             "--interval", "1", *extra], env=sim.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True))
    base = free_port_run(2)
    for rank, compute_ms in enumerate((20, 45)):  # rank 1 is the straggler
        env = {"PATH": "/usr/bin:/bin", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "GPUOBS_JOB_ID": "example-job", "GPUOBS_PROMETHEUS_PORT": str(base), "GPUOBS_GPU_UUID": rank_gpu}
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "train.py"), "--steps", "100000", "--compute-ms",
             str(compute_ms), "--data-ms", "10", "--checkpoint-every", "30", "--eval-every", "10"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    server = free_port()
    procs.append(subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "GPUOBS_PROMETHEUS_PORT": str(server), "GPUOBS_JOB_ID": "llm-serving"}))
    return {"gpuobs": [(f"127.0.0.1:{node_a}", "east", "node-a"),
                       (f"127.0.0.1:{exporters['node-b']}", "west", "node-b"),
                       (f"127.0.0.1:{exporters['node-c']}", "east", "node-c")],
            "training": [(f"127.0.0.1:{base}", "east", "node-a"), (f"127.0.0.1:{base + 1}", "east", "node-a")],
            "inference": [(f"127.0.0.1:{server}", "west", "node-b")]}


def _panel_checks() -> list[tuple[str, str, str | None]]:
    """(what, PromQL, label a result must have a value for) of every panel target (but EXEMPT) and
    every variable, with the scenario's VALUES."""
    checks = []
    for name, d in load().items():
        for p, t in queries(d):
            # a series linked to its node's GPU metrics must carry the node the link opens
            links = p.get("fieldConfig", {}).get("defaults", {}).get("links", [])
            label = "node" if any(k["title"].startswith("GPU metrics at this time") for k in links) else None
            if (name, p["title"], t["refId"]) not in EXEMPT:
                checks.append((f"{name} / {p['title']} / {t['refId']}", substitute(t["expr"], VALUES[name]), label))
        for var, label, promql in variable_queries(d, VALUES[name]):
            checks.append((f"{name} / variable {var}", promql, label))
    return checks


def _assert_every_check_gets_data(prom: Prometheus, procs: list, checks: list[tuple[str, str, str | None]]) -> None:
    """Every query parses, before any data is there, and returns data within 45 s (the targets all
    still running)."""
    for what, promql, _ in checks:
        try:
            prom.query(promql)
        except AssertionError as e:
            pytest.fail(f"{what} does not parse: {e}")
    empty = checks
    deadline = time.monotonic() + 45
    while empty and time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"{proc.args[:4]} exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        time.sleep(1)
        empty = [(what, q, label) for what, q, label in empty
                 if not any(label is None or r["metric"].get(label) for r in prom.query(q))]
    assert not empty, "queries without data:\n" + "\n".join(f"{w}\n    {q}" for w, q, _ in empty)


def _assert_the_scenario(prom: Prometheus) -> None:
    """The exemptions are still real (still empty), and the scenario is what the panels claim: a
    straggler, an allocated idle GPU, a lost GPU, NVML down."""
    for name, title, ref in EXEMPT:
        d = load()[name]
        expr = next(t["expr"] for p, t in queries(d) if p["title"] == title and t["refId"] == ref)
        assert prom.query(substitute(expr, VALUES[name])) == [], f"{title} has data now: drop its exemption"
    east, lost, node_c = 'cluster="east"', 'reason="lost"', 'node="node-c"'
    assert prom.query(f"topk(1, {records.RANK_STEP_P50.name})")[0]["metric"]["rank"] == "1"
    assert float(prom.query(f"sum({sel(records.CLUSTER_GPUS_ALLOCATED_IDLE, east)})")[0]["value"][1]) >= 1
    assert float(prom.query(f"sum({sel(records.CLUSTER_GPUS_LOST, east)})")[0]["value"][1]) >= 1
    assert len(prom.query(f"{sel(c.GPU_UNHEALTHY, east, lost)} == 1")) == 1
    assert prom.query(f"{sel(c.NVML_UP, node_c)} == 0")
    # the efficiency inputs: pods' GPUs summed by team (ml-research's team label), pending demand, quota use
    team = {r["metric"]["team"]: float(r["value"][1]) for r in prom.query(sel(records.TEAM_GPUS_ALLOCATED, east))}
    assert team == {"ml": 2, "sandbox": 1}
    assert float(prom.query(sel(records.NAMESPACE_GPUS_PENDING, east))[0]["value"][1]) == 2
    assert float(prom.query(sel(records.QUEUE_GPU_QUOTA_USED, east))[0]["value"][1]) == 0.5


def _hold_pods(run, servicer) -> None:
    """node-a's pods: one of namespace ml-research (team ml) on the H100 and the A100, one of sandbox
    (no team label) on the RTX; the Slurm job keeps GPUs 0 and 3."""
    uuid = {l["gpu"]: l["uuid"] for n, l, _ in run.scrape() if n == c.GPU_INFO.exposed_name}
    servicer.pods = [("trainer-0", "ml-research", "main", "nvidia.com/gpu", [uuid["1"], uuid["2"]]),
                     ("notebook-0", "sandbox", "main", "nvidia.com/gpu", [uuid["4"]])]


def test_every_panel_query_returns_data(exporter, kubelet, tmp_path):
    """Three simulated nodes (node-a: a mixed node with faults, in process; node-b: 8 busy H100s;
    node-c: NVML down), two training ranks and an inference server, scraped by a real Prometheus
    with the recording rules: every panel target of every dashboard parses and returns data."""
    servicer, socket, _ = kubelet
    run = _node_a(exporter, tmp_path, socket)
    _hold_pods(run, servicer)
    st = run.sim.state
    nodes = [Simulator(scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml"), base=REPO,
                       directory=tmp_path / "node-b", node="node-b"),
             Simulator({"gpus": [{"profile": "a100-40gb", "count": 2}]}, base=REPO, directory=tmp_path / "node-c",
                       node="node-c")]
    nodes[1].state.fail_init(9)  # node-c: NVML_ERROR_DRIVER_NOT_LOADED
    procs, servers = [], []
    try:
        h200 = next(l["uuid"] for n, l, _ in run.scrape() if n == c.GPU_INFO.exposed_name and l["gpu"] == "0")
        prom = Prometheus(tmp_path, {**_start_targets(nodes, procs, run.exp.http.port, h200),  # at its power cap
                                     **_serve_cluster_state(servers)})
        procs.append(prom.proc)
        prom.ready()
        run.next_snapshot(2)
        st.xid(0, 13)  # after the exporter registered for events
        st.fail("nvmlEventSetWait_v2", 999, times=2)  # XID watcher errors, counted by code
        st.fail("nvmlDeviceGetTemperature", 0, gpu=1, delay_ms=700, times=2)  # two passes past the deadline
        spare_up = sel(records.GPU_UP_STEP_MIN, 'node="node-a"', 'gpu="5"') + " == 1"
        deadline = time.monotonic() + 20  # ...seen up by the weekly group too, so that its loss counts there
        while not prom.query(spare_up) and time.monotonic() < deadline:
            time.sleep(0.5)
        st.lose_gpu(5)  # the spare A100 falls off the bus after it was seen
        _assert_every_check_gets_data(prom, procs, _panel_checks())
        _assert_the_scenario(prom)
    finally:
        for proc in procs:
            stop(proc)
        for server in servers:
            server.shutdown()
        for sim in nodes:
            sim.close()
