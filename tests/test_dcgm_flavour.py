"""The rule pack's dcgm flavour (gpuobs/alerts/dcgm.py, alerts/dcgm/): the adapter reads exactly the labels
dcgm naming writes, what it leaves out lacks an input, promtool accepts it, and on a real Prometheus
scraping `gpuobs exporter --naming dcgm` on the simulator every adapter record and every kept GPU
record and panel returns data, the key alerts fire on their faults and stay quiet on a healthy node."""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import REPO, free_port, prometheus_query, require_tool, stop
from test_dashboards import VALUES, load, queries, substitute

from gpuobs import catalog as c
from gpuobs import records
from gpuobs.alerts import dcgm
from gpuobs.alerts.common import FAST
from gpuobs.exporter import render
from gpuobs.sim.state import set_counter, set_val

GIB = 1024 ** 3
T = FAST.__class__(**{**FAST.__dict__, "exporter_job": "gpuobs"})  # the test's scrape job
GPU_DASHBOARDS = ("node", "fleet-overview", "fleet-efficiency")
ATTRIBUTION_LEVELS = ("cluster_namespace", "cluster_hpc_job", "cluster_team")
# metrics the simulated H200 does not serve, or faults this test does not inject: no data expected
EXEMPT = {c.FAN_SPEED.name: "an H200 SXM has no fan", c.RETIRED_PAGES.name: "Hopper remaps rows, retires no pages",
          c.RETIRED_PAGES_PENDING.name: "Hopper remaps rows, retires no pages",
          c.FABRIC_HEALTH.name: "the simulated H200 has no NVSwitch fabric",
          records.NODE_PCIE_DEGRADED.name: "no PCIe fault injected",
          records.RANK_GPUS.name: "no training ranks run on this node",
          **{r.name: "no training job runs on this node" for r in (
              records.JOB_GPUS, records.TRAINING_JOB_POWER, records.TRAINING_JOB_CO2E_RATE,
              records.TRAINING_JOB_ENERGY_PER_STEP, records.TRAINING_JOB_ENERGY_PER_TOKEN)}}
# the alerts this test injects a fault for: (alert, GPU slot)
EXPECTED = {("GpuHwThermalSlowdown", 0), ("GpuXidRebootRequired", 1), ("GpuLost", 1), ("GpuAllocatedIdle", 2),
            ("GpuSwPowerCapSustained", 3), ("GpuEccUncorrectable", 3), ("GpuRowRemapPending", 3)}


def test_the_adapter_drops_and_renames_exactly_the_labels_dcgm_naming_writes():
    ident = render.DcgmIdentity([], "node-a").labels("0", "GPU-x", gpu_instance="1")
    assert set(ident) == set(dcgm.DCGM_LABELS) | {"gpu"}
    native, theirs = render.ATTRIBUTION_LABELS["gpuobs"], render.ATTRIBUTION_LABELS["dcgm"]
    assert {theirs[k]: native[k] for k in theirs if theirs[k] != native[k]} == dcgm.DCGM_ATTRIBUTION
    assert render.XID_FIELD == c.DCGM_XID_FIELD


def test_what_is_left_out_lacks_an_input_and_what_is_kept_has_all():
    t = dcgm.DCGM_DEFAULT
    groups = dcgm.rule_groups(t)
    kept = [r for g in groups[1:] for r in g["rules"]]
    dropped = set(dcgm.left_out_records(t))
    replaced = {a.name for a in dcgm.replacements(t)}
    for rule in kept:
        if rule.get("alert") not in replaced:
            assert dcgm.missing_inputs(rule["expr"], dropped) == [], rule
    assert dropped and all(dcgm.left_out_records(t).values())
    assert all(dcgm.left_out_alerts(t).values())
    names = {r.get("record", r.get("alert")) for r in kept}
    assert not names & (dropped | (set(dcgm.left_out_alerts(t)) - replaced))
    assert replaced <= names
    # the check sees a rule reading a metric the adapter has no field for
    assert dcgm.missing_inputs(f"{c.NVML_UP.name} == 0", set()) == [c.NVML_UP.exposed_name]
    assert dcgm.missing_inputs(f"{c.TEMPERATURE.name} > 80", set()) == []


def test_promtool_accepts_the_flavour(tmp_path):
    promtool = require_tool("promtool")
    for path in (dcgm.write_fast_rules(tmp_path, T), REPO / dcgm.FOLDER / dcgm.RULES_FILE):
        out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


class Prom:
    """A real Prometheus scraping one target as job gpuobs, cluster east, node node-a, with one rule file."""

    def __init__(self, tmp_path, target: str, rules):
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                          f"rule_files: ['{rules}']\nscrape_configs:\n  - job_name: gpuobs\n"
                          f"    static_configs: [{{targets: ['{target}'], labels: {{cluster: east, node: node-a}}}}]\n")
        self.proc = subprocess.Popen([require_tool("prometheus"), f"--config.file={config}",
                                      f"--storage.tsdb.path={tmp_path / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def query(self, promql: str) -> list[dict]:
        """Instant query (OSError until Prometheus listens)."""
        return prometheus_query(self.port)(promql)

    def wait(self, predicate, timeout: float, what):
        """Poll predicate() until true or fail with what()."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()[-2000:]
            try:
                if predicate():
                    return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"timed out after {timeout}s: {what()}")

    def firing(self) -> set[tuple[str, str]]:
        """(alert, gpu) of the firing alerts."""
        return {(r["metric"]["alertname"], r["metric"].get("gpu", "")) for r in self.query('ALERTS{alertstate="firing"}')}


def _gpu_reads(expr: str, kept_records: dict[str, str]) -> bool:
    """Whether expr reads an adapted or derived metric, directly or through kept records."""
    adapter = set(dcgm.adapted() + dcgm.derived())
    todo, seen = [expr], set()
    while todo:
        e = todo.pop()
        if records.metrics_read(e) & adapter:
            return True
        for token in set(records.TOKEN.findall(e)) & set(kept_records) - seen:
            seen.add(token)
            todo.append(kept_records[token])
    return False


def _checks(prom_rules: list[dict]) -> list[tuple[str, str]]:
    """(what, PromQL) of every record of the flavour that reads GPU series, and every panel query of the
    GPU dashboards whose inputs the flavour has."""
    kept = {r["record"]: r["expr"] for r in prom_rules if "record" in r}
    dropped = set(dcgm.left_out_records(T))
    out = [(f"record {name}", name) for name, expr in kept.items() if _gpu_reads(expr, kept)]
    for name, d in load().items():
        if name in GPU_DASHBOARDS:
            values = {**VALUES[name], "model": ".+", "gpu": ".*"}
            out += [(f"{name} / {p['title']} / {t['refId']}", substitute(t["expr"], values)) for p, t in queries(d)
                    if not dcgm.missing_inputs(t["expr"], dropped) and _gpu_reads(t["expr"], kept)]
    return out


def _exempt(what: str, promql: str) -> bool:
    """Checks this node cannot feed: attribution levels (no pods or Slurm jobs here) and the
    simulated H200's values that a dcgm field has none of (see EXEMPT)."""
    return any(f"{level}:" in promql or f"{level}_" in what for level in ATTRIBUTION_LEVELS) or any(
        name in promql for name in EXEMPT)


def _assert_every_check_gets_data(prom: Prom, checks: list[tuple[str, str]]) -> None:
    empty = [(w, q) for w, q in checks if not _exempt(w, q)]

    def all_have_data() -> bool:
        empty[:] = [(w, q) for w, q in empty if not prom.query(q)]
        return not empty
    prom.wait(all_have_data, 30, lambda: "records and panels without data:\n" + "\n".join(
        f"{w}\n    {q}" for w, q in empty))


@pytest.mark.timeout(180)
def test_the_flavour_on_dcgm_naming_records_serves_panels_and_alerts_both_ways(exporter, tmp_path):
    run = exporter({"gpus": [{"profile": "h200", "count": 4}]}, naming="dcgm", interval=0.5)
    st = run.sim.state
    for i in range(4):  # a busy node: every GPU computing and holding memory
        set_val(st.gpu(i).util_gpu, 90)
        set_val(st.gpu(i).mem_used, 40 * GIB)
    rules = dcgm.write_fast_rules(tmp_path, T)
    prom = Prom(tmp_path, f"127.0.0.1:{run.exp.http.port}", rules)
    try:
        groups = dcgm.rule_groups(T)
        checks = _checks([r for g in groups for r in g["rules"]])
        # quiet on a healthy node: no GPU alert once every check has data (the pack's own for: windows pass)
        prom.wait(lambda: prom.query(c.GPU_UP.exposed_name), 30, lambda: "the adapter's first records")
        time.sleep(12)  # longer than for_medium: a false positive would fire by now
        assert {a for a, _ in prom.firing()} <= {"Watchdog", "GpuFleetIdleCapacity"}, prom.firing()

        set_val(st.gpu(0).clock_events, 0x40)  # HW thermal slowdown
        st.xid(1, 79)  # XID 79, then the GPU falls off the bus
        prom.wait(lambda: prom.query(f'{c.DCGM_XID_FIELD} == 79'), 10, lambda: "XID 79 scraped")
        st.lose_gpu(1)
        set_val(st.gpu(2).util_gpu, 0)  # allocated (40 GiB held) but idle
        g3 = st.gpu(3)
        set_val(g3.clock_events, 0x4)  # SW power cap
        set_counter(g3.ecc[2], rate=1.0)  # uncorrected, volatile
        set_val(g3.remap_pending, 1)
        expected = {(a, str(i)) for a, i in EXPECTED}
        seen: set[tuple[str, str]] = set()  # XIDs resolve rate_window after the change: every alert seen firing

        def all_fired() -> bool:
            seen.update(prom.firing())
            return expected <= seen
        prom.wait(all_fired, 60, lambda: f"expected {sorted(expected)}; got {seen}")
        gpu_alerts = {(a, g) for a, g in seen if g}
        assert gpu_alerts <= expected | {("GpuTemperatureNearSlowdown", "0")}, gpu_alerts - expected
        _assert_every_check_gets_data(prom, checks)
    finally:
        stop(prom.proc)
