"""`gpuobs report` against a real Prometheus holding a known history (written here as OpenMetrics,
backfilled with promtool), and the report opened in headless Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import free_port, require_tool, stop

from gpuobs import report
from gpuobs.alerts.rules import DEFAULT
from gpuobs.cli import main

HOURS = 3
STEP = 60  # seconds between the history's samples, and the report's step
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
# (node, model, [namespace of each GPU, "" when no pod holds it]); n2 exports no gpuobs_gpu_info (model unknown)
NODES = [("n0", H100, ["llm-train", "llm-train", "llm-train", "vision"]),
         ("n1", A100, ["vision", "research", "", ""]),
         ("n2", None, ["research", "research"])]
UTIL_BY_HOUR = (0.9, 0.0, 0.5, 0.3)  # a GPU's utilisation in hour h is UTIL_BY_HOUR[(2 * gpu + h + node) % 4]
TEAMS = {"llm-train": "foundation", "research": "foundation", "vision": "perception"}
COSTS = {H100: 4.0, "default": 2.0}
# (labels, firing minutes [from, to)); each tuple of spans is one ALERTS series
ALERT_SPELLS = [
    ({"alertname": "GpuXidError", "severity": "page", "node": "n1", "gpu": "0"}, [(10, 100)]),
    ({"alertname": "GpuAllocatedIdle", "severity": "ticket", "node": "n0", "gpu": "1"}, [(20, 40), (120, 140)]),
    ({"alertname": report.PLACEMENT_ALERT, "severity": "ticket", "k8s_namespace": "llm-train", "k8s_pod": "llm-0"},
     [(30, 60)]),
]
FIT_RECORD = "uuid:gpuobs_test_fit:profile"  # a record's series in the history, for the record sections


def _util(labels: dict, minute: int) -> float:
    return UTIL_BY_HOUR[(2 * int(labels["gpu"]) + minute // 60 + int(labels["node"][1:])) % 4]


def _labels(d: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def _gpus():
    for node, model, namespaces in NODES:
        for gpu, ns in enumerate(namespaces):
            labels = {"cluster": "test", "node": node, "instance": f"{node}:9445", "gpu": str(gpu),
                      "uuid": f"GPU-{node}-{gpu}"}
            yield labels, model, ns


def openmetrics(t0: int) -> str:
    """The history: per GPU one sample a minute of utilisation (with its namespace) and identity,
    and the ALERTS series, as OpenMetrics with timestamps (one family after the other)."""
    minutes = range(HOURS * 60)
    lines = ["# TYPE gpuobs_gpu_utilization_ratio gauge"]
    for labels, _, ns in _gpus():
        series = _labels({**labels, **({"k8s_namespace": ns} if ns else {})})
        lines += [f"gpuobs_gpu_utilization_ratio{series} {_util(labels, m)} {t0 + STEP * m}" for m in minutes]
    lines.append("# TYPE gpuobs_gpu_up gauge")  # what a held GPU is, for the allocation records
    for labels, _, ns in _gpus():
        series = _labels({**labels, **({"k8s_namespace": ns} if ns else {})})
        lines += [f"gpuobs_gpu_up{series} 1 {t0 + STEP * m}" for m in minutes]
    lines.append("# TYPE gpuobs_gpu_info gauge")
    for labels, model, _ in _gpus():
        if model:
            lines += [f"gpuobs_gpu_info{_labels({**labels, 'name': model})} 1 {t0 + STEP * m}" for m in minutes]
    lines.append("# TYPE kube_namespace_labels gauge")  # the teams: one source, as the rules read them
    for ns, team in TEAMS.items():
        lines += [f'kube_namespace_labels{{cluster="test",namespace="{ns}",{DEFAULT.team_label}="{team}"}} 1 '
                  f"{t0 + STEP * m}" for m in minutes]
    lines.append("# TYPE ALERTS gauge")
    for labels, spans in ALERT_SPELLS:
        series = _labels({**labels, "alertstate": "firing"})
        lines += [f"ALERTS{series} 1 {t0 + STEP * m}" for a, b in spans for m in range(a, b)]
    pending = _labels({"alertname": "GpuOnlyPending", "alertstate": "pending", "severity": "page"})
    lines += [f"ALERTS{pending} 1 {t0 + STEP * m}" for m in range(0, 50)]
    lines += ["# TYPE uuid:gpuobs_test_fit:profile gauge",
              f'{FIT_RECORD}{{uuid="GPU-n0-2",profile="3g.40gb"}} 1 {t0 + 3600}']
    return "\n".join(lines) + "\n# EOF\n"


def expected_usage() -> dict[str, dict[str, float]]:
    """{namespace: {allocated, used, idle, idle_cost}} computed from the history above: GPUs no pod
    holds are nobody's; a GPU without gpuobs_gpu_info has no model, so no price (as the rules price)."""
    out: dict[str, dict[str, float]] = {}
    for labels, model, ns in _gpus():
        if not ns:
            continue
        row = out.setdefault(ns, {"allocated": 0.0, "used": 0.0, "idle": 0.0, "idle_cost": 0.0})
        utils = [_util(labels, m) for m in range(HOURS * 60)]
        idle = sum(1 for u in utils if u <= 0.01) / 60
        row["allocated"] += len(utils) / 60
        row["used"] += sum(utils) / 60
        row["idle"] += idle
        row["idle_cost"] += idle * (COSTS.get(model, COSTS["default"]) if model else 0.0)
    return out


def expected_teams() -> dict[str, dict[str, float]]:
    """expected_usage summed by team (TEAMS, the history's kube_namespace_labels)."""
    out: dict[str, dict[str, float]] = {}
    for ns, row in expected_usage().items():
        team = out.setdefault(TEAMS.get(ns, ns), dict.fromkeys(row, 0.0))
        for k, v in row.items():
            team[k] += v
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(Prometheus base URL, t0, t1) of a real Prometheus on the backfilled history."""
    promtool, prometheus = require_tool("promtool"), require_tool("prometheus")
    work = tmp_path_factory.mktemp("report")
    t1 = int(time.time()) // 3600 * 3600 - 3600
    t0 = t1 - HOURS * 3600
    (work / "history.om").write_text(openmetrics(t0))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "history.om"),
                    str(work / "data")], check=True, capture_output=True, timeout=120)
    (work / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            assert time.monotonic() < deadline, "prometheus never became ready"
            time.sleep(0.3)
    yield url, t0, t1
    stop(proc)


@pytest.fixture(scope="module")
def rendered(history, tmp_path_factory) -> Path:
    """The report of the whole history, written by the CLI with a cost and team file."""
    url, t0, t1 = history
    work = tmp_path_factory.mktemp("out")
    costs = work / "costs.yaml"
    costs.write_text(json.dumps({"cost_per_gpu_hour": COSTS, "currency": "EUR"}))  # JSON is YAML
    out = work / "report.html"
    result = CliRunner().invoke(main, ["report", "--prometheus", url, "--from", str(t0), "--to", str(t1),
                                       "--cost-file", str(costs), "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out


def _num(cell: str) -> float:
    return float(cell.split()[0].replace(",", ""))


def test_report_has_the_gpu_hours_per_namespace_and_team(rendered):
    """Without the recording rules loaded, the report evaluates the records' own definitions."""
    text = rendered.read_text()
    rows = report.read_rows(text)
    assert "Computed from raw series" in text
    expected = expected_usage()
    # every row differs from the others (so a mixed-up row fails) and some GPUs sat idle
    assert len({tuple(row.values()) for row in expected.values()}) == len(expected) == 3
    assert all(row["idle"] > 0 for row in expected.values())
    for key, want in [*expected.items(), *expected_teams().items()]:
        cells = rows[("usage", key)]  # namespace or team, allocated, used, mean %, idle, idle cost
        assert _num(cells[1]) == pytest.approx(want["allocated"], abs=0.005), key
        assert _num(cells[2]) == pytest.approx(want["used"], abs=0.005), key
        assert _num(cells[4]) == pytest.approx(want["idle"], abs=0.005), key
        assert _num(cells[5]) == pytest.approx(want["idle_cost"], abs=0.005) and cells[5].endswith("EUR"), key
    assert set(expected_teams()) == {"foundation", "perception"}


def test_a_settings_file_mapping_teams_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text("teams: {a: b}\n")
    with pytest.raises(report.ReportError, match="kube_namespace_labels"):
        report.load_settings(tmp_path / "s.yaml")


def test_report_ranks_alerts_by_time_firing_and_count(rendered):
    text = rendered.read_text()
    rows = report.read_rows(text)
    assert rows[("alerts", "GpuXidError")] == ["GpuXidError", "1", "1.50 h"]
    assert rows[("alerts", "GpuAllocatedIdle")] == ["GpuAllocatedIdle", "2", "40 min"]
    assert rows[("alerts", report.PLACEMENT_ALERT)][1:] == ["1", "30 min"]
    alerts = text[text.index('<section id="alerts"'):]
    by_time = alerts[:alerts.index("By count")]
    assert by_time.index("GpuXidError") < by_time.index("GpuAllocatedIdle") < by_time.index(report.PLACEMENT_ALERT)
    assert "GpuOnlyPending" not in text  # pending is not firing
    placement = [cells for (section, _), cells in rows.items() if section == "placement"]
    assert placement == [["llm-train", "llm-0", "ticket", "1", "30 min"]]  # namespace, pod, severity, ...


def test_sections_whose_records_have_no_series_say_no_data(rendered):
    text = rendered.read_text()
    assert re.findall(r'<section id="(\w+)"', text) == ["usage", "energy", "placement", "mig", "reliability", "alerts", "slow_jobs"]
    mig = text[text.index('<section id="mig"'):text.index('<section id="reliability"')]
    assert "No data" in mig and "<table" not in mig


def test_a_record_section_reads_the_record_by_its_python_name(history, monkeypatch):
    from gpuobs import records

    url, t0, t1 = history
    # a record defined under a Python name, whose series the history holds (FIT_RECORD)
    fake = records.Record(("uuid",), "gpuobs_test_fit", "profile", lambda t: "unused")
    assert fake.name == FIT_RECORD
    monkeypatch.setitem(records.NAMES, "TEST_RECORD", fake)
    monkeypatch.setitem(report.RECORDS, "reliability", ("TEST_RECORD", "NO_SUCH_RECORD"))
    section = report.section_reliability(report.Prometheus(url), report.Window(t0, t1, STEP), report.Settings())
    rows = report.read_rows(f'<section id="reliability">{section.body}</section>')
    assert rows == {("reliability", "3g.40gb/GPU-n0-2"): ["3g.40gb", "GPU-n0-2", "1"]}
    assert "gpuobs.records.NO_SUCH_RECORD is not defined" in section.body


class Canned:
    """A Prometheus client answering instant queries by the record name they read (for the MIG section)."""
    url = "canned"

    def __init__(self, answers: dict[str, list[dict]]):
        self.answers, self.queries = answers, []

    def instant(self, promql: str, at: float) -> list[dict]:
        self.queries.append(promql)
        return next((v for name, v in self.answers.items() if name in promql), [])


def _advice(uuid: str, profile: str) -> dict:
    from gpuobs import mig
    slices = next(p.compute_slices for m in mig.MODELS for p in m.profiles if p.name == profile)
    return {"metric": {"uuid": uuid, "profile": profile}, "value": [0, str(slices)]}


def test_the_mig_section_lists_partitions_not_whole_gpus():
    from gpuobs import records

    whole = [p.name for p in __import__("gpuobs.mig").mig.MODELS[2].profiles][-1]  # H100's 7g.80gb
    assert whole in report.WHOLE_GPU and "3g.40gb" not in report.WHOLE_GPU
    client = Canned({records.GPU_MIG_ADVICE.name: [_advice("GPU-a", whole), _advice("GPU-b", "3g.40gb")]})
    section = report.section_mig(client, report.Window(0, 7 * 86400, 3600), report.Settings())
    rows = report.read_rows(f'<section id="mig">{section.body}</section>')
    assert list(rows) == [("mig", "3g.40gb/GPU-b")]


def test_an_empty_mig_section_says_why():
    from gpuobs import records

    window = report.Window(0, 7 * 86400, 3600)
    whole = sorted(report.WHOLE_GPU)[0]
    only_whole = Canned({records.GPU_MIG_ADVICE.name: [_advice("GPU-a", whole)]})
    body = report.section_mig(only_whole, window, report.Settings()).body
    assert "no GPU is a MIG candidate" in body and "whole-GPU profile" in body and "not loaded" not in body
    peaks_only = Canned({records.GPU_MEMORY_PEAK.name: [{"metric": {}, "value": [0, "12"]}]})
    body = report.section_mig(peaks_only, window, report.Settings()).body
    assert "no GPU is a MIG candidate: 12 GPUs" in body and "not loaded" not in body
    body = report.section_mig(Canned({}), window, report.Settings()).body
    assert "not loaded" in body and "candidate" not in body and "<table" not in body


def test_unreachable_prometheus_exits_2_with_a_message(tmp_path):
    result = CliRunner().invoke(main, ["report", "--prometheus", f"http://127.0.0.1:{free_port()}",
                                       "--range", "1h", "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert "cannot query Prometheus at http://127.0.0.1:" in result.output
    assert not (tmp_path / "r.html").exists()


def test_without_matplotlib_the_report_says_what_to_install(history, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = CliRunner().invoke(main, ["report", "--prometheus", history[0], "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "pip install 'gpuobs[report]'" in result.output


def test_a_bad_range_exits_2(tmp_path):
    result = CliRunner().invoke(main, ["report", "--prometheus", "http://127.0.0.1:1", "--range", "7x"])
    assert result.exit_code == 2 and "not a duration" in result.output
    result = CliRunner().invoke(main, ["report", "--prometheus", "http://127.0.0.1:1", "--from", "200", "--to", "100"])
    assert result.exit_code == 2 and "range is empty" in result.output


CHECK = """<script>
window.onerror = function (m) { document.documentElement.setAttribute("data-js-error", String(m)); };
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).length;
  var ids = Array.prototype.map.call(document.querySelectorAll("section"), function (s) { return s.id; });
  var d = document.createElement("div");
  d.id = "render-check";
  d.textContent = "images=" + images.length + " broken=" + broken + " sections=" + ids.join(",");
  document.body.appendChild(d);
});
</script>"""


def _open_in_chromium(html_text: str, work: Path) -> tuple[re.Match, str, str]:
    """(the render check's match, the dumped DOM, Chromium's log) of a page opened in headless Chromium
    with CHECK appended: the report itself has no script."""
    chromium = require_tool("chromium")
    page = work / "page.html"
    page.write_text(html_text.replace("<body>", "<body>" + CHECK, 1))  # first, to see every script's error
    run = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
                          f"--user-data-dir={work / 'p'}",
                          "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stderr[-2000:]
    check = re.search(r'<div id="render-check">images=(\d+) broken=(\d+) sections=([\w,]*)</div>', run.stdout)
    assert check, run.stdout[-2000:] + run.stderr[-2000:]
    return check, run.stdout, run.stderr


JS_ERROR = re.compile(r"<html[^>]*data-js-error")
CONSOLE_ERROR = re.compile(r"CONSOLE\(\d+\)|Uncaught")  # what Chromium logs of a page's console and errors


def test_the_report_renders_in_headless_chromium(rendered, tmp_path):
    check, dom, log = _open_in_chromium(rendered.read_text(), tmp_path)
    assert int(check.group(1)) >= 2 and check.group(2) == "0"
    assert check.group(3).split(",") == ["usage", "energy", "placement", "mig", "reliability", "alerts", "slow_jobs"]
    assert not JS_ERROR.search(dom)
    assert not CONSOLE_ERROR.search(log), log[-2000:]


def test_the_browser_check_sees_a_broken_image_and_a_script_error(tmp_path):
    page = ('<!DOCTYPE html><html><body><section id="s"><img src="data:image/png;base64,AAAA"></section>'
            "<script>undefined_function();</script></body></html>")
    check, dom, log = _open_in_chromium(page, tmp_path)
    assert check.group(1, 2, 3) == ("1", "1", "s")
    assert JS_ERROR.search(dom) and CONSOLE_ERROR.search(log), log[-2000:]


# ------------------------------------------------------------- against the fleet simulation's history
FLEET_NODES, FLEET_HOURS = 5, 2  # one node per cluster (cluster-4 runs Slurm jobs)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(History, rendered report page) of the fleet bench's simulation (bench/fleet.py): nodes built from
    the gpuobs exporter's own exposition on the simulator, pods of several namespaces coming and going,
    kube-state-metrics and Kueue, every recording rule backfilled; the report through the CLI."""
    require_tool("promtool"), require_tool("prometheus")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import fleet as bench_fleet

    work = tmp_path_factory.mktemp("fleet")
    h = bench_fleet.History(work, bench_fleet.node_template(work), FLEET_NODES, hours=FLEET_HOURS,
                            dashboards=bench_fleet.FLEET_DASHBOARDS + bench_fleet.EFFICIENCY_DASHBOARDS)
    try:
        h.write()
        h.backfill_rules(only={r.name for r in report.records_read()})
        h.serve(h.lookback)  # the report reads the scraped series: see History
        out = work / "report.html"  # teams from the simulation's kube_namespace_labels, prices the rules'
        result = CliRunner().invoke(main, ["report", "--prometheus", h.url, "--from", str(h.start), "--to", str(h.end),
                                           "--step", "60", "--out", str(out)])
        assert result.exit_code == 0, result.output + repr(result.exception)
        yield h, out.read_text()
    finally:
        h.close()


def test_report_on_the_fleet_simulation_has_each_teams_gpu_hours(fleet):
    from bench import workload

    h, page = fleet
    rows = report.read_rows(page)
    truth = workload.over_clusters(h.truth((h.start, h.end))["team"])  # the simulation's allocation
    assert len(truth) >= 3 and any(t.idle > 0 for t in truth.values())
    # The rules' GPU-hours cover the weekly steps inside the range: Prometheus (and promtool's backfill)
    # offsets a group's evaluations by a hash of its name and file, so the steps cover the range shifted
    # by up to one weekly_interval, and up to one interval's hours at the two ends together may be
    # missing. The simulation's own hours in those two intervals bound it, team by team.
    step = report.records.duration_seconds(DEFAULT.weekly_interval)
    ends = [workload.over_clusters(h.truth(w)["team"]) for w in ((h.start, h.start + step), (h.end - step, h.end))]
    for team, want in truth.items():
        late = {f: sum(getattr(e[team], f) or 0.0 for e in ends if team in e) for f in ("allocated", "used", "idle")}
        cells = rows[("usage", team)]  # team, allocated, used, mean %, idle, idle cost
        assert _num(cells[1]) == pytest.approx(want.allocated, rel=0.02, abs=late["allocated"]), team
        assert _num(cells[2]) == pytest.approx(want.used, rel=0.02, abs=late["used"]), team
        # idle hours are a fraction of an hour here: allow the report's 60 s step at each end of an idle hold
        assert _num(cells[4]) == pytest.approx(want.idle, rel=0.02, abs=2 / 60 + late["idle"]), team
        # no cost_per_gpu_hour in the file: priced as the recording rules price an H100
        price = max(cost for _, cost in DEFAULT.gpu_hour_costs)
        assert _num(cells[5]) == pytest.approx(want.idle_cost, rel=0.02, abs=price * (2 / 60 + late["idle"])), team
        assert cells[5].endswith("USD"), team


def test_report_on_the_fleet_simulation_has_mig_candidates_and_failures(fleet):
    _, page = fleet
    for section in ("mig", "reliability"):
        body = page[page.index(f'<section id="{section}"'):]
        body = body[:body.index("</section>")]
        assert "<table" in body, section
    reliability = page[page.index('<section id="reliability"'):]
    assert "gpu_lost" in reliability and "xid_reboot" in reliability  # the simulation's lost GPU and XID 79


def test_report_on_the_fleet_simulation_renders_in_headless_chromium(fleet, tmp_path):
    check, dom, log = _open_in_chromium(fleet[1], tmp_path)
    # every plot loaded (the history has no ALERTS series: no alerts plot)
    assert int(check.group(1)) == fleet[1].count("<img") >= 1 and check.group(2) == "0"
    assert check.group(3).split(",") == ["usage", "energy", "placement", "mig", "reliability", "alerts", "slow_jobs"]
    assert not JS_ERROR.search(dom) and not CONSOLE_ERROR.search(log), log[-2000:]


def test_without_a_cost_file_the_report_prices_as_the_recording_rules(tmp_path):
    rules = report.Settings.from_thresholds()
    assert report.load_settings(None).costs == rules.costs and report.load_settings(None).priced
    (tmp_path / "off.yaml").write_text("cost_per_gpu_hour: {}\n")
    assert not report.load_settings(tmp_path / "off.yaml").priced


def test_report_gpu_hours_per_team_equal_the_weekly_records(fleet):
    """The report's GPU-hours per team are the weekly records' own values on the same data: over the
    range from the history's start to the records' last weekly step (the history is shorter than
    weekly_window, so the record sums the whole of it), and both are the simulation's truth (its
    allocation, integrated every 5 s) over that range."""
    from bench import workload
    from gpuobs import records

    h, _ = fleet
    client = report.Prometheus(h.url)
    hours = report.hours_records("team")
    # the records' last step (raw samples: the history's Prometheus looks back 60 s only)
    t_last = max(float(v[0]) for s in client.instant(f"{hours['allocated'].name}[15m]", h.end) for v in s["values"])
    rows, from_rules = report.usage(client, report.Window(h.start, t_last, 60), report.Settings(), "team")
    assert from_rules
    # the truth over the steps the record summed (each standing for the weekly interval before it),
    # as the fleet bench's check_usage compares them
    step = report._step_of(hours["allocated"])
    times = [float(v[0]) for s in client.instant(f"{step.name}[{FLEET_HOURS + 1}h]", t_last) for v in s["values"]]
    interval = records.duration_seconds(DEFAULT.weekly_interval)
    truth = workload.over_clusters(h.truth((min(times) - interval, max(times)))["team"])
    for field in ("allocated", "used", "idle"):
        got: dict[str, float] = {}
        for s in client.instant(hours[field].name, t_last):
            got[s["metric"]["team"]] = got.get(s["metric"]["team"], 0.0) + float(s["value"][1])
        assert set(got) == set(truth) and len(got) >= 3, field
        for team, value in got.items():
            assert getattr(rows[team], field) == pytest.approx(value, rel=1e-9, abs=1e-9), (field, team)
            # the records' own error on 2 h of pods starting and ending inside 5 min steps (a few %; the
            # fleet bench measures it on a longer history): the report adds none, above
            assert value == pytest.approx(getattr(truth[team], field), rel=0.05, abs=2 / 60), (field, team)
