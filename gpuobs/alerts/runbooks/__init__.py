"""The runbooks (meaning, impact, diagnosis, action) rendered into docs/runbooks by `gpuobs generate`,
read from Markdown templates beside this module.

Layout: `<family>/<Alert>.md`, one file per alert of the pack, in the folder named after the function
of `gpuobs.alerts.rules.FAMILIES` that defines the alert (`thermal/GpuHwThermalSlowdown.md`); `load`
refuses a file in another family's folder, a file that names no alert, and an alert without a file.
A template holds the four sections of SECTIONS as `## Meaning`, `## Impact`, `## Diagnosis` and
`## Action` headings, in that order, and nothing before the first (so no other line may start with
`## `); each section's text is taken without its surrounding blank lines.

Shared text lives in `_shared/<name>.md`. A line that is exactly `{{include NAME}}` or
`{{include NAME PARAM=VALUE}}` is replaced by that snippet, in which `{{PARAM}}` stands for VALUE
(the rest of the directive, spaces included: `{{include drain reason=gpu degrading}}`). Snippets may
include snippets (not themselves). Each line is read once, so expansion is linear in the output. An
unknown snippet, a parameter the snippet does not take or lacks, or `{{` anywhere else is a
ValueError naming the file, at import.

The texts name no metric or recording rule literally: `$NAME` stands for the sample name of the catalog
metric `gpuobs.catalog.NAME` (counters with `_total`; `${NAME}_sum`, `_count`, `_bucket` for a
histogram's series) or for the name of the record `gpuobs.records.NAME`, filled in when rendered
(`render`), so that they follow a rename. `$thresholds.FIELD` stands for the value of that field of the
`Thresholds` the runbook is rendered for (`threshold_values`: durations in words, shares in percent),
so that the prose quotes the thresholds in use and cannot drift from them. `$$` writes a dollar sign.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from string import Template

from ... import catalog as c
from ... import records
from ..rules import DEFAULT, FAMILIES, Thresholds

SECTIONS = ("meaning", "impact", "diagnosis", "action")
# metrics of the catalog without a name of their own there
ALIASES = {"GPM_DRAM_ACTIVE": c.GPM_METRICS[10]}  # 10: NVML_GPM_METRIC_DRAM_BW_UTIL
ROOT = Path(__file__).parent  # the templates: <family>/<Alert>.md and _shared/<name>.md
SHARED = "_shared"


def names() -> dict[str, str]:
    """What each `$NAME` of the texts stands for, from the catalog and the records as they are now.
    ValueError if a Python name means both a metric and a record."""
    metrics = {k: v for k, v in vars(c).items() if isinstance(v, c.Metric)} | ALIASES
    both = metrics.keys() & records.NAMES.keys()
    if both:
        raise ValueError(f"both a catalog metric and a record: {sorted(both)}")
    return {k: m.exposed_name for k, m in metrics.items()} | {k: r.name for k, r in records.NAMES.items()}


class _Text(Template):
    """A runbook text: `$NAME` (a catalog metric or record) or `$thresholds.FIELD` (a Thresholds field)."""
    idpattern = r"(?a:thresholds\.[a-z][a-z0-9_]*|[_a-z][_a-z0-9]*)"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}
_PERCENT = ("_share", "_utilization", "_ratio")  # fields that are a share of 1, quoted in percent


def _words(duration: str) -> str:
    """A Prometheus duration in words: "5m" -> "5 minutes", "1h" -> "1 hour"."""
    match = _DURATION.fullmatch(duration)
    if match is None:
        raise ValueError(f"{duration!r} is not a Prometheus duration")
    number, unit = match.groups()
    return f"{number} {_UNITS[unit]}{'' if float(number) == 1 else 's'}"


def _quote(name: str, value: object) -> str:
    """How prose quotes one Thresholds field: durations in words, shares in percent ("10 %"), bytes in
    GiB, other numbers as %g, other strings as they are."""
    if isinstance(value, str):
        return _words(value) if _DURATION.fullmatch(value) else value
    if isinstance(value, tuple):  # a table of (key, number) pairs: gpu_hour_costs
        return ", ".join(f"{key} {number:g}" for key, number in value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"Thresholds.{name} is a {type(value).__name__}: no prose form for it")
    if name.endswith(_PERCENT):
        return f"{value * 100:g} %"
    if name.endswith("_bytes"):
        return f"{value / 1024 ** 3:g} GiB"
    return f"{value:g}"


def threshold_values(t: Thresholds = DEFAULT) -> dict[str, str]:
    """What each `$thresholds.FIELD` of the texts stands for under thresholds t (_quote), and two
    derived quantities: `FIELD_per_h` for each `*_per_s` field (an hourly count), and
    `power_brake_changes` (the state changes GpuPowerBrakeRepeated counts: 2 per episode, less one)."""
    values = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    out = {name: _quote(name, v) for name, v in values.items()}
    out |= {f"{name[:-len('_per_s')]}_per_h": f"{v * 3600:g}" for name, v in values.items() if name.endswith("_per_s")}
    out["power_brake_changes"] = f"{2 * t.power_brake_episodes - 1}"
    return {f"thresholds.{name}": text for name, text in out.items()}


def render(alert: str, t: Thresholds = DEFAULT) -> dict[str, str]:
    """The runbook of alert, section by section (SECTIONS), its `$NAME`s and `$thresholds.FIELD`s filled
    in for thresholds t. KeyError for an alert without a runbook, or a `$NAME` that is neither a catalog
    metric nor a record, or a `$thresholds.FIELD` that Thresholds lacks; ValueError for a `$` followed
    by no name."""
    values = names() | threshold_values(t)
    return {section: _Text(text).substitute(values) for section, text in RUNBOOKS[alert].items()}


# ------------------------------------------------------------------------------------------ templates
_HEADING = re.compile(r"^## (.*)$", re.M)
_INCLUDE = re.compile(r"\{\{include ([a-z_]+)(?: ([a-z_]+)=([^{}]*))?\}\}")
_PARAM = re.compile(r"\{\{([a-z_]+)\}\}")


def families() -> dict[str, str]:
    """Each alert's family: the `__name__` of the function of rules.FAMILIES that returns it (the names
    of the pack do not depend on the thresholds), in the pack's order."""
    return {a.name: family.__name__ for family in FAMILIES for a in family(DEFAULT)}


def _sections(text: str, where: str) -> dict[str, str]:
    """A template's sections (SECTIONS), each without its surrounding blank lines. ValueError unless
    its headings are exactly `## Meaning`, `## Impact`, `## Diagnosis`, `## Action` in that order, with
    nothing before the first."""
    parts = _HEADING.split(text)  # [before, heading, body, heading, body, ...]
    headings, expected = parts[1::2], [s.capitalize() for s in SECTIONS]
    if parts[0].strip() or headings != expected:
        raise ValueError(f"{where}: the sections must be {', '.join('## ' + h for h in expected)} in this order, "
                         f"with nothing before the first; found {['## ' + h for h in headings]}")
    return {section: body.strip("\n") for section, body in zip(SECTIONS, parts[2::2])}


def _expand(text: str, root: Path, where: str, stack: tuple[str, ...] = ()) -> str:
    """text with each `{{include ...}}` line replaced by its snippet (recursively; stack: the snippets
    being expanded, to refuse a cycle). ValueError for `{{` on a line that is no include."""
    out = []
    for line in text.split("\n"):
        include = _INCLUDE.fullmatch(line)
        if include:
            name, param, value = include.groups()
            out.append(_snippet(root, name, param, value, where, stack))
        elif "{{" in line:
            raise ValueError(f"{where}: {line.strip()!r} is no directive; a line that is exactly "
                             "{{include NAME}} or {{include NAME PARAM=VALUE}} is the only one")
        else:
            out.append(line)
    return "\n".join(out)


def _snippet(root: Path, name: str, param: str | None, value: str | None, where: str, stack: tuple[str, ...]) -> str:
    """The text of _shared/<name>.md, its `{{param}}` replaced by value and its includes expanded.
    ValueError for a snippet that does not exist, includes itself, or takes another parameter."""
    path = root / SHARED / f"{name}.md"
    if name in stack or not path.is_file():
        reason = "includes itself" if name in stack else f"there is no {SHARED}/{name}.md"
        raise ValueError(f"{where}: {{{{include {name}}}}}: {reason}")
    text = path.read_text().strip("\n")
    takes, given = set(_PARAM.findall(text)), set() if param is None else {param}
    if takes != given:
        raise ValueError(f"{where}: {SHARED}/{name}.md takes {sorted(takes) or 'no parameter'}, "
                         f"given {sorted(given) or 'none'}")
    if param is not None and value is not None:  # _INCLUDE matches both or neither
        text = text.replace(f"{{{{{param}}}}}", value)
    return _expand(text, root, f"{SHARED}/{name}.md", (*stack, name))


def load(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Every alert's runbook, in the pack's order: {alert: {section: text}}, includes expanded, `$`
    tokens left for render. ValueError for a template in a folder other than its alert's family
    (families), a template that names no alert of the pack, an alert without a template, or a
    template or snippet that is not well formed (_sections, _expand)."""
    family, found = families(), {}
    for path in sorted(root.glob("*/*.md")):
        if path.parent.name == SHARED:
            continue
        where, alert = path.relative_to(root).as_posix(), path.stem
        if alert not in family:
            raise ValueError(f"{where}: the alert pack has no alert {alert}")
        if family[alert] != path.parent.name:
            raise ValueError(f"{where}: {alert} is an alert of the family {family[alert]}: "
                             f"its runbook is {family[alert]}/{alert}.md")
        found[alert] = {s: _expand(text, root, where) for s, text in _sections(path.read_text(), where).items()}
    missing = [a for a in family if a not in found]
    if missing:
        raise ValueError(f"alerts without a runbook (<family>/<Alert>.md in {root}): {missing}")
    return {alert: found[alert] for alert in family}


# {alert: {section: template}}: what render fills in (tests may replace an entry)
RUNBOOKS: dict[str, dict[str, str]] = load()
