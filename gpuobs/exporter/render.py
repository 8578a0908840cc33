"""Render a Snapshot as Prometheus text, once per snapshot, in gpuobs or dcgm-exporter naming."""

from __future__ import annotations

import socket
from collections import defaultdict
from itertools import chain
from typing import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric as PromMetric

from .. import catalog as c
from ..collect.base import Sample, Snapshot

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
Extra = Callable[[Sample], "dict[str, str] | None"]


class _Collect:
    """A prometheus_client custom collector over a fixed list of metric families."""

    def __init__(self, families: list[PromMetric]):
        self._families = families

    def collect(self):
        return iter(self._families)


def _to_text(families: Iterable[PromMetric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collect(list(families)))
    return generate_latest(registry)


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
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = ("Value of the last XID error the driver reported for the GPU, 0 before any (derived from "
            f"{c.XID_LAST_SEEN.name}).")
# err_msg of DCGM_FI_DEV_XID_ERRORS: the titles of common XIDs in NVIDIA's XID catalog; others are
# "Unknown Error". Alert on err_code: the titles may differ in wording from dcgm-exporter's.
XID_MESSAGES = {0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
                43: "GPU stopped processing", 45: "Preemptive cleanup, due to previous errors",
                48: "Double Bit ECC Error", 61: "Internal micro-controller breakpoint/warning",
                62: "Internal micro-controller halt", 63: "ECC page retirement or row remapping recording event",
                64: "ECC page retirement or row remapper recording failure", 74: "NVLink Error",
                79: "GPU has fallen off the bus", 92: "High single-bit ECC error rate", 94: "Contained ECC error",
                95: "Uncontained ECC error", 119: "GSP RPC Timeout", 120: "GSP Error"}


class DcgmIdentity:
    """dcgm-exporter's labels of one GPU's (or MIG GPU instance's) series, from the snapshot's
    gpuobs_gpu_info and gpuobs_mig_info samples: gpu, UUID (the physical GPU's), pci_bus_id, device,
    modelName, GPU_I_PROFILE/GPU_I_ID on MIG series, hostname (dcgm-exporter since its rename) and
    Hostname (every release up to 4.8.2), and the DCGM_FI_DRIVER_VERSION label field."""

    def __init__(self, samples: list[Sample], hostname: str):
        self.info = {s.labels[1]: dict(zip(c.GPU_INFO.labels, s.labels)) for s in samples if s.metric is c.GPU_INFO}
        self.profiles = {(s.labels[1], s.labels[2]): s.labels[5] for s in samples if s.metric is c.MIG_INFO}
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


DcgmSeries = tuple[str, str, Sample, "dict[str, str]", float]  # field, help, source sample, labels, value


def _field_series(samples: list[Sample], ident: DcgmIdentity) -> Iterable[DcgmSeries]:
    """Every sample of a catalog metric with a DCGM field, under that field and its aliases."""
    for s in samples:
        m = s.metric
        n_id = len(m.identity)
        field = m.dcgm.get(tuple(s.labels[n_id:]))
        if not field or not n_id:
            continue
        gpu_instance = s.labels[2] if m.identity == c.MIG_LABELS else None
        for name in (field, *c.DCGM_ALIASES.get(field, ())):
            yield name, f"{m.help} ({m.name})", s, ident.labels(s.labels[0], s.labels[1], gpu_instance), \
                s.value * m.dcgm_scale


def _xid_series(samples: list[Sample], ident: DcgmIdentity, watched: bool) -> Iterable[DcgmSeries]:
    """DCGM_FI_DEV_XID_ERRORS per GPU: the XID last reported (by gpuobs_gpu_xid_last_seen_timestamp_seconds,
    whatever MIG instance it named), with err_code and err_msg; while the watcher runs, 0 ("No Error")
    for a GPU that reported none, as dcgm-exporter shows before any XID."""
    last: dict[str, Sample] = {}
    for s in samples:
        if s.metric is c.XID_LAST_SEEN and (s.labels[1] not in last or s.value >= last[s.labels[1]].value):
            last[s.labels[1]] = s
    if watched:
        for uuid, info in ident.info.items():
            last.setdefault(uuid, Sample(c.XID_LAST_SEEN, (info["gpu"], uuid, "0", "", ""), 0.0))
    for uuid, s in sorted(last.items(), key=lambda kv: kv[1].labels[0]):
        code = int(s.labels[2])
        labels = ident.labels(s.labels[0], uuid)
        labels.update(err_code=str(code), err_msg=XID_MESSAGES.get(code, "Unknown Error"))
        yield XID_FIELD, XID_HELP, s, labels, float(code)


def dcgm_families(samples: Iterable[Sample], hostname: str, extra: Extra | None = None,
                  xid_watched: bool = False) -> list[PromMetric]:
    """dcgm-exporter names, labels (DcgmIdentity, then err_code/err_msg on XIDs, then `extra`:
    attribution) and types for every catalog metric that has a DCGM field, plus DCGM_FI_DEV_XID_ERRORS
    (xid_watched: the XID watcher runs, so a GPU without XIDs reads 0). Families are sorted by field;
    a counter family's HELP/TYPE lines name it `<field>_total` until dcgm_text() renders it."""
    samples = list(samples)
    ident = DcgmIdentity(samples, hostname)
    fams: dict[str, PromMetric] = {}
    seen: set[tuple] = set()
    for field, help_text, s, labels, value in chain(_field_series(samples, ident),
                                                     _xid_series(samples, ident, xid_watched)):
        if extra and (more := extra(s)):
            labels.update(more)
        key = (field, tuple(sorted(labels.items())))
        if key in seen:  # DCGM has no compute-instance label: the first of a GPU instance's devices wins
            continue
        seen.add(key)
        fam = fams.get(field)
        if fam is None:
            kind = "counter" if s.metric.kind == "counter" or field in DCGM_COUNTERS else "gauge"
            fam = fams[field] = PromMetric(field, help_text, kind)
        fam.add_sample(field, labels, value)
    return [fams[k] for k in sorted(fams)]


def dcgm_text(families: list[PromMetric]) -> bytes:
    """Text format 0.0.4 of dcgm_families(): prometheus_client's output with only the HELP and TYPE
    lines of counter families renamed from `<field>_total` to `<field>`, as dcgm-exporter writes them
    (its samples carry the bare field name, and dashboards built for it query that name)."""
    text = _to_text(families)
    for fam in families:
        if fam.type == "counter":
            name = fam.name.encode()
            for kind in (b"HELP", b"TYPE"):
                text = text.replace(b"# %s %s_total " % (kind, name), b"# %s %s " % (kind, name), 1)
    return text


class Renderer:
    """Renders each Snapshot once into `fresh`, the complete body; `stale`, the self-health-only body
    served when the snapshot is stale (so that no stale GPU value is served as fresh), is rendered
    when first asked for, since it is rarely served."""

    def __init__(self, naming: str = "gpuobs", hostname: str | None = None, attribution: Sequence = ()):
        if naming not in NAMINGS:
            raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
        self.naming = naming
        self.attribution = tuple(attribution)  # sources with lookup(uuid, index, gpu_instance)
        self.hostname = hostname or socket.gethostname()
        self.fresh = b""
        self.snapshot: Snapshot | None = None
        self._own: list[Sample] = []  # the snapshot's self-health samples
        self._stale: tuple[Snapshot | None, bytes] | None = None  # (for which snapshot, body)
        self._texts: dict[c.Metric, tuple[tuple, bytes]] = {}  # metric -> (its samples, their text)

    def _stale_flag(self, stale: bool) -> PromMetric:
        fam = PromMetric(c.SNAPSHOT_STALE.name, c.SNAPSHOT_STALE.help, "gauge")
        fam.add_sample(c.SNAPSHOT_STALE.name, {}, float(stale))
        return fam

    def _self_only(self, samples: list[Sample], stale: bool) -> bytes:
        return _to_text(native_families(samples) + [self._stale_flag(stale)])

    def _attributor(self, samples: list[Sample]) -> Extra | None:
        """Attribution labels of a per-GPU or MIG sample, looked up once per device per render. A MIG
        sample is looked up by its MIG UUID (and GPU instance), else by its parent GPU."""
        if not self.attribution:
            return None
        names = ATTRIBUTION_LABELS[self.naming]
        n_mig = len(c.MIG_LABELS)
        mig_uuids = {tuple(s.labels[:n_mig]): s.labels[n_mig] for s in samples if s.metric is c.MIG_INFO}
        cache: dict[tuple, dict[str, str] | None] = {}

        def extra(s: Sample) -> dict[str, str] | None:
            key = tuple(s.labels[:len(s.metric.identity)])
            if not key:
                return None
            if key not in cache:
                gpu, uuid, labels = key[0], key[1], {}
                for source in self.attribution:
                    found = None
                    if len(key) == n_mig:
                        found = source.lookup(mig_uuids.get(key, ""), gpu, key[2])
                    found = found or source.lookup(uuid, gpu)
                    for k, v in (found or {}).items():
                        if k in names and v:
                            labels[names[k]] = v
                cache[key] = labels or None
            return cache[key]

        return extra

    def _native_text(self, samples: list[Sample], extra: Extra | None) -> bytes:
        """gpuobs-named text of the GPU samples, metric by metric in name order. A metric whose
        samples (and attribution labels) equal the previous snapshot's keeps its text: most series
        (limits, error counters, info) change rarely, and formatting is most of a render's cost."""
        by_metric: dict[c.Metric, list[Sample]] = defaultdict(list)
        for s in samples:
            by_metric[s.metric].append(s)
        previous, self._texts = self._texts, {}
        parts = []
        for metric in sorted(by_metric, key=lambda m: m.name):
            group = tuple(by_metric[metric])
            key = (group, tuple(map(extra, group)) if extra else None)
            old = previous.get(metric)
            text = old[1] if old is not None and old[0] == key else _to_text(native_families(group, extra))
            self._texts[metric] = (key, text)
            parts.append(text)
        return b"".join(parts)

    def render(self, snap: Snapshot) -> None:
        """Render a new snapshot (called on the sampling thread, once per snapshot)."""
        own = [s for s in snap.samples if s.metric.family in SELF_FAMILIES]
        gpu = [s for s in snap.samples if s.metric.family not in SELF_FAMILIES]
        extra = self._attributor(gpu)
        if self.naming == "dcgm":
            watched = any(s.metric is c.XID_WATCHER_UP for s in own)
            body = dcgm_text(dcgm_families(gpu, self.hostname, extra, xid_watched=watched))
        else:
            body = self._native_text(gpu, extra)
        self.fresh = body + _to_text(native_families(own) + [self._stale_flag(False)])
        self._own, self.snapshot = own, snap

    @property
    def stale(self) -> bytes:
        """The body served when the latest snapshot is stale: its self-health, less what is then
        unknown (NVML and GPU state), with gpuobs_exporter_snapshot_stale 1. Safe from any thread:
        a race renders the same bytes twice."""
        snap, own = self.snapshot, self._own
        cached = self._stale
        if cached is None or cached[0] is not snap:
            cached = self._stale = (snap, self._self_only([s for s in own if s.metric not in UNKNOWN_WHEN_STALE],
                                                          stale=True))
        return cached[1]
