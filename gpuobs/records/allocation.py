"""Records of allocation, use and cost (fleet efficiency), per namespace, team and Slurm job, now and
as GPU-hours over the weekly window; pending demand and Kueue quota."""

from __future__ import annotations

from typing import Callable

from .. import catalog as c
from .base import (
    GPU_BY,
    Record,
    Windows,
    _by,
)
from .placement import HPC_JOB
from .weekly import WeeklyWindows, _integral, duration_seconds

# ------------------------------------------------------------------- allocation, use and cost (fleet efficiency)
# Per namespace, per team and per Slurm job: GPUs allocated (carrying the attribution label: a pod or a
# job holds them), used (the sum of their utilisation, the share of time a kernel ran: every model has
# it, where SM activity needs GPM, Hopper and later, and would price an A100 and an H100 of the same
# job differently), wasted (allocated at or under idle_utilization now: the same test, sample by
# sample, as gpuobs.report's idle GPU-hours) and what they cost an hour in the settings' currency
# (Thresholds.gpu_hour_costs by GPU model). The weekly group turns each into GPU-hours (money for the
# cost) over weekly_window, sampling the record once a step as the weekly section does. Teams come
# from kube-state-metrics' namespace labels (Thresholds.team_label); a namespace without one is its
# own team, as in the report; one kube-state-metrics per Prometheus: namespaces match by name only.
# Pending demand and quota come from kube-state-metrics and Kueue, whose names are theirs (below).
KSM_REQUESTS = "kube_pod_container_resource_requests"
KSM_GPU = 'resource="nvidia_com_gpu"'  # kube-state-metrics writes nvidia.com/gpu with an underscore
KSM_PHASE = "kube_pod_status_phase"
KSM_NAMESPACE_LABELS = "kube_namespace_labels"
KUEUE_PENDING = "kueue_pending_workloads"
KUEUE_USAGE = "kueue_cluster_queue_resource_usage"
KUEUE_QUOTA = "kueue_cluster_queue_nominal_quota"
KUEUE_GPU = 'resource="nvidia.com/gpu"'  # Kueue keeps the resource's own name
NAMESPACE = ("cluster", "k8s_namespace")
TEAM = ("cluster", "team")
CLUSTER_QUEUE = ("cluster", "cluster_queue")


CostWindows = Windows  # the allocation records' settings: part of the one protocol (records.base.Windows)


def gpu_hour_cost(t: CostWindows) -> str:
    """Per GPU (GPU_BY labels), its cost per GPU-hour: the first pair of t.gpu_hour_costs whose regex
    matches its model, else the default (`or` keeps the left operand's series)."""
    info = c.GPU_INFO.exposed_name
    terms = [f'({cost:g} * group by ({GPU_BY}) ({info}{{name=~"{regex}"}}))' for regex, cost in t.gpu_hour_costs]
    return " or ".join(terms + [f"({t.gpu_hour_cost_default:g} * group by ({GPU_BY}) ({info}))"])


def _allocated(by: tuple[str, ...], condition: str = "") -> str:
    """Utilization of the GPUs a holder (`by`) has, filtered by condition."""
    return f'{c.UTILIZATION.name}{{{by[-1]}!=""}}{condition}'


def _holdings(by: tuple[str, ...]) -> str:
    """The GPUs a holder has: gpuobs_gpu_up, which every GPU reports (a GPU in MIG mode has no
    utilization rate: NVML does not give one), lost or timed out ones too (they are still held)."""
    return f'{c.GPU_UP.name}{{{by[-1]}!=""}}'


def _wasted(t: Windows) -> str:
    return f" <= {t.idle_utilization:g}"


def _priced(by: tuple[str, ...], condition: Callable[[Windows], str] | None = None) -> Callable[[CostWindows], str]:
    """Cost per hour of the GPUs held (condition None) or of the held GPUs whose utilization meets
    condition, summed by `by`."""
    def expr(t: CostWindows) -> str:
        gpus = _holdings(by) if condition is None else _allocated(by, condition(t))
        return f"sum by ({_by(by)}) (({gpus}) * 0 + on ({GPU_BY}) group_left () ({gpu_hour_cost(t)}))"
    return expr


def _usage(by: tuple[str, ...]) -> tuple[Record, ...]:
    """GPUs allocated, used and wasted, and the cost per hour of the wasted ones, by `by` (the cost of
    the allocated ones had no reader: tests/test_record_readers.py)."""
    return (Record(by, "gpuobs_gpus_allocated", "count", lambda t: f"count by ({_by(by)}) ({_holdings(by)})"),
            Record(by, "gpuobs_gpus_used", "sum", lambda t: f"sum by ({_by(by)}) ({_allocated(by)})"),
            Record(by, "gpuobs_gpus_wasted", "count",
                   lambda t: f"count by ({_by(by)}) ({_allocated(by, _wasted(t))}) or {_none(by)}"),
            Record(by, "gpuobs_gpus_wasted_cost_per_hour", "sum",
                   lambda t: f"{_priced(by, _wasted)(t)} or {_none(by)}"))


def _none(by: tuple[str, ...]) -> str:
    # 0, not nothing, where GPUs are allocated and none is wasted: a holder without waste is data too
    return f"0 * count by ({_by(by)}) ({_holdings(by)})"


def _teams(t: CostWindows) -> str:
    """Per namespace with a team label, k8s_namespace and team (kube-state-metrics' namespace is renamed)."""
    team = t.team_label
    named = f'max by (namespace, {team}) ({KSM_NAMESPACE_LABELS}{{{team}!=""}})'
    return (f'label_replace(label_replace({named}, "k8s_namespace", "$1", "namespace", "(.*)"), '
            f'"team", "$1", "{team}", "(.*)")')


def _by_team(source: Record) -> Record:
    """A namespace record summed by team; a namespace without a team label is its own team."""
    own = f'label_replace({source.name}, "team", "$1", "k8s_namespace", "(.*)")'
    return Record(TEAM, source, source.operation,
                  lambda t: f"sum by ({_by(TEAM)}) (({source.name} * on (k8s_namespace) group_left (team) "
                            f"{_teams(t)}) or on (k8s_namespace) {own})")


def _weekly(now: Record, hours_of: str, unit_s: float = 3600) -> tuple[Record, Record]:
    """A step record of `now` (its average over weekly_interval, an evaluation without a series
    counting as 0: a pod or job present for part of the step counts for that part, where
    avg_over_time would count it for the whole step) and its sum over weekly_window per unit_s
    seconds (hours by default; 1: watts become joules, grams per second grams)."""
    def average(t: WeeklyWindows) -> str:
        step = duration_seconds(t.weekly_interval)
        # (t - step, t]: a 1 ms shorter range, so that Prometheus 2 (which includes a sample exactly at
        # t - step) and 3 (which does not) both see one step's evaluations when the groups tick together
        return f"sum_over_time({now.name}[{round(step * 1000) - 1}ms]) / {step / duration_seconds(t.eval_interval):g}"
    step = Record(now.by, now, "avg", average)
    return step, Record(now.by, hours_of, "sum", _integral(step, unit_s))


(NAMESPACE_GPUS_ALLOCATED, NAMESPACE_GPUS_USED, NAMESPACE_GPUS_WASTED,
 NAMESPACE_WASTED_COST) = _usage(NAMESPACE)
(JOB_GPUS_ALLOCATED, JOB_GPUS_USED, JOB_GPUS_WASTED, JOB_WASTED_COST) = _usage(HPC_JOB)
(TEAM_GPUS_ALLOCATED, TEAM_GPUS_USED, TEAM_GPUS_WASTED, TEAM_WASTED_COST) = (
    _by_team(r) for r in (NAMESPACE_GPUS_ALLOCATED, NAMESPACE_GPUS_USED, NAMESPACE_GPUS_WASTED, NAMESPACE_WASTED_COST))
HOURS_OF = {"gpuobs_gpus_allocated": "gpuobs_gpu_hours_allocated", "gpuobs_gpus_used": "gpuobs_gpu_hours_used",
            "gpuobs_gpus_wasted": "gpuobs_gpu_hours_wasted",
            "gpuobs_gpus_wasted_cost_per_hour": "gpuobs_gpus_wasted_cost"}
WEEKLY_USAGE = {level: tuple(x for now in (allocated, used, wasted, cost) for x in _weekly(now, HOURS_OF[now.metric]))
                for level, allocated, used, wasted, cost in (
                    ("namespace", NAMESPACE_GPUS_ALLOCATED, NAMESPACE_GPUS_USED, NAMESPACE_GPUS_WASTED,
                     NAMESPACE_WASTED_COST),
                    ("team", TEAM_GPUS_ALLOCATED, TEAM_GPUS_USED, TEAM_GPUS_WASTED, TEAM_WASTED_COST),
                    ("job", JOB_GPUS_ALLOCATED, JOB_GPUS_USED, JOB_GPUS_WASTED, JOB_WASTED_COST))}
(NAMESPACE_ALLOCATED_STEP, NAMESPACE_GPU_HOURS_ALLOCATED, NAMESPACE_USED_STEP, NAMESPACE_GPU_HOURS_USED,
 NAMESPACE_WASTED_STEP, NAMESPACE_GPU_HOURS_WASTED, NAMESPACE_WASTED_COST_STEP,
 NAMESPACE_WASTED_COST_WEEK) = WEEKLY_USAGE["namespace"]
(TEAM_ALLOCATED_STEP, TEAM_GPU_HOURS_ALLOCATED, TEAM_USED_STEP, TEAM_GPU_HOURS_USED,
 TEAM_WASTED_STEP, TEAM_GPU_HOURS_WASTED, TEAM_WASTED_COST_STEP, TEAM_WASTED_COST_WEEK) = WEEKLY_USAGE["team"]
(JOB_ALLOCATED_STEP, JOB_GPU_HOURS_ALLOCATED, JOB_USED_STEP, JOB_GPU_HOURS_USED,
 JOB_WASTED_STEP, JOB_GPU_HOURS_WASTED, JOB_WASTED_COST_STEP, JOB_WASTED_COST_WEEK) = WEEKLY_USAGE["job"]


def _pending(t: Windows) -> str:
    # GPUs requested by the containers of pods Pending now (kube_pod_status_phase is 1 for the phase
    # a pod is in), kube-state-metrics' namespace renamed as attribution names it
    pending = f'{KSM_PHASE}{{phase="Pending"}} == 1'
    demand = (f"sum by (cluster, namespace) ({KSM_REQUESTS}{{{KSM_GPU}}} * on (cluster, namespace, pod) "
              f"group_left () ({pending}))")
    return f'sum by ({_by(NAMESPACE)}) (label_replace({demand}, "k8s_namespace", "$1", "namespace", "(.*)"))'


NAMESPACE_GPUS_PENDING = Record(NAMESPACE, "gpuobs_gpus_requested_pending", "sum", _pending)
QUEUE_PENDING_WORKLOADS = Record(CLUSTER_QUEUE, KUEUE_PENDING, "sum",
                                 lambda t: f"sum by ({_by(CLUSTER_QUEUE)}) ({KUEUE_PENDING})")
QUEUE_GPU_USAGE = Record(CLUSTER_QUEUE, "gpuobs_kueue_gpus_used", "sum",
                         lambda t: f"sum by ({_by(CLUSTER_QUEUE)}) ({KUEUE_USAGE}{{{KUEUE_GPU}}})")
QUEUE_GPU_QUOTA = Record(CLUSTER_QUEUE, "gpuobs_kueue_gpus_nominal_quota", "sum",
                         lambda t: f"sum by ({_by(CLUSTER_QUEUE)}) ({KUEUE_QUOTA}{{{KUEUE_GPU}}})")
# GPUs in use over the nominal quota (the queue's fair share), every flavor together; over 1: borrowing
QUEUE_GPU_QUOTA_USED = Record(CLUSTER_QUEUE, "gpuobs_kueue_gpu_quota_used", "ratio",
                              lambda t: f"{QUEUE_GPU_USAGE.name} / ({QUEUE_GPU_QUOTA.name} > 0)")
