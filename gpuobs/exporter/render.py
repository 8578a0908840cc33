"""Render a Snapshot as Prometheus text, once per snapshot, in gpuobs or dcgm-exporter naming."""

from __future__ import annotations

import socket
from collections import defaultdict
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


def dcgm_families(samples: Iterable[Sample], hostname: str, extra: Extra | None = None) -> list[PromMetric]:
    """dcgm-exporter names and labels (gpu, UUID, pci_bus_id, device, modelName, Hostname, and
    GPU_I_ID/GPU_I_PROFILE on MIG series) for every catalog metric that has a DCGM field."""
    samples = list(samples)
    info = {s.labels[1]: dict(zip(c.GPU_INFO.labels, s.labels)) for s in samples if s.metric is c.GPU_INFO}
    profiles = {(s.labels[1], s.labels[2]): s.labels[5] for s in samples if s.metric is c.MIG_INFO}
    fams: dict[str, PromMetric] = {}
    seen: set[tuple] = set()
    for s in samples:
        m = s.metric
        n_id = len(m.identity)
        field = m.dcgm.get(tuple(s.labels[n_id:]))
        if not field or not n_id:
            continue
        gpu, uuid = s.labels[0], s.labels[1]
        ident = info.get(uuid, {})
        labels = {"gpu": gpu, "UUID": uuid, "pci_bus_id": ident.get("pci_bus_id", ""),
                  "device": f"nvidia{gpu}", "modelName": ident.get("name", ""), "Hostname": hostname}
        if m.identity == c.MIG_LABELS:
            labels["GPU_I_ID"] = s.labels[2]
            labels["GPU_I_PROFILE"] = profiles.get((uuid, s.labels[2]), "")
        if extra and (more := extra(s)):
            labels.update(more)
        key = (field, tuple(sorted(labels.items())))
        if key in seen:  # DCGM has no compute-instance label: the first of a GPU instance's devices wins
            continue
        seen.add(key)
        fam = fams.get(field)
        if fam is None:
            # Typed gauge: text format 0.0.4 in prometheus_client would rename a counter to
            # <field>_total, and dashboards built for dcgm-exporter query the bare field name.
            fam = fams[field] = PromMetric(field, f"{m.help} ({m.name})", "gauge")
        fam.add_sample(field, labels, s.value * m.dcgm_scale)
    return [fams[k] for k in sorted(fams)]


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
            body = _to_text(dcgm_families(gpu, self.hostname, extra))
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
