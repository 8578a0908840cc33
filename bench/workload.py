"""The fleet bench's workload: who holds which GPU when, what kube-state-metrics and Kueue say about
it, and the ground truth (GPU-hours allocated, used and idle, and their cost, and energy, per
namespace, team and Slurm job) that the recording rules and `gpuobs report` must reproduce.

Kubernetes clusters run pods of 1, 2, 4 or 8 GPUs from a few namespaces, one after another with gaps
between them; GPUs the bench marks idle are never allocated and those it marks allocated-idle sit in
a notebook pod for the whole span. The Slurm cluster runs jobs the same way, attributed by `hpc_job`.
Times are Unix seconds; a hold covers [start, end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuobs.report import Usage

# namespace -> team (its kube_namespace_labels label_team; "" = the namespace has no team label,
# so the records fall back to the namespace's own name)
NAMESPACES = {"llm-pretrain": "foundation", "llm-finetune": "foundation", "vision": "perception",
              "speech": "perception", "recsys": "ads", "notebooks": ""}
NOTEBOOKS = "notebooks"          # where allocated-idle GPUs sit
QUEUES = {"foundation": 96, "perception": 48, "ads": 24}   # Kueue cluster queue per team: nominal GPU quota
SLURM_CLUSTERS = frozenset({"cluster-4"})
POD_MINUTES = (40, 180)           # a pod's or job's run time, uniform
GAP_MINUTES = (0, 20)             # between one pod and the next on the same GPUs
PENDING = {"llm-pretrain": (8, 8), "vision": (4,)}   # per cluster: pending pods' GPU requests
TRAINING = {"goodput": 0.9, "checkpoint": 0.05, "data_wait": 0.05}   # rank 0's seconds per second, by cause


def team_of(namespace: str) -> str:
    """The team a namespace's GPU-hours count for, as the cluster_team records map it."""
    return NAMESPACES.get(namespace) or namespace


@dataclass(frozen=True)
class Hold:
    """One pod's or Slurm job's hold on some GPUs of one node over [start, end) (Unix seconds).
    `who` are the attribution labels the exporter adds to every series of those GPUs."""
    gpus: tuple[int, ...]
    start: float
    end: float
    who: dict = field(hash=False)
    idle: bool = False   # holds its GPUs without using them

    def key(self, kind: str) -> str:
        """The namespace, pod or hpc_job this hold counts for ('' when not that kind)."""
        return self.who.get({"namespace": "k8s_namespace", "pod": "k8s_pod", "hpc_job": "hpc_job"}[kind], "")


def _sizes(rng: np.random.Generator, n: int) -> list[int]:
    """A random split of n GPUs into pods of 8, 4, 2 or 1."""
    out = []
    while n:
        fits = [s for s in (8, 4, 2, 1) if s <= n]
        out.append(int(rng.choice(fits)))
        n -= out[-1]
    return out


def schedule(rng: np.random.Generator, node: str, cluster: str, roles: list[str],
             span: tuple[float, float]) -> list[Hold]:
    """Every hold on a node's GPUs over span. roles: per GPU, 'idle' (never held),
    'allocated_idle' (held by a notebook pod, unused) or anything else (runs pods)."""
    t0, t1 = span
    slurm = cluster in SLURM_CLUSTERS
    holds = []
    idle = [g for g, r in enumerate(roles) if r == "allocated_idle"]
    if idle and not slurm:
        holds.append(Hold(tuple(idle), t0, t1, {"k8s_namespace": NOTEBOOKS, "k8s_pod": f"nb-{node}",
                                                "k8s_container": "notebook"}, idle=True))
    elif idle:
        holds.append(Hold(tuple(idle), t0, t1, {"hpc_job": str(int(rng.integers(10000, 99999)))}, idle=True))
    free = [g for g, r in enumerate(roles) if r not in ("idle", "allocated_idle")]
    working = [ns for ns in NAMESPACES if ns != NOTEBOOKS]
    k = 0
    for size in _sizes(rng, len(free)):
        gpus, free = tuple(free[:size]), free[size:]
        t = t0 - rng.uniform(0, POD_MINUTES[1] * 60)   # the first pod started before the span
        while t < t1:
            end = t + 60 * rng.uniform(*POD_MINUTES)
            if end > t0:
                if slurm:
                    who = {"hpc_job": f"{int(rng.integers(100000, 999999))}"}
                else:
                    ns = str(rng.choice(working))
                    who = {"k8s_namespace": ns, "k8s_pod": f"{ns}-{node}-{k}", "k8s_container": "main"}
                holds.append(Hold(gpus, max(t, t0), min(end, t1), who))
                k += 1
            t = end + 60 * rng.uniform(*GAP_MINUTES)
    return holds


def held(holds: list[Hold], gpus: int, t: np.ndarray, busy_only: bool = False) -> np.ndarray:
    """(gpus, len(t)) 0/1: whether a hold (a working one, with busy_only) covers GPU g at t."""
    out = np.zeros((gpus, len(t)))
    for h in holds:
        if busy_only and h.idle:
            continue
        on = (t >= h.start) & (t < h.end)
        for g in h.gpus:
            out[g] = np.maximum(out[g], on)
    return out


def spans_without(holds: list[Hold], gpu: int, span: tuple[float, float]) -> list[tuple[float, float]]:
    """The parts of span in which no hold covers the GPU: its series carry no attribution then."""
    covered = sorted((h.start, h.end) for h in holds if gpu in h.gpus)
    out, t = [], span[0]
    for a, b in covered:
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < span[1]:
        out.append((t, span[1]))
    return out


# ------------------------------------------------------------------------------------ ground truth


def truth(nodes, window: tuple[float, float], price: float, idle_utilization: float, grid_s: float = 5.0) -> dict:
    """{'namespace': {(cluster, ns): Usage}, 'team': {(cluster, team): Usage}, 'hpc_job': {(cluster, job): Usage}}
    of the given bench nodes (each with .cluster, .holds and .utilization(t) giving (GPUS, len(t)) in
    0..1) over window, integrated on a grid_s grid: GPU-hours allocated (held), used (held x
    utilization), idle (held at or under idle_utilization) and the idle hours' cost at price per
    GPU-hour, in gpuobs.report's Usage, the report's own rows."""
    t = np.arange(window[0] + grid_s / 2, window[1], grid_s)
    out = {"namespace": {}, "team": {}, "hpc_job": {}}
    for nd in nodes:
        util = nd.utilization(t)
        for h in nd.holds:
            on = (t >= h.start) & (t < h.end)
            if not on.any():
                continue
            for g in h.gpus:
                u = util[g][on]
                hours = on.sum() * grid_s / 3600
                wasted = (u <= idle_utilization).sum() * grid_s / 3600
                used = u.sum() * grid_s / 3600
                keys = ([("hpc_job", h.key("hpc_job"))] if h.key("hpc_job") else
                        [("namespace", h.key("namespace")), ("team", team_of(h.key("namespace")))])
                for kind, name in keys:
                    out[kind].setdefault((nd.cluster, name), Usage()).add(Usage(hours, used, wasted, wasted * price))
    return out


def energy_truth(nodes, window: tuple[float, float], grid_s: float = 5.0) -> dict:
    """{'namespace' | 'team' | 'hpc_job': {(cluster, name): joules}} of the given bench nodes (each with
    .cluster, .holds and .power(t) giving (GPUS, len(t)) watts, the simulated power values) over window:
    each GPU's power integrated on a grid_s grid over the spans its holders hold it."""
    t = np.arange(window[0] + grid_s / 2, window[1], grid_s)
    out: dict = {"namespace": {}, "team": {}, "hpc_job": {}}
    for nd in nodes:
        watts = nd.power(t)
        for h in nd.holds:
            on = (t >= h.start) & (t < h.end)
            joules = sum(watts[g][on].sum() for g in h.gpus) * grid_s
            keys = ([("hpc_job", h.key("hpc_job"))] if h.key("hpc_job") else
                    [("namespace", h.key("namespace")), ("team", team_of(h.key("namespace")))])
            for kind, name in keys:
                out[kind][(nd.cluster, name)] = out[kind].get((nd.cluster, name), 0.0) + joules
    return out


def over_clusters(rows: dict[tuple[str, str], Usage]) -> dict[str, Usage]:
    """truth()'s rows of one level summed over clusters, by name (what gpuobs report shows)."""
    out: dict[str, Usage] = {}
    for (_, name), u in rows.items():
        out.setdefault(name, Usage()).add(u)
    return out


def close(measured: float, expected: float) -> float:
    """Relative error of measured against expected (0 when both are 0, inf when only expected is)."""
    if expected == 0:
        return 0.0 if measured == 0 else math.inf
    return abs(measured - expected) / expected
