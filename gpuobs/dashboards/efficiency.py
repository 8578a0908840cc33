"""Fleet efficiency: who holds GPUs and leaves them idle, what that idle time costs, GPUs allocated
against GPUs used by team, namespace and Slurm job, pending GPU demand (kube-state-metrics) and
Kueue's quota use against each cluster queue's nominal quota (its fair share), and the energy and
CO2e of the GPUs each holder has.

Everything reads the allocation records of gpuobs/records.py: "wasted" GPUs are allocated ones at or
under the idle threshold, and costs are per hour in the cost table's currency (Thresholds.currency,
gpu_hour_costs; docs/fleet-review.md).
"""

from __future__ import annotations

from .. import records as r
from . import common as k
from .common import sel, target

C = 'cluster=~"$cluster"'
HOLDERS = 10  # rows of the top idle holders table
MONEY = "short"  # amounts in the cost table's currency, which the dashboards do not know
WEEK_BY_TEAM = {r.TEAM_GPU_HOURS_ALLOCATED: "GPU-hours allocated", r.TEAM_GPU_HOURS_USED: "GPU-hours used",
                r.TEAM_GPU_HOURS_WASTED: "GPU-hours wasted", r.TEAM_WASTED_COST_WEEK: "wasted cost"}


def holders(namespace: r.Record, job: r.Record) -> str:
    """A namespace record and its Slurm job twin together: the holders of GPUs, whichever scheduler."""
    return f"{sel(namespace, C)} or {sel(job, C)}"


def now(L: k.Layout) -> None:
    """Append the 'Now' row to L: wasted GPUs and their cost per hour, pending demand, idle holders."""
    L.row("Now")
    L.add(k.stat("GPUs wasted", [target(f"sum({holders(r.NAMESPACE_GPUS_WASTED, r.JOB_GPUS_WASTED)})")], "short",
                 "GPUs a pod or Slurm job holds at or under the idle utilisation threshold now."), 6, 4)
    L.add(k.stat("Cost of wasted GPUs per hour", [target(
        f"sum({holders(r.NAMESPACE_WASTED_COST, r.JOB_WASTED_COST)})")], MONEY,
        "What the wasted GPUs cost an hour, in the cost table's currency."), 6, 4)
    L.add(k.stat("Pending GPU demand", [target(f"sum({sel(r.NAMESPACE_GPUS_PENDING, C)})")], "short",
                 "GPUs requested by pods Pending now (kube-state-metrics): demand the fleet does not serve."), 6, 4)
    L.add(k.stat("Kueue pending workloads", [target(f"sum({sel(r.QUEUE_PENDING_WORKLOADS, C)})")], "short",
                 "Workloads waiting in Kueue's cluster queues, active and inadmissible."), 6, 4)
    L.add(k.table("Top idle holders", [target(
        f"topk({HOLDERS}, {holders(r.NAMESPACE_WASTED_COST, r.JOB_WASTED_COST)})")],
        MONEY, f"The {HOLDERS} namespaces and Slurm jobs whose wasted GPUs cost the most an hour now.",
        rename={"Value": "wasted cost per hour"}, sort_by="wasted cost per hour"), 24, 7)


def waste(L: k.Layout) -> None:
    """Append the 'Waste over time' row to L: the cost and number of idle allocated GPUs by holder."""
    L.row("Waste over time")
    L.add(k.timeseries("Cost of wasted GPUs by team", [
        target(sel(r.TEAM_WASTED_COST, C), "{{team}}"),
        target(sel(r.JOB_WASTED_COST, C), "job {{hpc_job}}")], MONEY,
        "Cost per hour of GPUs held at or under the idle threshold, by team (kube-state-metrics namespace "
        "label; a namespace without one is its own team) and Slurm job.", min=0, stack=True), 12, 8)
    L.add(k.timeseries("Wasted GPUs by namespace", [
        target(sel(r.NAMESPACE_GPUS_WASTED, C), "{{k8s_namespace}}"),
        target(sel(r.JOB_GPUS_WASTED, C), "job {{hpc_job}}")], "short",
        "GPUs held at or under the idle threshold, by namespace and Slurm job.", min=0, stack=True), 12, 8)


def allocation(L: k.Layout) -> None:
    """Append the 'Allocated and used' row to L: GPUs held and used by team, namespace and Slurm job."""
    L.row("Allocated and used")
    for title, level, label in (("team", "TEAM", "team"), ("namespace", "NAMESPACE", "k8s_namespace"),
                                ("Slurm job", "JOB", "hpc_job")):
        L.add(k.timeseries(f"GPUs allocated and used by {title}", [
            target(sel(r.NAMES[f"{level}_GPUS_ALLOCATED"], C), f"{{{{{label}}}}} allocated"),
            target(sel(r.NAMES[f"{level}_GPUS_USED"], C), f"{{{{{label}}}}} used")], "short",
            f"GPUs held by each {title}, and their utilisation summed (a GPU busy half the time is half a GPU "
            "used): the gap is what it holds and does not use.", min=0), 8, 8)
    L.add(k.table("GPU-hours over the review window by team", [
        target(f"sum by (cluster, team) ({sel(record, C)})") for record in WEEK_BY_TEAM], "short",
        "GPU-hours allocated, used and wasted, and the wasted hours' cost, over the weekly review window "
        "(Thresholds.weekly_window), by team.", merge=True,
        rename={f"Value #{chr(ord('A') + i)}": title for i, title in enumerate(WEEK_BY_TEAM.values())},
        sort_by="wasted cost"), 24, 7)


def _unit(column: str, unit: str) -> dict:
    return {"matcher": {"id": "byName", "options": column}, "properties": [{"id": "unit", "value": unit}]}


def energy(L: k.Layout) -> None:
    """Append the 'Energy and carbon' row to L: watts drawn now, and energy (kWh) and CO2e (grams) over
    the review window, by team, namespace and Slurm job (gpuobs.records' energy section)."""
    L.row("Energy and carbon")
    L.add(k.timeseries("Power drawn by team", [
        target(sel(r.TEAM_POWER, C), "{{team}}"), target(sel(r.JOB_POWER, C), "job {{hpc_job}}")], "watt",
        "Watts the GPUs each team and Slurm job holds draw (the rate of the GPUs' energy counters; the power "
        "gauge for a GPU without one).", min=0, stack=True), 24, 8)
    kwh = f"/ {r.JOULES_PER_KWH:g}"
    for title, level, label in (("team", "TEAM", "team"), ("namespace", "NAMESPACE", "k8s_namespace"),
                                ("Slurm job", "JOB", "hpc_job")):
        L.add(k.table(f"Energy and CO2e over the review window by {title}", [
            target(f"sum by (cluster, {label}) ({sel(r.NAMES[f'{level}_ENERGY'], C)}) {kwh}"),
            target(f"sum by (cluster, {label}) ({sel(r.NAMES[f'{level}_CO2E'], C)})")], "kwatth",
            f"Energy of the GPUs each {title} held, over the weekly review window (Thresholds.weekly_window), "
            "and its CO2e at the configured grid intensity (an average, not live; embodied carbon not counted).",
            merge=True, rename={"Value #A": "energy", "Value #B": "CO2e"}, sort_by="energy",
            overrides=[_unit("CO2e", "massg")]), 8, 8)


def demand(L: k.Layout) -> None:
    """Append the 'Demand and quota' row to L: pending GPU demand and Kueue quota use."""
    L.row("Demand and quota")
    L.add(k.timeseries("Pending GPU demand by namespace", [
        target(sel(r.NAMESPACE_GPUS_PENDING, C), "{{k8s_namespace}}")], "short",
        "GPUs requested by Pending pods, by namespace (kube-state-metrics' container resource requests).",
        min=0, stack=True), 12, 8)
    L.add(k.timeseries("Kueue pending workloads", [
        target(sel(r.QUEUE_PENDING_WORKLOADS, C), "{{cluster_queue}}")], "short",
        "Workloads waiting for admission, by cluster queue.", min=0), 12, 8)
    L.add(k.bargauge("Kueue GPU quota use", [target(sel(r.QUEUE_GPU_QUOTA_USED, C), "{{cluster_queue}}")],
                     "percentunit", "GPUs in use over the nominal quota (the queue's fair share), every flavor "
                     "together; over 100 %: the queue borrows from its cohort.", max=1.5), 12, 8)
    L.add(k.timeseries("Kueue GPUs used and nominal quota", [
        target(sel(r.QUEUE_GPU_USAGE, C), "{{cluster_queue}} used"),
        target(sel(r.QUEUE_GPU_QUOTA, C), "{{cluster_queue}} nominal quota")], "short",
        "GPUs each cluster queue's admitted workloads use, against its nominal quota.", min=0), 12, 8)


def build():
    """The Fleet efficiency dashboard: rows Now, Waste over time, Allocated and used, Energy and
    carbon, Demand and quota; variable cluster."""
    L = k.Layout()
    now(L)
    waste(L)
    allocation(L)
    energy(L)
    demand(L)
    variables = [k.variable("cluster", f"label_values({r.NAMESPACE_GPUS_ALLOCATED.name}, cluster)", "Cluster")]
    links = [k.dashboard_link("Fleet overview", "fleet"), k.dashboard_link("Training job", "training")]
    return k.dashboard("gpuobs / Fleet efficiency", "efficiency",
                       "GPUs allocated against used, idle holders and their cost, energy and CO2e, pending demand "
                       "and Kueue quota use, by team, namespace and Slurm job.", L, variables, links,
                       time_from="now-24h")
