"""Generate docs/metrics.md from the catalog and docs/cardinality.md from the exporter run on the
simulator (`gpuobs generate` rewrites both, with the other generated files; `--check` only reports
differences)."""

from __future__ import annotations

import collections
import logging
import os
import re
from pathlib import Path

from . import catalog as c

DOCS = Path(__file__).resolve().parents[1] / "docs"
METRICS_MD = DOCS / "metrics.md"
CARDINALITY_MD = DOCS / "cardinality.md"
# (label, simulator profile, MIG layout): the GPUs the cardinality budget is measured on
CARDINALITY_CASES = (("H100 SXM", "h100-sxm-80gb", None), ("H100, MIG 7 × 1g.10gb", "h100-sxm-80gb", ["1g.10gb"] * 7),
                     ("H200", "h200", None), ("A100 40GB", "a100-40gb", None), ("L40S", "l40s-pcie", None),
                     ("RTX 4080 SUPER", "rtx-4080-super", None))
PROFILE_NAMES = ("default", "full")  # gpuobs.collect.profile.PROFILES, in the order the tables show them
SERIES_BUDGET = 40  # most series per H100/H200 GPU in the default profile (tests/test_cardinality.py)
MULTIPLIER_PROCESSES = 3  # compute processes placed on the GPU to measure series per process
MULTIPLIER_XIDS = (79, 48)  # XID codes injected to measure series per code seen


def _tier_note(m: c.Metric) -> str:
    """What the default profile serves of a metric (docs/cardinality.md), for the metrics reference."""
    if m in c.DETAIL:
        return " *Detail: `--profile full` or `--detail " + m.family + "`.*"
    if m in c.DEFAULT_VALUES:
        label, values = c.DEFAULT_VALUES[m]
        return (f" *Default profile: {label} " + ", ".join(sorted(values)) + " only; every value with "
                f"`--profile full` or `--detail {m.family}`.*")
    return ""


def metrics_markdown() -> str:
    """The metrics reference: one table per family, every catalog metric once."""
    out = ["# Metrics", "",
           "Generated from `gpuobs/catalog/` by `gpuobs generate`; a test fails when this file differs.",
           "", f"Every per-GPU series carries the identity labels `{', '.join(c.GPU_LABELS)}` (NVML index and UUID);",
           f"MIG series carry `{', '.join(c.MIG_LABELS)}`. Families marked opt-in are off by default;",
           "metrics marked detail are left out by the default profile (docs/cardinality.md).",
           "The training and inference families are recorded by `gpuobs.instrument` through OpenTelemetry;",
           "their names are what OTel's Prometheus conversion makes of the instrument names.", ""]
    from .collect import REGISTRY

    for family in (*REGISTRY, "exporter", *c.APP_FAMILIES):
        metrics = [m for m in c.ALL if m.family == family]
        opt = " (opt-in)" if family in REGISTRY and not REGISTRY[family].default else ""
        out += [f"## {family}{opt}", "", "| metric | type | labels | description | NVML source | DCGM field |",
                "| --- | --- | --- | --- | --- | --- |"]
        for m in sorted(metrics, key=lambda m: m.name):
            extra = ", ".join(m.extra_labels if m.identity else m.labels) or "-"
            dcgm = ", ".join(sorted(set(m.dcgm.values()))) or "-"
            out.append(f"| `{m.exposed_name}` | {m.kind} | {extra} | {m.help}{_tier_note(m)} | {m.source} | {dcgm} |")
        out.append("")
    return "\n".join(out)


def _family_of() -> dict[str, str]:
    """Exposed sample name -> catalog family, for every exporter metric."""
    return {name: m.family for m in c.ALL for name in m.prometheus_samples}


def count_series(body: str) -> collections.Counter[str]:
    """Series per catalog family in a /metrics body (gpuobs naming): one per sample line."""
    family = _family_of()
    out: collections.Counter[str] = collections.Counter()
    for line in body.splitlines():
        if line and not line.startswith("#"):
            out[family[line.split("{", 1)[0].split(" ", 1)[0]]] += 1
    return out


def render_node(spec: dict, xids: tuple[int, ...] = (), profile: str = "full") -> str:
    """The /metrics body after the second sampling pass (GPM needs two) of an exporter with every
    family on a simulated node, serving the series of `profile` (collect.profile: default or full);
    `xids` are queued on GPU slot 0 after the first pass."""
    import time

    from .collect import REGISTRY, Sampler, Session, XidWatcher, build_families
    from .collect.profile import Profile
    from .exporter import ExporterConfig
    from .exporter.render import Renderer
    from .sim import Simulator

    saved = os.environ.get("GPUOBS_SIM_STATE")
    quiet = logging.getLogger("gpuobs")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the injected XIDs are logged as errors: not news here
    sim = Simulator(spec).activate()
    session = Session()
    watcher = XidWatcher(session, wait_ms=20)
    sampler = Sampler(session, build_families(set(REGISTRY), watcher=watcher, process_cap=ExporterConfig().process_cap),
                      interval=1.0, profile=Profile(profile))
    renderer = Renderer(hostname="node")
    try:
        sampler.sample_once()
        if xids:
            watcher.start()
            for code in xids:
                sim.state.xid(0, code)
            deadline = time.monotonic() + 10
            while len(watcher.totals()) < len(xids) and time.monotonic() < deadline:
                time.sleep(0.01)
        renderer.render(sampler.sample_once())
        return renderer.fresh.decode()
    finally:
        if xids:
            watcher.stop()
        session.shutdown()
        sim.close()
        quiet.setLevel(level)
        if saved is None:
            os.environ.pop("GPUOBS_SIM_STATE", None)
        else:
            os.environ["GPUOBS_SIM_STATE"] = saved


def _gpu_spec(profile: str, mig: list[str] | None) -> dict:
    g: dict = {"profile": profile, "count": 1}
    if mig:
        g["mig"] = mig
    return {"gpus": [g]}


def measure_cardinality() -> dict:
    """Series counts: per profile (default, full) per family for one GPU of each case, and the
    multipliers (per process, per XID code, per NVLink link, per MIG instance, under full), all from
    rendered /metrics bodies."""
    from .sim import profiles

    cases = {prof: {label: count_series(render_node(_gpu_spec(gpu, mig), profile=prof))
                    for label, gpu, mig in CARDINALITY_CASES} for prof in PROFILE_NAMES}
    procs = [{"gpu": 0, "pid": 4000 + i, "name": f"python worker{i}.py", "used_mib": 1024 * (i + 1),
              "sm_util": 50} for i in range(MULTIPLIER_PROCESSES)]
    busy = count_series(render_node({**_gpu_spec("h100-sxm-80gb", None), "processes": procs}, MULTIPLIER_XIDS))
    h100, mig = cases["full"][CARDINALITY_CASES[0][0]], cases["full"][CARDINALITY_CASES[1][0]]
    mig_default = cases["default"][CARDINALITY_CASES[1][0]]["mig"] - cases["default"][CARDINALITY_CASES[0][0]]["mig"]
    links = profiles.get("h100-sxm-80gb")["nvlink"]["links"]
    from .exporter import ExporterConfig

    return {"cases": cases, "links": links, "process_cap": ExporterConfig().process_cap,
            "per_process": busy["processes"] / MULTIPLIER_PROCESSES,
            "per_xid": busy["xid"] / len(MULTIPLIER_XIDS),
            # less the NVLink series a GPU has once, whatever its links (no `link` label)
            "per_link": (h100["nvlink"] - sum(m.family == "nvlink" and "link" not in m.labels
                                              for m in c.EXPORTED)) / links,
            "per_mig": (mig["mig"] - h100["mig"]) / len(CARDINALITY_CASES[1][2]),
            "per_mig_default": mig_default / len(CARDINALITY_CASES[1][2])}


def _n(x: float) -> str:
    return f"{x:g}"


def _family_table(cases: dict) -> list[str]:
    """One row per exporter family (default-on, then opt-in), one column per case and profile
    (cases: {profile: {case: Counter}})."""
    from .collect import REGISTRY

    cols = [(prof, label) for label in cases["default"] for prof in PROFILE_NAMES]
    out = ["| family | " + " | ".join(f"{label}, {prof}" for prof, label in cols) + " |",
           "| --- |" + " ---: |" * len(cols)]
    default = [name for name, spec in REGISTRY.items() if spec.default]
    for fam in default:
        out.append(f"| {fam} | " + " | ".join(str(cases[p][k][fam]) for p, k in cols) + " |")
    total = {col: sum(cases[col[0]][col[1]][f] for f in default) for col in cols}
    out.append("| **per GPU, default families** | " + " | ".join(f"**{total[col]}**" for col in cols) + " |")
    return out


def per_gpu_series(measured: dict, profile: str, case: str) -> int:
    """Series per GPU of the default-on families in one measured case and profile (the budget's number)."""
    from .collect import default_families

    return sum(measured["cases"][profile][case][f] for f in default_families())


def _detail_lines() -> list[str]:
    """What the default profile leaves out, per family: the detail metrics and the narrowed ones."""
    from .collect import REGISTRY

    out = []
    for fam in REGISTRY:
        left = sorted(f"`{m.exposed_name}`" for m in c.DETAIL if m.family == fam)
        left += sorted(f"`{m.exposed_name}` other than {label} " + ", ".join(sorted(v))
                       for m, (label, v) in c.DEFAULT_VALUES.items() if m.family == fam)
        if left:
            out.append(f"- **{fam}** (`--detail {fam}`): " + "; ".join(left) + ".")
    return out


_SELF_HEALTH = ", ".join(f"`{n}`" for n in (c.NVML_UP.exposed_name, f"{c.NAMESPACE}_gpus_*",
                                            f"{c.NAMESPACE}_exporter_*", c.NVML_INFO.exposed_name))


def cardinality_markdown(measured: dict | None = None) -> str:
    """docs/cardinality.md: the series budget per GPU and per node, per profile, measured on the simulator."""
    m = measured or measure_cardinality()
    h100 = CARDINALITY_CASES[0][0]
    node = m["cases"]["default"][h100]["exporter"]
    per_gpu = {prof: per_gpu_series(m, prof, h100) for prof in PROFILE_NAMES}
    profiles = ", ".join(f"{label} = `{p}`" + (f" with MIG {len(mig)} × {mig[0]}" if mig else "")
                         for label, p, mig in CARDINALITY_CASES)
    out = ["# Cardinality budget", "",
           "Generated by `gpuobs generate` from the exporter itself: for each GPU below, a simulated node "
           "with that one GPU (`gpuobs.sim`, idle, no processes, no XIDs) is sampled twice by the exporter's "
           "sampler with every family on, and the second pass is rendered as `/metrics` (gpuobs naming), once "
           "per profile. A series is one sample line. A test fails when this file differs from what the code "
           "measures, and another when the default profile serves more than "
           f"{SERIES_BUDGET} series per H100 or H200 GPU.", "",
           "## Profiles", "",
           "- **default** (`gpuobs exporter`, `--profile default`): what every shipped alert, recording rule "
           "and default dashboard panel reads. Per-GPU totals stand in for the per-link NVLink series, and the "
           f"NVLink domain (`{c.NVLINK_DOMAIN.exposed_name}`) for the GPU pairs.",
           "- **full** (`--profile full`; the default with `--naming dcgm`): every series, the detail too.",
           "- **detail per family** (`--detail nvlink,ecc`): the default profile plus every series of those "
           "families. Panels that need detail say so in their description.", "",
           f"Simulator profiles: {profiles}.", "",
           "## Series per GPU, by family", ""]
    out += _family_table(m["cases"])
    out += ["", f"Per node, on top: **{node}** exporter self-health series ({_SELF_HEALTH}), plus one per NVML "
            "error seen (by call and code) and one per kind of dropped value (by metric and reason).", "",
            f"A node of N such GPUs serves N × (per GPU) + per node, plus N × (N − 1) GPU pairs (topology) in "
            f"the full profile; for example 8 × H100 SXM: 8 × {per_gpu['default']} + {node} = "
            f"{8 * per_gpu['default'] + node} series by default, 8 × {per_gpu['full']} + {node} + 56 = "
            f"{8 * per_gpu['full'] + node + 56} with `--profile full`.", "",
            "## What the default profile leaves out", ""]
    out += _detail_lines()
    out += ["", "## What multiplies", ""]
    out += [f"- **NVLink links** (detail): {_n(m['per_link'])} series per link ({m['links']} links on an H100 "
            "SXM); a GPU without NVLink, or in MIG mode, has none. By default 4 per GPU, whatever its links.",
            "- **GPU pairs** (topology, detail): one series per ordered pair of GPUs on a node, N × (N − 1) (56 "
            "on an 8-GPU node, 7 per GPU), not in the per-GPU column above (measured on a node of one GPU); "
            "bounded by the node's GPU count, read at probe.",
            f"- **MIG instances**: {_n(m['per_mig_default'])} series per MIG device by default, "
            f"{_n(m['per_mig'])} in the full profile (identity, memory, BAR1, SMs and GPM activity per GPU "
            "instance), on top of the physical GPU's own series (the MIG columns show the net effect).",
            f"- **XID codes**: {_n(m['per_xid'])} series per distinct XID code a GPU has reported since the "
            f"exporter started (measured with {len(MULTIPLIER_XIDS)} codes); none until the first XID.",
            f"- **Clock-event reasons**: one 0/1 series for each of the {len(c.CLOCK_EVENT_REASONS)} known reasons "
            f"({len(c.DEFAULT_VALUES[c.CLOCK_EVENT_ACTIVE][1])} by default: those the alerts read), plus one per "
            f"unknown bit NVML sets (`bit_N`, full profile), and {len(c.CLOCK_EVENT_COUNTER_FIELDS)} duration "
            "counters where the GPU supports them (detail).",
            "- **Unsupported values** are left out, which is why consumer and older cards have fewer series.",
            "- **Attribution** (`k8s_pod`, `k8s_namespace`, `k8s_container`, `hpc_job`) adds labels, not series "
            "on a scrape, but every new pod or job starts new series in the TSDB.", "",
            "## Opt-in families", "",
            f"- **processes** (`--processes`): {_n(m['per_process'])} series per compute process (measured with "
            f"{MULTIPLIER_PROCESSES} on an H100 SXM), for at most `--process-cap` processes per GPU (default "
            f"{m['process_cap']}, the largest memory users): up to {_n(m['per_process'] * m['process_cap'])} series "
            "per GPU. Graphics-only processes have "
            "no SM utilization sample. Every new PID is a new series in the TSDB, so expect churn on shared nodes.",
            ""]
    return "\n".join(out)


DCGM_SOURCE = DOCS / "src" / "dcgm.md"  # hand-written prose of docs/dcgm.md, native names as placeholders
SIMULATOR_SOURCE = DOCS / "src" / "simulator.md"  # docs/simulator.md, its table of fields not exported generated
TEMPLATES = (DCGM_SOURCE, SIMULATOR_SOURCE)


def not_exported_table() -> str:
    """The Markdown table of the capture fields the simulator's importer does not export and why
    (gpuobs.sim.smi_fields.NOT_EXPORTED: field path pattern -> reason), one row per reason, its
    patterns in the order they are declared."""
    from .sim.smi_fields import NOT_EXPORTED

    by_reason: dict[str, list[str]] = {}
    for pattern, reason in NOT_EXPORTED.items():
        by_reason.setdefault(reason, []).append(pattern)
    return "\n".join(["| fields | not exported, because |", "| --- | --- |",
                      *(f"| {', '.join(f'`{p}`' for p in patterns)} | {reason} |"
                        for reason, patterns in by_reason.items())])
def flavour_table() -> str:
    """The Markdown table of the rule pack's alerts and records the dcgm flavour leaves out or
    replaces (gpuobs.alerts.dcgm), with the inputs DCGM lacks."""
    from .alerts import dcgm

    t = dcgm.DCGM_DEFAULT
    replaced = {a.name for a in dcgm.replacements(t)}
    rows = [f"| alert `{a.name}` | replaced: rewritten on DCGM's series |" for a in dcgm.replacements(t)]
    for kind, missing in (("alert", dcgm.left_out_alerts(t)), ("record", dcgm.left_out_records(t))):
        rows += [f"| {kind} `{name}` | left out: reads {', '.join(f'`{i}`' for i in inputs)} |"
                 for name, inputs in missing.items() if name not in replaced]
    return "\n".join(["| rule | on the dcgm flavour |", "| --- | --- |", *rows])


_PLACEHOLDER = re.compile(r"\{\{(?:c\.([A-Z][A-Z0-9_]*)(\.name)?|dcgm:(DCGM_FI_[A-Z0-9_]+))\}\}")


def _native(match: re.Match) -> str:
    if match[3]:
        found = [m for m in c.ALL if match[3] in m.dcgm.values() and m.identity != c.MIG_LABELS]
    else:
        found = [m for m in [getattr(c, match[1], None)] if isinstance(m, c.Metric)]
    if len(found) != 1:
        raise ValueError(f"{match[0]}: {len(found)} catalog metrics match; name exactly one")
    return found[0].name if match[2] else found[0].exposed_name


def from_template(text: str) -> str:
    """A hand-written page whose native metric names are placeholders, with the names filled in
    from the catalog, so that a rename in the catalog is followed: {{c.NAME}} (NAME a catalog
    Metric's Python name) becomes its exposed name (`_total`, `_info` added), {{c.NAME.name}} its
    name, {{dcgm:FIELD}} the exposed name of the one whole-GPU metric served as that dcgm-exporter
    field, {{sim:not_exported}} the table of not_exported_table(). The template's first line (a
    comment naming its output) is dropped. Raises ValueError for a placeholder that names no metric
    or several."""
    body = text.split("\n", 1)[1] if text.startswith("<!--") else text
    if "{{flavour:left_out}}" in body:
        body = body.replace("{{flavour:left_out}}", flavour_table())
    if "{{sim:not_exported}}" in body:  # the table's reasons name metrics already filled in from the catalog
        body = body.replace("{{sim:not_exported}}", not_exported_table())
    return _PLACEHOLDER.sub(_native, body)


def generated(root: Path = DOCS.parent) -> dict[Path, str]:
    """Every generated doc under root/docs and its content (gpuobs.generated adds the first line
    that names the generator). The cardinality measurement initialises NVML on simulators of its
    own: run it in a process that has no other NVML state (as `gpuobs generate` is)."""
    docs = root / DOCS.name
    return {docs / METRICS_MD.name: metrics_markdown(), docs / CARDINALITY_MD.name: cardinality_markdown(),
            **{docs / src.name: from_template(src.read_text()) for src in TEMPLATES}}
