"""The per-family checklist: the metric family is the unit of change (one catalog module, one
collector, one alert module per family), and every metric of every family of the exporter's registry
(gpuobs.collect.REGISTRY, and the exporter's own self-health) passes every layer:

1. catalog: defined in its family's catalog module, gpuobs/catalog/<family>.py;
2. collected: served by the exporter on a simulated node, or listed in NOT_SIMULATED with the reason;
3. documented: in docs/metrics.md;
4. read: by a dashboard panel, a recording rule or an alert, or detail (catalog.DETAIL, declared in
   its family module), or listed in NOT_READ with the reason;
5. runbook: every alert that reads it has docs/runbooks/<Alert>.md.

test_a_missing_layer_fails shows each layer catching a metric that lacks it."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO, free_port, stop

from gpuobs import catalog as c
from gpuobs import records
from gpuobs.alerts.rules import DEFAULT, alerts
from gpuobs.collect import REGISTRY

FAMILIES = (*REGISTRY, "exporter")
TOKEN = re.compile(r"(?<![\w:])[a-zA-Z_][\w:]*")

# metric -> why the simulated node of test_every_family_passes_the_checklist does not serve it
NOT_SIMULATED: dict[c.Metric, str] = {
    c.GPU_UNHEALTHY: "only while a GPU is unusable (tests/test_exporter_faults.py injects that)",
    c.RETIRED_PAGES: "page retirement is pre-Ampere; the simulator's profiles are Ampere and newer",
    c.RETIRED_PAGES_PENDING: "page retirement is pre-Ampere; the simulator's profiles are Ampere and newer",
    c.FABRIC_HEALTH: "the captured Hopper driver reports no fabric health mask (nvmlGpuFabricInfo_v2)",
    c.NVML_INIT_ERROR: "only while NVML is down or initializing (tests/test_exporter_faults.py)",
    c.NVML_ERRORS: "only after a failed NVML call (tests/test_exporter_faults.py)",
    c.DROPPED: "only after an impossible value (tests/test_exporter_honest.py)",
    c.XID_WATCHER_ERRORS: "only after the XID thread failed (tests/test_xid_watcher.py)",
    c.ATTRIBUTION_UP: "only with attribution on (tests/test_attribution.py)",
}
# metric -> why it is served by default though no panel, record or alert reads it
NOT_READ: dict[c.Metric, str] = {}


@dataclass
class World:
    """What the layers are checked against: sample names served on the simulator, docs/metrics.md,
    {metric: readers} (panels, records, alerts) and the runbooks there are."""
    served: set[str]
    docs: str
    readers: dict[c.Metric, set[str]] = field(default_factory=dict)
    runbooks: set[str] = field(default_factory=set)


def family_metrics(family: str) -> list[c.Metric]:
    """The catalog's metrics of one family (Metric.family), in catalog order."""
    return [m for m in c.ALL if m.family == family]


def defined_by_module(family: str) -> set[c.Metric]:
    """The metrics gpuobs/catalog/<family>.py defines: its Metric attributes and the values of its
    dicts of Metric (GPM_METRICS, MIG_GPM_METRICS). Empty without such a module."""
    try:
        module = importlib.import_module(f"gpuobs.catalog.{family}")
    except ModuleNotFoundError:
        return set()
    found = set(c.defined_in(module))
    for value in vars(module).values():
        if isinstance(value, dict):
            found |= {v for v in value.values() if isinstance(v, c.Metric)}
    return found


def _expressions(obj) -> list[str]:
    """The PromQL of a Grafana dashboard: every "expr", "query" and "definition" string in it."""
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k in ("expr", "query", "definition") and isinstance(v, str)] + \
            [e for v in obj.values() for e in _expressions(v)]
    if isinstance(obj, list):
        return [e for v in obj for e in _expressions(v)]
    return []


def readers() -> dict[c.Metric, set[str]]:
    """{metric: "panel <dashboard>" / "record <name>" / "alert <name>"} of everything that selects it."""
    by_sample = {s: m for m in c.ALL for s in (m.name, *m.prometheus_samples)}
    exprs = [(f"alert {a.name}", a.expr) for a in alerts(DEFAULT)]
    exprs += [(f"record {r.record}", r.expr) for r in records.recording_rules(DEFAULT)]
    for path in sorted((REPO / "dashboards").glob("*.json")):
        exprs += [(f"panel {path.stem}", e) for e in _expressions(json.loads(path.read_text()))]
    out: dict[c.Metric, set[str]] = {}
    for who, expr in exprs:
        for token in TOKEN.findall(expr):
            if token in by_sample:
                out.setdefault(by_sample[token], set()).add(who)
    return out


def checklist(metric: c.Metric, world: World) -> list[str]:
    """The layers the metric misses, each as 'layer: what is wrong' (empty: it passes them all)."""
    gaps = []
    if metric not in defined_by_module(metric.family):
        gaps.append(f"catalog: not defined in gpuobs/catalog/{metric.family}.py")
    if not set(metric.prometheus_samples) & world.served and metric not in NOT_SIMULATED:
        gaps.append("collected: not served on the simulator and not in NOT_SIMULATED")
    if f"`{metric.exposed_name}`" not in world.docs:
        gaps.append("documented: not in docs/metrics.md")
    read_by = world.readers.get(metric, set())
    if not read_by and metric not in c.DETAIL and metric not in NOT_READ:
        gaps.append("read: no panel, record or alert reads it, and it is not detail (catalog.DETAIL)")
    for who in sorted(read_by):
        if who.startswith("alert ") and who[6:] not in world.runbooks:
            gaps.append(f"runbook: {who} has no docs/runbooks/{who[6:]}.md")
    return gaps


def world_of(served: set[str]) -> World:
    """The World of the repository's generated files and rules, with these sample names served."""
    return World(served=served, docs=(REPO / "docs" / "metrics.md").read_text(), readers=readers(),
                 runbooks={p.stem for p in (REPO / "docs" / "runbooks").glob("*.md") if p.read_text().strip()})


# One node with whatever the families need to have something to say: a whole GPU with a process,
# one in MIG mode, a desktop board with a fan; an XID event and a kernel-log line follow at run time.
SPEC = {"gpus": [{"profile": "h100-sxm-80gb", "count": 1}, {"profile": "h100-sxm-80gb", "count": 1,
                                                              "mig": ["1g.10gb", "1g.10gb"]},
                 {"profile": "rtx-4080-super", "count": 1}],
        "processes": [{"gpu": 0, "pid": 4242, "name": "python train.py", "used_mib": 2048, "sm_util": 50}]}
KERNEL_LINE = "4,0,17,-;NVRM: Xid (PCI:0000:ee:00): 48, pid=1, An uncorrectable double bit error\n"


def test_every_family_passes_the_checklist(exporter, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KERNEL_LINE)
    run = exporter(SPEC, families=set(REGISTRY), kernel_log=str(kmsg), kernel_log_state="")
    run.sim.state.xid(0, 79)
    wanted = {c.XID_ERRORS.exposed_name, c.KERNEL_XID_ERRORS.exposed_name, c.PROCESS_MEMORY.exposed_name,
              c.MIG_GPM_METRICS[next(iter(c.MIG_GPM_METRICS))].exposed_name}
    scrape = run.wait_for(lambda s: wanted <= {n for n, _, _ in s}, 15, "XID, kernel-log, process and MIG GPM series")
    world = world_of({name for name, _, _ in scrape})
    assert set(REGISTRY) <= {m.family for m in c.ALL}, "a registered family without catalog metrics"
    gaps = {f"{family}/{m.name}": checklist(m, world) for family in FAMILIES for m in family_metrics(family)}
    assert not {k: v for k, v in gaps.items() if v}
    # the exceptions are still exceptions: a metric served after all, or read after all, leaves its list
    assert not [m.name for m in NOT_SIMULATED if set(m.prometheus_samples) & world.served]
    assert not [m.name for m in NOT_READ if world.readers.get(m) or m in c.DETAIL]


def test_every_catalog_module_holds_only_its_family():
    for module in c.FAMILY_MODULES:
        family = module.__name__.rsplit(".", 1)[1]
        assert {m.family for m in defined_by_module(family)} == {family}, family
    assert set(c.ALL) == {m for module in c.FAMILY_MODULES for m in defined_by_module(module.__name__.split(".")[-1])}


def test_a_missing_layer_fails(monkeypatch):
    """A fake power gauge, added one layer at a time: each missing layer is named, and with every
    layer in place the checklist passes."""
    fake = c.Metric("gpuobs_gpu_fake_watts", "gauge", "watts", "A fake.", "power", "nowhere")
    monkeypatch.setattr(c, "ALL", c.ALL + (fake,))
    world = world_of(served=set())
    layers = lambda: [gap.split(":")[0] for gap in checklist(fake, world)]  # noqa: E731
    assert layers() == ["catalog", "collected", "documented", "read"]
    monkeypatch.setattr(importlib.import_module("gpuobs.catalog.power"), "FAKE", fake, raising=False)
    assert layers() == ["collected", "documented", "read"]
    world.served.add(fake.name)
    assert layers() == ["documented", "read"]
    world.docs += f"| `{fake.name}` |"
    assert layers() == ["read"]
    world.readers[fake] = {"alert GpuFakeAlert"}
    assert layers() == ["runbook"]
    world.runbooks.add("GpuFakeAlert")
    assert layers() == []
    world.readers.pop(fake)
    monkeypatch.setattr(c, "DETAIL", c.DETAIL | {fake})
    assert checklist(fake, world) == []
    assert fake in family_metrics("power")


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_every_registered_family_has_a_catalog_module(family):
    assert defined_by_module(family), f"gpuobs/catalog/{family}.py defines no metric"


# ------------------------------------------------------------------------ acceptance, in a temp copy
# What `gpuobs generate` reads and writes: the package and every generator's folders (gpuobs.generated)
COPIED = ("gpuobs", "alerts", "dashboards", "docs", "deploy/fluent-bit", "examples/scenarios")


def _copy(tmp_path: Path) -> Path:
    """A copy of what `gpuobs generate` and the exporter need (no caches)."""
    root = tmp_path / "repo"
    for part in COPIED:
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(root: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """`python ARGS` in the copy, importing gpuobs from it."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300,
                          **kw)


def _generate(root: Path) -> set[str]:
    """Run `gpuobs generate` in the copy; the paths (relative) of every file a generator makes there."""
    out = _run(root, "-m", "gpuobs.cli", "generate")
    assert out.returncode == 0, out.stderr[-2000:]
    listing = _run(root, "-c", "import json; from gpuobs import generated as g; print(json.dumps(sorted("
                   "str(p.relative_to(g.ROOT)) for gen in g.GENERATORS for p in gen.make(g.ROOT, None))))")
    assert listing.returncode == 0, listing.stderr[-2000:]
    return set(json.loads(listing.stdout))


def _changed(root: Path) -> list[str]:
    """Files of the copy that differ from the repository's (or that it alone has), relative paths."""
    changed = []
    for path in sorted(p for part in COPIED for p in (root / part).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel:
            continue
        if not (REPO / rel).is_file() or (REPO / rel).read_bytes() != path.read_bytes():
            changed.append(rel)
    return changed


def _edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of old in a file (AssertionError unless there is exactly one)."""
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_renaming_a_metric_changes_only_its_catalog_line_and_generated_files(tmp_path):
    """The rename, as a user does it: one name string in the family's catalog module, then `gpuobs
    generate`. Every file that changed is generated, or that one catalog line."""
    root = _copy(tmp_path)
    module = root / "gpuobs" / "catalog" / f"{c.POWER_USAGE.family}.py"
    old, new = c.POWER_USAGE.name, "gpuobs_gpu_board_power_watts"
    _edit(module, f'_m("{old.removeprefix("gpuobs_")}"', f'_m("{new.removeprefix("gpuobs_")}"')
    generated = _generate(root)
    changed = _changed(root)
    catalog_line = module.relative_to(root).as_posix()
    assert catalog_line in changed and set(changed) - {catalog_line} <= generated, changed
    before, after = (REPO / catalog_line).read_text().splitlines(), module.read_text().splitlines()
    assert len(before) == len(after) and sum(a != b for a, b in zip(before, after)) == 1
    # the rules, the dashboards, the runbooks and the metric docs all followed
    for part in ("alerts/", "dashboards/", "docs/runbooks/", "docs/metrics.md"):
        assert any(p.startswith(part) for p in changed), part
    assert not [p for p in generated if old in (root / p).read_text()], "a generated file keeps the old name"


NEW_METRIC = '''
POWER_INSTANT = _m("gpu_power_instant_watts", "gauge", "watts", "Power draw of the GPU board at this instant "
                   "(the same field as gpuobs_gpu_power_usage_watts, unchecked).", "power",
                   "NVML_FI_DEV_POWER_INSTANT (milliwatts) / 1000")
detail(POWER_INSTANT)
'''


def test_adding_a_metric_to_a_family_reaches_every_layer(tmp_path):
    """A new gauge of the power family, added as ARCHITECTURE.md's "Where to add" says, in a temp copy.
    Hand-written files edited: 2 (gpuobs/catalog/power.py: the Metric and its tier; and
    gpuobs/collect/power.py: one emit) where it took 10 before the family modules; then `gpuobs
    generate`. docs/metrics.md lists it, docs/cardinality.md counts it, and the exporter of the copy
    serves it on the simulator."""
    root = _copy(tmp_path)
    with (root / "gpuobs" / "catalog" / "power.py").open("a") as f:
        f.write(NEW_METRIC)
    _edit(root / "gpuobs" / "collect" / "power.py", "        gpu.emit(c.POWER_USAGE, draw, per=MILLI)\n",
          "        gpu.emit(c.POWER_USAGE, draw, per=MILLI)\n        gpu.emit(c.POWER_INSTANT, draw, per=MILLI)\n")
    generated = _generate(root)
    changed = _changed(root)
    edited = sorted(set(changed) - generated)
    assert edited == ["gpuobs/catalog/power.py", "gpuobs/collect/power.py"], edited
    assert "`gpuobs_gpu_power_instant_watts`" in (root / "docs" / "metrics.md").read_text()
    assert "docs/cardinality.md" in changed  # the full profile's power series, one more per GPU
    assert _serves(root, "gpuobs_gpu_power_instant_watts") == 8  # one per GPU of the 8xH100 scenario


def _serves(root: Path, name: str) -> int:
    """Series of `name` the copy's exporter serves (full profile) on the 8xH100 simulator."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--simulate",
                             "examples/scenarios/8xh100.yaml", "--listen-address", "127.0.0.1", "--port", str(port),
                             "--interval", "0.5", "--profile", "full", "--kernel-log", "off"],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                if "gpuobs_gpu_power_usage_watts{" in body:
                    return sum(line.startswith(name + "{") for line in body.splitlines())
            except OSError:
                pass
            assert time.monotonic() < deadline, "the copy's exporter served no GPU series"
            time.sleep(0.2)
    finally:
        stop(proc)
