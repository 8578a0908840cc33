"""Training job: step time by rank and the straggler, data waits, throughput, MFU, loss, gradient
norm, learning rate, checkpoints, goodput, the GPUs of the nodes the job runs on, and its power and
energy (per step, per token, and kWh and CO2e over the range).

The series come from gpuobs.instrument (OpenTelemetry, scraped from each rank's Prometheus
endpoint or through a collector); every point carries `job_id` and `rank`.
"""

from __future__ import annotations

from .. import catalog as c
from .. import records as r
from . import common as k
from .common import quantile, rate, sel, target, windowed

JOB = 'job_id="$job_id"'
RANK = 'rank=~"$rank"'
J = (JOB, RANK)
BY_RANK = "rank {{rank}}"
RANK_NODE = "rank, node"  # by node too: the series' node label feeds the link to its GPU metrics
TOKENS = "suffix: tokens/s"
RANGE_STEP_S = 15  # seconds between the samples of a record integrated over the range (a job younger
# than one step would show nothing; 15 s is half the default evaluation interval)


def job_nodes() -> str:
    """`on` the nodes the job's ranks run on (the scrape's cluster and node labels)."""
    return f"on (cluster, node) group by (cluster, node) ({sel(c.STEPS, JOB)})"


def m(metric: c.Metric, *matchers: str, suffix: str = "") -> str:
    """A selector over a catalog metric restricted to the selected job and ranks (J), plus matchers;
    suffix: a histogram's bucket, sum or count."""
    return sel(metric, *J, *matchers, suffix=suffix)


def _why_slow(L: k.Layout) -> None:
    """The row "Why is this job slow": the causes the slowdown records name (gpuobs.records.slowdown),
    as `gpuobs explain` reads them, and the clock-event reasons of the ranks' GPUs."""
    ranks_gpus = sel(r.RANK_GPUS, JOB, RANK)
    L.row("Why is this job slow")
    L.add(k.stat("Most likely cause", [target(sel(r.JOB_CAUSE, JOB), "{{cause}} rank {{cause_rank}} {{cause_gpu}}")],
                 "short", "The job's most likely slowdown cause (recording rule): its name, the rank and the GPU's "
                 "UUID; the value is the cause's priority plus its evidence (0: none found, look at the hosts). "
                 "`gpuobs explain <job>` prints the evidence and how to confirm it.",
                 text_mode="value_and_name", graph=False), 8, 7)
    L.add(k.table("Cause per rank", [target(sel(r.RANK_CAUSE, JOB, RANK))], "short",
                  "Each rank's most likely cause and the GPU it was found on (empty for data_loader and none); "
                  "score: priority plus evidence.", hide=("job_id",), rename={"Value": "score"}, sort_by="score"),
          16, 7)
    L.add(k.timeseries("Clock-event reasons of the ranks' GPUs", [target(
        f"max by (node, gpu, uuid, reason) (avg_over_time({sel(c.CLOCK_EVENT_ACTIVE)}[$__rate_interval])) > 0 "
        f"and on (uuid) {ranks_gpus}", "{{node}} GPU {{gpu}} {{reason}}")], "percentunit",
        "Share of the time each reason held the clocks of a GPU the selected ranks run on (the join of the "
        "ranks' rank info to the GPUs): HW thermal or power brake slowdown slows the rank that runs there.",
        min=0, max=1), 12, 8)
    L.add(k.table("Causes on the ranks' GPUs", [target(
        f"{sel(r.GPU_CAUSES)} and on (uuid) {ranks_gpus}")], "short",
        "Every slowdown cause present on each GPU the selected ranks run on, with its score (none on every GPU).",
        hide=("cluster", "instance", "k8s_namespace", "k8s_pod", "k8s_container", "hpc_job"),
        rename={"Value": "score"}, sort_by="score"), 12, 8)
    L.add(k.table("Where each rank runs", [target(m(c.RANK_INFO))], "short",
                  "Each rank's host, pod and GPU UUID as it reports them (rank info): what the causes are joined "
                  "on (docs/instrument.md, Why is my rank slow).", hide=("job_id", "Value")), 24, 6)


def _over_range(record: r.Record) -> str:
    """A per-second record of the selected job integrated over the dashboard's range: its value sampled
    every RANGE_STEP_S (a subquery, whatever the rules' evaluation interval) times that step."""
    return f"sum_over_time(({sel(record, JOB)})[$__range:{RANGE_STEP_S}s]) * {RANGE_STEP_S}"


def _energy(L: k.Layout) -> None:
    """Panels of the job's power, energy per step and per token, and energy and CO2e over the range (the
    energy records per training job: the watts of the GPUs its ranks run on, gpuobs.records.energy)."""
    L.add(k.timeseries("Power of the job's GPUs", [target(sel(r.TRAINING_JOB_POWER, JOB), "watts")], "watt",
                       "Watts the GPUs the job's ranks run on draw (the rate of their energy counters; the join of "
                       "the ranks' rank info to the GPUs: UUID, pod, Slurm job or bare host).", min=0), 8, 6)
    L.add(k.stat("Energy per step", [target(sel(r.TRAINING_JOB_ENERGY_PER_STEP, JOB))], "joule",
                 "Joules the job's GPUs draw per optimizer step: their watts over the job's steps per second."), 4, 6)
    L.add(k.stat("Energy per token", [target(sel(r.TRAINING_JOB_ENERGY_PER_TOKEN, JOB))], "joule",
                 "Joules the job's GPUs draw per token trained (no data when the job reports no tokens)."), 4, 6)
    L.add(k.stat("Energy over the range", [target(f"{_over_range(r.TRAINING_JOB_POWER)} / {r.JOULES_PER_KWH:g}",
                                                  instant=True)], "kwatth",
                 "kWh the job's GPUs drew over the dashboard's time range, while its ranks were up.",
                 graph=False), 4, 6)
    L.add(k.stat("CO2e over the range", [target(_over_range(r.TRAINING_JOB_CO2E_RATE), instant=True)], "massg",
                 "Grams of CO2e of that energy at the configured grid intensity (an average, not live; embodied "
                 "carbon not counted).", graph=False), 4, 6)


def build():
    """The Training job dashboard: rows Progress, Why is this job slow, Step time, Data loading and throughput,
    Optimization, Checkpoints and goodput, The job's GPUs; variables job_id (one job) and rank."""
    L = k.Layout()
    relative = sel(r.STRAGGLER_RATIO, JOB, RANK)
    nodes = job_nodes()
    goodput = f"sum({rate(m(c.GOODPUT))})"
    badput = f"sum({rate(m(c.BADPUT))})"

    L.row("Progress")
    L.add(k.stat("Steps/s", [target(f"avg({rate(m(c.STEPS))})")], "ops",
                 "Optimizer steps per second, averaged over the ranks."), 4, 5)
    L.add(k.stat("Tokens/s", [target(f"sum({rate(m(c.TOKENS_TRAINED))})")], TOKENS,
                 "Tokens trained per second by the whole job."), 4, 5)
    L.add(k.stat("MFU", [target(f"avg({sel(r.MFU_RATIO, JOB, RANK)})")], "percentunit",
                 "Model FLOPs utilization over the rate window (FLOPs per second / peak FLOP/s), averaged over "
                 "the ranks."), 4, 5)
    L.add(k.stat("Goodput", [target(f"{goodput} / ({goodput} + {badput})")], "percentunit",
                 "Share of the ranks' time spent computing steps; the rest is data wait, checkpoints, startup and "
                 "idle time.", thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 0.5},
                                           {"color": "green", "value": 0.8}]), 4, 5)
    L.add(k.stat("Straggler rank", [target(f"topk(1, {relative})", BY_RANK)], "percentunit",
                 "The slowest rank: its compute time per step (data and collective waits excluded) over the mean "
                 "of the job's other ranks.",
                 text_mode="value_and_name", graph=False,
                 thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1.2}]), 4, 5)
    L.add(k.stat("Since last step", [target(f"time() - max({m(c.LAST_STEP)})")], "s",
                 "Seconds since the most recent step of any selected rank finished: a stalled job keeps growing.",
                 thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 600}]), 4, 5)

    _why_slow(L)

    L.row("Step time")
    L.add(k.timeseries("Step time p50 by rank", [target(windowed(0.5, c.STEP_DURATION, J, RANK_NODE), BY_RANK)],
                       "s", "Median duration of an optimizer step, data wait included (exact, over each rank's "
                       "quantile window). Click a series for its node's GPU metrics over this time range.", min=0,
                       links=[k.GPU_METRICS_AT_THIS_TIME]), 12, 8)
    L.add(k.timeseries("Step time p99 by rank", [target(windowed(0.99, c.STEP_DURATION, J, RANK_NODE), BY_RANK)],
                       "s", "99th percentile step duration (exact, over each rank's quantile window). Click a "
                       "series for its node's GPU metrics over this time range.", min=0,
                       links=[k.GPU_METRICS_AT_THIS_TIME]), 12, 8)
    L.add(k.bargauge("Rank compute vs the other ranks", [target(relative, BY_RANK, instant=True)], "percentunit",
                     "Each rank's compute time per step over the mean of the job's other ranks (recording rule): "
                     "a straggler stands out above 100%, even when collectives make all step times equal.",
                     min=0, max=2,
                     thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1.2},
                                 {"color": "red", "value": 1.5}]), 12, 8)
    L.add(k.heatmap("Step time distribution", [target(
        f"sum by (le) ({rate(m(c.STEP_DURATION, suffix='bucket'), 'increase')})", exemplar=True)], "s",
        "Steps per step-time bucket over time, all selected ranks; the dots are slow steps' exemplars "
        "(click one for its trace)."), 12, 8)
    L.add(k.timeseries("Compute and collective wait per step by rank", [
        target(f"sum by (rank) ({rate(m(c.COMPUTE))}) / sum by (rank) ({rate(m(c.STEPS))})", BY_RANK + " compute"),
        target(f"sum by (rank) ({rate(m(c.COLLECTIVE_WAIT))}) / sum by (rank) ({rate(m(c.STEPS))})",
               BY_RANK + " collective wait")], "s",
        "Seconds per step each rank computes and waits in collectives: the slow rank computes longest and "
        "waits least.", min=0), 12, 8)
    L.add(k.timeseries("Slow steps: p99 by rank with exemplars", [target(
        quantile(0.99, c.STEP_DURATION, J, RANK_NODE), BY_RANK, exemplar=True)], "s",
        "99th percentile step time from the histogram buckets; each dot is a slow step (at or above its rank's "
        "p90 and twice its median) whose exemplar links to the step's trace. Click a series for its node's GPU "
        "metrics over this time range.", min=0, links=[k.GPU_METRICS_AT_THIS_TIME]), 12, 8)

    L.row("Data loading and throughput")
    L.add(k.timeseries("Data-wait share by rank", [target(sel(r.DATA_WAIT_RATIO, JOB, RANK), BY_RANK)],
                       "percentunit", "Share of wall time spent waiting for the data loader over the rate window; "
                       "over ~30% the job is input bound.", min=0, max=1), 8, 8)
    L.add(k.timeseries("Data wait p99 and mean by rank", [
        target(windowed(0.99, c.DATA_WAIT, J, "rank"), BY_RANK + " p99"),
        target(f"sum by (rank) ({rate(m(c.DATA_WAIT, suffix='sum'))}) / "
               f"sum by (rank) ({rate(m(c.DATA_WAIT, suffix='count'))})", BY_RANK + " mean")], "s",
                       "99th percentile wait for a batch inside the data loader.", min=0), 8, 8)
    L.add(k.timeseries("Tokens/s by rank", [target(f"sum by (rank) ({rate(m(c.TOKENS_TRAINED))})", BY_RANK)],
                       TOKENS, "Tokens trained per second per rank.", min=0, stack=True), 8, 8)
    L.add(k.timeseries("Samples/s", [target(f"sum by (rank) ({rate(m(c.SAMPLES_TRAINED))})", BY_RANK)],
                       "suffix: samples/s", "Samples trained per second per rank.", min=0, stack=True), 8, 8)
    L.add(k.timeseries("MFU by rank", [target(
        f"sum by (rank) ({rate(m(c.FLOPS))}) / max by (rank) ({m(c.PEAK_FLOPS)})", BY_RANK)], "percentunit",
        "Model FLOPs utilization: FLOPs per second over the interval / peak FLOP/s of the rank's GPU.", min=0), 8, 8)
    L.add(k.timeseries("Micro-steps per step", [target(
        f"sum by (rank) ({rate(m(c.MICRO_STEPS))}) / sum by (rank) ({rate(m(c.STEPS))})", BY_RANK)], "short",
        "Gradient-accumulation passes per optimizer step.", min=0), 8, 8)

    L.row("Optimization")
    L.add(k.timeseries("Loss", [target(m(c.LOSS), BY_RANK)], "short", "Last reported training loss."), 8, 8)
    L.add(k.timeseries("Gradient norm", [target(m(c.GRAD_NORM), BY_RANK)], "short",
                       "Last reported gradient norm: spikes precede divergence."), 8, 8)
    L.add(k.timeseries("Learning rate", [target(m(c.LEARNING_RATE), BY_RANK)], "sci",
                       "Learning rate, read at the reporting interval."), 8, 8)
    L.add(k.timeseries("Non-finite values", [target(
        f"sum by (rank, value) ({rate(m(c.NONFINITE), 'increase')})", BY_RANK + " {{value}}")], "short",
        "Reported loss, gradient norm or learning rate that was NaN or infinite: the run is diverging.",
        bars=True, min=0), 12, 6)
    L.add(k.timeseries("Failed steps", [target(
        f"sum by (rank, exception) ({rate(m(c.STEPS_FAILED), 'increase')})", BY_RANK + " {{exception}}")], "short",
        "Steps whose body raised (the loop caught the exception and went on), by exception class: no progress.",
        bars=True, min=0), 12, 6)
    L.add(k.timeseries("Run ended or crashed", [
        target(f"max by (rank) ({m(c.RUN_END)} > bool 0)", BY_RANK + " ended"),
        target(f"max by (rank) ({m(c.RUN_CRASH)} > bool 0)", BY_RANK + " crashed")], "short",
        "1 once a rank's last scrape marked its run as ended normally, or as ended by an uncaught exception "
        "(served for a short grace before the process exits): what TrainingTargetDown tells apart.",
        min=0, max=1), 24, 6)

    L.row("Checkpoints and goodput")
    L.add(k.timeseries("Checkpoint duration", [target(
        f"max by (rank) ({rate(m(c.CHECKPOINT_DURATION, suffix='sum'))} / "
        f"{rate(m(c.CHECKPOINT_DURATION, suffix='count'))})", BY_RANK)], "s",
        "Mean duration of the checkpoints saved in each interval.", min=0, bars=True), 8, 8)
    L.add(k.timeseries("Checkpoint duration p99 (window)", [target(windowed(0.99, c.CHECKPOINT_DURATION, J, "rank"),
                                                                  BY_RANK)], "s",
                       "99th percentile of the checkpoint saves in each rank's quantile window.", min=0), 8, 8)
    L.add(k.timeseries("Telemetry dropped", [
        target(f"sum({rate(sel(c.SPANS_DROPPED), 'increase')})", "spans"),
        target(f"sum({rate(sel(c.LOGS_DROPPED), 'increase')})", "log records"),
        target(f"sum({rate(sel(c.LOG_LINES_TRUNCATED), 'increase')})", "log lines truncated")], "short",
        "Spans and log records the instrumentation dropped (a slow or dead trace endpoint or Fluentd); "
        "training itself never waits for them. Log lines truncated: messages longer than the log-pattern "
        "catalog's cap, matched on their start only (still shipped whole).", min=0, bars=True), 8, 8)
    L.add(k.timeseries("Log patterns", [target(
        f"sum by (rank, pattern) ({rate(m(c.LOG_PATTERN_MATCHES), 'increase')})", BY_RANK + " {{pattern}}")],
        "short", "Log records of each rank that match a known failure pattern (NCCL timeout, CUDA OOM, illegal "
        "address, Xid, ECC, NVLink): see docs/instrument.md.", min=0, bars=True, stack=True), 8, 8)
    L.add(k.timeseries("Checkpoints", [target(
        f"sum by (rank) ({rate(m(c.CHECKPOINT_DURATION, suffix='count'), 'increase')})", BY_RANK)], "short",
        "Checkpoints saved per interval.", min=0, bars=True), 8, 8)
    L.add(k.timeseries("Goodput and badput", [
        target(f"avg({rate(m(c.GOODPUT))})", "goodput (computing)"),
        target(f"avg by (cause) ({rate(m(c.BADPUT))})", "badput: {{cause}}")], "percentunit",
        "Share of each rank's time by what it was doing, averaged over the ranks.", min=0, max=1,
        stack=True), 8, 8)

    L.row("The job's GPUs")
    L.add(k.table("GPUs of the job's nodes", [
        target(f"{sel(c.UTILIZATION)} and {nodes}"), target(f"{sel(c.MEMORY_USED)} and {nodes}")],
        "percentunit", "Every GPU on the nodes the job's ranks run on; click for the node's dashboard.",
        merge=True, rename={"Value #A": "utilization", "Value #B": "memory used"}, links=[k.TO_NODE],
        overrides=[{"matcher": {"id": "byName", "options": "memory used"},
                    "properties": [{"id": "unit", "value": "bytes"}]}]), 24, 7)
    L.add(k.timeseries("GPU utilization", [target(f"{sel(c.UTILIZATION)} and {nodes}", "{{node}} GPU {{gpu}}")],
                       "percentunit", "Utilization of the GPUs on the job's nodes.", min=0, max=1,
                       links=[k.TO_NODE_SERIES]), 8, 8)
    L.add(k.timeseries("GPU memory used", [target(f"{sel(c.MEMORY_USED)} and {nodes}", "{{node}} GPU {{gpu}}")],
                       "bytes", "Device memory used on the job's nodes.", min=0), 8, 8)
    L.add(k.timeseries("GPU power", [target(f"{sel(c.POWER_USAGE)} and {nodes}", "{{node}} GPU {{gpu}}")],
                       "watt", "Board power on the job's nodes.", min=0), 8, 8)
    _energy(L)

    variables = [
        k.variable("job_id", f"label_values({c.STEPS.exposed_name}, job_id)", "Job", multi=False),
        k.variable("rank", f"label_values({sel(c.STEPS, JOB)}, rank)", "Rank"),
    ]
    links = [k.dashboard_link("Fleet overview", "fleet"), k.dashboard_link("Node", "node"),
             k.dashboard_link("Inference service", "inference")]
    return k.dashboard("gpuobs / Training job", "training",
                       "Step time by rank and stragglers, data waits, throughput, MFU, loss, checkpoints, goodput "
                       "and the job's GPUs.", L, variables, links, time_from="now-3h")
