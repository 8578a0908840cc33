"""Records that explain a slow training rank or job: which GPUs each rank runs on (the join of the
instrumentation's rank info to the exporter's GPU series), the slowdown causes present on each GPU,
and per rank and per job the most likely one.

The join (RANK_GPUS, and the same paths in RANK_CAUSE) maps a rank by the first of four paths that
finds it, each over what the other side serves:

1. exact: the rank's GPU UUID (gpuobs_training_rank_info `uuid`) equals a GPU's `uuid`;
2. pod: the rank's k8s_namespace/k8s_pod equal the exporter's attribution labels of a GPU (every GPU
   of the pod);
3. Slurm: the rank's job_id equals the exporter's `hpc_job` and its host the GPU series' `node`
   (every GPU of the job on that host);
4. bare host: the rank's host equals the GPU series' `node` (every GPU of the node that no pod or
   Slurm job holds: a GPU held by another job is never named).

The exporter's `node` label comes from the scrape (relabeling, as the placement records read it): it
must equal the host name the ranks see (RunEnv.node: NODE_NAME, SLURMD_NODENAME or the hostname).
PromQL joins one-to-many only, so a holder with several ranks and several GPUs (one pod of 8 ranks on
8 GPUs, without UUIDs) cannot be joined rank by GPU: RANK_CAUSE then joins each rank to its holder's
top cause (a rank maps to its pod's GPUs), and RANK_GPUS lists (rank, GPU) pairs only where a rank's
UUID names its GPU or its holder runs that one rank. JOB_GPUS maps each job to the GPUs its ranks run
on now, through the same paths (one-to-many: a holder running ranks of one job maps it to all its
GPUs); the energy records charge a training job through it (gpuobs.records.energy).

Causes and their priorities (the integer part of GPU_CAUSES' value; the fraction is the evidence, in
[0, 1), so topk(1) picks the most likely): CAUSES below. A rank's data loader (its data-wait share an
outlier in its job) ranks above every GPU cause: the rank is then slow before its GPU is involved.
"""

from __future__ import annotations

from .. import catalog as c
from .base import GPU, JOB, RANK, SAME_SERIES, Record, Windows, pcie_below_max
from .errors import new_first
from .reliability import GPU_ECC_CORRECTED_RATE, GPU_NVLINK_ERRORS_RATE, GPU_PCIE_REPLAYS_RATE
from .training import COMPUTE_PER_STEP, DATA_WAIT_RATIO, DATA_WAIT_TO_OTHERS

# cause -> priority: the order in which a cause explains a rank computing slower. Clocks held down
# by heat or the power brake cut compute most; another process takes SMs; XIDs and ECC activity mean
# a failing GPU (retries, page retirement); PCIe and NVLink faults slow transfers and collectives
# more than compute; the SW power cap is common under full load, so it is named only when nothing
# else is. `none` (0) is every GPU's, so that every GPU has a series.
CAUSES = {"data_loader": 9, "thermal": 8, "power_brake": 7, "shared_gpu": 6, "xid": 5, "ecc": 4, "pcie": 3,
          "nvlink": 2, "power_cap": 1, "none": 0}
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")
# RANK_CAUSE ranks the candidates of the paths by path first (offset), then by cause: a rank the
# exact path maps is explained by its own GPU, even when healthy, never by another GPU of its pod.
# The offsets are multiples of PATH_STEP, taken off again by `% PATH_STEP`.
PATH_STEP = 100
CAUSE_BY = ("job_id", "rank", "cause", "cause_gpu")  # the labels of RANK_CAUSE's series
JOB_CAUSE_BY = ("job_id", "cause", "cause_gpu", "cause_rank")  # the labels of JOB_CAUSE's series


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def _evidence(x: str) -> str:
    """A non-negative quantity (a count, a multiple of a threshold) as evidence in [0, 1): 1 - 1/(1 + x)."""
    return f"(1 - 1 / (1 + ({x})))"


def _cause(name: str, per_gpu: str, evidence: str) -> str:
    """One cause's series: per GPU (SAME_SERIES labels) where per_gpu has a series, valued its
    priority plus evidence (an expression over per_gpu's value, written with `{x}`), labelled cause."""
    value = evidence.format(x=f"max by ({SAME_SERIES}) ({per_gpu})")
    return f'label_replace({CAUSES[name]} + {value}, "cause", "{name}", "", "")'


def _share(reasons: tuple[str, ...], t: Windows) -> str:
    """Per GPU, the share of rate_window's samples in which one of reasons held the clocks down, where
    it is over cause_min_share. The 0/1 gauge, not the duration counter: the default profile serves
    it (the counter is detail) and so does the dcgm-exporter adapter."""
    active = f'{c.CLOCK_EVENT_ACTIVE.name}{{reason=~"{"|".join(reasons)}"}}'
    return f"avg_over_time({active}[{t.rate_window}]) > {t.cause_min_share:g}"


def _gpu_causes(t: Windows) -> str:
    """Every cause present on every GPU, and `none` on every GPU; one pass over each input."""
    share = "clamp_max({x}, 0.999)"
    xids = f"sum by ({SAME_SERIES}) ({new_first(c.XID_ERRORS.exposed_name, t.long_window)}) > 0"
    ecc = (f"{GPU_ECC_CORRECTED_RATE.name} / {t.ecc_corrected_per_s:g} > 1 or "
           f"{c.REMAP_PENDING.name} == 1")
    # a link below its max counts as 1 (PCIe downshifts at idle to save power: only on a busy GPU)
    pcie = (f"0 * (({pcie_below_max()}) and on ({SAME_SERIES}) {c.UTILIZATION.name} > {t.pcie_busy_utilization:g})"
            f" + 1 or {GPU_PCIE_REPLAYS_RATE.name} / {t.pcie_replays_per_s:g} > 1")
    nvlink = f"{GPU_NVLINK_ERRORS_RATE.name} / {t.nvlink_errors_per_s:g} > 1 or {c.NVLINKS_DOWN.name} > 0"
    # processes on the whole GPU (MIG instances are apart: each its own device); more than one shares it
    shared = f'count by ({SAME_SERIES}) ({c.PROCESS_MEMORY.name}{{gpu_instance_id=""}}) > 1'
    terms = [
        _cause("thermal", _share(THERMAL_REASONS, t), share),
        _cause("power_brake", _share(("hw_power_brake_slowdown",), t), share),
        _cause("shared_gpu", shared, "(1 - 1 / {x})"),
        _cause("xid", xids, _evidence("{x}")),
        _cause("ecc", ecc, _evidence("{x}")),
        _cause("pcie", pcie, _evidence("{x}")),
        _cause("nvlink", nvlink, _evidence("{x}")),
        _cause("power_cap", _share(("sw_power_cap",), t), share),
        _cause("none", c.GPU_INFO.exposed_name, "0 * {x}"),
    ]
    return " or ".join(terms)


# Per GPU (its identity and attribution labels), one series per slowdown cause present, valued its
# priority plus its evidence (a share of time, or 1 - 1/(1 + how far over its threshold)), and `none`
# (0) on every GPU. One series per GPU on a healthy fleet.
GPU_CAUSES = Record(GPU, "gpuobs_gpu_slowdown_cause", "priority", _gpu_causes)


# ---------------------------------------------------------------------------------- the join paths
def _rank_info(t: Windows, matchers: str = "", now: bool = False) -> str:
    # over rate_window, as the rates the training alerts compare: a rank that just ended keeps its
    # cause as long as its alert's inputs last (a cause label that changes restarts the alert's for).
    # now: the rank info served now (it goes stale at the rank's first failed scrape), for what is
    # charged while a job runs (its energy), never after it
    if now:
        return f"{c.RANK_INFO.name}{matchers}"
    return f"last_over_time({c.RANK_INFO.name}{matchers}[{t.rate_window}])"


def _host_as(labels: tuple[str, ...], expr: str) -> str:
    """expr with each label of labels set from another: node from host, hpc_job from job_id."""
    source = {"node": "host", "hpc_job": "job_id"}
    for label in labels:
        expr = f'label_replace({expr}, "{label}", "$1", "{source[label]}", "(.+)")'
    return expr


def _paths(t: Windows, now: bool = False) -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
    """(path, rank side, the labels both sides match on, the GPU series of the path): in order, each
    for the ranks the earlier ones did not map. now: the rank side is the rank info served now
    (_rank_info), else its last sample over rate_window."""
    return (
        ("exact", _rank_info(t, '{uuid!=""}', now), ("uuid",), ""),
        ("pod", _rank_info(t, '{k8s_pod!=""}', now), ("k8s_namespace", "k8s_pod"), '{k8s_pod!=""}'),
        ("slurm", _host_as(("hpc_job", "node"), _rank_info(t, '{job_id!="", host!=""}', now)), ("hpc_job", "node"),
         '{hpc_job!=""}'),
        ("host", _host_as(("node",), _rank_info(t, '{host!=""}', now)), ("node",), '{k8s_pod="", hpc_job=""}'),
    )


def _mapped_before(paths: tuple[tuple[str, str, tuple[str, ...], str], ...], i: int) -> str:
    """The rank info series that a path before paths[i] maps (those with a GPU on that path); "" for the first."""
    info = c.GPU_INFO.exposed_name
    return " or ".join(f"{r} and on ({_by(o)}) {info}{g}" for _, r, o, g in paths[:i])


def _rank_gpus(t: Windows) -> str:
    """Per path, the ranks mapped to their GPUs (exact: by UUID, many ranks to one GPU; the others
    where the holder runs one rank: that rank to every GPU of the holder), each for the ranks no
    earlier path mapped."""
    info = c.GPU_INFO.exposed_name
    terms = []
    paths = _paths(t)
    for i, (_, ranks, on, gpus) in enumerate(paths):
        keys = _by(on)
        if i == 0:
            pairs = f"{ranks} * on ({keys}) group_left (node, gpu) max by ({keys}, node, gpu) ({info})"
        else:
            per_rank = f"max by (job_id, rank, {keys}) ({ranks})"
            one = f"{per_rank} and on ({keys}) (count by ({keys}) ({per_rank}) == 1)"
            pairs = f"({one}) * on ({keys}) group_right (job_id, rank) {info}{gpus}"
        found = f"max by (job_id, rank, node, gpu, uuid) ({pairs})"
        mapped = _mapped_before(paths, i)
        terms.append(f"({found} unless on (job_id, rank) ({mapped}))" if mapped else f"({found})")
    return " or ".join(terms)


# Each rank's GPUs: (job_id, rank, node, gpu, uuid), value 1
RANK_GPUS = Record(("job_id", "rank", "node", "gpu", "uuid"), "gpuobs_training_rank_gpus", "info", _rank_gpus)


def _top_cause(on: tuple[str, ...], gpus: str) -> str:
    """Per holder (the labels on), its GPUs' top cause, with cause_gpu its GPU's UUID (empty for none)."""
    top = f"topk by ({_by(on)}) (1, {GPU_CAUSES.name}{gpus})"
    named = f'label_replace({top}, "cause_gpu", "$1", "uuid", "(.*)")'
    return f'label_replace({named}, "cause_gpu", "", "cause", "none")'


def _rank_cause(t: Windows) -> str:
    """Per rank, the top of: its data loader when its data wait is an outlier, its GPUs' causes by
    the first path that maps it, and `none`; value the cause's priority plus evidence."""
    by = _by(CAUSE_BY)
    paths = _paths(t)
    loader = (f'label_replace({PATH_STEP * len(paths) + CAUSES["data_loader"]} + clamp_max({DATA_WAIT_RATIO.name} > '
              f"{t.data_wait_straggler_share:g}, 0.999) and on (job_id, rank) {DATA_WAIT_TO_OTHERS.name} > "
              f'{t.data_wait_straggler:g}, "cause", "data_loader", "", "")')
    terms = [f"max by ({by}) ({loader})"]
    for i, (_, ranks, on, gpus) in enumerate(paths):
        offset = PATH_STEP * (len(paths) - 1 - i)
        joined = f"0 * {ranks} + on ({_by(on)}) group_left (cause, cause_gpu) {_top_cause(on, gpus)}"
        terms.append(f"{offset} + max by ({by}) ({joined})")
    # the ranks the training alerts read (from rates over rate_window, as this record's inputs)
    ranks = f"group by (job_id, rank) ({COMPUTE_PER_STEP.name} or {DATA_WAIT_RATIO.name})"
    terms.append(f'max by ({by}) (label_replace(0 * {ranks}, "cause", "none", "", ""))')
    return f"topk by (job_id, rank) (1, {' or '.join(terms)}) % {PATH_STEP}"


def _job_gpus(t: Windows) -> str:
    """Per path, each job to every GPU its ranks run on now, over the ranks no earlier path maps: by
    UUID (a GPU may be several jobs'), else every GPU of each holder (pod, Slurm job on a host, bare
    host) that runs ranks of that one job only (a pod runs one job; a host running two jobs' ranks
    without UUIDs cannot tell their GPUs apart and maps neither)."""
    info = c.GPU_INFO.exposed_name
    terms = []
    paths = _paths(t, now=True)
    for i, (_, ranks, on, gpus) in enumerate(paths):
        keys = _by(on)
        mapped = _mapped_before(paths, i)
        own = f"{ranks} unless on (job_id, rank) ({mapped})" if mapped else ranks
        per_job = f"max by (job_id, {keys}) ({own})"
        if i == 0:
            pairs = f"{per_job} * on ({keys}) group_left (node, gpu) max by ({keys}, node, gpu) ({info})"
        else:
            one = f"{per_job} and on ({keys}) (count by ({keys}) ({per_job}) == 1)"
            pairs = f"({one}) * on ({keys}) group_right (job_id) {info}{gpus}"
        terms.append(f"max by (job_id, node, gpu, uuid) ({pairs})")
    return " or ".join(terms)


# Each training job's GPUs now (the rank info served now: nothing is charged to a job after its ranks
# end): (job_id, node, gpu, uuid), value 1. One-to-many where RANK_GPUS cannot list pairs: a pod or
# host running several ranks of one job without UUIDs maps the job to every GPU it holds.
JOB_GPUS = Record(("job_id", "node", "gpu", "uuid"), "gpuobs_training_job_gpus", "info", _job_gpus)


# Per rank (with steps or data waits over rate_window, or mapped to a GPU), one series: its most likely
# slowdown cause and the GPU it is on (cause_gpu, empty for data_loader and none), valued the cause's
# priority plus its evidence
RANK_CAUSE = Record(RANK, "gpuobs_training_slowdown_cause", "top", _rank_cause)


def _job_cause(t: Windows) -> str:
    top = f"topk by (job_id) (1, {RANK_CAUSE.name})"
    named = f'label_replace({top}, "cause_rank", "$1", "rank", "(.*)")'
    return f'max by ({_by(JOB_CAUSE_BY)}) (label_replace({named}, "cause_rank", "", "cause", "none"))'


# Per job, its ranks' top cause, with the rank it is on (cause_rank, empty for none)
JOB_CAUSE = Record(JOB, RANK_CAUSE, "top", _job_cause)

__all__ = ["CAUSE_BY", "CAUSES", "JOB_CAUSE_BY", "GPU_CAUSES", "JOB_CAUSE", "JOB_GPUS", "RANK_CAUSE", "RANK_GPUS"]
