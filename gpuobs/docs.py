"""Generate docs/metrics.md from the catalog (`python -m gpuobs.docs` rewrites it)."""

from __future__ import annotations

from pathlib import Path

from . import catalog as c

METRICS_MD = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def metrics_markdown() -> str:
    """The metrics reference: one table per family, every catalog metric once."""
    out = ["# Metrics", "",
           "Generated from `gpuobs/catalog.py` by `python -m gpuobs.docs`; a test fails when this file differs.",
           "", f"Every per-GPU series carries the identity labels `{', '.join(c.GPU_LABELS)}` (NVML index and UUID);",
           f"MIG series carry `{', '.join(c.MIG_LABELS)}`. Families marked opt-in are off by default.",
           "The training and inference families are recorded by `gpuobs.instrument` through OpenTelemetry;",
           "their names are what OTel's Prometheus conversion makes of the instrument names.", ""]
    for family in (*c.FAMILIES, "exporter", *c.APP_FAMILIES):
        metrics = [m for m in c.ALL if m.family == family]
        opt = " (opt-in)" if family in c.DEFAULT_OFF else ""
        out += [f"## {family}{opt}", "", "| metric | type | labels | description | NVML source | DCGM field |",
                "| --- | --- | --- | --- | --- | --- |"]
        for m in sorted(metrics, key=lambda m: m.name):
            extra = ", ".join(m.extra_labels if m.identity else m.labels) or "-"
            dcgm = ", ".join(sorted(set(m.dcgm.values()))) or "-"
            out.append(f"| `{m.exposed_name}` | {m.kind} | {extra} | {m.help} | {m.source} | {dcgm} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    METRICS_MD.write_text(metrics_markdown())
    print(METRICS_MD)


if __name__ == "__main__":
    main()
