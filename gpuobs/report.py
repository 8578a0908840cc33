"""`gpuobs report`: a self-contained HTML report of a time range, read from Prometheus, for a weekly review.

The report is a list of sections (SECTIONS). Each is a small function `section(client, window, settings)
-> Section` that queries Prometheus' HTTP API through a `Prometheus` client and returns escaped HTML,
with its plots embedded as base64 PNG data URIs (matplotlib, Agg), so the file needs nothing else to
open. Fleet numbers are the recording rules' (gpuobs.records), never computed a second way: GPU-hours
by team, namespace and Slurm job are the weekly GPU-hour records' expressions over the report's range
(teams from kube-state-metrics' namespace label, as the rules take them); MIG candidates and failures
are the weekly records' series. Sections that read records not every version defines look them up by
Python name in `gpuobs.records.NAMES` (RECORDS below) and say "no data" when the rule or its series is
absent.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import importlib
import io
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Callable

import yaml

from . import catalog as c
from . import mig, records
from .alerts.common import check_grid_intensities
from .alerts.rules import DEFAULT, Thresholds

# Python names in gpuobs.records.NAMES of the records the MIG and reliability sections read, when the
# running version defines them (sections say "no data" otherwise). Change a name here if a rule is renamed.
RECORDS = {
    "reliability": ("CLUSTER_FAILURE_RATE", "NODE_MTBF", "MODEL_MTBF"),
}
PLACEMENT_ALERT = "GpuPodPlacementWithoutNvlink"  # its ALERTS series name the pod placed without NVLink
ALERT_LABELS_HIDDEN = frozenset({"__name__", "alertname", "alertstate"})  # same on every row of a table
STEPS_S = (60, 300, 900, 3600)  # range-query steps: the finest one under MAX_POINTS points
MAX_POINTS = 2500
DURATION = re.compile(r"^(\d+)([smhdw])$")
UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
GROUP_WITHOUT_LABELS = re.compile(r"\b(group_left|group_right)\s+(?=[A-Za-z_:])")  # a modifier before a name
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^{}]*\})?")  # a name, with its matchers if any
MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(!=|=)\s*"([^"\\]*)"\s*')  # l="v" or l!="v"


class ReportError(Exception):
    """Prometheus is unreachable or refused a query, or an option or the settings file is wrong."""


# ------------------------------------------------------------------------------------------ input
@dataclass(frozen=True)
class Window:
    """The reviewed range: start and end in Unix seconds, step in seconds between evaluations (each
    evaluation stands for one step of time, so GPU-hours are sums of values times step)."""
    start: float
    end: float
    step: int

    @property
    def hours(self) -> float:
        """The range's length in hours."""
        return (self.end - self.start) / 3600


def parse_duration(text: str) -> int:
    """Seconds in a Prometheus-style duration of one unit ("90m", "7d"); ReportError if malformed."""
    m = DURATION.match(text.strip())
    if not m or int(m.group(1)) == 0:
        raise ReportError(f"not a duration: {text!r} (use e.g. 7d, 12h, 90m)")
    return int(m.group(1)) * UNITS_S[m.group(2)]


def parse_time(text: str) -> float:
    """Unix seconds from Unix seconds or an ISO 8601 / RFC 3339 time (UTC when it has no offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"not a time: {text!r} (use Unix seconds or e.g. 2026-11-24T00:00:00Z)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def make_window(start: str | None, end: str | None, length: str, step: int | None = None) -> Window:
    """The window from --from/--to/--range: `end` defaults to now, `start` to end minus `length`; the
    step (s) to the finest of STEPS_S giving at most MAX_POINTS evaluations. ReportError if empty."""
    stop = parse_time(end) if end else time.time()
    begin = parse_time(start) if start else stop - parse_duration(length)
    if stop <= begin:
        raise ReportError("the range is empty: --from must be before --to")
    if step is None:
        step = next((s for s in STEPS_S if (stop - begin) / s <= MAX_POINTS), STEPS_S[-1])
    return Window(begin, stop, step)


@dataclass(frozen=True)
class Settings:
    """What the report cannot read from Prometheus, for GPU-hours computed from raw series when the
    recording rules are not loaded (with them loaded, the rules' own Thresholds price and judge):
    team_label: the kube_namespace_labels label naming a namespace's team, as Thresholds.team_label
    (a namespace without it is its own team). costs: {GPU model as gpuobs_gpu_info's `name`, or a regex
    matching whole names as Thresholds.gpu_hour_costs: cost per GPU-hour}, an exact name first, then
    the first regex that matches, then default_cost (None: no cost shown). idle_utilization: a held
    GPU at or below this utilisation (ratio) is wasted. grid_intensities and grid_intensity: the grid's
    carbon intensity in gCO2e/kWh, as Thresholds.grid_intensities (first match) and grid_intensity_default.
    from_thresholds gives the rules' own settings."""
    team_label: str = DEFAULT.team_label
    costs: dict[str, float] = field(default_factory=dict)
    default_cost: float | None = None
    currency: str = DEFAULT.currency
    idle_utilization: float = DEFAULT.idle_utilization
    grid_intensities: tuple[tuple[str, str, float], ...] = DEFAULT.grid_intensities
    grid_intensity: float = DEFAULT.grid_intensity_default

    @classmethod
    def from_thresholds(cls, t=DEFAULT, **overrides) -> "Settings":
        """The pricing, idle threshold and team label of the allocation recording rules under
        thresholds t: the report then agrees with the Fleet efficiency dashboard."""
        return cls(**{"costs": dict(t.gpu_hour_costs), "default_cost": t.gpu_hour_cost_default,
                      "currency": t.currency, "idle_utilization": t.idle_utilization, "team_label": t.team_label,
                      "grid_intensities": t.grid_intensities, "grid_intensity": t.grid_intensity_default,
                      **overrides})

    def thresholds(self, t: Thresholds = DEFAULT) -> Thresholds:
        """t with these settings: the windows of the records' expressions when the report evaluates
        them itself. Each cost key is tried as an exact name first (escaped), then as a regex."""
        exact = [(_promql_literal(k), v) for k, v in self.costs.items()]
        regexes = [(k.replace("\\", "\\\\"), v) for k, v in self.costs.items() if _valid(k)]  # backslashes, for PromQL
        return dataclasses.replace(t, team_label=self.team_label, idle_utilization=self.idle_utilization,
                                   gpu_hour_costs=tuple(exact + regexes),
                                   gpu_hour_cost_default=self.default_cost or 0.0,
                                   grid_intensities=self.grid_intensities,
                                   grid_intensity_default=self.grid_intensity)

    def cost(self, model: str) -> float | None:
        """Cost of one GPU-hour of this model, or None when no cost is known."""
        if model in self.costs:
            return self.costs[model]
        return next((cost for key, cost in self.costs.items() if _fullmatch(key, model)), self.default_cost)

    @property
    def priced(self) -> bool:
        """Whether any cost is configured (else the report shows no money)."""
        return bool(self.costs) or self.default_cost is not None


def _promql_literal(name: str) -> str:
    """A regex matching exactly `name`, written for a PromQL double-quoted string (whose own escapes
    are Go's: a regex backslash is written twice, and `re.escape`'s `\\ ` is no escape there)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\\\1", name)


def _valid(pattern: str) -> bool:
    """Whether a cost key is a valid regex (else it only matches its own name exactly)."""
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _fullmatch(pattern: str, text: str) -> bool:
    """Whether a cost key, read as a regex (PromQL's `=~` matches whole names), matches text."""
    try:
        return re.fullmatch(pattern, text) is not None
    except re.error:  # a model name that is no valid regex is matched exactly, above
        return False


def _grid_intensity(table: Any) -> dict[str, Any]:
    """Settings' grid intensity fields from the settings file's `grid_intensity` mapping ({"default" or
    "LABEL=REGEX": gCO2e per kWh}, the first matching entry in file order wins); ValueError on a key
    that is neither, an invalid label or regex, or an intensity that is negative or not a number."""
    kw: dict[str, Any] = {}
    overrides = []
    for key, value in (table or {}).items():
        if str(key) == "default":
            kw["grid_intensity"] = float(value)
            continue
        label, sep, regex = str(key).partition("=")
        if not sep:
            raise ValueError(f"grid_intensity key {key!r} is neither default nor LABEL=REGEX")
        overrides.append((label.strip(), regex.strip(), float(value)))
    kw["grid_intensities"] = tuple(overrides)
    check_grid_intensities(kw["grid_intensities"], kw.get("grid_intensity", DEFAULT.grid_intensity_default))
    return kw


def load_settings(path: str | Path | None, **overrides) -> Settings:
    """Settings from a YAML file (keys: cost_per_gpu_hour {model or "default": number}, currency,
    team_label, idle_utilization, grid_intensity {"default" or "LABEL=REGEX": gCO2e per kWh}), then
    overrides; ReportError if the file is unreadable, a value has
    the wrong type, or it maps namespaces to teams (`teams`: teams are kube-state-metrics' namespace
    label, the recording rules' one source, so that the report and the dashboards agree). Without
    cost_per_gpu_hour (or without a file) GPU-hours are priced as the recording rules price them
    (Thresholds.gpu_hour_costs); an empty cost_per_gpu_hour turns pricing off."""
    data: Any = {}  # the YAML document: checked below, field by field
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ReportError(f"cannot read the settings file {path}: {e}") from None
    if isinstance(data, dict) and "teams" in data:
        raise ReportError(f"{path}: `teams` is no longer read: a namespace's team is its kube_namespace_labels "
                          f"label (team_label, default {DEFAULT.team_label}), as the recording rules take it")
    try:
        if "cost_per_gpu_hour" in data:
            costs = {str(k): float(v) for k, v in (data["cost_per_gpu_hour"] or {}).items()}
            kw: dict[str, Any] = {"costs": costs, "default_cost": costs.pop("default", None)}
        else:  # the recording rules' prices: the report then agrees with the Fleet efficiency dashboard
            rules = Settings.from_thresholds()
            kw = {"costs": rules.costs, "default_cost": rules.default_cost}
        kw.update({k: str(data[k]) for k in ("currency", "team_label") if k in data})
        if "idle_utilization" in data:
            kw["idle_utilization"] = float(data["idle_utilization"])
        if "grid_intensity" in data:  # else the recording rules' (Thresholds' defaults)
            kw.update(_grid_intensity(data["grid_intensity"]))
    except (AttributeError, TypeError, ValueError) as e:
        raise ReportError(f"{path}: {e} (see docs/report.md for its format)") from None
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**kw)


class Prometheus:
    """A client of Prometheus' HTTP API (urllib). Every method raises ReportError with what went
    wrong when Prometheus is unreachable, answers an HTTP error or reports a failed query."""

    def __init__(self, url: str, timeout: float = 120):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _get(self, path: str, **params) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422/503 carry Prometheus' JSON error
            raise ReportError(f"Prometheus at {self.url} answered {e.code}: {_error_of(e)}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ReportError(f"cannot query Prometheus at {self.url}: {getattr(e, 'reason', e)}") from None
        if body.get("status") != "success":
            raise ReportError(f"Prometheus at {self.url}: {body.get('error', body)}")
        return body["data"]

    def instant(self, promql: str, at: float) -> list[dict]:
        """[{metric: labels, value: [t, "v"]}] of promql evaluated at Unix second `at`."""
        return self._get("/api/v1/query", query=promql, time=f"{at:.3f}")["result"]

    def range(self, promql: str, window: Window, offset: float = 0.0) -> list[dict]:
        """[{metric: labels, values: [[t, "v"], ...]}] of promql at each step of the window, from
        window.start + offset to window.end + offset - step (one evaluation per step of time)."""
        start = window.start + offset
        end = max(start, window.end + offset - window.step)
        return self._get("/api/v1/query_range", query=promql, start=f"{start:.3f}", end=f"{end:.3f}",
                         step=str(window.step))["result"]


def _error_of(e: urllib.error.HTTPError) -> str:
    try:
        return json.load(e).get("error", "")
    except (ValueError, OSError):
        return e.reason


def _values(series: dict) -> list[tuple[float, float]]:
    """(t, value) pairs of a range-query series, NaN dropped."""
    return [(float(t), float(v)) for t, v in series["values"] if not math.isnan(float(v))]


# ------------------------------------------------------------------------------------------ output
@dataclass(frozen=True)
class Section:
    """One part of the report: key (its HTML id), title, and body, escaped HTML."""
    key: str
    title: str
    body: str


def esc(value) -> str:
    """Text escaped for HTML content and attribute values."""
    return html.escape(str(value), quote=True)


def table(headers: list[str], rows: list[tuple[str, list]], numeric_from: int = 1) -> str:
    """An HTML table; rows are (key, cells), key in data-key (for tools and tests); cells from
    numeric_from on are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for key, cells in rows:
        tds = "".join(f'<td class="{"num" if i >= numeric_from else "txt"}">{esc(v)}</td>'
                      for i, v in enumerate(cells))
        body.append(f'<tr data-key="{esc(key)}">{tds}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Rows(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: dict[tuple[str, str], list[str]] = {}
        self._section, self._row, self._cell = "", None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a.get("id", "")
        elif tag == "tr" and "data-key" in a:  # a key's first row in its section (by time before by count)
            key = (self._section, a["data-key"])
            self._row = [] if key in self.rows else self.rows.setdefault(key, [])
        elif tag == "td" and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def read_rows(page: str) -> dict[tuple[str, str], list[str]]:
    """The tables of a rendered report, for tools and tests: {(section id, row's data-key): its cell
    texts}, the first row with that key in each section."""
    parser = _Rows()
    parser.feed(page)
    return parser.rows


def no_data(why: str) -> str:
    """The paragraph a section shows instead of made-up numbers."""
    return f'<p class="nodata">No data: {esc(why)}</p>'


def png(draw: Callable, width: float = 9, height: float = 3.5, alt: str = "") -> str:
    """An <img> with a PNG data URI of what draw(ax) plots on a fresh Figure (no pyplot state)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=90, layout="constrained")
    draw(fig.add_subplot())
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def hours(x: float) -> str:
    """GPU-hours as the tables show them."""
    return f"{x:,.2f}"


def money(x: float | None, settings: Settings) -> str:
    """An amount in the settings' currency, or n/a when no cost is known."""
    return "n/a" if x is None else f"{x:,.2f} {settings.currency}"


# ------------------------------------------------------------------------------ usage and waste
# Per level (its records' label): the weekly GPU-hour records of gpuobs.records.WEEKLY_USAGE, as
# (step record, GPU-hours record) pairs of GPUs allocated, used, wasted and the wasted GPUs' cost
LEVELS = {"team": "team", "namespace": "k8s_namespace", "Slurm job": "hpc_job"}
USAGE_FIELDS = ("allocated", "used", "idle", "idle_cost")  # Usage's fields, in WEEKLY_USAGE's order
WEEKLY_LEVEL = {"team": "team", "namespace": "namespace", "Slurm job": "job"}  # LEVELS -> WEEKLY_USAGE keys


def hours_records(level: str) -> dict[str, records.Record]:
    """{Usage field: the weekly GPU-hours (or money) record of that level} (gpuobs.records.WEEKLY_USAGE)."""
    pairs = records.WEEKLY_USAGE[WEEKLY_LEVEL[level]]
    return dict(zip(USAGE_FIELDS, pairs[1::2]))


def inlined(record: records.Record, t: Thresholds) -> str:
    """record's expression with every record it reads replaced by that record's own expression (in
    parentheses), recursively: the same quantity from raw series, for a Prometheus without the rules.
    Only for records that read records as instant vectors (the per-moment allocation records)."""
    by_name = {r.name: r for r in records.RECORDS}
    # `group_right x` with x a record: written `group_right (...)` it would read as a label list, so an
    # empty one is made explicit first (the same matching)
    expr = GROUP_WITHOUT_LABELS.sub(r"\1 () ", record.expr(t))

    def one(m: re.Match) -> str:
        if m[1] not in by_name:
            return m[0]
        return _filtered(f"({inlined(by_name[m[1]], t)})", m[2] or "")
    return SELECTOR.sub(one, expr)


def _filtered(expr: str, matchers: str) -> str:
    """expr restricted as `{matchers}` would restrict a selector (PromQL has no matchers on an
    expression): each `l="v"` as `and on (l)` a one-series vector labelled l="v", each `l!="v"` as
    `unless on (l)` it (v may be "": no label). ValueError for a regex matcher, which this cannot write."""
    inner = matchers.strip()[1:-1] if matchers else ""
    for part in filter(str.strip, inner.split(",")):
        m = MATCHER.fullmatch(part)
        if m is None:
            raise ValueError(f"cannot inline a record selected with {part.strip()!r}: only = and != to a string")
        label, op, value = m.groups()
        one = f'label_replace(vector(1), "{label}", "{value}", "", "")'
        expr = f"({expr} {'and' if op == '=' else 'unless'} on ({label}) {one})"
    return expr


def record_hours(client: Prometheus, window: Window, settings: Settings, hours: records.Record,
                 unit_s: float = 3600) -> tuple[list, bool]:
    """(instant-query result, from the rules?) of a GPU-hours record over the report's range (or of
    another weekly total: unit_s 1 for the energy records' joules and grams).

    The record's own expression with weekly_window set to the range, evaluated at its end: it sums the
    record's step record (read by name, the recording rules' results), so over a range of
    weekly_window ending at a weekly evaluation it is the record's value, and over any other range
    the same definition. Fallback, when the step record has no series (a Prometheus without the rules
    loaded): the per-moment record the step averages, evaluated from raw series (`inlined`) as a
    subquery at the report's step, summed into hours. One fallback, not one per record level: a
    Prometheus either has the rule groups or not, and the raw definition is the rules' own."""
    rng = f"{int(window.end - window.start)}s"
    t = dataclasses.replace(settings.thresholds(), weekly_window=rng)
    result = client.instant(hours.expr(t), window.end)
    if result:
        return result, True
    now = _step_of(hours).source  # the per-moment record its step record averages
    assert isinstance(now, records.Record)
    raw = f"sum_over_time(({inlined(now, t)})[{rng}:{window.step}s]) * {window.step} / {unit_s:g}"
    # half a step early: each evaluation then sits on a step's start and stands for that step, the
    # range's first included and none past its end
    return client.instant(raw, window.end - window.step / 2), False


def _step_of(hours: records.Record) -> records.Record:
    """The step record a weekly GPU-hours (or energy) record sums (its pair in WEEKLY_USAGE or WEEKLY_ENERGY)."""
    for pairs in (*records.WEEKLY_USAGE.values(), *records.WEEKLY_ENERGY.values()):
        for step, total in zip(pairs[0::2], pairs[1::2]):
            if total is hours:
                return step
    raise KeyError(hours.name)


@dataclass
class Usage:
    """GPU-hours of one team, namespace or Slurm job over the range: allocated (held by a pod or
    job), used (utilisation-weighted), idle (held, at or below the idle threshold: the records'
    "wasted") and the idle time's cost."""
    allocated: float = 0.0
    used: float = 0.0
    idle: float = 0.0
    idle_cost: float | None = None

    def add(self, other: "Usage") -> None:
        """Add other's hours and cost to this one (bench.workload sums its truth with it)."""
        self.allocated += other.allocated
        self.used += other.used
        self.idle += other.idle
        if other.idle_cost is not None:
            self.idle_cost = (self.idle_cost or 0.0) + other.idle_cost


def usage(client: Prometheus, window: Window, settings: Settings, level: str) -> tuple[dict[str, Usage], bool]:
    """({team, namespace or job: Usage}, from the rules?) over the window, from the level's weekly
    records (clusters summed: the tables have no cluster column)."""
    out: dict[str, Usage] = defaultdict(Usage)
    from_rules = True
    for name, record in hours_records(level).items():
        result, ruled = record_hours(client, window, settings, record)
        from_rules = from_rules and ruled
        for series in result:
            row = out[series["metric"].get(LEVELS[level], "")]
            setattr(row, name, (getattr(row, name) or 0.0) + float(series["value"][1]))
    return dict(out), from_rules


def _usage_rows(usage: dict[str, Usage], settings: Settings) -> list[tuple[str, list]]:
    rows = []
    for name, u in sorted(usage.items(), key=lambda kv: -kv[1].idle):
        cells = [name, hours(u.allocated), hours(u.used), f"{100 * u.used / u.allocated:.1f}" if u.allocated else "n/a",
                 hours(u.idle)] + ([money(u.idle_cost, settings)] if settings.priced else [])
        rows.append((name, cells))
    return rows


def _usage_table(usage: dict[str, Usage], settings: Settings, first: str) -> str:
    headers = [first, "GPU-hours allocated", "GPU-hours used (utilisation-weighted)", "mean utilisation %",
               "GPU-hours idle (held, utilisation at or under the idle threshold)"]
    headers += ["idle cost"] if settings.priced else []
    return table(headers, _usage_rows(usage, settings))


def _usage_plot(teams: dict[str, Usage]) -> str:
    names = sorted(teams, key=lambda t: -teams[t].allocated)[:15]

    def draw(ax):
        used = [teams[t].used for t in names]
        ax.barh(names, used, label="used (utilisation-weighted)", color="#3b7dd8")
        ax.barh(names, [teams[t].allocated - teams[t].used for t in names], left=used,
                label="allocated, not used", color="#e8a33d")
        ax.invert_yaxis()
        ax.set_xlabel("GPU-hours")
        ax.legend(loc="lower right")
    return png(draw, height=1.2 + 0.35 * len(names), alt="GPU-hours allocated and used by team")


def section_usage(client: Prometheus, window: Window, settings: Settings) -> Section:
    """Utilisation and waste: GPU-hours allocated, used and idle, and the idle cost, by team, by
    namespace and by Slurm job (the weekly allocation records), with a bar chart per team."""
    levels = {level: usage(client, window, settings, level) for level in LEVELS}
    if not any(rows for rows, _ in levels.values()):
        return Section("usage", "Utilisation and waste by team",
                       no_data(f"no GPU held by a pod or Slurm job in this range ({c.GPU_UP.name} with "
                               f"{', '.join(records.ATTRIBUTION)} labels)"))
    ruled = all(r for rows, r in levels.values() if rows)
    source = ("<p>From the recording rules (the weekly GPU-hour records over this range).</p>" if ruled else
              "<p>Computed from raw series with the recording rules' definitions: the weekly allocation "
              "records have no series in this range (are the rules loaded?).</p>")
    teams = levels["team"][0]
    parts = [source, _usage_plot(teams) if teams else no_data("no namespace held a GPU")]
    for level, (rows, _) in levels.items():
        if rows:
            parts += [f"<h3>By {esc(level)}</h3>", _usage_table(rows, settings, level)]
    if not settings.priced:
        parts.append("<p>No cost per GPU-hour configured (--cost-file has an empty cost_per_gpu_hour): "
                     "idle time is not priced.</p>")
    return Section("usage", "Utilisation and waste by team", "".join(parts))


# ------------------------------------------------------------------------------ energy and carbon
ENERGY_FIELDS = ("joules", "grams")  # Energy's fields: the totals of WEEKLY_ENERGY, in its order


@dataclass
class Energy:
    """Of one team, namespace or Slurm job over the range: the energy its GPUs drew (joules) and its
    CO2e (grams) at the configured grid intensity."""
    joules: float = 0.0
    grams: float = 0.0

    def add(self, other: "Energy") -> None:
        """Add other's energy and CO2e to this one (bench.workload sums its truth with it)."""
        self.joules += other.joules
        self.grams += other.grams


def energy(client: Prometheus, window: Window, settings: Settings, level: str) -> tuple[dict[str, Energy], bool]:
    """({team, namespace or job: Energy}, from the rules?) over the window, from the level's weekly
    energy records (gpuobs.records.WEEKLY_ENERGY; clusters summed), evaluated as record_hours does."""
    out: dict[str, Energy] = defaultdict(Energy)
    from_rules = True
    for name, record in zip(ENERGY_FIELDS, records.WEEKLY_ENERGY[WEEKLY_LEVEL[level]][1::2]):
        result, ruled = record_hours(client, window, settings, record, unit_s=1)
        from_rules = from_rules and ruled
        for series in result:
            row = out[series["metric"].get(LEVELS[level], "")]
            setattr(row, name, getattr(row, name) + float(series["value"][1]))
    return dict(out), from_rules


def kwh(joules: float) -> str:
    """Energy in kWh as the tables show it."""
    return f"{joules / records.JOULES_PER_KWH:,.2f}"


def co2e(grams: float) -> str:
    """CO2e in kg as the tables show it."""
    return f"{grams / 1000:,.2f}"


def section_energy(client: Prometheus, window: Window, settings: Settings) -> Section:
    """Energy and carbon: kWh and kg CO2e of the GPUs each team, namespace and Slurm job held (the
    weekly energy records over this range, or their definitions from raw series without the rules)."""
    levels = {level: energy(client, window, settings, level) for level in LEVELS}
    if not any(rows for rows, _ in levels.values()):
        return Section("energy", "Energy and carbon by team",
                       no_data(f"no GPU held by a pod or Slurm job drew power in this range "
                               f"({c.ENERGY.exposed_name} or {c.POWER_USAGE.name})"))
    ruled = all(r for rows, r in levels.values() if rows)
    overrides = ", ".join(f"{label}=~{regex}: {value:g}" for label, regex, value in settings.grid_intensities)
    source = ("From the recording rules (the weekly energy records over this range)" if ruled else
              "Computed from raw series with the recording rules' definitions: the weekly energy records have "
              "no series in this range (are the rules loaded?)")
    intensity = f"{settings.grid_intensity:g} gCO2e/kWh" + (f" ({overrides} first)" if overrides else "")
    parts = [f"<p>{esc(source)}. Grid intensity {esc(intensity)}: a configured average, not live; embodied "
             "carbon (manufacturing) is not counted.</p>"]
    for level, (rows, _) in levels.items():
        if rows:
            ranked = sorted(rows.items(), key=lambda kv: -kv[1].joules)
            parts += [f"<h3>By {esc(level)}</h3>", table([level, "energy kWh", "CO2e kg"],
                                                          [(n, [n, kwh(e.joules), co2e(e.grams)]) for n, e in ranked])]
    return Section("energy", "Energy and carbon by team", "".join(parts))


# --------------------------------------------------------------------------------------- alerts
@dataclass
class Firing:
    """Of one alert (or one alert's series): episodes (separate firing spells) and seconds firing,
    at the window's step resolution."""
    episodes: int = 0
    seconds: float = 0.0


def _spells(times: list[float], step: int) -> int:
    """How many runs of consecutive steps a sorted list of evaluation times holds."""
    return sum(1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] > step * 1.5)


def firing(client: Prometheus, window: Window, matchers: str = "") -> list[tuple[dict, Firing]]:
    """[(labels, Firing)] of each firing ALERTS series in the window: a step counts as firing when the
    series has a sample in it (count_over_time over the step, so no staleness look-back stretches it)."""
    # 1 ms short of a step: Prometheus 2 closes a range at both ends, and a sample on the boundary
    # would count in two steps
    promql = f'count_over_time(ALERTS{{alertstate="firing"{matchers}}}[{window.step * 1000 - 1}ms])'
    out = []
    for series in client.range(promql, window, offset=window.step):
        times = sorted(t for t, v in _values(series) if v > 0)
        if times:
            out.append((series["metric"], Firing(_spells(times, window.step), len(times) * window.step)))
    return out


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def section_alerts(client: Prometheus, window: Window, settings: Settings) -> Section:
    """Top alerts by time firing and by count (firing spells), from the ALERTS series."""
    by_alert: dict[str, Firing] = defaultdict(Firing)
    for labels, f in firing(client, window):
        total = by_alert[labels.get("alertname", "")]
        total.episodes += f.episodes
        total.seconds += f.seconds
    if not by_alert:
        return Section("alerts", "Top alerts", no_data("no alert fired in this range"))
    top = sorted(by_alert.items(), key=lambda kv: (-kv[1].seconds, kv[0]))[:20]
    rows = [(name, [name, f.episodes, _duration(f.seconds)]) for name, f in top]

    def draw(ax):
        ax.barh([n for n, _ in top][:12], [f.seconds / 3600 for _, f in top][:12], color="#c8453b")
        ax.invert_yaxis()
        ax.set_xlabel("hours firing")
    counts = sorted(by_alert.items(), key=lambda kv: (-kv[1].episodes, kv[0]))[:10]
    body = (png(draw, height=1.2 + 0.35 * min(len(top), 12), alt="hours firing by alert")
            + "<h3>By time firing</h3>" + table(["alert", "times fired", "time firing"], rows)
            + "<h3>By count</h3>" + table(["alert", "times fired", "time firing"],
                                          [(n, [n, f.episodes, _duration(f.seconds)]) for n, f in counts]))
    return Section("alerts", "Top alerts by count and time firing", body)


def section_placement(client: Prometheus, window: Window, settings: Settings) -> Section:
    """Placement problems: pods whose GPUs lack NVLink between them, from PLACEMENT_ALERT's ALERTS."""
    spells = firing(client, window, f',alertname="{PLACEMENT_ALERT}"')
    if not spells:
        return Section("placement", "Placement problems",
                       no_data(f"{PLACEMENT_ALERT} did not fire in this range (or is not in the rule set)"))
    keys = sorted({k for labels, _ in spells for k in labels} - ALERT_LABELS_HIDDEN)
    rows = [("/".join(labels.get(k, "") for k in keys), [labels.get(k, "") for k in keys] + [f.episodes,
             _duration(f.seconds)]) for labels, f in sorted(spells, key=lambda lf: -lf[1].seconds)]
    return Section("placement", "Placement problems",
                   f"<p>Pods placed on GPUs without NVLink between them ({esc(PLACEMENT_ALERT)}).</p>"
                   + table(keys + ["times fired", "time firing"], rows, numeric_from=len(keys)))


# ------------------------------------------------------------------- sections read from records
def record_table(client: Prometheus, window: Window, name: str) -> str:
    """The last value in the window of each series of the record named `name` in gpuobs.records.NAMES,
    as a table; "no data" when the record is not defined in this version or has no series."""
    record = records.NAMES.get(name)
    if record is None:
        return no_data(f"gpuobs.records.{name} is not defined in this version")
    result = client.instant(f"last_over_time({record.name}[{int(window.end - window.start)}s])", window.end)
    if not result:
        return no_data(f"{record.name} has no series in this range (are the recording rules loaded?)")
    keys = sorted({k for s in result for k in s["metric"]} - {"__name__"})
    rows = [("/".join(s["metric"].get(k, "") for k in keys), [s["metric"].get(k, "") for k in keys]
             + [f"{float(s['value'][1]):.4g}"]) for s in sorted(result, key=lambda s: sorted(s["metric"].items()))]
    return f"<h3>{esc(record.name)}</h3>" + table(keys + ["value"], rows, numeric_from=len(keys))


WHOLE_GPU = frozenset(p.name for m in mig.MODELS for p in m.profiles if p.compute_slices == mig.COMPUTE_SLICES)


def mig_candidates(client: Prometheus, window: Window) -> tuple[list[dict], str]:
    """(GPU_MIG_ADVICE's last series in the window whose profile is a real partition, the reason
    when there is none). A GPU whose smallest fit is the whole-GPU profile (7g.80gb) is no candidate:
    one instance of the whole GPU is the GPU. No advice series at all is told apart: the weekly
    rules have peaks (GPU_MEMORY_PEAK) but no GPU fits a profile, or the rules have no data."""
    span = f"{int(window.end - window.start)}s"
    advice = records.GPU_MIG_ADVICE.name
    result = client.instant(f"last_over_time({advice}[{span}])", window.end)
    parts = [s for s in result if s["metric"].get("profile") not in WHOLE_GPU]
    if parts:
        return parts, ""
    if result:
        return [], (f"no GPU is a MIG candidate: the peaks of all {len(result)} GPUs with advice fit only the "
                    f"whole-GPU profile ({', '.join(sorted({s['metric'].get('profile', '') for s in result}))})")
    peaks = client.instant(f"count(last_over_time({records.GPU_MEMORY_PEAK.name}[{span}]))", window.end)
    if peaks:
        return [], (f"no GPU is a MIG candidate: {float(peaks[0]['value'][1]):.0f} GPUs have a week of peaks "
                    f"({records.GPU_MEMORY_PEAK.name}) and none fits a MIG profile with headroom, is of a model "
                    f"with MIG, or is out of MIG mode")
    return [], (f"{advice} and {records.GPU_MEMORY_PEAK.name} have no series in this range: the weekly "
                f"recording rules ({records.WEEKLY_GROUP}) are not loaded, or ran for less than a step")


def section_mig(client: Prometheus, window: Window, settings: Settings) -> Section:
    """MIG candidates: GPUs whose peak memory and SM activity would fit a MIG partition smaller than
    the whole GPU (records.GPU_MIG_ADVICE), or why there is none."""
    rows, why = mig_candidates(client, window)
    if not rows:
        return Section("mig", "MIG candidates", no_data(why))
    keys = sorted({k for s in rows for k in s["metric"]} - {"__name__"})
    table_rows = [("/".join(s["metric"].get(k, "") for k in keys), [s["metric"].get(k, "") for k in keys]
                   + [f"{float(s['value'][1]):.4g}"]) for s in sorted(rows, key=lambda s: sorted(s["metric"].items()))]
    return Section("mig", "MIG candidates",
                   f"<p>The smallest MIG profile each GPU's week of peaks fits with headroom; value: its compute "
                   f"slices of {mig.COMPUTE_SLICES}.</p>"
                   + table(keys + ["compute slices"], table_rows, numeric_from=len(keys)))


def section_reliability(client: Prometheus, window: Window, settings: Settings) -> Section:
    """Failures per 1,000 GPU-hours and MTBF (RECORDS["reliability"])."""
    return Section("reliability", "Failures and MTBF",
                   "".join(record_table(client, window, n) for n in RECORDS["reliability"]))


def records_read() -> tuple[records.Record, ...]:
    """Every record whose series the report reads, for backfills and the check that every record
    has a reader: the GPU-hour and energy records (and the step records their expressions sum), MIG advice and
    the peaks that explain its absence, and the reliability records this version defines."""
    usage = tuple(x for level in LEVELS for x in (*records.WEEKLY_USAGE[WEEKLY_LEVEL[level]],
                                                  *records.WEEKLY_ENERGY[WEEKLY_LEVEL[level]]))
    named = tuple(records.NAMES[n] for names in RECORDS.values() for n in names if n in records.NAMES)
    return usage + (records.GPU_MIG_ADVICE, records.GPU_MEMORY_PEAK) + named


SectionFn = Callable[[Prometheus, Window, Settings], Section]
SECTIONS: tuple[SectionFn, ...] = (section_usage, section_energy, section_placement, section_mig,
                                   section_reliability, section_alerts)

# --------------------------------------------------------------------------------------- the page
STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em} th,td{border:1px solid #ddd;padding:.25em .6em}
th{background:#f3f3f3;text-align:left} td.num{text-align:right;font-variant-numeric:tabular-nums}
.nodata{color:#777;font-style:italic} .meta{color:#555} img{max-width:100%}
"""


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render(client: Prometheus, window: Window, settings: Settings,
           sections: tuple[SectionFn, ...] = SECTIONS) -> str:
    """The whole report as one HTML document; ReportError without matplotlib, or from the first
    query that fails."""
    try:
        importlib.import_module("matplotlib")  # the plots: an extra, which the exporter does not need
    except ImportError:
        raise ReportError("the report's plots need matplotlib: pip install 'gpuobs[report]'") from None
    parts = [section(client, window, settings) for section in sections]
    toc = "".join(f'<li><a href="#{esc(s.key)}">{esc(s.title)}</a></li>' for s in parts)
    body = "".join(f'<section id="{esc(s.key)}"><h2>{esc(s.title)}</h2>{s.body}</section>' for s in parts)
    meta = (f"{esc(_utc(window.start))} to {esc(_utc(window.end))} ({window.hours:.1f} h, step {window.step} s), "
            f"from Prometheus at {esc(client.url)}; generated {esc(_utc(time.time()))}.")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>GPU fleet report {esc(_utc(window.start))} to {esc(_utc(window.end))}</title>"
            f"<style>{STYLE}</style></head><body><h1>GPU fleet report</h1><p class=\"meta\">{meta}</p>"
            f"<nav><ul>{toc}</ul></nav>{body}</body></html>\n")


def write(url: str, window: Window, settings: Settings, out: str | Path,
          sections: tuple[SectionFn, ...] = SECTIONS) -> Path:
    """Render the report from the Prometheus at url and write it to out; ReportError on failure
    (nothing is written then). sections: `gpuobs report` adds gpuobs.explain's "Slow jobs" (a layer
    above this module, which it reads from)."""
    text = render(Prometheus(url), window, settings, sections)
    path = Path(out)
    path.write_text(text, encoding="utf-8")
    return path
