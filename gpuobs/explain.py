"""`gpuobs explain JOB`: why one training job is slow, from the evidence Prometheus holds over a window.

The causes are the slowdown records' own (gpuobs.records.slowdown: RANK_CAUSE per rank, GPU_CAUSES per
GPU, the join RANK_GPUS), never a second implementation: each record is read by its rule name when the
recording rules are loaded in that Prometheus, else its expression is evaluated from raw series with
every record it reads inlined (gpuobs.report.inlined), as a subquery at the rules' evaluation interval.
Diagnosis.source says which. Over the window a record's series are averaged (quantities) or their
maximum taken (causes: the most severe seen in the window). What is shown beside them (per rank: step
time, compute, data and collective waits; per GPU: the health signals the causes read) is read from the
same records or straight from the catalog metrics, for the reader to check the finding.

Findings rank the per-rank causes and the further causes present on the ranks' GPUs by the records'
score (a cause's priority plus its evidence in [0, 1), gpuobs.records.slowdown.CAUSES), the slowest rank
(compute per step against the other ranks) first among equal scores. render() writes the terminal text,
with each cause's "how to confirm" line from the shared runbook section (slowdown_cause) of the alerts
that name it. The report's "Slow jobs" section (section_slow_jobs) lists the jobs whose cause is not none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from . import catalog as c
from . import records
from .alerts import runbooks
from .alerts.rules import DEFAULT, Thresholds
from .demo import JAEGER, slowest_exemplar
from .report import Prometheus, ReportError, Section, esc, inlined, no_data, parse_duration, table

CAUSE_RUNBOOK_ALERT = "TrainingStragglerRank"  # its runbook includes the shared cause table (_shared/slowdown_cause.md)
STEP_BUCKETS = c.STEP_DURATION.prometheus_samples[0]  # the step-duration histogram's buckets: slow steps' exemplars
NO_CAUSE = "none"


class ExplainError(Exception):
    """The input names nothing Prometheus knows: a job without series in the window (the CLI exits 1)."""


@dataclass(frozen=True)
class Finding:
    """One possible cause of the job's slowness: cause (a key of records.CAUSES), the rank it slows
    (its `rank` label), gpu (the GPU's UUID, "" for data_loader and none), node (the GPU's, else the
    rank's host), evidence (text from the signals), score (the record's value: priority + evidence)."""
    cause: str
    rank: str
    gpu: str
    node: str
    evidence: str
    score: float


@dataclass
class RankRow:
    """One rank over the window (None where its series are absent): step time p50 (s, RANK_STEP_P50),
    compute per step (s, COMPUTE_PER_STEP) and over the other ranks' (STRAGGLER_RATIO), data-wait share
    of wall time (DATA_WAIT_RATIO) and over the others' (DATA_WAIT_TO_OTHERS), collective-wait share (the
    rate of the collective-wait counter), its host, its GPUs' UUIDs (RANK_GPUS, else its cause's GPU),
    and its top cause (RANK_CAUSE: cause, cause GPU, score)."""
    rank: str
    host: str = ""
    step_p50: float | None = None
    compute_per_step: float | None = None
    compute_to_others: float | None = None
    data_wait_share: float | None = None
    data_wait_to_others: float | None = None
    collective_wait_share: float | None = None
    gpus: list[str] = field(default_factory=list)
    cause: str = NO_CAUSE
    cause_gpu: str = ""
    score: float = 0.0


@dataclass
class GpuRow:
    """One GPU a rank runs on, over the window: node and index (gpuobs_gpu_info), the ranks on it,
    clock-event reasons with the share of samples each held the clocks (0-1), XIDs counted, corrected
    ECC errors/s (GPU_ECC_CORRECTED_RATE) and a row remap pending, PCIe generation and width in use and
    their maxima (lowest seen) with replays/s (GPU_PCIE_REPLAYS_RATE), NVLink errors/s
    (GPU_NVLINK_ERRORS_RATE) and links down (most seen), processes seen on it, mean utilization (0-1),
    and every cause GPU_CAUSES found on it ({cause: score}, `none` included)."""
    uuid: str
    node: str = ""
    gpu: str = ""
    ranks: list[str] = field(default_factory=list)
    clock_events: dict[str, float] = field(default_factory=dict)
    xids: float | None = None
    ecc_corrected_per_s: float | None = None
    remap_pending: float | None = None
    pcie: dict[str, float] = field(default_factory=dict)  # generation, generation_max, width, width_max
    pcie_replays_per_s: float | None = None
    nvlink_errors_per_s: float | None = None
    nvlinks_down: float | None = None
    processes: float | None = None
    utilization: float | None = None
    causes: dict[str, float] = field(default_factory=dict)


@dataclass
class Energy:
    """A training job's energy over the window, from the energy records per training job
    (gpuobs.records.energy): watts its GPUs drew (TRAINING_JOB_POWER, mean over the samples it has),
    joules (that record summed over the window times the rules' evaluation interval), joules per step
    and per token (their records' means; None where absent: no steps or no tokens reported)."""
    watts: float
    joules: float
    joules_per_step: float | None = None
    joules_per_token: float | None = None


@dataclass
class Diagnosis:
    """Why job_id is slow over the `window` (a Prometheus duration) ending at `at` (Unix s): per rank,
    per GPU, the findings most likely first, and the slowest step's exemplar (trace id, its duration in
    s and its rank; "" / None without exemplars). source: how the records were read. energy: the job's
    power and energy over the window (None where its GPUs are not joined)."""
    job_id: str
    prometheus: str
    at: float
    window: str
    source: str
    ranks: list[RankRow]
    gpus: list[GpuRow]
    findings: list[Finding]
    trace_id: str = ""
    trace_seconds: float | None = None
    trace_rank: str = ""
    energy: Energy | None = None


# ------------------------------------------------------------------------------------ reading
RULES = "recording rules"
INLINED = "record expressions inlined (no recording rules in this Prometheus)"


class _Reader:
    """Instant queries at `at` over `window` through client; records by rule name (rules) or inlined."""

    def __init__(self, client: Prometheus, at: float, window: str, t: Thresholds):
        self.client, self.at, self.window, self.t = client, at, window, t
        self.rules = bool(self.query(f"count(last_over_time({records.RANK_CAUSE.name}[{window}]))"))

    def query(self, promql: str) -> list[dict]:
        return self.client.instant(promql, self.at)

    def record(self, record: records.Record, fn: str, keep: dict[str, set[str]]) -> list[dict]:
        """fn_over_time of record's series over the window, those whose labels are in keep's sets."""
        if self.rules:
            series = f"{record.name}[{self.window}]"
        else:
            series = f"({inlined(record, self.t)})[{self.window}:{self.t.eval_interval}]"
        result = self.query(f"{fn}_over_time({series})")
        return [s for s in result if all(s["metric"].get(k, "") in v for k, v in keep.items())]


def _value(series: dict) -> float:
    return float(series["value"][1])


def _one_of(values: set[str] | list[str]) -> str:
    """A PromQL regex matching exactly these label values."""
    return "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\\\1", v) for v in sorted(values))


def _ranks(r: _Reader, job_id: str) -> dict[str, RankRow]:
    """The job's ranks with their numbers and top cause; ExplainError when it has none."""
    job = {"job_id": {job_id}}
    info = r.query(f'last_over_time({c.RANK_INFO.exposed_name}{{job_id="{_one_of([job_id])}"}}[{r.window}])')
    ranks = {s["metric"]["rank"]: RankRow(s["metric"]["rank"], host=s["metric"].get("host", "")) for s in info}
    numbers = (("step_p50", records.RANK_STEP_P50), ("compute_per_step", records.COMPUTE_PER_STEP),
               ("compute_to_others", records.STRAGGLER_RATIO), ("data_wait_share", records.DATA_WAIT_RATIO),
               ("data_wait_to_others", records.DATA_WAIT_TO_OTHERS))
    for name, record in numbers:
        for s in r.record(record, "avg", job):
            setattr(ranks.setdefault(s["metric"]["rank"], RankRow(s["metric"]["rank"])), name, _value(s))
    waits = (f'sum by (job_id, rank) (rate({c.COLLECTIVE_WAIT.exposed_name}{{job_id="{_one_of([job_id])}"}}'
             f"[{r.t.rate_window}]))")
    for s in r.query(f"avg_over_time(({waits})[{r.window}:{r.t.eval_interval}])"):
        ranks.setdefault(s["metric"]["rank"], RankRow(s["metric"]["rank"])).collective_wait_share = _value(s)
    for s in r.record(records.RANK_CAUSE, "max", job):
        row = ranks.setdefault(s["metric"]["rank"], RankRow(s["metric"]["rank"]))
        if _value(s) >= row.score:  # the most severe cause seen in the window
            row.cause, row.cause_gpu, row.score = s["metric"].get("cause", NO_CAUSE), s["metric"].get(
                "cause_gpu", ""), _value(s)
    if not ranks:
        known = r.query(f"group by (job_id) (last_over_time({c.STEPS.exposed_name}[{r.window}]))")
        names = ", ".join(sorted(s["metric"].get("job_id", "") for s in known)) or "none"
        raise ExplainError(f"no training job {job_id!r} in Prometheus at {r.client.url} in the {r.window} before "
                           f"{_utc(r.at)} (jobs seen then: {names})")
    for s in r.record(records.RANK_GPUS, "max", job):
        mapped = ranks.get(s["metric"]["rank"])
        if mapped is not None and s["metric"].get("uuid") and s["metric"]["uuid"] not in mapped.gpus:
            mapped.gpus.append(s["metric"]["uuid"])
    for row in ranks.values():  # a rank of a holder with several ranks: no pairs, its cause's GPU
        if not row.gpus and row.cause_gpu:
            row.gpus.append(row.cause_gpu)
    return ranks


def _energy(r: _Reader, job_id: str) -> Energy | None:
    """The job's power, energy, and energy per step and per token over the window; None when no GPU of
    its ranks is joined (nothing is charged to it)."""
    job = {"job_id": {job_id}}
    power = r.record(records.TRAINING_JOB_POWER, "avg", job)
    if not power:
        return None
    total = r.record(records.TRAINING_JOB_POWER, "sum", job)
    per = {rec: r.record(rec, "avg", job) for rec in (records.TRAINING_JOB_ENERGY_PER_STEP,
                                                       records.TRAINING_JOB_ENERGY_PER_TOKEN)}
    step, token = (_value(found[0]) if found else None for found in per.values())
    return Energy(_value(power[0]), _value(total[0]) * parse_duration(r.t.eval_interval), step, token)


def _gpu_signals(r: _Reader, uuids: set[str]) -> dict[str, list[tuple[str, dict, float]]]:
    """{signal: [(uuid, labels, value)]} of the health signals of these GPUs over the window."""
    on = f'{{uuid=~"{_one_of(uuids)}"}}'
    w = r.window
    xids = f"{c.XID_ERRORS.exposed_name}{on}"
    raw = {
        "info": f"max by (uuid, node, gpu) (last_over_time({c.GPU_INFO.exposed_name}{on}[{w}]))",
        "clock": f"avg by (uuid, reason) (avg_over_time({c.CLOCK_EVENT_ACTIVE.exposed_name}{on}[{w}]))",
        "xids": f"sum by (uuid) ({records.errors.new_first(xids, w)})",
        "remap_pending": f"max by (uuid) (max_over_time({c.REMAP_PENDING.exposed_name}{on}[{w}]))",
        "nvlinks_down": f"max by (uuid) (max_over_time({c.NVLINKS_DOWN.exposed_name}{on}[{w}]))",
        "processes": f'count by (uuid) (last_over_time({c.PROCESS_MEMORY.exposed_name}{{uuid=~"{_one_of(uuids)}",'
                     f'gpu_instance_id=""}}[{w}]))',
        "utilization": f"avg by (uuid) (avg_over_time({c.UTILIZATION.exposed_name}{on}[{w}]))",
    }
    for key, metric in (("generation", c.PCIE_GENERATION), ("generation_max", c.PCIE_MAX_GENERATION),
                        ("width", c.PCIE_WIDTH), ("width_max", c.PCIE_MAX_WIDTH)):
        raw[f"pcie_{key}"] = f"min by (uuid) (min_over_time({metric.exposed_name}{on}[{w}]))"
    out = {k: [(s["metric"].get("uuid", ""), s["metric"], _value(s)) for s in r.query(q)] for k, q in raw.items()}
    keep = {"uuid": uuids}
    for key, record, fn in (("ecc", records.GPU_ECC_CORRECTED_RATE, "avg"), ("replays", records.GPU_PCIE_REPLAYS_RATE,
                            "avg"), ("nvlink", records.GPU_NVLINK_ERRORS_RATE, "avg"),
                            ("causes", records.GPU_CAUSES, "max")):
        out[key] = [(s["metric"].get("uuid", ""), s["metric"], _value(s)) for s in r.record(record, fn, keep)]
    return out


def _gpus(r: _Reader, ranks: dict[str, RankRow]) -> dict[str, GpuRow]:
    """The GPUs of the ranks with their health signals."""
    gpus: dict[str, GpuRow] = {}
    for row in ranks.values():
        for uuid in row.gpus:
            gpus.setdefault(uuid, GpuRow(uuid)).ranks.append(row.rank)
    if not gpus:
        return gpus
    plain = {"xids": "xids", "remap_pending": "remap_pending", "nvlinks_down": "nvlinks_down",
             "processes": "processes", "utilization": "utilization", "ecc": "ecc_corrected_per_s",
             "replays": "pcie_replays_per_s", "nvlink": "nvlink_errors_per_s"}
    for signal, found in _gpu_signals(r, set(gpus)).items():
        for uuid, labels, value in found:
            g = gpus.get(uuid)
            if g is None:
                continue
            if signal == "info":
                g.node, g.gpu = labels.get("node", ""), labels.get("gpu", "")
            elif signal == "clock":
                g.clock_events[labels.get("reason", "")] = value
            elif signal == "causes":
                cause = labels.get("cause", NO_CAUSE)
                g.causes[cause] = max(value, g.causes.get(cause, value))
            elif signal.startswith("pcie_"):
                g.pcie[signal.removeprefix("pcie_")] = value
            else:
                setattr(g, plain[signal], max(value, getattr(g, plain[signal]) or value))
    return gpus


# ------------------------------------------------------------------------------------ findings
def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _times(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def evidence(cause: str, rank: RankRow, gpu: GpuRow | None, t: Thresholds) -> str:
    """The signals behind a cause on a rank (and its GPU), as one line of text."""
    g = gpu or GpuRow("")
    shares = {k: v for k, v in g.clock_events.items() if v > 0}

    def held(reasons: tuple[str, ...]) -> str:
        active = [f"{k} {_percent(v)}" for k, v in sorted(shares.items()) if k in reasons]
        return f"clocks held down ({', '.join(active) or 'n/a'} of the window)"
    texts = {
        "data_loader": f"data-wait share {_percent(rank.data_wait_share)}, {_times(rank.data_wait_to_others)} the "
                       f"other ranks'",
        "thermal": held(records.slowdown.THERMAL_REASONS),
        "power_brake": held(("hw_power_brake_slowdown",)),
        "power_cap": held(("sw_power_cap",)),
        "shared_gpu": f"{g.processes or 0:.0f} processes on the GPU",
        "xid": f"{g.xids or 0:.0f} XIDs in the window",
        "ecc": f"corrected ECC {g.ecc_corrected_per_s or 0:.3g}/s (cause over {t.ecc_corrected_per_s:g}/s), "
               f"row remap pending {g.remap_pending or 0:.0f}",
        "pcie": f"PCIe gen {g.pcie.get('generation', 0):.0f}/{g.pcie.get('generation_max', 0):.0f}, width "
                f"x{g.pcie.get('width', 0):.0f}/x{g.pcie.get('width_max', 0):.0f}, replays "
                f"{g.pcie_replays_per_s or 0:.3g}/s",
        "nvlink": f"NVLink errors {g.nvlink_errors_per_s or 0:.3g}/s, links down {g.nvlinks_down or 0:.0f}",
        NO_CAUSE: "no cause on its GPUs: look at the host (CPU, memory, NIC, other jobs)",
    }
    speed = f"; computes {_times(rank.compute_to_others)} the other ranks per step"
    return texts.get(cause, cause) + speed


def _findings(ranks: dict[str, RankRow], gpus: dict[str, GpuRow], t: Thresholds) -> list[Finding]:
    """Each rank's top cause, then every other cause on its GPUs; most likely first."""
    out = []
    for row in ranks.values():
        gpu = gpus.get(row.cause_gpu)
        node = gpu.node if gpu else row.host
        out.append(Finding(row.cause, row.rank, row.cause_gpu, node, evidence(row.cause, row, gpu, t), row.score))
        for uuid in row.gpus:
            g = gpus[uuid]
            out += [Finding(cause, row.rank, uuid, g.node, evidence(cause, row, g, t), score)
                    for cause, score in g.causes.items()
                    if cause != NO_CAUSE and (cause, uuid) != (row.cause, row.cause_gpu)]
    slowness = {r.rank: r.compute_to_others or 0.0 for r in ranks.values()}
    return sorted(out, key=lambda f: (-f.score, -slowness[f.rank], f.rank, f.gpu))


def diagnose(prometheus: str, job_id: str, at: float | None = None, window: str = "15m",
             thresholds: Thresholds = DEFAULT) -> Diagnosis:
    """Why job_id is slow over `window` (a Prometheus duration) ending at `at` (Unix s; None: now), from
    the Prometheus at URL `prometheus`. thresholds: the rule profile the loaded rules use (their windows
    and limits; the inlined expressions are built with them). Raises ExplainError for a job without
    series in the window, ReportError when Prometheus is unreachable or refuses a query, and
    ReportError for a malformed window."""
    import time

    parse_duration(window)
    client = Prometheus(prometheus, timeout=60)
    when = time.time() if at is None else at
    reader = _Reader(client, when, window, thresholds)
    ranks = _ranks(reader, job_id)
    gpus = _gpus(reader, ranks)
    d = Diagnosis(job_id, client.url, when, window, RULES if reader.rules else INLINED,
                  [ranks[k] for k in sorted(ranks, key=_rank_order)], [gpus[k] for k in sorted(gpus)],
                  _findings(ranks, gpus, thresholds), energy=_energy(reader, job_id))
    _add_exemplar(d, parse_duration(window))
    return d


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def _add_exemplar(d: Diagnosis, window_s: int) -> None:
    """The slowest step's exemplar in the window, when Prometheus stores exemplars (else left empty)."""
    query = f'{STEP_BUCKETS}{{job_id="{_one_of([d.job_id])}"}}'
    try:
        slowest = slowest_exemplar(d.prometheus, query, window_s, end=d.at)
    except (OSError, ValueError, KeyError):  # exemplar storage off (an error answer) or none
        return
    if slowest is not None:
        d.trace_id, d.trace_seconds = slowest.get("trace_id", ""), slowest["value"]
        d.trace_rank = slowest["labels"].get("rank", "")


# ------------------------------------------------------------------------------------ output
def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def confirm_lines(t: Thresholds = DEFAULT) -> dict[str, str]:
    """{cause: "confirm: ...; fix: ..."} from the shared slowdown-cause table of the runbooks, as
    rendered for thresholds t (metric and record names filled in)."""
    text = "\n".join(runbooks.render(CAUSE_RUNBOOK_ALERT, t).values())
    out = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].strip("`") in records.CAUSES:
            out[cells[0].strip("`")] = f"confirm: {cells[1]}; fix: {cells[2]}".replace("\\|", "|")
    return out


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def _rank_table(d: Diagnosis) -> list[str]:
    rows = [[r.rank, r.host or "-", _cell(r.step_p50, ".3f"), _cell(r.compute_per_step, ".3f"),
             _cell(r.compute_to_others, ".2f"), _cell(r.data_wait_share and 100 * r.data_wait_share, ".1f"),
             _cell(r.collective_wait_share and 100 * r.collective_wait_share, ".1f"), r.cause,
             " ".join(r.gpus) or "-"] for r in d.ranks]
    return _columns(["rank", "host", "step p50 s", "compute/step s", "vs others", "data wait %", "collective %",
                     "cause", "GPUs"], rows)


def _gpu_table(d: Diagnosis) -> list[str]:
    rows = []
    for g in d.gpus:
        clocks = ",".join(f"{k} {100 * v:.0f}%" for k, v in sorted(g.clock_events.items()) if v > 0) or "-"
        pcie = (f"{g.pcie.get('generation', 0):.0f}/{g.pcie.get('generation_max', 0):.0f} "
                f"x{g.pcie.get('width', 0):.0f}/{g.pcie.get('width_max', 0):.0f}") if g.pcie else "-"
        causes = ",".join(f"{k}" for k, _ in sorted(g.causes.items(), key=lambda kv: -kv[1])) or "-"
        rows.append([g.node or "-", g.gpu or "-", g.uuid, ",".join(g.ranks), _cell(g.utilization and
                     100 * g.utilization, ".0f"), clocks, _cell(g.xids, ".0f"), _cell(g.ecc_corrected_per_s, ".3g"),
                     _cell(g.remap_pending, ".0f"), pcie, _cell(g.pcie_replays_per_s, ".3g"),
                     _cell(g.nvlink_errors_per_s, ".3g"), _cell(g.nvlinks_down, ".0f"), _cell(g.processes, ".0f"),
                     causes])
    return _columns(["node", "gpu", "uuid", "ranks", "util %", "clock events (share)", "xids", "ecc/s", "remap",
                     "pcie gen/width", "replays/s", "nvlink err/s", "links down", "procs", "causes"], rows)


def headline(f: Finding) -> str:
    """A finding as the ranked line names it: cause, rank, GPU, node and evidence."""
    where = f"rank {f.rank}" + (f", GPU {f.gpu}" if f.gpu else "") + (f", node {f.node}" if f.node else "")
    return f"{f.cause} on {where}: {f.evidence} (score {f.score:.2f})"


def energy_line(d: Diagnosis) -> str:
    """One line: the job's mean power and energy over the window, per step and per token."""
    e = d.energy
    if e is None:
        return "Energy: none charged (no GPU of its ranks joined)"
    per = f"{_cell(e.joules_per_step, '.4g')} J/step, {_cell(e.joules_per_token, '.4g')} J/token"
    kwh = e.joules / records.JOULES_PER_KWH
    return f"Energy: {e.watts:.0f} W on its GPUs (mean), {kwh:.4g} kWh in the window, {per}"


def render(d: Diagnosis, trace_url: str = JAEGER) -> str:
    """The terminal text: a header, the causes most likely first (the first line names the top one's
    rank, GPU and node), the rank and GPU tables, the slowest step's trace (a link under trace_url,
    Jaeger's UI) and, per cause found, the runbook's line saying how to confirm and fix it."""
    lines = [f"Job {d.job_id}: {len(d.ranks)} ranks, the {d.window} before {_utc(d.at)}",
             f"  from Prometheus at {d.prometheus}; causes read from the {d.source}", "",
             "Most likely causes, most likely first:"]
    lines += [f"  {i}. {headline(f)}" for i, f in enumerate(d.findings, 1)]
    lines += ["", energy_line(d), "", "Ranks:", *_rank_table(d), "", "GPUs of the ranks:"]
    lines += _gpu_table(d) if d.gpus else ["  none mapped (no rank info joined to a GPU: see docs/instrument.md)"]
    lines.append("")
    if d.trace_id:
        lines.append(f"Slowest step: {d.trace_seconds or 0:.3f} s on rank {d.trace_rank or '?'}, trace {d.trace_id}: "
                     f"{trace_url.rstrip('/')}/trace/{d.trace_id}")
    else:
        lines.append("Slowest step: no exemplar in the window (exemplar storage off, or no slow step)")
    confirm = confirm_lines()
    lines += ["", "How to confirm (runbook: docs/runbooks/TrainingStragglerRank.md):"]
    lines += [f"  {cause}: {confirm.get(cause, 'see the runbook')}"
              for cause in dict.fromkeys(f.cause for f in d.findings)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the report
def slow_jobs(client: Prometheus, at: float, window: str, t: Thresholds = DEFAULT) -> list[str]:
    """The jobs whose top cause (JOB_CAUSE) is not none, or whose straggler or data-wait input
    (STRAGGLER_RATIO, DATA_WAIT_TO_OTHERS) went over its alert's threshold, in the window ending at `at`."""
    r = _Reader(client, at, window, t)
    jobs = {s["metric"].get("job_id", "") for s in r.record(records.JOB_CAUSE, "max", {})
            if s["metric"].get("cause", NO_CAUSE) != NO_CAUSE}
    for record, limit in ((records.STRAGGLER_RATIO, t.straggler), (records.DATA_WAIT_TO_OTHERS, t.data_wait_straggler)):
        jobs |= {s["metric"].get("job_id", "") for s in r.record(record, "max", {}) if _value(s) > limit}
    return sorted(jobs - {""})


def section_slow_jobs(client: Prometheus, window, settings, t: Thresholds = DEFAULT) -> Section:
    """The report's "Slow jobs": the jobs slow_jobs finds in the last hour of the report's range (at most:
    the inlined records are subqueries, whose cost grows with the span), each with its most likely
    cause, the first finding of diagnose over that span."""
    span = f"{int(min(window.end - window.start, 3600))}s"
    jobs = slow_jobs(client, window.end, span, t)
    if not jobs:
        return Section("slow_jobs", "Slow jobs", no_data("no training job had a slowdown cause or a straggler"))
    rows = []
    for job in jobs:
        try:
            d = diagnose(client.url, job, at=window.end, window=span, thresholds=t)
        except ExplainError:  # its series ended between the two queries
            continue
        top = d.findings[0] if d.findings else Finding(NO_CAUSE, "", "", "", "", 0.0)
        rows.append((job, [job, top.cause, top.rank, top.gpu or "-", top.node or "-", top.evidence]))
    return Section("slow_jobs", "Slow jobs",
                   f"<p>Training jobs with a slowdown cause, a straggler or a data-loader outlier in the {esc(span)} "
                   "before the range's end, with their most likely cause (<code>gpuobs explain JOB</code> for "
                   "the whole diagnosis).</p>"
                   + table(["job", "cause", "rank", "GPU", "node", "evidence"], rows, numeric_from=99))


__all__ = ["Diagnosis", "Energy", "ExplainError", "Finding", "GpuRow", "RankRow", "ReportError", "confirm_lines",
           "diagnose", "energy_line", "evidence", "headline", "render", "section_slow_jobs", "slow_jobs"]
