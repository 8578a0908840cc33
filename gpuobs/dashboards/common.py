"""Shared building blocks of the gpuobs dashboards, on top of grafanalib.

Conventions every dashboard follows (and tests/test_dashboards.py checks):

- every panel and target reads the templated Prometheus datasource `${datasource}`;
- every panel has a unit;
- only non-Angular panel types: timeseries, stat, table, bargauge, state-timeline, heatmap (and rows);
- every rate()/increase() runs over `$__rate_interval`, and only over counters;
- panels are laid out by `Layout` in non-overlapping grid positions;
- a panel's id is derived from its identity, not its position: the SHA-256 of [dashboard uid, row
  title, panel title] (or an explicit key given to Layout.add/row instead of the title) reduced to
  1..2^31-1 (panel_id), so adding, removing or moving other panels changes no id and Grafana's
  `viewPanel=<id>` links survive; two panels of one identity or two ids alike fail the build
  (PanelIdError);
- uids are stable, so links between dashboards (fleet -> node -> job) keep working.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import attr
from grafanalib.core import (
    REFRESH_ON_TIME_RANGE_CHANGE,
    BarGauge,
    Dashboard,
    DashboardLink,
    GridPos,
    Heatmap,
    RowPanel,
    Stat,
    StateTimeline,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from .. import catalog as c
from .. import records as r

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39  # Grafana 11
PLUGIN_VERSION = "11.0.0"  # panels are written in the options format of this version: no migration runs
TAGS = ["gpuobs"]
UIDS = {"fleet": "gpuobs-fleet", "node": "gpuobs-node", "training": "gpuobs-training",
        "inference": "gpuobs-inference", "exporter": "gpuobs-exporter", "efficiency": "gpuobs-efficiency"}
SLUGS = {"fleet": "gpuobs-fleet-overview", "node": "gpuobs-node", "training": "gpuobs-training-job",
         "inference": "gpuobs-inference-service", "exporter": "gpuobs-exporter-health",
         "efficiency": "gpuobs-fleet-efficiency"}
GPU_BY = r.GPU_BY  # one GPU, whatever the scrape adds
# a panel's threshold steps as Grafana reads them: {"color": name, "value": lower bound or None for the base}
Steps: TypeAlias = list[dict[str, str | float | None]]
BASE_THRESHOLDS: Steps = [{"color": "green", "value": None}]
NO_DATA = "No data"


# ---------------------------------------------------------------------------------------- names
def sample(m: c.Metric, suffix: str = "") -> str:
    """The sample name of a catalog metric in Prometheus: counters with _total, info with _info,
    histograms with the suffix given (bucket, sum or count)."""
    if m.kind == "histogram":
        if suffix not in ("bucket", "sum", "count"):
            raise ValueError(f"{m.name} is a histogram: name its bucket, sum or count series")
        return f"{m.name}_{suffix}"
    if suffix:
        raise ValueError(f"{m.name} is a {m.kind}, not a histogram")
    return m.exposed_name


def sel(m: c.Metric | r.Record | str, *matchers: str, suffix: str = "") -> str:
    """metric{matchers}: a selector over a catalog metric, a recording rule (gpuobs.records) or another
    series named here (Prometheus's own: up, scrape_duration_seconds)."""
    if isinstance(m, r.Record):
        if suffix:
            raise ValueError(f"{m.name} is a recording rule, not a histogram")
        name = m.name
    else:
        name = m if isinstance(m, str) else sample(m, suffix)
    inner = ",".join(x for x in matchers if x)
    return f"{name}{{{inner}}}" if inner else name


def rate(selector: str, fn: str = "rate") -> str:
    """rate()/increase() over the panel's $__rate_interval."""
    return f"{fn}({selector}[$__rate_interval])"


def quantile(q: float, m: c.Metric, matchers: tuple[str, ...], by: str = "") -> str:
    """histogram_quantile over a catalog histogram."""
    by_le = f"{by}, le" if by else "le"
    return f"histogram_quantile({q:g}, sum by ({by_le}) ({rate(sel(m, *matchers, suffix='bucket'))}))"


def windowed(q: float, m: c.Metric, matchers: tuple[str, ...], by: str = "") -> str:
    """The exact in-process quantile of a duration histogram (its catalog.QUANTILES gauge), the
    worst over the series merged: quantiles of different processes cannot be combined exactly."""
    selector = sel(c.QUANTILES[m], *matchers, 'quantile="%g"' % q)
    return f"max by ({by}) ({selector})" if by else f"max ({selector})"


def mean(m: c.Metric, matchers: tuple[str, ...], by: str = "") -> str:
    """Mean of a histogram's observations: rate of the sum over rate of the count."""
    agg = f"sum by ({by})" if by else "sum"
    return (f"{agg} ({rate(sel(m, *matchers, suffix='sum'))}) / "
            f"{agg} ({rate(sel(m, *matchers, suffix='count'))})")


# -------------------------------------------------------------------------------------- links
def url(dashboard: str, **variables: str) -> str:
    """A link to another gpuobs dashboard by its stable uid, keeping datasource and time range."""
    params = "".join(f"&var-{k}={v}" for k, v in variables.items())
    return f"/d/{UIDS[dashboard]}/{SLUGS[dashboard]}?var-datasource=${{datasource}}{params}&${{__url_time_range}}"


def data_link(title: str, dashboard: str, **variables: str) -> dict:
    """A panel data link (fieldConfig links) to another gpuobs dashboard (a key of UIDS), with the
    variables given (Grafana ${__data.fields.*} or ${__field.labels.*} references) set, in the same tab."""
    return {"title": title, "url": url(dashboard, **variables), "targetBlank": False}


# Links to the Node dashboard: from a table row (its cluster and node fields) and from a series.
TO_NODE = data_link("Node dashboard: ${__data.fields.node}", "node", cluster="${__data.fields.cluster}",
                    node="${__data.fields.node}")
TO_NODE_SERIES = data_link("Node dashboard: ${__field.labels.node}", "node",
                           cluster="${__field.labels.cluster}", node="${__field.labels.node}")
# From a training series (by rank and node) to its node's GPUs over the same time range.
GPU_METRICS_AT_THIS_TIME = data_link("GPU metrics at this time: ${__field.labels.node}", "node",
                                     cluster="${__field.labels.cluster}", node="${__field.labels.node}")


def dashboard_link(title: str, dashboard: str, tooltip: str = "") -> DashboardLink:
    """A link in the dashboard's header to another gpuobs dashboard (a key of UIDS), carrying the current
    variables and time range."""
    return DashboardLink(title=title, type="link", uri=f"/d/{UIDS[dashboard]}/{SLUGS[dashboard]}",
                         includeVars=True, keepTime=True, tooltip=tooltip, icon="dashboard")


# ----------------------------------------------------------------------------------- variables
def datasource_variable() -> Template:
    """The ${datasource} variable every panel reads: a picker of the Prometheus datasources, listed when
    the dashboard loads."""
    return Template(name="datasource", query="prometheus", type="datasource", label="Data source",
                    refresh=1, hide=0, sort=0)


def variable(name: str, query: str, label: str, multi: bool = True, hide: int = 0) -> Template:
    """A query variable from label_values(...); multi-valued ones have All = .* (which also matches
    series without the label, e.g. when cluster is only an external label)."""
    return Template(name=name, query=query, label=label, dataSource=DATASOURCE, multi=multi, includeAll=multi,
                    allValue=".*" if multi else None, default="All" if multi else None,
                    refresh=REFRESH_ON_TIME_RANGE_CHANGE, hide=hide)


# -------------------------------------------------------------------------------------- panels
if TYPE_CHECKING:
    _C = TypeVar("_C")

    def _extends(cls: _C) -> _C:
        """attr.s to mypy's eyes, minus its attrs plugin (below)."""
else:
    # attr.s for a subclass of a grafanalib panel that adds fields. grafanalib ships no types, so its
    # classes are Any to mypy; mypy's attrs plugin, given @attr.s, would write the subclass an __init__
    # of only the fields added here and reject grafanalib's own (title=, targets=, ...). Hidden behind
    # this name, the class is what mypy can know: a subclass of an untyped class, whose constructor
    # takes whatever grafanalib's does.
    _extends = attr.s


@_extends
class _Target(Target):
    """grafanalib's Target has no `exemplar`: with it true, Grafana also asks Prometheus for the
    exemplars of the query's series (histogram buckets carrying trace ids) and draws them, linked
    to the trace through the datasource's exemplarTraceIdDestinations."""
    exemplar = attr.ib(default=False)

    def to_json_data(self):
        data = super().to_json_data()
        if self.exemplar:  # only where asked: the other panels' JSON stays as it was
            data["exemplar"] = True
        return data


def target(expr: str, legend: str = "", instant: bool = False, fmt: str = "time_series",
           exemplar: bool = False) -> Target:
    """A Prometheus query on ${datasource}; exemplar=True for histogram bucket queries whose slow
    observations carry trace ids (gpuobs.instrument.exemplars)."""
    return _Target(expr=expr, legendFormat=legend, instant=instant, format=fmt, datasource=DATASOURCE,
                   intervalFactor=1, exemplar=exemplar)


def _refs(targets: list[Target]) -> list[Target]:
    return [attr.evolve(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)]


def _extra(links: list[dict] | None = None, **defaults) -> dict:
    extra: dict = {"pluginVersion": PLUGIN_VERSION}
    fd = {k: v for k, v in defaults.items() if v is not None}
    if links:
        fd["links"] = links
    if fd:
        extra["fieldConfig"] = {"defaults": fd}
    return extra


def timeseries(title: str, targets: list[Target], unit: str, description: str = "", stack: bool = False,
               bars: bool = False, min: int | None = None, max: int | None = None,
               links: list[dict] | None = None, fill: int = 10, overrides: list | None = None) -> TimeSeries:
    """A time series panel of targets in unit (a Grafana unit id); stack: stacked series; bars: drawn as
    bars; min/max: the y axis bounds (None: automatic); fill: area opacity in %; links: data_link()s."""
    return TimeSeries(title=title, description=description, dataSource=DATASOURCE, targets=_refs(targets),
                      unit=unit, drawStyle="bars" if bars else "line", fillOpacity=80 if bars else fill,
                      stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none", "group": "A"},
                      valueMin=min, valueMax=max, tooltipMode="multi", tooltipSort="desc",
                      legendDisplayMode="list", showPoints="never", thresholds=BASE_THRESHOLDS,
                      overrides=overrides or [], extraJson=_extra(links))


def stat(title: str, targets: list[Target], unit: str, description: str = "",
         thresholds: Steps | None = None, graph: bool = True, links: list[dict] | None = None,
         text_mode: str = "auto", decimals: int | None = None) -> Stat:
    """A stat panel of the last non-null value of each target, in unit, coloured by thresholds (Steps;
    BASE_THRESHOLDS when None); graph: a sparkline under the value; "No data" when no series."""
    return Stat(title=title, description=description, dataSource=DATASOURCE, targets=_refs(targets), format=unit,
                reduceCalc="lastNotNull", graphMode="area" if graph else "none", colorMode="value",
                color={"mode": "thresholds"}, thresholds=thresholds or BASE_THRESHOLDS, noValue=NO_DATA,
                textMode=text_mode, decimals=decimals, extraJson=_extra(links))


def table(title: str, targets: list[Target], unit: str, description: str = "", hide: tuple[str, ...] = (),
          rename: dict[str, str] | None = None, links: list[dict] | None = None, merge: bool = False,
          sort_by: str | None = None, overrides: list | None = None) -> Table:
    """A table of instant queries; Time, __name__, job and instance columns hidden."""
    exclude = {k: True for k in ("Time", "__name__", "job", "instance", *hide)}
    transformations = ([{"id": "merge", "options": {}}] if merge else []) + [
        {"id": "organize", "options": {"excludeByName": exclude, "renameByName": rename or {}}}]
    if sort_by:
        transformations.append({"id": "sortBy", "options": {"sort": [{"field": sort_by, "desc": True}]}})
    targets = [attr.evolve(t, instant=True, format="table") for t in targets]
    return Table(title=title, description=description, dataSource=DATASOURCE, targets=_refs(targets), unit=unit,
                 transformations=transformations, overrides=overrides or [], filterable=True,
                 extraJson=_extra(links))


class _BarGauge(BarGauge):
    """grafanalib's BarGauge writes the Grafana 6 options format; this writes the current one."""

    def to_json_data(self):
        return self.panel_json({
            "fieldConfig": {"defaults": {"unit": self.format, "min": self.min, "max": self.max,
                                         "decimals": self.decimals, "color": {"mode": "thresholds"},
                                         "thresholds": {"mode": "absolute", "steps": self.thresholds}},
                            "overrides": []},
            "options": {"displayMode": self.displayMode, "orientation": self.orientation,
                        "reduceOptions": {"calcs": [self.calc], "fields": "", "values": False},
                        "showUnfilled": True, "valueMode": "color", "namePlacement": "auto",
                        "sizing": "auto", "minVizHeight": 16, "minVizWidth": 8, "maxVizHeight": 300},
            "type": "bargauge"})


def bargauge(title: str, targets: list[Target], unit: str, description: str = "", min: float | None = 0,
             max: float | None = None, thresholds: Steps | None = None,
             links: list[dict] | None = None) -> BarGauge:
    """A bar gauge of each target's last non-null value in unit, from min to max (None: automatic), bars
    coloured by thresholds (Steps; BASE_THRESHOLDS when None), in the current options format."""
    return _BarGauge(title=title, description=description, dataSource=DATASOURCE, targets=_refs(targets),
                     format=unit, min=min, max=max, calc="lastNotNull", displayMode="gradient",
                     thresholds=thresholds or BASE_THRESHOLDS, extraJson=_extra(links))


@_extends
class _StateTimeline(StateTimeline):
    """grafanalib's StateTimeline has no unit or thresholds; this adds them."""
    unit = attr.ib(default="short")
    steps = attr.ib(factory=lambda: list(BASE_THRESHOLDS))

    def to_json_data(self):
        data = super().to_json_data()
        data["fieldConfig"]["defaults"].update(unit=self.unit,
                                               thresholds={"mode": "absolute", "steps": self.steps})
        return data


def state_timeline(title: str, targets: list[Target], unit: str, description: str = "",
                   thresholds: Steps | None = None, mappings: list | None = None,
                   links: list[dict] | None = None) -> StateTimeline:
    """A state timeline of targets (one band per series) in unit, coloured by thresholds (Steps;
    BASE_THRESHOLDS when None) and value mappings (e.g. 0 -> down, 1 -> up); values not shown in the bands."""
    return _StateTimeline(title=title, description=description, dataSource=DATASOURCE, targets=_refs(targets),
                          unit=unit, steps=thresholds or BASE_THRESHOLDS, mappings=mappings or [],
                          showValue="never", extraJson=_extra(links))


@_extends
class _Heatmap(Heatmap):
    """grafanalib's Heatmap writes the Angular-era heatmap; this writes the current panel's options.

    calculate: Grafana buckets raw series itself (e.g. one temperature per GPU); otherwise the
    targets are Prometheus histogram buckets (format heatmap)."""
    unit = attr.ib(default="short")
    calculate = attr.ib(default=False)

    def to_json_data(self):
        options = {"calculate": self.calculate, "cellGap": 1, "showValue": "never",
                   "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5,
                             "fill": "dark-orange", "reverse": False, "scale": "exponential"},
                   "exemplars": {"color": "rgba(255,0,255,0.7)"}, "filterValues": {"le": 1e-9},
                   "legend": {"show": True}, "rowsFrame": {"layout": "auto"},
                   "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
                   "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit}}
        return self.panel_json({
            "fieldConfig": {"defaults": {"unit": self.unit,
                                         "custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                                                    "scaleDistribution": {"type": "linear"}}},
                            "overrides": []},
            "options": options, "type": "heatmap"})


def heatmap(title: str, targets: list[Target], unit: str, description: str = "", calculate: bool = False) -> Heatmap:
    """A heatmap in unit, at most 60 points wide. calculate=False: targets are Prometheus histogram
    bucket rates (format heatmap, legend {{le}} unless given); calculate=True: Grafana buckets raw series."""
    if not calculate:
        targets = [attr.evolve(t, format="heatmap", legendFormat=t.legendFormat or "{{le}}") for t in targets]
    return _Heatmap(title=title, description=description, dataSource=DATASOURCE, targets=_refs(targets),
                    unit=unit, calculate=calculate, maxDataPoints=60, extraJson=_extra())


# -------------------------------------------------------------------------------------- layout
MAX_PANEL_ID = 2**31 - 1  # ids are 1..2^31-1: Grafana's int64 and the browser's numbers hold them exactly


class PanelIdError(ValueError):
    """Two panels of one dashboard with one identity, or two identities hashing to one id."""


def panel_id(identity: str) -> int:
    """A panel's id from its identity (panel_identity): the first 8 bytes of its SHA-256, as an integer
    in 1..MAX_PANEL_ID. Depends on nothing else, so adding, removing or moving other panels keeps it."""
    digest = hashlib.sha256(identity.encode()).digest()
    return int.from_bytes(digest[:8], "big") % MAX_PANEL_ID + 1


def panel_identity(uid: str, row: str | None, title: str) -> str:
    """What a panel's id is derived from: [dashboard uid, row title, panel title or explicit key] as JSON;
    a row panel's is [uid, row title] (two elements, so no panel's can equal it)."""
    return json.dumps([uid, title] if row is None else [uid, row, title])


def assign_ids(uid: str, panels: list, identities: list[tuple[str | None, str]]) -> list:
    """The panels with their ids (panel_id of each identity (row, title or key) under dashboard uid).
    Raises PanelIdError on two panels of one identity (give one a key) or on two identities with
    one id (a hash collision: give one of them a key)."""
    seen: dict[int, tuple[str | None, str]] = {}
    out = []
    for panel, (row, key) in zip(panels, identities, strict=True):
        pid = panel_id(panel_identity(uid, row, key))
        if seen.get(pid) == (row, key):  # the same identity twice, not a collision
            where = "two rows" if row is None else f"two panels in row {row!r}"
            raise PanelIdError(f"dashboard {uid}: {where} titled {key!r}; give one an explicit key "
                               "(Layout.add(..., key=...) or Layout.row(..., key=...))")
        if pid in seen:
            raise PanelIdError(f"dashboard {uid}: panel {key!r} (row {row!r}) and panel {seen[pid][1]!r} "
                               f"(row {seen[pid][0]!r}) hash to the same id {pid}; give one an explicit key")
        seen[pid] = (row, key)
        out.append(attr.evolve(panel, id=pid))
    return out


class Layout:
    """Places panels left to right in lines of 24 columns, rows as section headers, and records each
    panel's identity (its row's title and its own title, or an explicit key) for its id (assign_ids,
    applied by dashboard()): an id never depends on a position, so adding a panel renumbers no other and
    Grafana's viewPanel links keep working. A panel renamed keeps its id with its old title as key."""

    def __init__(self) -> None:
        self.panels: list = []
        self.identities: list[tuple[str | None, str]] = []  # (row title, panel title or key); rows: (None, title)
        self.x = self.y = self.line_h = 0
        self.row_title = ""  # panels before the first row

    def _newline(self) -> None:
        self.y += self.line_h
        self.x = self.line_h = 0

    def _place(self, panel, w: int, h: int, identity: tuple[str | None, str]):
        if not 1 <= w <= 24:
            raise ValueError(f"{panel.title}: width {w} is not 1-24")
        if self.x + w > 24:
            self._newline()
        placed = attr.evolve(panel, gridPos=GridPos(h=h, w=w, x=self.x, y=self.y))
        self.panels.append(placed)
        self.identities.append(identity)
        self.x += w
        self.line_h = max(self.line_h, h)
        return placed

    def row(self, title: str, key: str | None = None) -> None:
        """A row (section header) titled title; key replaces the title in its id and its panels'."""
        self._newline()
        self.row_title = key or title
        self._place(RowPanel(title=title, collapsed=False), 24, 1, (None, self.row_title))
        self._newline()

    def add(self, panel, w: int = 12, h: int = 8, key: str | None = None) -> None:
        """Place a panel w columns wide and h high; key replaces its title in its id (for a title
        repeated within one row, or a renamed panel keeping its id)."""
        families = detail_families(panel)
        if families:  # says which exporter flag the panel needs: the default profile leaves its series out
            note = (f"Detail: needs the exporter's --profile full or --detail {','.join(families)} "
                    "(docs/cardinality.md).")
            panel = attr.evolve(panel, description=f"{panel.description} {note}".strip())
        self._place(panel, w, h, (self.row_title, key or panel.title))


_EXPOSED = {name: m for m in c.EXPORTED for name in m.prometheus_samples}


def detail_families(panel) -> list[str]:
    """The families of the detail metrics (catalog.DETAIL) that a panel's queries read, sorted; [] for
    a panel that reads only series of the default profile."""
    names = {t for target in getattr(panel, "targets", [])
             for t in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", target.expr)}
    return sorted({_EXPOSED[n].family for n in names if n in _EXPOSED and _EXPOSED[n] in c.DETAIL})


def dashboard(title: str, key: str, description: str, layout: Layout, variables: list[Template],
              links: list[DashboardLink], time_from: str = "now-6h") -> Dashboard:
    """A gpuobs dashboard of uid UIDS[key], its panels from layout with their ids (assign_ids): raises
    PanelIdError where two panels share an identity or an id."""
    panels = assign_ids(UIDS[key], layout.panels, layout.identities)
    return Dashboard(title=title, uid=UIDS[key], description=description, tags=TAGS, panels=panels,
                     templating=Templating([datasource_variable(), *variables]), links=links,
                     schemaVersion=SCHEMA_VERSION, graphTooltip=1, refresh="30s", timezone="browser",
                     time=Time(time_from, "now"), editable=True)


VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")  # $name, ${name}, ${name:format}


def interpolate(expr: str, values: dict[str, str]) -> str:
    """A panel query with its Grafana variables ($name, ${name}, ${name:fmt}) replaced by `values`,
    as Grafana sends it to Prometheus. Raises KeyError naming a variable without a value."""
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr}")
        return values[name]

    return VARIABLE.sub(one, expr)


UP_THRESHOLDS: Steps = [{"color": "red", "value": None}, {"color": "green", "value": 1}]  # 0 bad, 1 good
