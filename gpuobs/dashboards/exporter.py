"""Exporter health: is every node's gpuobs exporter scraped, is NVML up, are snapshots fresh, how
long a sampling pass takes, and which NVML calls fail with which code."""

from __future__ import annotations

from .. import catalog as c
from .. import records as r
from . import common as k
from .common import rate, sel, target

C = 'cluster=~"$cluster"'
N = 'node=~"$node"'
JOB = 'job=~"$job"'
E = (JOB, C, N)
NODE = "{{node}}"
BAD: k.Steps = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
UP_MAP = [{"type": "value", "options": {"0": {"text": "down", "color": "red", "index": 0},
                                        "1": {"text": "up", "color": "green", "index": 1}}}]


def m(metric: c.Metric, *matchers: str) -> str:
    """A selector over a catalog metric restricted to the selected job, cluster and node (E), plus matchers."""
    return sel(metric, *E, *matchers)


def status(L: k.Layout) -> None:
    """The 'Status' row."""
    up = sel("up", *E)
    L.row("Status")
    L.add(k.stat("Exporters up", [target(f"sum({up})")], "short", "Exporter targets Prometheus scrapes now."), 4, 4)
    L.add(k.stat("Exporters down", [target(f"count({up} == 0) or vector(0)")], "short",
                 "Exporter targets Prometheus cannot scrape.", thresholds=BAD), 4, 4)
    L.add(k.stat("NVML down", [target(f"count({m(c.NVML_UP)} == 0) or vector(0)")], "short",
                 "Exporters that cannot initialise or reach NVML: none of their GPUs can be read.",
                 thresholds=BAD), 4, 4)
    L.add(k.stat("Stale snapshots", [target(f"sum({m(c.SNAPSHOT_STALE)})")], "short",
                 "Exporters whose last snapshot is older than two intervals (NVML hangs); their GPU series are "
                 "withheld.", thresholds=BAD), 4, 4)
    L.add(k.stat("GPUs missing", [target(f"sum({sel(r.NODE_GPUS_EXPECTED, C, N)}) - "
                                         f"sum({sel(r.NODE_GPUS_PRESENT, C, N)})")], "short",
                 "GPUs expected but not counted by the driver, over the selected nodes (a GPU counted but lost "
                 "or unusable reads gpu_up 0: see the node dashboard).", thresholds=BAD), 4, 4)
    L.add(k.stat("NVML errors/s", [target(f"sum({rate(m(c.NVML_ERRORS))}) or vector(0)")], "cps",
                 "NVML calls failing per second, all selected exporters.",
                 thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.1}]), 4, 4)
    L.add(k.state_timeline("Scrape up by node", [target(up, NODE)], "short",
                           "Whether Prometheus can scrape each exporter.", mappings=UP_MAP,
                           thresholds=k.UP_THRESHOLDS,
                           links=[k.TO_NODE_SERIES]), 12, 6)
    L.add(k.state_timeline("NVML up by node", [target(m(c.NVML_UP), NODE)], "short",
                           "Whether each exporter's NVML answers.", mappings=UP_MAP,
                           thresholds=k.UP_THRESHOLDS,
                           links=[k.TO_NODE_SERIES]), 12, 6)
    L.add(k.state_timeline("Attribution up by node", [target(m(c.ATTRIBUTION_UP), "{{node}} {{source}}")], "short",
                           "Whether each exporter's pod (kubelet PodResources) or Slurm job attribution answered at "
                           "its last refresh; no row where attribution is off. Down: GPU series lack their pod or "
                           "job labels.", mappings=UP_MAP,
                           thresholds=k.UP_THRESHOLDS,
                           links=[k.TO_NODE_SERIES]), 24, 5)
    L.add(k.table("NVML init errors", [target(f"{m(c.NVML_INIT_ERROR)} == 1")], "short",
                  "The NVML error that keeps NVML down, per exporter.", hide=("Value",), links=[k.TO_NODE]), 12, 5)
    L.add(k.table("Driver and NVML versions", [target(m(c.NVML_INFO))], "short",
                  "Driver, NVML and CUDA driver versions per node.", hide=("Value",), links=[k.TO_NODE]), 12, 5)


def sampling(L: k.Layout) -> None:
    """The 'Sampling' row."""
    L.row("Sampling")
    L.add(k.timeseries("Collection duration", [target(m(c.COLLECTION_DURATION), NODE)], "s",
                       "Wall time of the last complete sampling pass.", min=0), 8, 8)
    L.add(k.timeseries("Snapshot age", [target(f"time() - {m(c.LAST_SUCCESS)}", NODE)], "s",
                       "Seconds since the last complete sampling pass started: the age of the values the exporter "
                       "serves.",
                       min=0), 8, 8)
    L.add(k.state_timeline("Snapshot stale", [target(m(c.SNAPSHOT_STALE), NODE)], "short",
                           "1 while the exporter withholds GPU series because its snapshot is stale.",
                           thresholds=BAD), 8, 8)
    L.add(k.timeseries("Sampling passes/s", [target(rate(m(c.SAMPLES)), NODE)], "ops",
                       "Sampling passes completed per second (1 / --interval when healthy).", min=0), 8, 8)
    L.add(k.timeseries("NVML calls per sample", [target(m(c.NVML_CALLS), NODE)], "short",
                       "NVML calls made by the last sampling pass.", min=0), 8, 8)
    L.add(k.timeseries("GPUs expected and present", [
        target(sel(r.NODE_GPUS_EXPECTED, C, N), NODE + " expected"),
        target(sel(r.NODE_GPUS_PRESENT, C, N), NODE + " present")], "short",
        "GPUs each node should have and GPUs its driver counts.", min=0), 8, 8)


def errors(L: k.Layout) -> None:
    """The 'Errors' row."""
    L.row("Errors")
    L.add(k.timeseries("NVML errors by call and code", [target(
        f"sum by (node, call, code) ({rate(m(c.NVML_ERRORS))})", NODE + " {{call}} {{code}}")], "cps",
        "NVML calls that returned an error, per function and NVML return code.", min=0), 12, 8)
    L.add(k.timeseries("Dropped values", [target(
        f"sum by (node, metric, reason) ({rate(m(c.DROPPED))})", NODE + " {{metric}} {{reason}}")], "cps",
        "Values dropped as impossible (NVML sentinels, out of range), per metric.", min=0), 12, 8)
    L.add(k.timeseries("NVML re-initialisations", [target(rate(m(c.NVML_REINITS), "increase"), NODE)], "short",
                       "NVML shutdown and re-init after repeated driver-level errors.", min=0, bars=True), 12, 8)
    L.add(k.timeseries("Scrape duration", [target(sel("scrape_duration_seconds", *E), NODE)], "s",
                       "How long Prometheus takes to scrape each exporter.", min=0), 12, 8)
    L.add(k.timeseries("Scrapes by format and encoding", [target(
        f"sum by (node, format, encoding) ({rate(m(c.SCRAPES))})", NODE + " {{format}} {{encoding}}")], "reqps",
        "Metrics responses by what the scraper asked for: OpenMetrics and gzip from Prometheus, text from curl "
        "and most tools.", min=0), 12, 8)
    L.add(k.timeseries("HTTP connections refused", [target(
        f"sum by (node, reason) ({rate(m(c.HTTP_REFUSED))})", NODE + " {{reason}}")], "cps",
        "Connections the exporter closed without an answer: all its connection slots taken (limit), the "
        "client's share taken (client_limit), a request not done in time (deadline), or out of file "
        "descriptors (open_files, counted once per back-off). Rising client_limit behind a proxy: raise "
        "--web.max-connections-per-client.", min=0), 12, 8)
    L.add(k.timeseries("GPU sampling timeouts", [target(
        f"sum by (node, gpu, uuid) ({rate(m(c.GPU_TIMEOUTS))})", NODE + " GPU {{gpu}}")], "cps",
        "Passes per second in which a GPU's NVML reads missed the sampling deadline: its series were withheld.",
        min=0), 12, 8)
    L.add(k.state_timeline("Collectors succeeding", [target(
        f"min by (node, collector) ({m(c.COLLECTOR_SUCCESS)})", NODE + " {{collector}}")], "short",
        "0 while a collector raises (a bug, an unexpected binding); its series are missing.",
        mappings=UP_MAP, thresholds=k.UP_THRESHOLDS), 12, 8)
    L.add(k.timeseries("Collector errors", [target(
        f"sum by (node, collector) ({rate(m(c.COLLECTOR_ERRORS))})", NODE + " {{collector}}")], "cps",
        "Exceptions raised by each collector, per GPU and pass.", min=0), 12, 8)
    L.add(k.state_timeline("XID watcher up", [target(m(c.XID_WATCHER_UP), NODE)], "short",
                           "0 while the XID event thread cannot wait on its event set: XIDs may be missed.",
                           mappings=UP_MAP, thresholds=k.UP_THRESHOLDS), 12, 8)
    L.add(k.timeseries("XID watcher errors", [target(
        f"sum by (node, code) ({rate(m(c.XID_WATCHER_ERRORS))})", NODE + " {{code}}")], "cps",
        "Errors of the XID event thread by NVML code; 'restarted' when it died and was started again.",
        min=0), 12, 8)
    L.add(k.state_timeline("Kernel-log watcher up", [target(m(c.KERNEL_LOG_UP), NODE + " {{source}}")], "short",
                           "0 while the kernel-log watcher cannot read /dev/kmsg, its file or the journal "
                           "(kernel-log XIDs and driver messages are not counted then).",
                           mappings=UP_MAP, thresholds=k.UP_THRESHOLDS), 12, 8)
    L.add(k.timeseries("Kernel-log records lost", [target(
        f"sum by (node) ({rate(m(c.KERNEL_LOG_LOST), 'increase')})", NODE), target(
        f"sum by (node) ({rate(m(c.KERNEL_LOG_OVERFLOW), 'increase')})", NODE + " over the label-set cap"), target(
        f"sum by (node) ({rate(m(c.KERNEL_LOG_TRUNCATED), 'increase')})", NODE + " file truncations")], "short",
        "Kernel ring-buffer records overwritten before the watcher read them (their XIDs are not counted); "
        "records over the cap of distinct (PCI address, code) label sets (forged lines: counted only here); "
        "truncations of a kernel-log file (records just before one may be lost).", min=0), 12, 8)
    L.add(k.table("Exporter versions", [target(m(c.BUILD_INFO))], "short",
                  "The gpuobs version and the Python each node's exporter runs (one row per exporter): a "
                  "fleet half-way through a rollout shows two.", hide=("cluster", "job")), 24, 8)
    L.add(k.table("NVML calls unavailable", [target(f"{m(c.NVML_UNAVAILABLE)} > 0")], "short",
                  "Calls that give no value by design, with the number of GPUs: not_supported, no_permission, or "
                  "function_not_found on an older driver (a fallback call serves the value where one exists).",
                  hide=("cluster", "instance", "job")), 24, 8)


ROWS = [status, sampling, errors]  # in dashboard order


def build():
    """The Exporter health dashboard: the rows of ROWS in order, variables job, cluster and node."""
    L = k.Layout()
    for row in ROWS:
        row(L)

    variables = [
        k.variable("job", f"label_values({c.NVML_UP.name}, job)", "Scrape job"),
        k.variable("cluster", f"label_values({c.NVML_UP.name}{{{JOB}}}, cluster)", "Cluster"),
        k.variable("node", f"label_values({c.NVML_UP.name}{{{JOB},{C}}}, node)", "Node"),
    ]
    links = [k.dashboard_link("Fleet overview", "fleet"), k.dashboard_link("Node", "node")]
    return k.dashboard("gpuobs / Exporter health", "exporter",
                       "Scrapes, NVML state, snapshot freshness, sampling cost and NVML errors of the gpuobs "
                       "exporters.", L, variables, links, time_from="now-6h")
