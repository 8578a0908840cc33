"""Fleet overview: how many GPUs, how busy, how healthy, across clusters.

Fleet-wide numbers read the recording rules of gpuobs/records.py (`level:metric:operations`),
so they stay cheap on thousands of GPUs; those rules aggregate by cluster or by node, so the node
filter applies to the per-node ones and the model filter to the per-GPU panels (top-N, tables) only.
"""

from __future__ import annotations

from .. import catalog as c
from .. import records as r
from . import common as k
from .common import sel, target

C = 'cluster=~"$cluster"'
N = 'node=~"$node"'
M = 'name=~"$model"'
NOT_IDLE = 'reason!="gpu_idle"'
BAD: k.Steps = [{"color": "green", "value": None}, {"color": "red", "value": 1}]


def gpus(m: c.Metric, *matchers: str) -> str:
    """A per-GPU catalog metric filtered by cluster, node and GPU model."""
    return f"({sel(m, C, N, *matchers)} {model()})"


def model() -> str:
    """`and` the GPUs of the selected models."""
    return f"and on ({k.GPU_BY}) {sel(c.GPU_INFO, C, N, M)}"


def per_cluster(rate: r.Record) -> str:
    """Per-second rate of a counter summed per cluster, from its per-node recording rule."""
    return f"sum by (cluster) ({sel(rate, C, N)})"


def per_node_sum(record: r.Record) -> str:
    """A per-GPU gauge summed over the selected nodes, from its per-node recording rule."""
    return f"sum({sel(record, C, N)})"


def rise(record: r.Record) -> str:
    """The ten GPUs whose per-GPU trend record rose most over the dashboard's range (now less its
    lowest in the range), one series per GPU (the largest of its error types)."""
    now = sel(record, C, N)
    return f"topk(10, max by ({k.GPU_BY}) ({now} - min_over_time({now}[$__range])) {model()})"


def at_risk() -> list:
    """Targets of the "GPUs most at risk" table, each one series per GPU (labels GPU_BY, so that the
    table merges them into a row per GPU): per degradation signal, the ten GPUs that moved most
    towards failure (the degradation alerts' inputs, without their thresholds: those are the alert
    pack's, which the dashboards never read)."""
    brake = sel(c.CLOCK_EVENT_ACTIVE, C, N, 'reason="hw_power_brake_slowdown"')
    temp, slowdown = sel(c.TEMPERATURE, C, N), sel(c.SLOWDOWN_TEMPERATURE, C, N)
    return [
        target(rise(r.GPU_ECC_CORRECTED_RATE)),
        target(rise(r.GPU_PCIE_REPLAYS_RATE)),
        target(rise(r.GPU_NVLINK_ERRORS_RATE)),
        target(rise(r.GPU_REMAP_BANKS_LOW)),
        # °C left to the GPU's own slowdown threshold in 3 h at its pace over the last hour: low or
        # negative is a GPU heating towards it
        target(f"bottomk(10, max by ({k.GPU_BY}) (max by ({k.GPU_BY}) ({slowdown}) - on ({k.GPU_BY}) "
               f"max by ({k.GPU_BY}) (predict_linear({temp}[1h], 10800))) {model()})"),
        target(f"topk(10, max by ({k.GPU_BY}) (changes({brake}[$__range])) {model()})"),
    ]


def _override(column: str, unit: str) -> dict:
    return {"matcher": {"id": "byName", "options": column}, "properties": [{"id": "unit", "value": unit}]}


def weekly_review(L: k.Layout) -> None:
    """The weekly review rows (gpuobs.records' weekly group, over its window, 7 days by default): MIG
    right-sizing of the GPUs not in MIG mode, and fleet reliability (docs/fleet-review.md explains the numbers)."""
    L.row("MIG right-sizing (over the weekly window)")
    advice = f"({sel(r.GPU_MIG_ADVICE, C, N)} {model()})"
    L.add(k.table("MIG candidates", [
        target(advice),
        target(f"{sel(r.GPU_MEMORY_PEAK, C, N)} and on ({k.GPU_BY}) {advice}"),
        target(f"{sel(r.GPU_SM_PEAK, C, N)} and on ({k.GPU_BY}) {advice}")], "short",
        "GPUs not in MIG mode whose peak memory used and peak SM activity over the week (utilization where the "
        "GPU has no GPM), plus the right-sizing headroom, fit a MIG profile of their model: the smallest such "
        "profile and its compute slices of 7. A GPU missing here needs the whole GPU, has no MIG, or is in MIG "
        "mode already.", merge=True, links=[k.TO_NODE],
        rename={"Value #A": "compute slices of 7", "Value #B": "peak memory", "Value #C": "peak SM active"},
        overrides=[_override("peak memory", "bytes"), _override("peak SM active", "percentunit")]), 16, 8)
    L.add(k.bargauge("MIG candidates by profile", [
        target(f"count by (profile) {advice}", "{{profile}}", instant=True)], "short",
        "How many GPUs would fit each profile (their smallest fit)."), 8, 8)

    L.row("Reliability (over the weekly window)")
    L.add(k.bargauge("Failures per 1,000 GPU-hours", [
        target(sel(r.CLUSTER_FAILURE_RATE, C), "{{cluster}} {{class}}", instant=True)], "short",
        "Failure events per 1,000 GPU-hours up, by class: XIDs by tier of action (reboot 79; reset 48, 62-64, 95, "
        "119, 120; application 13, 31, 43, 45, 94; NVLink 74), GPUs lost, row-remap failures, uncorrectable ECC "
        "errors. One incident can count in two classes (an XID 79 and the GPU lost)."), 8, 8)
    L.add(k.table("MTBF per node", [target(sel(r.NODE_MTBF, C, N))], "h",
                  "GPU-hours up per hardware failure on each node (application XIDs excluded); nodes without "
                  "failures are not listed.", rename={"Value": "MTBF"}, links=[k.TO_NODE]), 8, 8)
    L.add(k.table("MTBF per GPU model", [target(sel(r.MODEL_MTBF, C))], "h",
                  "GPU-hours up per hardware failure of each GPU model (application XIDs excluded).",
                  rename={"Value": "MTBF", "name": "model"}), 8, 8)
    L.add(k.stat("GPU-hours up", [target(f"sum({sel(r.NODE_MODEL_GPU_HOURS, C, N)})")], "h",
                 "GPU-hours of GPUs answering NVML over the window."), 6, 4)
    L.add(k.stat("GPU-hours lost to failures", [target(f"sum({sel(r.NODE_MODEL_GPU_HOURS_LOST, C, N)})")], "h",
                 "GPU-hours of GPUs present but down (lost, needing a reset, unreadable or timed out).",
                 thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}]), 6, 4)
    L.add(k.stat("GPU-hours lost to checkpoints and restarts", [
        target(f"sum({sel(r.CLUSTER_RESTART_HOURS, C)})")], "h",
        "Training ranks' time saving checkpoints and starting up after a restart (checkpoint load included): "
        "the training badput of causes checkpoint and startup, one rank one GPU."), 6, 4)
    L.add(k.stat("Training goodput", [target(sel(r.CLUSTER_GOODPUT, C), "{{cluster}}")], "percentunit",
                 "The share of the training ranks' time spent in steps (goodput over goodput and badput).",
                 thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 0.7},
                             {"color": "green", "value": 0.9}]), 6, 4)


def inventory(L: k.Layout) -> None:
    """The 'Inventory' row."""
    L.row("Inventory")
    expected = f"sum({sel(r.CLUSTER_GPUS_EXPECTED, C)})"
    present = f"sum({sel(r.CLUSTER_GPUS_PRESENT, C)})"
    lost = f"(sum({sel(r.CLUSTER_GPUS_LOST, C)}) or vector(0))"
    L.add(k.stat("GPUs expected", [target(expected)], "short",
                 "GPUs the nodes should have (--expected-gpus, else the most each exporter has seen)."), 4, 4)
    L.add(k.stat("GPUs up", [target(present)], "short", "GPUs answering NVML."), 4, 4)
    L.add(k.stat("GPUs lost", [target(lost)], "short", "GPUs that stopped answering NVML (GPU_IS_LOST).",
                 thresholds=BAD), 4, 4)
    L.add(k.stat("GPUs missing", [target(f"clamp_min({expected} - {present} - {lost}, 0)")], "short",
                 "GPUs expected but gone from the device count, or on nodes whose NVML is down.",
                 thresholds=BAD), 4, 4)
    L.add(k.stat("Allocated but idle GPUs",
                 [target(f"sum({sel(r.CLUSTER_GPUS_ALLOCATED_IDLE, C)}) or vector(0)")], "short",
                 "GPUs that hold memory (someone has them) but did no work over the idle window.",
                 thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}]), 4, 4)
    L.add(k.stat("Idle GPUs", [target(f"sum({sel(r.CLUSTER_GPUS_IDLE, C)}) or vector(0)")], "short",
                 "GPUs with no work over the idle window, allocated or not."), 4, 4)


def utilization(L: k.Layout) -> None:
    """The 'Utilization' row."""
    L.row("Utilization")
    L.add(k.timeseries("Fleet GPU utilization and SM activity", [
        target(sel(r.CLUSTER_UTILIZATION, C), "{{cluster}} GPU utilization"),
        target(sel(r.CLUSTER_SM_ACTIVE, C), "{{cluster}} SM active")], "percentunit",
        "Average over the fleet's GPUs. Utilization is the share of time a kernel ran; SM active (GPM, Hopper "
        "and later) is the share of SMs busy, the better measure of how much of the GPU is used.",
        min=0, max=1), 12, 8)
    L.add(k.bargauge("Utilization by node",
                     [target(sel(r.NODE_UTILIZATION, C, N), "{{node}}", instant=True)],
                     "percentunit", "Average GPU utilization per node; click a bar for the node's dashboard.",
                     min=0, max=1, links=[k.TO_NODE_SERIES],
                     thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 0.2},
                                 {"color": "green", "value": 0.6}]), 12, 8)
    L.add(k.timeseries("Allocated but idle GPUs", [
        target(sel(r.CLUSTER_GPUS_ALLOCATED_IDLE, C), "{{cluster}} allocated, idle"),
        target(sel(r.CLUSTER_GPUS_IDLE, C), "{{cluster}} idle")], "short",
        "Idle: no work over the idle window. Allocated: holding device memory, so a job or pod has it.",
        min=0), 12, 8)
    L.add(k.table("Most idle GPUs",
                  [target(f"bottomk(10, (avg_over_time({sel(c.UTILIZATION, C, N)}[$__range]) {model()}))")],
                  "percentunit", "The ten GPUs with the lowest average utilization over the dashboard's range.",
                  rename={"Value": "avg utilization"}, links=[k.TO_NODE]), 12, 8)


def throttling(L: k.Layout) -> None:
    """The 'Throttling, power and temperature' row."""
    L.row("Throttling, power and temperature")
    L.add(k.timeseries("Throttled GPUs by reason", [
        target(sel(r.CLUSTER_THROTTLED, C), "{{cluster}} {{reason}}")],
        "short", "GPUs whose clocks are held down, per clock-event reason (idle excluded). Thermal and power-brake "
        "slowdowns need attention; sw_power_cap is the power limit at work.", stack=True, bars=True, min=0), 12, 8)
    L.add(k.table("Throttled GPUs now",
                  [target(f"{gpus(c.CLOCK_EVENT_ACTIVE, NOT_IDLE)} == 1")], "short",
                  "Every GPU with a throttle reason active (idle excluded).", hide=("Value",), links=[k.TO_NODE]),
          12, 8)
    L.add(k.timeseries("Power draw vs limit", [
        target(f"sum({sel(r.CLUSTER_POWER, C)})", "draw"),
        target(f"sum({sel(r.CLUSTER_POWER_LIMIT, C)})", "enforced limit")], "watt",
        "Board power of all GPUs against the sum of their enforced limits.", min=0), 12, 8)
    L.add(k.heatmap("Node temperature distribution",
                    [target(sel(r.NODE_MAX_TEMPERATURE, C, N), "{{node}}")], "celsius",
                    "How many nodes have their hottest GPU at each temperature over time.", calculate=True), 12, 8)
    L.add(k.timeseries("Hottest GPU by cluster", [
        target(sel(r.CLUSTER_MAX_TEMPERATURE, C), "{{cluster}}")], "celsius",
        "The highest GPU core temperature in each cluster."), 12, 8)
    L.add(k.table("Hottest GPUs", [target(f"topk(10, {gpus(c.TEMPERATURE)})")], "celsius",
                  "The ten hottest GPUs now.", rename={"Value": "temperature"}, links=[k.TO_NODE]), 12, 8)


def errors(L: k.Layout) -> None:
    """The 'Errors and events' row."""
    L.row("Errors and events")
    L.add(k.timeseries("XID errors by code", [
        target(sel(r.CLUSTER_XID_ERRORS, C), "{{cluster}} XID {{xid}}")], "short",
        "XID errors over the recording rule's long window, per code. 79: fell off the bus; 48/63/64/95: memory "
        "errors; 13/31/43/45: application faults; 74: NVLink.", bars=True, stack=True, min=0), 12, 8)
    L.add(k.table("Last XID per GPU", [target(f"{gpus(c.XID_LAST_SEEN)} * 1000")], "dateTimeAsIso",
                  "When each GPU last reported each XID code.", rename={"Value": "last seen"}, links=[k.TO_NODE]),
          12, 8)
    L.add(k.timeseries("Uncorrectable ECC errors", [
        target(sel(r.CLUSTER_ECC_UNCORRECTED, C), "{{cluster}}")], "short",
        "Uncorrectable (double-bit) volatile ECC errors over the recording rule's long window.",
        bars=True, min=0), 8, 8)
    L.add(k.stat("Row remaps pending", [target(per_node_sum(r.NODE_REMAP_PENDING))], "short",
                 "GPUs with a DRAM row remap waiting for a GPU reset.", thresholds=BAD, graph=False), 4, 4)
    L.add(k.stat("Row remap failures", [target(per_node_sum(r.NODE_REMAP_FAILURE))], "short",
                 "GPUs that could not remap a failing row: they need service.", thresholds=BAD, graph=False), 4, 4)
    L.add(k.table("Fewest spare rows",
                  [target(f"topk(10, sum by ({k.GPU_BY}) ({sel(r.GPU_REMAP_BANKS_LOW, C, N)}))")], "short",
                  "GPUs with the most memory banks low on or out of spare rows for remapping (a bank out of "
                  "them cannot remap another failing row). Rows remapped so far, per GPU: the node dashboard "
                  "with the exporter's --detail ecc.",
                  rename={"Value": "banks low or out"}, links=[k.TO_NODE]), 8, 8)


def most_at_risk(L: k.Layout) -> None:
    """The 'GPUs most at risk' row."""
    L.row("GPUs most at risk")
    L.add(k.table("GPUs most at risk", at_risk(), "short",
                  "Per degradation signal, the ten GPUs that moved most towards failure over the dashboard's "
                  "range: rise of corrected ECC errors/s, PCIe replays/s, NVLink CRC or replay errors/s (each a "
                  "rate over the trend window), banks newly low on spare rows, °C left to the slowdown "
                  "threshold in 3 h at the last hour's pace, and changes in and out of the HW power brake. "
                  "A GPU high on one of them: drain it and plan its replacement (the degradation alerts' "
                  "runbooks).",
                  merge=True, links=[k.TO_NODE],
                  rename={"Value #A": "ECC corrected/s rise", "Value #B": "PCIe replays/s rise",
                          "Value #C": "NVLink errors/s rise", "Value #D": "banks newly low",
                          "Value #E": "°C to slowdown in 3 h", "Value #F": "power brake changes"}), 24, 9)


def interconnects(L: k.Layout) -> None:
    """The 'Interconnects' row."""
    L.row("Interconnects")
    L.add(k.stat("NVLink links down",
                 [target(f"sum({sel(r.NODE_NVLINK_LINKS_DOWN, C, N)}) or vector(0)")], "short",
                 "Inactive NVLink links on GPUs that have NVLink.", thresholds=BAD), 4, 6)
    L.add(k.stat("PCIe links below max",
                 [target(f"sum({sel(r.NODE_PCIE_DEGRADED, C, N)}) or vector(0)")], "short",
                 "GPUs whose PCIe link runs below its maximum generation or width. Idle GPUs downshift to save "
                 "power: only a busy GPU below its maximum is a fault.",
                 thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}]), 4, 6)
    L.add(k.timeseries("NVLink errors", [
        target(f"sum by (cluster) ({sel(r.NODE_NVLINK_ERRORS, C, N)})", "{{cluster}}")],
        "cps", "NVLink data-link errors per second (CRC, replay, recovery), over every link.", min=0), 8, 6)
    L.add(k.timeseries("PCIe replays", [
        target(sel(r.NODE_PCIE_REPLAYS, C, N), "{{node}}")], "cps",
        "PCIe link-level retransmissions per second, per node.", min=0, links=[k.TO_NODE_SERIES]), 8, 6)
    L.add(k.table("Placed without NVLink", [target(
        f"({sel(r.POD_NVLINK_DOMAINS, C, N)} > 1) or ({sel(r.JOB_NVLINK_DOMAINS, C)} > 1)")], "short",
        "Pods and Slurm jobs holding GPUs of several NVLink domains on one node (value: the domains), so "
        "GPU-to-GPU traffic between them crosses PCIe (GpuPodPlacementWithoutNvlink on nodes with NVLink).",
        rename={"Value": "NVLink domains"}), 24, 6)
    L.add(k.timeseries("NVLink traffic", [
        target(per_cluster(r.NODE_NVLINK_TX), "{{cluster}} transmit"),
        target(per_cluster(r.NODE_NVLINK_RX), "{{cluster}} receive")], "Bps",
        "NVLink data bytes per second over all links.", min=0), 12, 7)
    L.add(k.timeseries("PCIe traffic", [
        target(per_cluster(r.NODE_PCIE_TX), "{{cluster}} transmit"),
        target(per_cluster(r.NODE_PCIE_RX), "{{cluster}} receive")], "Bps",
        "PCIe bytes per second between the GPUs and their hosts.", min=0), 12, 7)


ROWS = [inventory, utilization, throttling, errors, most_at_risk, interconnects, weekly_review]  # in dashboard order


def build():
    """The Fleet overview dashboard: the rows of ROWS in order, variables cluster, node and model."""
    L = k.Layout()
    for row in ROWS:
        row(L)

    variables = [
        k.variable("cluster", f"label_values({c.GPUS_EXPECTED.name}, cluster)", "Cluster"),
        k.variable("node", f"label_values({c.GPUS_EXPECTED.name}{{{C}}}, node)", "Node"),
        k.variable("model", f"label_values({sel(c.GPU_INFO, C, N)}, name)", "GPU model"),
    ]
    links = [k.dashboard_link("Node", "node", "Per-GPU detail of one node"),
             k.dashboard_link("Training job", "training"), k.dashboard_link("Inference service", "inference"),
             k.dashboard_link("Exporter health", "exporter"),
             k.dashboard_link("Fleet efficiency", "efficiency", "Allocated against used GPUs, idle holders, cost")]
    return k.dashboard("gpuobs / Fleet overview", "fleet",
                       "GPU inventory, utilization, throttling, power, temperature, XID/ECC/remap events and "
                       "interconnect health across the fleet.", L, variables, links)
