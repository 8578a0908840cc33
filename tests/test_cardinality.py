"""The series budget and its profiles (issue: fleet scale at dcgm-exporter's series cost).

- The default profile serves at most 40 series per H100/H200 GPU (node self-health apart) on every
  built-in H100/H200 simulator profile, and full keeps every series the default serves and more.
- Every shipped alert and recording rule, and every panel of the fleet, node and efficiency
  dashboards, keeps its data on a default-profile exporter: two real exporters (default and full)
  on the same simulated node are scraped by one real Prometheus evaluating the rules, and whatever
  the full exporter's data answers, the default one's must answer too, unless the panel says it
  needs detail (and reads a detail metric, which is how it is marked)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import REPO, free_port, stop
from test_dashboards import Prometheus, load, queries, substitute

from gpuobs import catalog as c
from gpuobs import records
from gpuobs.alerts.rules import DEFAULT, alerts
from gpuobs.dashboards.common import detail_families
from gpuobs.sim import Simulator, profiles

BUDGET = 40
PER_MIG_DEVICE = 3  # MIG device identity, memory used and total
EXPORTED = {name: m for m in c.EXPORTED for name in m.prometheus_samples}
SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_][\w:]*)\s*(\{[^{}]*\})?")

MEASURE = """
import json, sys
from gpuobs import docs
spec = json.loads(sys.argv[1])
out = {}
for prof in ("default", "full"):
    body = docs.render_node(spec, profile=prof)
    out[prof] = docs.count_series(body)
    out[prof + "_names"] = sorted({l.split("{")[0].split(" ")[0] for l in body.splitlines() if l and not l.startswith("#")})
print(json.dumps(out))
"""


def measure(spec: dict) -> dict:
    """Series per family and the sample names served, per profile, of a one-node simulator (in a
    process of its own: the measurement initialises NVML on simulators of its own)."""
    out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(spec)], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


HOPPER = [name for name in profiles.PROFILES if name.startswith(("h100", "h200"))]


@pytest.mark.parametrize("mig", [None, ["1g.10gb"] * 7], ids=["whole", "mig-7"])
def test_default_profile_serves_at_most_40_series_per_hopper_gpu(mig):
    """Every built-in H100/H200 profile: at most 40 series per GPU by default (node self-health and
    the opt-in families apart); in MIG mode the physical GPU's 40 plus 3 per MIG device. The full
    profile serves every name the default does, and more (the detail)."""
    assert HOPPER, "no H100/H200 simulator profile"
    for name in HOPPER:
        spec = {"gpus": [{"profile": name, "count": 1, **({"mig": mig} if mig else {})}]}
        got = measure(spec)
        per_gpu = {prof: sum(n for fam, n in got[prof].items() if fam not in ("exporter", "telemetry", "processes"))
                   for prof in ("default", "full")}
        budget = BUDGET + (PER_MIG_DEVICE * len(mig) if mig else 0)
        assert per_gpu["default"] <= budget, (name, mig, got["default"])
        assert set(got["default_names"]) < set(got["full_names"]), name
        assert per_gpu["full"] > 4 * per_gpu["default"] or mig, (name, per_gpu)


def selectors(expr: str) -> list[tuple[str, str]]:
    """(sample name, matchers) of every exporter-metric selector in a PromQL expression."""
    return [(name, braces or "") for name, braces in SELECTOR.findall(expr) if name in EXPORTED]


def _with(name: str, matchers: str, label: str) -> str:
    inner = matchers[1:-1].strip() if matchers else ""
    return f"{name}{{{label}{',' + inner if inner else ''}}}"


def test_no_rule_reads_a_detail_series():
    """Statically: no alert or recording rule selects a detail metric, nor a label value the default
    profile leaves out (an equality matcher on a narrowed label)."""
    exprs = [a.expr for a in alerts(DEFAULT)] + [r.expr for r in records.recording_rules(DEFAULT)]
    for expr in exprs:
        for name, matchers in selectors(expr):
            metric = EXPORTED[name]
            assert metric not in c.DETAIL, (name, expr)
            if metric in c.DEFAULT_VALUES:
                label, values = c.DEFAULT_VALUES[metric]
                for value in re.findall(rf'{label}\s*=\s*"([^"]*)"', matchers):
                    assert value in values, (name, value, expr)


def _exporter(sim: Simulator, port: int, profile: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                             "--port", str(port), "--interval", "1", "--profile", profile, "--kernel-log", "off"],
                            env=sim.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


SPEC = {"gpus": [{"profile": "h100-sxm-80gb", "count": 4}], "topology": "nvswitch",
        "processes": [{"gpu": 0, "pid": 4242, "name": "python train.py", "used_mib": 20480, "sm_util": 60}]}
ON = {"default": ("c-default", "node-default"), "full": ("c-full", "node-full")}


def _has(prom: Prometheus, promql: str) -> bool:
    return bool(prom.query(promql))


def _missing_rule_inputs(prom: Prometheus) -> list[str]:
    """Rule inputs the full exporter's node has and the default one's lacks."""
    exprs = [a.expr for a in alerts(DEFAULT)] + [r.expr for r in records.recording_rules(DEFAULT)]
    pairs = {(n, m) for expr in exprs for n, m in selectors(expr)}
    return [f"{n}{m}" for n, m in sorted(pairs)
            if _has(prom, _with(n, m, f'node="{ON["full"][1]}"')) and not _has(prom, _with(n, m, f'node="{ON["default"][1]}"'))]


def _panel_gaps(prom: Prometheus) -> list[tuple[str, dict, str]]:
    """(dashboard, panel, query) of the fleet, node and efficiency panels with data on the full node
    and none on the default one."""
    gaps = []
    for name in ("fleet-overview", "node", "fleet-efficiency"):
        d = load()[name]
        for panel, target in queries(d):
            got = {}
            for prof, (cluster, node) in ON.items():
                values = {"cluster": cluster, "node": node, "gpu": ".*", "model": ".*"}
                got[prof] = _has(prom, substitute(target["expr"], values))
            if got["full"] and not got["default"]:
                gaps.append((name, panel, target["expr"]))
    return gaps


def _unexplained(gaps: list[tuple[str, dict, str]]) -> list[tuple[str, str, str]]:
    """Gaps that are not detail panels of the node dashboard: a detail panel reads a detail metric
    and says in its description which exporter flag it needs."""
    return [(name, panel["title"], expr) for name, panel, expr in gaps
            if not (name == "node" and detail_families_of(panel) and "Detail:" in panel.get("description", ""))]


def test_rules_and_default_panels_keep_their_data_on_the_default_profile(tmp_path):
    """One simulated 4 x H100 NVSwitch node served twice, by a default-profile and a full-profile
    exporter (its own cluster and node labels each), scraped by one real Prometheus with the fast
    rule profile: every series an alert or recording rule selects that the full exporter's node has,
    the default one's has too; every fleet, node and efficiency panel with data on the full node has
    data on the default one, or is a detail panel (it says which flag it needs, and reads a detail
    metric); the fleet and efficiency dashboards have no detail panel at all."""
    sims, procs = [], []
    try:
        targets = {}
        for prof, (cluster, node) in ON.items():
            sim = Simulator(SPEC, base=REPO, directory=tmp_path / prof, node=node)
            sims.append(sim)
            port = free_port()
            procs.append(_exporter(sim, port, prof))
            targets.setdefault("gpuobs", []).append((f"127.0.0.1:{port}", cluster, node))
        prom = Prometheus(tmp_path, targets)
        procs.append(prom.proc)
        prom.ready()
        deadline = time.monotonic() + 45  # rates need two scrapes, the records an evaluation after them
        while time.monotonic() < deadline and not _has(prom, f'{records.NODE_NVLINK_TX.name}{{node="{ON["full"][1]}"}}'):
            time.sleep(1)  # compared before the records exist, both nodes would lack them alike
        while time.monotonic() < deadline and (_missing_rule_inputs(prom) or _unexplained(_panel_gaps(prom))):
            time.sleep(2)
        assert _missing_rule_inputs(prom) == []
        gaps = _panel_gaps(prom)
        assert _unexplained(gaps) == []
        assert gaps, "no detail panel lost its data: the full exporter served no detail?"
        assert len({p["title"] for _, p, _ in gaps}) < len({p["title"] for p, _ in queries(load()["node"])}) / 2
    finally:
        for proc in procs:
            stop(proc)
        for sim in sims:
            sim.close()


def detail_families_of(panel: dict) -> list[str]:
    """detail_families() of a generated panel (JSON): the families of the detail metrics it reads."""
    targets = [SimpleNamespace(expr=t["expr"]) for t in panel.get("targets", [])]
    return detail_families(SimpleNamespace(targets=targets))


def test_nvlink_totals_are_the_links_summed_and_withheld_when_a_link_is_not_read(exporter):
    """The per-GPU NVLink totals the default profile serves equal the per-link series of the same
    pass summed (bytes, the three error counters) and counted (links down), on a GPU with two links
    down and errors on others; a link whose counter NVML does not return withholds the GPU's sum
    (a partial sum would read as a counter reset) while the links down and the other sums stay."""
    from gpuobs.sim.state import set_val

    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, interval=0.1)
    g = run.sim.state.gpu(0)
    set_val(g.links[3].state, 0)
    set_val(g.links[7].state, 0)
    for i, (crc, replay, recovery) in enumerate(((5, 2, 1), (0, 9, 0), (40, 0, 3))):
        for counter, value in zip(("crc_errors", "replay_errors", "recovery_errors"), (crc, replay, recovery)):
            set_val(getattr(g.links[i], counter), value)

    def consistent(scrape) -> bool:  # in a pass read after the links changed (2 down), every total its sum
        sums = _nvlink_sums(scrape)
        return (2, 2) in sums.values() and all(want == got for want, got in sums.values())

    scrape = run.wait_for(consistent, 10, "NVLink totals equal to their links' sums")
    sums = _nvlink_sums(scrape)
    uuid0 = next(l["uuid"] for n, l, _ in scrape if n == "gpuobs_gpu_info" and l["gpu"] == "0")
    assert sums[(uuid0, "gpuobs_gpu_nvlinks_down")] == (2, 2)
    assert sums[(uuid0, "gpuobs_gpu_nvlinks_errors_total")] == (60, 60)
    import pynvml as N

    run.sim.state.fail("nvmlDeviceGetFieldValues", 999, gpu=0, field=N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC)
    run.next_snapshot(3)
    assert run.values("gpuobs_gpu_nvlinks_errors_total").get(uuid0) is None  # withheld, not a partial sum
    assert run.values("gpuobs_gpu_nvlinks_down").get(uuid0) == 2
    assert run.values("gpuobs_gpu_nvlinks_transmit_bytes_total").get(uuid0) is not None
    assert len(run.values("gpuobs_gpu_nvlinks_errors_total")) == 1  # the other GPU keeps its sum


def _nvlink_sums(scrape) -> dict[tuple[str, str], tuple[float, float]]:
    """{(uuid, per-GPU total): (sum or count of its per-link series, the total served)}."""
    per_link = {"gpuobs_gpu_nvlinks_errors_total": "gpuobs_gpu_nvlink_errors_total",
                "gpuobs_gpu_nvlinks_transmit_bytes_total": "gpuobs_gpu_nvlink_transmit_bytes_total",
                "gpuobs_gpu_nvlinks_receive_bytes_total": "gpuobs_gpu_nvlink_receive_bytes_total"}
    out = {}
    for n, labels, v in scrape:
        if n in per_link:
            links = [x for m, l, x in scrape if m == per_link[n] and l["uuid"] == labels["uuid"]]
            out[(labels["uuid"], n)] = (sum(links), v)
        elif n == "gpuobs_gpu_nvlinks_down":
            up = [x for m, l, x in scrape if m == "gpuobs_gpu_nvlink_link_up" and l["uuid"] == labels["uuid"]]
            out[(labels["uuid"], n)] = (up.count(0.0), v)
    return out
