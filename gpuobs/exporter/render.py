"""Render a Snapshot as Prometheus text, once per snapshot and format, in gpuobs or dcgm-exporter naming.

Two renderings of the same families:
- the reference: prometheus_client builds the families (native_families, dcgm_families) and writes
  them (generate_latest, or its OpenMetrics twin). It is used for the rarely served stale body and
  is what tests compare the fast one with.
- the fast one (Renderer): per series, the text before the value (name and labels) is written once,
  by prometheus_client itself, when the series appears; each pass formats only the values (with
  prometheus_client's floatToGoString), and a family whose samples did not change keeps its text.
  tests/test_render.py proves the two byte-identical.
"""

from __future__ import annotations

import gzip
import math
import socket
import threading
from collections import defaultdict
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest, openmetrics
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.utils import floatToGoString as _float_to_go_string

from .. import catalog as c
from ..collect.base import Sample, Snapshot
from . import xid_titles

NAMINGS = ("gpuobs", "dcgm")
SELF_FAMILIES = ("exporter", "telemetry")  # self-health: served even when the GPU values are stale
# Self-health that describes NVML and the GPUs as of a snapshot: unknown once it is stale
UNKNOWN_WHEN_STALE = frozenset({c.NVML_UP, c.GPUS_PRESENT, c.NVML_INFO, c.NVML_INIT_ERROR})
# Attribution labels (gpuobs.attribution), by naming. Native names stay clear of the target labels
# Prometheus's Kubernetes service discovery adds (pod, namespace, container); dcgm naming uses
# dcgm-exporter's names, which its users scrape with honor_labels or relabel.
ATTRIBUTION_LABELS = {
    "gpuobs": {"pod": "k8s_pod", "namespace": "k8s_namespace", "container": "k8s_container", "hpc_job": "hpc_job"},
    "dcgm": {"pod": "pod", "namespace": "namespace", "container": "container", "hpc_job": "hpc_job"},
}
Pairs = tuple[tuple[str, str], ...]  # sorted (label, value) pairs
Extra = Callable[[Sample], "Pairs | None"]  # (label, value) pairs to add to a sample
Entry = list[Any]  # a series' kept line: [line, its value, length of the prefix in it] (_entry)
Route = tuple[str, str, Entry]  # (prefix, DCGM field, _entry()) of a series a sample feeds
# (GPU samples by metric, self-health samples by metric, GPU samples in order, metrics with a -0.0 value)
Split = tuple[dict[c.Metric, list[Sample]], dict[c.Metric, list[Sample]], list[Sample], frozenset[c.Metric]]
floatToGoString: Callable[[float], str] = _float_to_go_string  # prometheus_client leaves it unannotated


class _Collect:
    """A prometheus_client custom collector over a fixed list of metric families."""

    def __init__(self, families: list[PromMetric]):
        self._families = families

    def collect(self) -> Iterator[PromMetric]:
        """The families, as prometheus_client's registry asks every collector."""
        return iter(self._families)


def _to_text(families: Iterable[PromMetric], fmt: str = "text") -> bytes:
    """prometheus_client's rendering of `families`: text format 0.0.4 (fmt "text") or OpenMetrics
    1.0.0 (fmt "openmetrics", ending in "# EOF")."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collect(list(families)))
    return ENCODERS[fmt](registry)


ENCODERS: dict[str, Callable[[CollectorRegistry], bytes]] = {
    "text": generate_latest, "openmetrics": openmetrics.exposition.generate_latest}
EOF_LINE = "# EOF\n"


def native_families(samples: Iterable[Sample], extra: Extra | None = None) -> list[PromMetric]:
    """Metric families with gpuobs names (catalog order, so output is stable); `extra` gives labels
    to add to a sample (attribution), after the catalog's."""
    by_metric: dict[c.Metric, list[Sample]] = defaultdict(list)
    for s in samples:
        by_metric[s.metric].append(s)
    out = []
    for metric in sorted(by_metric, key=lambda m: m.name):
        if metric.kind == "info":  # a gauge named ..._info, so HELP and TYPE name the samples
            fam = PromMetric(metric.exposed_name, metric.help, "gauge")
        else:
            fam = PromMetric(metric.name, metric.help, metric.kind)
        for s in by_metric[metric]:
            labels = dict(zip(metric.labels, s.labels))
            if extra and (more := extra(s)):
                labels.update(more)
            fam.add_sample(metric.exposed_name, labels, s.value)
        out.append(fam)
    return out


# Fields dcgm-exporter's default-counters.csv types `counter` that gpuobs reads as a gauge: DCGM
# reports NVLink bandwidth as a rate, yet dcgm-exporter declares it a counter; served as declared.
DCGM_COUNTERS = frozenset({"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"})
DCGM_INSTANCE_FIELDS = c.DCGM_INSTANCE_FIELDS  # served per GPU instance only on a MIG GPU (see catalog)
XID_FIELD = c.DCGM_XID_FIELD
XID_HELP = ("Value of the last XID error the driver reported for the GPU, 0 before any (derived from "
            f"{c.XID_LAST_SEEN.name}).")


def xid_title(code: int) -> str:
    """err_msg of DCGM_FI_DEV_XID_ERRORS for an XID code: dcgm-exporter's title of it (xid_titles.TITLES),
    "Unknown Error" for a code outside its table."""
    return xid_titles.TITLES.get(code, xid_titles.UNKNOWN)


def dcgm_value(metric: c.Metric, value: float) -> float:
    """A value of `metric` in DCGM's unit (value * dcgm_scale); for DCGM's INT64 fields (dcgm_int), the
    integer DCGM's cast gives: truncated, after a nudge of 1e-15 so that a count of nanoseconds read
    as seconds (a division) comes back whole instead of one below."""
    out = value * metric.dcgm_scale
    if metric.dcgm_int and math.isfinite(out) and out >= 0:
        return float(math.floor(out * (1 + 1e-15)))
    return out


class DcgmIdentity:
    """dcgm-exporter's entities and labels of one GPU's (or MIG GPU instance's) series, from the
    snapshot's gpuobs_gpu_info and gpuobs_mig_info samples: gpu, UUID (the physical GPU's), pci_bus_id,
    device, modelName, GPU_I_PROFILE/GPU_I_ID on a GPU instance's series, hostname (dcgm-exporter since
    its rename) and Hostname (every release up to 4.8.2), and the DCGM_FI_DRIVER_VERSION label field.
    `instances`: per GPU UUID, the first MIG device of each of its GPU instances (DCGM's entity is the
    GPU instance; a GPU instance's compute instances share its series), in snapshot order."""

    def __init__(self, samples: list[Sample], hostname: str):
        self.info = {s.labels[1]: dict(zip(c.GPU_INFO.labels, s.labels)) for s in samples if s.metric is c.GPU_INFO}
        self.profiles = {(s.labels[1], s.labels[2]): s.labels[5] for s in samples if s.metric is c.MIG_INFO}
        self.instances: dict[str, list[Sample]] = {}
        for s in samples:
            if s.metric is c.MIG_INFO:
                got = self.instances.setdefault(s.labels[1], [])
                if all(i.labels[2] != s.labels[2] for i in got):
                    got.append(s)
        self.hostname = hostname
        # node-wide: also labels the series of a GPU that is gone (its XIDs)
        self.driver = next((i["driver_version"] for i in self.info.values() if i["driver_version"]), "")

    def labels(self, gpu: str, uuid: str, gpu_instance: str | None = None) -> dict[str, str]:
        """The labels (prometheus_client writes them sorted); gpu_instance: the MIG GPU instance id, if any."""
        ident = self.info.get(uuid, {})
        labels = {"gpu": gpu, "UUID": uuid, "pci_bus_id": ident.get("pci_bus_id", ""), "device": f"nvidia{gpu}",
                  "modelName": ident.get("name", "")}
        if gpu_instance is not None:
            labels["GPU_I_PROFILE"] = self.profiles.get((uuid, gpu_instance), "")
            labels["GPU_I_ID"] = gpu_instance
        labels["hostname"] = labels["Hostname"] = self.hostname
        labels["DCGM_FI_DRIVER_VERSION"] = self.driver
        return labels

    def entities(self, s: Sample, field: str) -> list[tuple[Sample, str | None]]:
        """The DCGM entities a sample's `field` is served on, as (the sample whose attribution labels
        the series, GPU instance id or None for the whole GPU): a MIG device's sample on its GPU
        instance; a whole-GPU sample on the GPU, or on a MIG GPU on each GPU instance (none for a
        field DCGM reports per instance, DCGM_INSTANCE_FIELDS: no whole-GPU duplicate)."""
        if s.metric.identity == c.MIG_LABELS:
            return [(s, s.labels[2])]
        instances = self.instances.get(s.labels[1])
        if not instances:
            return [(s, None)]
        if field in DCGM_INSTANCE_FIELDS:
            return []
        return [(i, i.labels[2]) for i in instances]


def dcgm_field(s: Sample) -> str | None:
    """The DCGM field a sample feeds (by its labels after the identity ones), None if none."""
    m = s.metric
    n_id = len(m.identity)
    return m.dcgm.get(s.labels[n_id:]) if n_id and m.dcgm else None


def _entity_series(s: Sample, field: str, ident: DcgmIdentity, targets: list[tuple[Sample, str | None]],
                   mores: Sequence[Pairs | None]) -> Iterator[tuple[Sample, str, dict[str, str]]]:
    """(entity's sample, field name, labels) of every series a sample feeds: per entity (targets, with
    its attribution labels `mores`), under its field and the field's aliases."""
    for (target, gpu_instance), more in zip(targets, mores):
        labels = ident.labels(s.labels[0], s.labels[1], gpu_instance)
        labels.update(more or ())
        for name in (field, *c.DCGM_ALIASES.get(field, ())):
            yield target, name, dict(labels)


def dcgm_zero_samples(samples: Iterable[Sample], zero: Iterable[c.Metric]) -> list[Sample]:
    """A 0 sample of each metric in `zero` (whole-GPU metrics whose DCGM field reads 0 where gpuobs has
    no value: Metric.dcgm_zero) for every GPU of the snapshot (its gpuobs_gpu_info) without one."""
    zero = tuple(zero)
    if not zero:
        return []
    gpus: list[tuple[str, ...]] = []
    have: set[tuple[c.Metric, str]] = set()
    for s in samples:
        if s.metric is c.GPU_INFO:
            gpus.append(s.labels[:2])
        elif s.metric in zero:
            have.add((s.metric, s.labels[1]))
    return [Sample(m, gpu, 0.0) for m in zero for gpu in gpus if (m, gpu[1]) not in have]


# field, help, kind, the sample attribution looks up, labels, value
DcgmSeries = tuple[str, str, str, Sample, "dict[str, str]", float]


def _field_series(samples: list[Sample], ident: DcgmIdentity) -> Iterable[DcgmSeries]:
    """Every series of the samples of catalog metrics with a DCGM field (one per entity,
    DcgmIdentity.entities), under that field and its aliases; the sample yielded is the entity's,
    whose attribution labels the series."""
    for s in samples:
        field = dcgm_field(s)
        if not field:
            continue
        m = s.metric
        targets = ident.entities(s, field)
        for target, name, labels in _entity_series(s, field, ident, targets, [None] * len(targets)):
            kind = "counter" if m.kind == "counter" or name in DCGM_COUNTERS else "gauge"
            yield name, f"{m.help} ({m.name})", kind, target, labels, dcgm_value(m, s.value)


def _xid_series(samples: list[Sample], ident: DcgmIdentity, watched: bool) -> Iterable[DcgmSeries]:
    """DCGM_FI_DEV_XID_ERRORS per GPU (per GPU instance on a MIG GPU: a device field): the XID last
    reported (by gpuobs_gpu_xid_last_seen_timestamp_seconds, whatever MIG instance it named), with
    err_code and err_msg; while the watcher runs, 0 ("No Error") for a GPU that reported none, as
    dcgm-exporter shows before any XID. The sample yielded is the one attribution looks up."""
    last: dict[str, Sample] = {}
    for s in samples:
        if s.metric is c.XID_LAST_SEEN and (s.labels[1] not in last or s.value >= last[s.labels[1]].value):
            last[s.labels[1]] = s
    if watched:
        for uuid, info in ident.info.items():
            last.setdefault(uuid, Sample(c.XID_LAST_SEEN, (info["gpu"], uuid, "0", "", "", ""), 0.0))
    for uuid, s in sorted(last.items(), key=lambda kv: kv[1].labels[0]):
        code = int(s.labels[2])
        for target, gpu_instance in ident.entities(s, XID_FIELD):
            labels = ident.labels(s.labels[0], uuid, gpu_instance)
            labels.update(err_code=str(code), err_msg=xid_title(code))
            yield XID_FIELD, XID_HELP, "gauge", target, labels, float(code)


def dcgm_families(samples: Iterable[Sample], hostname: str, extra: Extra | None = None,
                  xid_watched: bool = False, zero: Iterable[c.Metric] = ()) -> list[PromMetric]:
    """dcgm-exporter names, labels (DcgmIdentity, then err_code/err_msg on XIDs, then `extra`:
    attribution), entities (DcgmIdentity.entities: GPU instances on a MIG GPU) and types for every
    catalog metric that has a DCGM field, plus DCGM_FI_DEV_XID_ERRORS (xid_watched: the XID watcher
    runs, so a GPU without XIDs reads 0); `zero`: metrics served as 0 on a GPU without a value
    (dcgm_zero_samples). Families are sorted by field; a counter family's HELP/TYPE lines name it
    `<field>_total` until dcgm_text() renders it."""
    samples = list(samples)
    samples += dcgm_zero_samples(samples, zero)
    ident = DcgmIdentity(samples, hostname)
    fams: dict[str, PromMetric] = {}
    seen: set[tuple[str, Pairs]] = set()
    for field, help_text, kind, target, labels, value in chain(_field_series(samples, ident),
                                                               _xid_series(samples, ident, xid_watched)):
        if extra and (more := extra(target)):
            labels.update(more)
        key = (field, tuple(sorted(labels.items())))
        if key in seen:  # DCGM has no compute-instance label: the first of a GPU instance's devices wins
            continue
        seen.add(key)
        fam = fams.get(field)
        if fam is None:
            fam = fams[field] = PromMetric(field, help_text, kind)
        fam.add_sample(field, labels, value)
    return [fams[k] for k in sorted(fams)]


def dcgm_text(families: list[PromMetric]) -> bytes:
    """Text format 0.0.4 of dcgm_families(): prometheus_client's output with only the HELP and TYPE
    lines of counter families renamed from `<field>_total` to `<field>`, as dcgm-exporter writes them
    (its samples carry the bare field name, and dashboards built for it query that name)."""
    text = _to_text(families).decode()
    for fam in families:
        if fam.type == "counter":
            text = _dcgm_counter_header(text, fam.name)
    return text.encode()


def _dcgm_counter_header(text: str, name: str) -> str:
    """`text` with the HELP and TYPE lines of counter `name` naming it `name`, not `name`_total."""
    for kind in ("HELP", "TYPE"):
        text = text.replace(f"# {kind} {name}_total ", f"# {kind} {name} ", 1)
    return text



FORMATS = ("text", "openmetrics")
CONTENT_TYPES = {"text": CONTENT_TYPE_PLAIN_0_0_4, "openmetrics": openmetrics.exposition.CONTENT_TYPE_LATEST}
GZIP_LEVEL = 1  # a body of repeated label text compresses ~10x at level 1; higher levels cost 2-3x the CPU


def _accept_clauses(header: str) -> list[tuple[str, dict[str, str], float]]:
    """(media type, parameters, q) of each clause of an Accept or Accept-Encoding header, in the
    header's order; q is 1 when absent and 0 when unreadable (so a garbled clause never wins)."""
    out = []
    for clause in header.split(","):
        kind, *params = (part.strip() for part in clause.split(";"))
        if not kind:
            continue
        named = {k.strip().lower(): v.strip().strip('"') for k, _, v in (p.partition("=") for p in params)}
        try:
            q = float(named.pop("q", "1"))
        except ValueError:
            q = 0.0
        out.append((kind.lower(), named, q if 0 <= q <= 1 else 0.0))
    return out


def _wants_openmetrics(accept: str) -> bool:
    """What client_golang's expfmt.NegotiateIncludingOpenMetrics decides between OpenMetrics and
    text: clauses by falling q (the more specific first at equal q, else in header order), the first
    naming OpenMetrics (version 1.0.0, 0.0.1 or none) or text (0.0.4 or none) wins; text if none
    does. A clause with q=0 refuses its type instead of asking for it."""
    clauses = [c for c in _accept_clauses(accept) if c[2] > 0]
    clauses.sort(key=lambda c: (-c[2], c[0].startswith("*"), c[0].endswith("*")))
    for kind, params, _ in clauses:
        version = params.get("version", "")
        if kind == "application/openmetrics-text" and version in ("", "0.0.1", "1.0.0"):
            return True
        if kind == "text/plain" and version in ("", "0.0.4"):
            return False
    return False


def _wants_gzip(accept_encoding: str) -> bool:
    """What client_golang's promhttp decides (httputil.NegotiateContentEncoding over the offers
    identity, gzip): the offer with the highest q that a clause (its name or *) gives it, identity on
    a tie; gzip only with a q above 0, so `gzip;q=0` is plain."""
    best, best_q = "identity", -1.0
    for offer in ("identity", "gzip"):
        for kind, _, q in _accept_clauses(accept_encoding):
            if kind in (offer, "*") and q > best_q:
                best, best_q = offer, q
    return best == "gzip" and best_q > 0


def negotiate(accept: str | None, accept_encoding: str | None, naming: str = "gpuobs") -> tuple[str, bool]:
    """(format, gzip) for a scrape's Accept and Accept-Encoding headers, decided as Prometheus' Go
    client library decides them, q-values included (_wants_openmetrics, _wants_gzip): "openmetrics"
    when the scraper prefers OpenMetrics (Prometheus does), else "text" (0.0.4; curl asks for
    neither). dcgm naming serves text only, as dcgm-exporter does: its counters carry no `_total`,
    which OpenMetrics requires of a counter."""
    om = _wants_openmetrics(accept or "")
    return ("openmetrics" if om and naming == "gpuobs" else "text"), _wants_gzip(accept_encoding or "")


class _Text:
    """One format's text pieces as prometheus_client writes them: HELP/TYPE headers (kept per
    family) and the text of a series before its value (name and labels, escaped), made by rendering
    the series once with a placeholder value."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self._headers: dict[tuple[str, str, str], str] = {}

    def _one(self, name: str, help_text: str, kind: str,
             sample: tuple[str, dict[str, str], float] | None = None) -> str:
        fam = PromMetric(name, help_text, kind)
        if sample:
            fam.add_sample(*sample)
        text = _to_text([fam], self.fmt).decode()
        return text[:-len(EOF_LINE)] if self.fmt == "openmetrics" else text

    def header(self, name: str, help_text: str, kind: str, dcgm: bool = False) -> str:
        """The HELP and TYPE lines of a family (dcgm: a counter named as dcgm-exporter names it)."""
        key = (name, help_text, kind)
        text = self._headers.get(key)
        if text is None:
            text = self._one(name, help_text, kind)
            if dcgm and kind == "counter":
                text = _dcgm_counter_header(text, name)
            if len(self._headers) > 4096:  # names and help texts come from the catalog: never reached
                self._headers.clear()
            self._headers[key] = text
        return text

    def prefix(self, sample_name: str, labels: dict[str, str]) -> str:
        """`name{labels} `: a series' line up to its value."""
        line = self._one(sample_name, "", "gauge", (sample_name, labels, 0.0)).rsplit("\n", 2)[-2]
        return line[:-len("0.0")]


def _entry(prefix: str, value: float) -> Entry:
    """A series' kept line: [line, its value, length of the prefix in it] (see _line)."""
    return [f"{prefix}{floatToGoString(value)}\n", value, len(prefix)]


def _line(entry: Entry, value: float) -> str:
    """A series' line for `value`, from its _entry(), updated in place so that an unchanged value
    costs no formatting (0.0 and -0.0 compare equal but are written apart). The prefix is kept only
    inside the line: at 64 GPUs a second copy of every series' labels would be megabytes."""
    if entry[1] != value or (value == 0 and math.copysign(1.0, value) != math.copysign(1.0, entry[1])):
        entry[0], entry[1] = f"{entry[0][:entry[2]]}{floatToGoString(value)}\n", value
    line: str = entry[0]
    return line


class _NativeText:
    """gpuobs-named text of a snapshot's samples, one family per metric in name order, as
    native_families() + prometheus_client write it. Kept between renders: a family whose samples
    (and attribution) did not change keeps its text, and each series its text up to the value."""

    def __init__(self, text: _Text):
        self.text = text
        self._families: dict[c.Metric, tuple[tuple[Any, ...], str]] = {}  # metric -> ((samples, extras, -0.0), text)
        self._series: dict[c.Metric, dict[Any, Entry]] = {}  # metric -> series key -> _entry()

    def render(self, by_metric: dict[c.Metric, list[Sample]], extra: Extra | None,
               negative_zero: frozenset[c.Metric] = frozenset()) -> str:
        """The text of every metric's samples; extra: attribution; negative_zero: metrics with a
        -0.0 value, whose text is never reused (-0.0 equals 0.0 but is written "-0.0")."""
        previous, self._families = self._families, {}
        parts = []
        for metric in sorted(by_metric, key=_name):
            group = tuple(by_metric[metric])
            extras = tuple(map(extra, group)) if extra else None
            key = (group, extras, metric in negative_zero)
            old = previous.get(metric)
            if old is not None and old[0] == key and not key[2]:
                text = old[1]
            else:
                text = self._family(metric, group, extras)
            self._families[metric] = (key, text)
            parts.append(text)
        for gone in self._series.keys() - by_metric.keys():
            del self._series[gone]
        return "".join(parts)

    def _family(self, metric: c.Metric, group: tuple[Sample, ...], extras: tuple[Pairs | None, ...] | None) -> str:
        exposed = metric.exposed_name
        old = self._series.get(metric, {})
        new = self._series[metric] = {}  # only the series of this render: churn does not pile up
        if metric.kind == "info":  # a gauge named ..._info, as native_families() makes it
            lines = [self.text.header(exposed, metric.help, "gauge")]
        else:
            lines = [self.text.header(metric.name, metric.help, metric.kind)]
        for i, s in enumerate(group):
            more = extras[i] if extras else None
            key = s.labels if more is None else (s.labels, more)
            entry = new.get(key) or old.get(key)
            if entry is None:
                labels = dict(zip(metric.labels, s.labels))
                labels.update(more or ())
                entry = _entry(self.text.prefix(exposed, labels), s.value)
            new[key] = entry
            lines.append(_line(entry, s.value))
        return "".join(lines)


def _name(metric: c.Metric) -> str:
    return metric.name


class _DcgmText:
    """dcgm-named text of a snapshot's GPU samples, as dcgm_families() + dcgm_text() write it. Kept
    between renders: per source series (metric, labels, attribution), the DCGM series it feeds and
    their text up to the value; all of it is made again when the GPUs' identity changes."""

    def __init__(self, text: _Text, hostname: str):
        self.text, self.hostname = text, hostname
        self._identity: tuple[Sample, ...] | None = None
        self._ident: DcgmIdentity | None = None
        self._series: dict[tuple[Any, ...], list[Route]] = {}  # (metric, labels, extra) -> [(prefix, field, _entry())]
        self._xids: dict[Pairs, str] = {}  # labels -> prefix of an XID series

    def render(self, samples: list[Sample], info: list[Sample], xids: list[Sample], extra: Extra | None,
               watched: bool) -> str:
        """samples: the GPU samples in snapshot order; info: its gpuobs_gpu_info and gpuobs_mig_info
        samples; xids: its gpuobs_gpu_xid_last_seen_timestamp_seconds samples."""
        identity = tuple(info)
        ident = self._ident
        if identity != self._identity or ident is None:
            ident = DcgmIdentity(info, self.hostname)
            self._identity, self._ident, self._series, self._xids = identity, ident, {}, {}
        old, new = self._series, dict[tuple[Any, ...], list[Route]]()
        fams: dict[str, list[str]] = {}
        seen: set[str] = set()  # DCGM has no compute-instance label: the first of a GPU instance's devices wins
        for s in samples:
            m = s.metric
            field = dcgm_field(s)
            if not field:
                continue
            targets = ident.entities(s, field)
            mores = tuple(extra(t) for t, _ in targets) if extra else (None,) * len(targets)
            key = (m, s.labels, mores)
            routes = new.get(key)
            if routes is None:
                routes = old.get(key)
            value = dcgm_value(m, s.value)
            if routes is None:
                routes = [(prefix, name, _entry(prefix, value)) for _, name, labels in
                          _entity_series(s, field, ident, targets, mores)
                          for prefix in (self.text.prefix(name, labels),)]
            new[key] = routes
            for prefix, name, entry in routes:
                if prefix in seen:
                    continue
                seen.add(prefix)
                lines = fams.get(name)
                if lines is None:
                    kind = "counter" if m.kind == "counter" or name in DCGM_COUNTERS else "gauge"
                    lines = fams[name] = [self.text.header(name, f"{m.help} ({m.name})", kind, dcgm=True)]
                lines.append(_line(entry, value))
        self._series = new
        for field, help_text, _, target, labels, value in _xid_series(xids, ident, watched):
            labels.update((extra(target) if extra else None) or ())
            xid_key = tuple(labels.items())
            prefix = self._xids.get(xid_key) or self._xids.setdefault(xid_key, self.text.prefix(field, labels))
            if prefix in seen:
                continue
            seen.add(prefix)
            if field not in fams:
                fams[field] = [self.text.header(field, help_text, "gauge", dcgm=True)]
            fams[field].append(f"{prefix}{floatToGoString(value)}\n")
        return "".join("".join(fams[field]) for field in sorted(fams))


def _split(samples: Iterable[Sample], in_order: bool) -> Split:
    """(GPU samples by metric, self-health samples by metric, GPU samples in order (only when
    in_order: dcgm naming needs them, and the list costs an append per sample), metrics with a
    -0.0 value)."""
    gpu: dict[c.Metric, list[Sample]] = defaultdict(list)
    own: dict[c.Metric, list[Sample]] = defaultdict(list)
    ordered: list[Sample] = []
    negative_zero: set[c.Metric] = set()
    for s in samples:
        if s.metric.family in SELF_FAMILIES:
            own[s.metric].append(s)
        else:
            gpu[s.metric].append(s)
            if in_order:
                ordered.append(s)
        if s.value == 0 and math.copysign(1.0, s.value) < 0:
            negative_zero.add(s.metric)
    return gpu, own, ordered, frozenset(negative_zero)


class Renderer:
    """Renders each Snapshot into the bodies scrapers ask for: per format (text 0.0.4 or OpenMetrics,
    see negotiate()), plain or gzip, fresh or stale, each made at most once per snapshot and only
    once asked for. render() makes the bodies asked for since the previous snapshot first, on the
    sampling thread, and only then publishes the new snapshot with them: until it does, scrapes get
    the previous snapshot's bodies without waiting, and `snapshot` is always the one being served
    (so its age is what a freshness check must judge). The stale body (self-health only, so that no
    stale GPU value is served as fresh) is written by prometheus_client itself: it is rarely served.
    Thread-safe: bodies are made under one lock."""

    def __init__(self, naming: str = "gpuobs", hostname: str | None = None, attribution: Sequence[Any] = (),
                 dcgm_zero: Iterable[c.Metric] = ()):
        if naming not in NAMINGS:
            raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
        self.naming = naming
        self.attribution = tuple(attribution)  # sources with lookup(uuid, index, gpu_instance)
        # metrics the profile serves whose DCGM field reads 0 where the GPU has no value (Metric.dcgm_zero)
        self.dcgm_zero = tuple(dcgm_zero)
        self.hostname = hostname or socket.gethostname()
        self.snapshot: Snapshot | None = None
        self._lock = threading.RLock()
        # (the published snapshot, key -> body)
        self._bodies: tuple[Snapshot | None, dict[tuple[str, bool, bool], bytes]] = (None, {})
        self._split: tuple[Snapshot | None, Split | None] = (None, None)
        self._asked: set[tuple[str, bool, bool]] = set()  # bodies asked for since the last render
        self._texts = {fmt: _Text(fmt) for fmt in FORMATS}
        self._gpu = {fmt: _NativeText(self._texts[fmt]) for fmt in FORMATS}
        self._own = {fmt: _NativeText(self._texts[fmt]) for fmt in FORMATS}
        self._dcgm = _DcgmText(self._texts["text"], self.hostname)

    def render(self, snap: Snapshot) -> None:
        """Take a new snapshot (called on the sampling thread, once per snapshot): make the fresh
        bodies asked for since the last one, then publish it."""
        asked, self._asked = self._asked, set()
        bodies: dict[tuple[str, bool, bool], bytes] = {}
        with self._lock:
            for fmt, gz, stale in asked:
                if not stale:
                    self._build(snap, bodies, fmt, gz, False)
            self.snapshot, self._bodies = snap, (snap, bodies)

    def body(self, fmt: str = "text", gz: bool = False, stale: bool = False) -> bytes:
        """The published snapshot in format `fmt` (FORMATS), gzip-compressed if `gz`; stale: its
        self-health less what is then unknown (NVML and GPU state), with gpuobs_exporter_snapshot_stale 1.
        b"" before the first snapshot. Raises ValueError for an unknown format."""
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
        key = (fmt, gz, stale)
        self._asked.add(key)
        got = self._bodies[1].get(key)
        if got is not None:
            return got
        with self._lock:
            snap, bodies = self._bodies
            return self._build(snap, bodies, fmt, gz, stale)

    def _build(self, snap: Snapshot | None, bodies: dict[tuple[str, bool, bool], bytes], fmt: str, gz: bool,
               stale: bool) -> bytes:
        """The body of `snap` for (fmt, gz, stale), made into `bodies` unless there (under the lock)."""
        key = (fmt, gz, stale)
        got = bodies.get(key)
        if got is None:
            if gz:
                got = gzip.compress(self._build(snap, bodies, fmt, False, stale), compresslevel=GZIP_LEVEL, mtime=0)
            elif snap is None:
                got = b""
            else:
                got = (self._stale_body(snap, fmt) if stale else self._fresh_body(snap, fmt)).encode()
            bodies[key] = got
        return got

    @property
    def fresh(self) -> bytes:
        """The latest snapshot's text body (format 0.0.4)."""
        return self.body("text")

    @property
    def stale(self) -> bytes:
        """The stale text body (format 0.0.4): see body()."""
        return self.body("text", stale=True)

    def _fresh_body(self, snap: Snapshot, fmt: str) -> str:
        split = self._split[1]
        if self._split[0] is not snap or split is None:
            split = _split(snap.samples, in_order=self.naming == "dcgm")
            self._split = (snap, split)
        gpu, own, ordered, negative_zero = split
        extra = self._attributor(gpu.get(c.MIG_INFO, ()))
        if self.naming == "dcgm":
            watched = c.XID_WATCHER_UP in own
            info = gpu.get(c.GPU_INFO, []) + gpu.get(c.MIG_INFO, [])
            zero = dcgm_zero_samples(chain(gpu.get(c.GPU_INFO, ()), *(gpu.get(m, ()) for m in self.dcgm_zero)),
                                     self.dcgm_zero)
            body = self._dcgm.render(ordered + zero, info, gpu.get(c.XID_LAST_SEEN, []), extra, watched)
        else:
            body = self._gpu[fmt].render(gpu, extra, negative_zero)
        text = self._texts[fmt]
        flag = text.header(c.SNAPSHOT_STALE.name, c.SNAPSHOT_STALE.help, "gauge") + f"{c.SNAPSHOT_STALE.name} 0.0\n"
        own_text = self._own[fmt].render(own, None, negative_zero)
        return body + own_text + flag + (EOF_LINE if fmt == "openmetrics" else "")

    def _stale_body(self, snap: Snapshot, fmt: str) -> str:
        own = [s for s in snap.samples if s.metric.family in SELF_FAMILIES and s.metric not in UNKNOWN_WHEN_STALE]
        return _to_text(native_families(own) + [_stale_flag(True)], fmt).decode()

    def _attributor(self, mig_info: Iterable[Sample]) -> Extra | None:
        """Attribution labels of a per-GPU or MIG sample, as a tuple of (label, value) pairs (None:
        none), looked up once per device per render. A MIG sample is looked up by its MIG UUID (and
        GPU instance), a per-GPU sample with a mig_uuid label (an XID naming a MIG instance) by that
        UUID (by each of a comma-joined list in turn: the first found wins), else by its parent GPU."""
        if not self.attribution:
            return None
        n_mig = len(c.MIG_LABELS)
        mig_uuids = {tuple(s.labels[:n_mig]): s.labels[n_mig] for s in mig_info}
        cache: dict[tuple[str, ...], Pairs | None] = {}
        shape: dict[c.Metric, tuple[int, int | None, int]] = {}  # metric -> _attribution_shape()

        def extra(s: Sample) -> Pairs | None:
            got = shape.get(s.metric)
            if got is None:
                got = shape[s.metric] = _attribution_shape(s.metric)
            n, at, gi_at = got
            key = s.labels[:n]
            if not key:
                return None
            migs: tuple[str, ...] = ()
            gpu_instance = None
            if n == n_mig:
                migs, gpu_instance = (mig_uuids.get(key, ""),), key[2]
            elif at is not None and s.labels[at]:
                migs, gpu_instance = tuple(s.labels[at].split(",")), s.labels[gi_at]
                key = key + (s.labels[at], gpu_instance)
            if key not in cache:
                cache[key] = self._lookup(key[0], key[1], migs, gpu_instance)
            return cache[key]

        return extra

    def _lookup(self, gpu: str, uuid: str, migs: tuple[str, ...], gpu_instance: str | None) -> Pairs | None:
        """The attribution labels (sorted (label, value) pairs, None: none) of a device: each source
        is asked for the MIG UUIDs `migs` in turn, else for the parent GPU's UUID."""
        names = ATTRIBUTION_LABELS[self.naming]
        labels: dict[str, str] = {}
        for source in self.attribution:
            found = None
            for mig in migs:
                found = found or source.lookup(mig, gpu, gpu_instance)
            found = found or source.lookup(uuid, gpu)
            for k, v in (found or {}).items():
                if k in names and v:
                    labels[names[k]] = v
        return tuple(sorted(labels.items())) or None


def _attribution_shape(metric: c.Metric) -> tuple[int, int | None, int]:
    """(how many identity labels a metric's series start with, the positions of its mig_uuid and
    gpu_instance_id labels when it is a per-GPU metric with both (the XID series), else None and -1)."""
    n = len(metric.identity)
    if n == len(c.GPU_LABELS) and "mig_uuid" in metric.labels and "gpu_instance_id" in metric.labels:
        return n, metric.labels.index("mig_uuid"), metric.labels.index("gpu_instance_id")
    return n, None, -1


def self_health_body(samples: Iterable[Sample], fmt: str = "text", gz: bool = False) -> bytes:
    """A body of the exporter's own samples only (self-health, no GPU value), with
    gpuobs_exporter_snapshot_stale 1, written by prometheus_client in format `fmt` (FORMATS: a valid
    text 0.0.4 or OpenMetrics body, "# EOF" included), gzip-compressed if `gz`: what is served before
    the first sampling pass. Raises ValueError for an unknown format or a sample of a GPU family."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    samples = list(samples)
    foreign = sorted({s.metric.name for s in samples if s.metric.family not in SELF_FAMILIES})
    if foreign:
        raise ValueError(f"not self-health: {', '.join(foreign)}")
    body = _to_text(native_families(samples) + [_stale_flag(True)], fmt)
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0) if gz else body


def _stale_flag(stale: bool) -> PromMetric:
    fam = PromMetric(c.SNAPSHOT_STALE.name, c.SNAPSHOT_STALE.help, "gauge")
    fam.add_sample(c.SNAPSHOT_STALE.name, {}, float(stale))
    return fam
