"""Capture fidelity: does the exporter, on a GPU seeded from an `nvidia-smi` capture, report what
the capture says?

`check(path, phase, exported)` imports the capture (gpuobs.sim.capture), seeds a simulated node
with its first GPU (gpuobs.sim.scenario), runs the real exporter on it through `exported`
(gpuobs.smi.exported_samples: in this process, the NVML session, every collector family, the
sampler and the renderer, i.e. the /metrics body) and compares, line by line of the capture's
`-q` section (plus the `pmon` per-process utilization):

- a field in EXPORTED must be exported with the capture's value after unit conversion, and be
  absent where the capture says N/A, `[N/A]`, `Not available` or `[Not Supported]`;
- a field matching NOT_EXPORTED is listed with the reason it is not exported;
- any other field is UNKNOWN, and fails the check like a mismatch;
- a value the capture cannot show (energy, NVLink counters: SYNTHESIZED) must be absent, unless the
  check was asked to synthesize it, and then its row says "synthesized" (not compared).

`gpuobs sim check-capture FILE [--phase idle|load]` prints the report and exits 1 on a failure.
The field tables (EXPORTED, NOT_EXPORTED, classify, known) live in gpuobs.sim.smi_fields, which the
importer also reads (`known()` tells it the lines it cannot place, logged once by name).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import catalog as c
from . import capture
from . import smi_text as smi
from .smi_fields import CONTEXT, EXPORTED, GPU_TREE, NOT_EXPORTED, Export, classify, known

__all__ = ["EXPORTED", "NOT_EXPORTED", "Export", "Row", "check", "classify", "known", "report"]


@dataclass
class Row:
    """One line of the report: field, the capture's value (raw text), the exported value (None:
    absent) and the verdict: "match", "mismatch", "not exported: <reason>" or "unknown"."""
    field: str
    capture: str
    exported: Any
    verdict: str

    @property
    def failed(self) -> bool:
        """True for a mismatch or an unknown field (either fails the fidelity check); a match or a
        field not exported by design passes."""
        return self.verdict.startswith(("mismatch", "unknown"))


# ---------------------------------------------------------------- comparing

Sample = tuple[str, dict[str, str], float]  # (sample name as served, labels, value)
Exported = Callable[[dict], list[Sample]]  # scenario mapping -> the exporter's samples on it (gpuobs.smi)


def _lookup(samples: list[Sample], spec: Export, labels: dict[str, str]) -> Any:
    """The exported value (or label value) of GPU 0's series of `spec` with `labels`; None if absent."""
    want = {**spec.labels, **labels}
    found = [(lab, v) for n, lab, v in samples if n == spec.metric.exposed_name and lab.get("gpu", "0") == "0"
             and all(lab.get(k) == v2 for k, v2 in want.items()) and (not spec.one_hot or v == 1)]
    if not found:
        return None
    lab, value = found[0]
    return (lab.get(spec.label) or None) if spec.label else value


def _same(expected: Any, got: Any, tolerance: float = 0.0) -> bool:
    if expected is None or got is None:
        return expected is None and got is None
    if isinstance(expected, str) or isinstance(got, str):
        return str(expected) == str(got)
    return math.isclose(float(expected), float(got), rel_tol=1e-6, abs_tol=max(tolerance, 1e-9))


def _context_labels(ctx: dict) -> dict[str, str]:
    """The labels that pick a MIG device's or a process's own series out of the metric's."""
    if "process" in ctx:
        return {"pid": str(smi._int(ctx["process"]))}
    if "mig" in ctx:
        mig = ctx["mig"]
        return {"gpu_instance_id": smi._s(smi._get(mig, "GPU Instance ID")) or "",
                "compute_instance_id": smi._s(smi._get(mig, "Compute Instance ID")) or ""}
    return {}


def _row(path: str, raw: Any, ctx: dict, profile: dict, samples: list[Sample]) -> Row:
    text = smi._s(raw)
    shown = text if text is not None else (str(raw.get(smi.VALUE)) if isinstance(raw, dict) else str(raw))
    where = classify(path)
    name = path + "".join(f"[{k}={v}]" for k, v in _context_labels(ctx).items())
    if where is None:
        return Row(name, shown, None, "unknown")
    if isinstance(where, str):
        return Row(name, shown, None, f"not exported: {where}")
    value = raw.get(smi.VALUE) if isinstance(raw, dict) else raw
    got = None
    for spec in (where, *where.also):  # the row shows the first series; every one must match
        expected = spec.convert(value, profile | {CONTEXT: ctx})
        found = _lookup(samples, spec, _context_labels(ctx))
        got = found if spec is where else got
        if not _same(expected, found, spec.tolerance):
            return Row(name, shown, got, f"mismatch (expected {expected!r} in {spec.metric.exposed_name})")
    return Row(name, shown, got, "match")


def _pmon_rows(profile: dict, samples: list[Sample]) -> list[Row]:
    """Per-process SM utilization from the capture's pmon section (means of the sampled rows)."""
    spec = EXPORTED["pmon/sm"]
    rows = []
    for proc in profile.get("processes") or []:
        if "C" not in (proc.get("type") or "C"):
            continue  # NVML samples utilization of compute processes only
        sm = proc.get("sm_util")
        got = _lookup(samples, spec, {"pid": str(proc["pid"])})
        expected = None if sm is None else sm / 100
        rows.append(Row(f"pmon/sm[pid={proc['pid']}]", "-" if sm is None else f"{sm} %", got,
                        "match" if _same(expected, got) else f"mismatch (expected {expected!r})"))
    return rows


# What the simulator can make up where a capture shows nothing (scenario.SYNTHESIZABLE) -> its metrics.
SYNTHESIZED: dict[str, tuple[c.Metric, ...]] = {
    "energy": (c.ENERGY,),
    "nvlink_counters": (c.NVLINK_TX, c.NVLINK_RX, c.NVLINK_ERRORS, c.NVLINKS_TX, c.NVLINKS_RX, c.NVLINKS_ERRORS),
}


def _synthesized_rows(samples: list[Sample], synthesize: tuple[str, ...]) -> list[Row]:
    """One row per SYNTHESIZED metric of GPU 0: absent unless `synthesize` names its group (a value nvidia-smi
    does not print is never invented: served, it fails), and then labelled "synthesized" (not compared)."""
    rows = []
    for name, metrics in SYNTHESIZED.items():
        for metric in metrics:
            got = next((v for n, lab, v in samples if n == metric.exposed_name and lab.get("gpu", "0") == "0"), None)
            field = f"(not in the capture)/{metric.exposed_name}"
            if name in synthesize:
                rows.append(Row(field, "-", got, f"synthesized: made up by the simulator ({name}), not compared"))
            else:
                rows.append(Row(field, "-", got, "match" if got is None else
                                f"mismatch (invented: the capture has no {name}; synthesize it to serve it)"))
    return rows


def check(path: str | Path, phase: str, exported: Exported, synthesize: tuple[str, ...] = ()) -> list[Row]:
    """One Row per value-bearing line of the first GPU's `-q` block of `phase` (and the top of the
    `-q` output), plus the pmon per-process rows; see the module docstring. `exported(spec)` runs
    the real exporter on a simulated node seeded from a scenario mapping and returns its samples
    (gpuobs.smi.exported_samples: the exporter is a higher layer than the simulator). `synthesize` names
    what the simulator may make up (scenario.SYNTHESIZABLE): those rows say "synthesized"; the others
    must be absent, since nvidia-smi prints no energy or NVLink counter.

    Raises FileNotFoundError, ValueError (as load_capture) or ScenarioError when the capture cannot
    be imported, and whatever `exported` raises."""
    path = Path(path)
    profiles = capture.load_capture(path, phase, warn=False)  # the scenario's import warns; the rows say it too
    if not profiles:
        raise ValueError(f"{path}: no GPU in the {phase} query (-q) section")
    secs = capture.read_sections(path.read_text(encoding="utf-8", errors="replace"))
    other = "load" if phase == "idle" else "idle"  # load_capture's fallback
    root = capture._tree(secs.get((phase, capture.QUERY)) or secs[(other, capture.QUERY)])
    gpu = next(v for k, v in root.items() if capture._GPU_KEY.match(k) and isinstance(v, dict))
    profile = profiles[0] | {"tlimit": _tlimit(secs, gpu), GPU_TREE: gpu}
    samples = exported({"gpus": [{"capture": str(path.resolve()), "phase": phase, "synthesize": list(synthesize)}]})
    rows = [_row(key, value, {}, profile, samples) for key, value in root.items()
            if not capture._GPU_KEY.match(key) and not isinstance(value, dict)]
    rows += [_row(p, raw, ctx, profile, samples) for p, raw, ctx in capture.field_paths(gpu)]
    return rows + _pmon_rows(profile, samples) + _synthesized_rows(samples, synthesize)


def _tlimit(secs: dict, gpu: dict) -> int | None:
    """The absolute T.Limit the importer uses for the first GPU: its idle reading, else this one."""
    idle = [v for k, v in capture._tree(secs.get(("idle", capture.QUERY), "")).items()
            if capture._GPU_KEY.match(k) and isinstance(v, dict)]
    limit = smi.tlimit(smi._get(idle[0], "Temperature")) if idle else None
    return smi.tlimit(smi._get(gpu, "Temperature")) if limit is None else limit


def report(rows: list[Row]) -> list[str]:
    """The rows as aligned text lines (field, capture value, exported value, verdict) and a summary."""
    w = max([len(r.field) for r in rows] + [5])
    lines = [f"{'field':<{w}}  {'capture':<28}  {'exported':<22}  verdict"]
    for r in rows:
        got = "(absent)" if r.exported is None else f"{r.exported:g}" if isinstance(r.exported, float) else r.exported
        lines.append(f"{r.field:<{w}}  {r.capture[:28]:<28}  {str(got)[:22]:<22}  {r.verdict}")
    counts = {k: sum(1 for r in rows if r.verdict.startswith(k)) for k in ("match", "mismatch", "not exported",
                                                                          "unknown", "synthesized")}
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    return lines
