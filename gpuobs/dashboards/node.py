"""Node: every exporter metric family of one node, per GPU, plus its MIG devices, its processes and
the jobs and models running on it (linked to their dashboards)."""

from __future__ import annotations

from .. import catalog as c
from . import common as k
from .common import rate, sel, target

C = 'cluster=~"$cluster"'
N = 'node="$node"'
G = 'gpu=~"$gpu"'
ON = (C, N, G)
GPU = "GPU {{gpu}}"
SM = 'clock="sm"'
NOT_IDLE = 'reason!="gpu_idle"'
VOLATILE = 'counter_type="volatile"'
BAD = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
UP_MAP = [{"type": "value", "options": {"0": {"text": "lost", "color": "red", "index": 0},
                                        "1": {"text": "up", "color": "green", "index": 1}}}]


def m(metric: c.Metric, *matchers: str) -> str:
    return sel(metric, *ON, *matchers)


def _title(metric: c.Metric) -> str:
    """'gpuobs_gpu_sm_active_ratio' -> 'SM active'."""
    words = metric.name.removeprefix("gpuobs_").removeprefix("gpu_").removeprefix("mig_").removesuffix("_ratio")
    upper = {"sm": "SM", "dram": "DRAM", "fp16": "FP16", "fp32": "FP32", "fp64": "FP64"}
    text = " ".join(upper.get(w, w) for w in words.split("_"))
    return text[0].upper() + text[1:]


def build():
    L = k.Layout()
    L.row("GPUs")
    L.add(k.stat("GPUs up", [target(f"sum({sel(c.GPU_UP, C, N)})")], "short", "GPUs answering NVML."), 3, 4)
    L.add(k.stat("GPUs expected", [target(f"sum({sel(c.GPUS_EXPECTED, C, N)})")], "short",
                 "GPUs this node should have."), 3, 4)
    L.add(k.stat("NVML up", [target(f"min({sel(c.NVML_UP, C, N)})")], "short", "1 if NVML answers.",
                 thresholds=k.UP_THRESHOLDS, graph=False), 3, 4)
    L.add(k.stat("Power draw", [target(f"sum({m(c.POWER_USAGE)})")], "watt", "Board power of the node's GPUs."),
          3, 4)
    L.add(k.state_timeline("GPU up", [target(m(c.GPU_UP), GPU)], "short",
                           "Up: answered NVML in the last pass. Down: lost, needs a reset, hung or unreadable (see GPUs "
                           "unhealthy); its other series stop.",
                           thresholds=k.UP_THRESHOLDS,
                           mappings=UP_MAP), 12, 4)
    L.add(k.table("GPU identity", [target(m(c.GPU_INFO))], "short",
                  "Name, UUID, PCI bus, serial, VBIOS, driver, CUDA and architecture of each GPU.",
                  hide=("Value", "cluster", "node")), 18, 6)
    L.add(k.table("GPUs unhealthy", [target(f"{m(c.GPU_UNHEALTHY)} == 1")], "short",
                  "Why a GPU reads down: lost (off the bus), reset_required, timeout (its NVML calls hang or are "
                  "slow) or unreadable. Empty while every GPU is healthy.",
                  hide=("Value", "cluster", "node", "instance", "job")), 6, 6)
    L.add(k.table("GPU modes", [target(m(c.PERSISTENCE_MODE)), target(f"{m(c.COMPUTE_MODE)} == 1"),
                                target(m(c.ECC_PENDING)), target(m(c.MIG_PENDING))], "short",
                  "Persistence mode, compute mode, and the ECC and MIG modes pending for the next reset (a pending "
                  "mode that differs from the current one takes effect then).", merge=True,
                  hide=("cluster", "node", "uuid", "Value #B"),
                  rename={"Value #A": "persistence", "Value #C": "ECC pending", "Value #D": "MIG pending"}), 24, 6)

    L.row("Jobs and models on this node")
    L.add(k.table("Training jobs", [target(f"count by (job_id) ({sel(c.STEPS, C, N)})")], "short",
                  "Training jobs with ranks on this node; click for the job's dashboard.",
                  rename={"Value": "ranks here"},
                  links=[k.data_link("Training job ${__data.fields.job_id}", "training",
                                     job_id="${__data.fields.job_id}")]), 12, 5)
    L.add(k.table("Inference models", [target(
        f"count by (gen_ai_request_model) ({sel(c.REQUEST_DURATION, C, N, suffix='count')})")], "short",
        "Models served on this node; click for the inference dashboard.", rename={"Value": "series"},
        links=[k.data_link("Inference: ${__data.fields.gen_ai_request_model}", "inference",
                           model="${__data.fields.gen_ai_request_model}")]), 12, 5)

    L.row("Utilization")
    L.add(k.timeseries("GPU utilization", [target(m(c.UTILIZATION), GPU)], "percentunit",
                       "Share of the sample period a kernel ran.", min=0, max=1), 12, 8)
    L.add(k.timeseries("Memory, encoder and decoder utilization", [
        target(m(c.MEMORY_UTILIZATION), GPU + " memory"), target(m(c.ENCODER_UTILIZATION), GPU + " encoder"),
        target(m(c.DECODER_UTILIZATION), GPU + " decoder")], "percentunit",
        "Share of the sample period device memory was read or written, and video engine use.", min=0, max=1), 12, 8)
    L.add(k.timeseries("Encoder and FBC sessions", [
        target(m(c.ENCODER_SESSIONS), GPU + " encoder"), target(m(c.FBC_SESSIONS), GPU + " frame capture")],
        "short", "Video encoder and frame-buffer-capture sessions running.", min=0), 8, 7)
    L.add(k.timeseries("Encoder and FBC frame rate", [
        target(m(c.ENCODER_FPS), GPU + " encoder"), target(m(c.FBC_FPS), GPU + " frame capture")],
        "short", "Average frames per second over the sessions running.", min=0), 8, 7)
    L.add(k.timeseries("Encoder and FBC latency", [
        target(m(c.ENCODER_LATENCY), GPU + " encoder"), target(m(c.FBC_LATENCY), GPU + " frame capture")],
        "s", "Average latency per frame over the sessions running.", min=0), 8, 7)

    L.row("Profiling (GPM)")
    for metric in c.GPM_METRICS.values():
        L.add(k.timeseries(_title(metric), [target(m(metric), GPU)], "percentunit", metric.help, min=0, max=1),
              6, 7)

    L.row("Memory")
    L.add(k.timeseries("Memory used", [target(m(c.MEMORY_USED), GPU + " used"),
                                       target(m(c.MEMORY_TOTAL), GPU + " total")], "bytes",
                       "Device memory allocated, against the GPU's total.", min=0), 8, 8)
    L.add(k.timeseries("Memory reserved and free", [target(m(c.MEMORY_RESERVED), GPU + " reserved"),
                                                    target(m(c.MEMORY_FREE), GPU + " free")], "bytes",
                       "Memory reserved by driver and firmware, and memory free.", min=0), 8, 8)
    L.add(k.timeseries("BAR1", [target(m(c.BAR1_USED), GPU + " used"), target(m(c.BAR1_TOTAL), GPU + " total")],
                       "bytes", "BAR1 aperture in use and in total.", min=0), 8, 8)

    L.row("Power")
    L.add(k.timeseries("Power draw and limits", [
        target(m(c.POWER_USAGE), GPU + " draw"), target(m(c.POWER_LIMIT), GPU + " enforced limit"),
        target(m(c.POWER_DEFAULT_LIMIT), GPU + " default limit"), target(m(c.POWER_MIN_LIMIT), GPU + " min limit"),
        target(m(c.POWER_MAX_LIMIT), GPU + " max limit")], "watt",
        "Board power against the enforced, default and settable limits.", min=0), 16, 8)
    L.add(k.timeseries("Energy rate", [target(rate(m(c.ENERGY)), GPU)], "watt",
                       "Power derived from the energy counter: joules per second.", min=0), 8, 8)
    L.add(k.timeseries("Average power, memory power and requested limit", [
        target(m(c.POWER_AVERAGE), GPU + " average"), target(m(c.MEMORY_POWER), GPU + " memory average"),
        target(m(c.POWER_REQUESTED_LIMIT), GPU + " requested limit")], "watt",
        "The driver's 1 s average board power, the memory's share where the GPU reports it, and the limit "
        "last requested (the enforced one can be lower).", min=0), 24, 8)

    L.row("Thermal")
    L.add(k.timeseries("GPU temperature and thresholds", [
        target(m(c.TEMPERATURE), GPU), target(m(c.SLOWDOWN_TEMPERATURE), GPU + " slowdown"),
        target(m(c.SHUTDOWN_TEMPERATURE), GPU + " shutdown"),
        target(m(c.MAX_OPERATING_TEMPERATURE), GPU + " max operating")], "celsius",
        "Core temperature against the GPU's own slowdown, shutdown and maximum operating thresholds."), 10, 8)
    L.add(k.timeseries("Memory temperature", [
        target(m(c.MEMORY_TEMPERATURE), GPU), target(m(c.MEMORY_MAX_TEMPERATURE), GPU + " max operating")],
        "celsius", "HBM/GDDR temperature against its maximum operating temperature."), 8, 8)
    L.add(k.timeseries("Fan speed", [target(m(c.FAN_SPEED), GPU)], "percentunit",
                       "Fan speed as a share of its maximum (boards with fans only).", min=0, max=1), 6, 8)

    L.row("Clocks and throttling")
    L.add(k.timeseries("Clocks", [target(m(c.CLOCK), GPU + " {{clock}}")], "hertz",
                       "Current clock per domain."), 8, 8)
    L.add(k.timeseries("SM clock headroom",
                       [target(f"{m(c.CLOCK, SM)} / on ({k.GPU_BY}, clock) {m(c.MAX_CLOCK, SM)}", GPU)],
        "percentunit", "SM clock as a share of its maximum.", min=0, max=1), 8, 8)
    L.add(k.timeseries("Max clocks", [target(m(c.MAX_CLOCK), GPU + " {{clock}}")], "hertz",
                       "Maximum clock per domain."), 8, 8)
    L.add(k.state_timeline("Performance state", [target(m(c.PSTATE), GPU)], "short",
                           "P0 is the maximum performance state, P15 the minimum.",
                           thresholds=[{"color": "green", "value": None}, {"color": "yellow", "value": 2},
                                       {"color": "blue", "value": 8}]), 8, 8)
    L.add(k.state_timeline("Throttle reasons active", [target(
        f"sum by (gpu) ({m(c.CLOCK_EVENT_ACTIVE, NOT_IDLE)})", GPU)], "short",
        "Clock-event reasons holding each GPU's clocks down (idle excluded); see the next panel for which.",
        thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]), 8, 8)
    L.add(k.timeseries("Throttle time by reason", [target(
        f"sum by (gpu, reason) ({rate(m(c.CLOCK_EVENT_DURATION))})", GPU + " {{reason}}")], "percentunit",
        "Share of time clocks were held down, per reason (nvidia-smi's clock event reason counters).",
        min=0, stack=True), 8, 8)
    L.add(k.table("Active clock-event reasons", [target(f"{m(c.CLOCK_EVENT_ACTIVE, NOT_IDLE)} == 1")], "short",
                  "Every clock-event reason holding clocks down now (gpu_idle left out). The default profile "
                  "serves the reasons the alerts read; the others with the exporter's --detail clock_events.",
                  hide=("Value", "cluster", "node")),
          18, 5)
    L.add(k.table("Clock-event reason mask", [target(m(c.CLOCK_EVENT_REASONS_MASK))], "short",
                  "nvmlClocksEventReasons bitmask, as nvidia-smi and DCGM show it (0x4: power cap, 0x40: HW "
                  "thermal slowdown, 0x1: idle).", hide=("cluster", "node", "uuid"), rename={"Value": "mask"}), 6, 5)

    L.row("ECC and memory repairs")
    L.add(k.timeseries("ECC errors", [target(
        f"sum by (gpu, error_type) ({rate(m(c.ECC_ERRORS, VOLATILE))})", GPU + " {{error_type}}")], "cps",
        "Corrected and uncorrected ECC errors per second (volatile counters).", min=0), 8, 8)
    L.add(k.table("ECC counters and mode", [target(m(c.ECC_ERRORS)), target(m(c.ECC_MODE))], "short",
                  "ECC error counts (volatile: since the last reset, aggregate: lifetime) and whether ECC is on.",
                  hide=("cluster", "node"), rename={"Value #A": "errors", "Value #B": "ECC enabled"}), 8, 8)
    L.add(k.timeseries("Remapped rows and retired pages", [
        target(m(c.REMAPPED_ROWS), GPU + " remapped {{error_type}}"),
        target(m(c.RETIRED_PAGES), GPU + " retired {{cause}}")], "short",
        "DRAM rows remapped (Ampere and later) and pages retired (earlier GPUs) after ECC errors.", min=0), 8, 8)
    L.add(k.state_timeline("Repairs pending or failed", [
        target(m(c.REMAP_PENDING), GPU + " remap pending"), target(m(c.REMAP_FAILURE), GPU + " remap failure"),
        target(m(c.RETIRED_PAGES_PENDING), GPU + " retirement pending")], "short",
        "A pending remap or retirement takes effect at the next GPU reset; a failed remap needs service.",
        thresholds=BAD), 12, 6)
    L.add(k.timeseries("Row-remap bank availability", [target(m(c.REMAP_BANKS), GPU + " {{availability}}")],
                       "short", "Memory banks by how many spare rows they have left (max to none): banks moving "
                       "toward low and none run out of repairs.", min=0, stack=True), 12, 6)
    L.add(k.timeseries("ECC errors by location", [target(
        f"sum by (gpu, location, error_type) ({rate(m(c.ECC_LOCATION_ERRORS, VOLATILE))})",
        GPU + " {{location}} {{error_type}}")], "cps",
        "ECC errors per second in on-chip SRAM and in device memory (DRAM), volatile counters.", min=0), 24, 7)

    L.row("PCIe")
    L.add(k.timeseries("PCIe throughput", [target(rate(m(c.PCIE_TX)), GPU + " transmit"),
                                           target(rate(m(c.PCIE_RX)), GPU + " receive")], "Bps",
                       "Bytes per second over PCIe.", min=0), 8, 8)
    L.add(k.timeseries("PCIe replays", [target(rate(m(c.PCIE_REPLAYS)), GPU)], "cps",
                       "Link-level retransmissions per second.", min=0), 8, 8)
    L.add(k.timeseries("PCIe and NVLink throughput per pass", [
        target(m(c.PCIE_THROUGHPUT), GPU + " PCIe {{direction}}"), target(m(c.NVLINK_THROUGHPUT), GPU + " NVLink")],
        "Bps", "Bytes per second between the exporter's last two passes (what DCGM's PCIe and NVLink bandwidth "
        "fields show); NVLink is sent plus received over all links.", min=0), 24, 7)
    L.add(k.table("PCIe link", [target(m(c.PCIE_GENERATION)), target(m(c.PCIE_MAX_GENERATION)),
                                target(m(c.PCIE_WIDTH)), target(m(c.PCIE_MAX_WIDTH))], "short",
                  "Generation and width now and at most. Idle GPUs downshift to save power.", merge=True,
                  hide=("cluster", "node", "uuid"),
                  rename={"Value #A": "generation", "Value #B": "max generation", "Value #C": "width",
                          "Value #D": "max width"}), 8, 8)

    L.row("NVLink")
    L.add(k.timeseries("NVLink throughput", [
        target(f"sum by (gpu) ({rate(m(c.NVLINKS_TX))})", GPU + " transmit"),
        target(f"sum by (gpu) ({rate(m(c.NVLINKS_RX))})", GPU + " receive")], "Bps",
        "Data bytes per second over all of a GPU's links.", min=0), 8, 8)
    L.add(k.timeseries("NVLink errors", [target(
        f"sum by (gpu) ({rate(m(c.NVLINKS_ERRORS))})", GPU)], "cps",
        "Data-link errors per second over all of a GPU's links: CRC, replay, recovery.", min=0), 8, 8)
    L.add(k.state_timeline("NVLink links down", [target(f"sum by (gpu) ({m(c.NVLINKS_DOWN)})", GPU)], "short",
                           "Inactive links per GPU (GPUs with NVLink only).", thresholds=BAD), 8, 8)
    L.add(k.timeseries("NVLink errors by link", [target(
        f"topk(10, sum by (gpu, link, error_type) ({rate(m(c.NVLINK_ERRORS))}))", GPU + " link {{link}} {{error_type}}")],
        "cps", "The ten links with the most errors, by kind (CRC, replay, recovery).", min=0), 8, 8)
    L.add(k.timeseries("NVLink throughput by link", [target(
        f"topk(10, sum by (gpu, link) ({rate(m(c.NVLINK_TX))} + {rate(m(c.NVLINK_RX))}))", GPU + " link {{link}}")],
        "Bps", "The ten busiest links: data bytes per second sent plus received.", min=0), 8, 8)
    L.add(k.table("NVLink link states", [target(m(c.NVLINK_UP))], "short",
                  "Each link's state: 1 active, 0 down.", hide=("cluster", "node", "uuid"),
                  rename={"Value": "up"}), 8, 8)

    L.row("NVSwitch fabric")
    L.add(k.table("Fabric registration", [target(f"{m(c.FABRIC_STATE)} == 1"), target(m(c.FABRIC_STATUS)),
                                          target(m(c.FABRIC_CLIQUE)), target(m(c.FABRIC_HEALTH))], "short",
                  "Each GPU's registration with the NVSwitch fabric manager: state (completed when registered), "
                  "status (0: success) and clique, and the fabric health mask (0: healthy). GPUs without NVSwitch "
                  "fabric show nothing.", merge=True, hide=("cluster", "node", "uuid", "Value #A"),
                  rename={"Value #B": "status", "Value #C": "clique", "Value #D": "health mask"}), 24, 6)

    L.row("Topology")
    L.add(k.table("GPU topology", [target(m(c.TOPOLOGY_NVLINK))], "short",
                  "Per pair of GPUs (nvidia-smi topo -m as a table): the NVLink links between them (0: none), the "
                  "closest path (nvlink, nvswitch, or the PCIe path) and the PCIe path itself: pcie_switch (PIX), "
                  "pcie_switches (PXB), host_bridge (PHB), numa_node (same socket), system (across sockets).",
                  hide=("cluster", "node", "uuid", "peer_uuid"), rename={"Value": "NVLink links"}), 16, 8)
    L.add(k.table("NUMA node and NVLink domain", [target(m(c.NUMA_NODE)), target(m(c.NVLINK_DOMAIN))], "short",
                  "Each GPU's NUMA node (CPU socket) and NVLink domain (the lowest GPU index it shares NVLink "
                  "with): a multi-GPU job wants GPUs of one domain, and its data loaders on their socket.",
                  merge=True, hide=("cluster", "node", "uuid"),
                  rename={"Value #A": "NUMA node", "Value #B": "NVLink domain"}), 8, 8)
    L.add(k.table("CPU affinity", [target(m(c.CPU_AFFINITY))], "short",
                  "The CPUs closest to each GPU: pin a GPU's data loaders there.",
                  hide=("cluster", "node", "uuid", "Value")), 24, 6)

    L.row("MIG")
    L.add(k.table("MIG devices", [target(m(c.MIG_INFO)), target(m(c.MIG_MEMORY_TOTAL))], "bytes",
                  "GPU instances and compute instances, with profile and memory.", merge=True,
                  hide=("cluster", "node", "Value #A"), rename={"Value #B": "memory"}), 12, 6)
    L.add(k.state_timeline("MIG mode", [target(m(c.MIG_MODE), GPU), target(m(c.MIG_PENDING), GPU + " pending")],
                           "short", "1 while MIG mode is enabled, and the mode pending for the next reset.",
                           thresholds=[{"color": "text", "value": None}, {"color": "blue", "value": 1}]), 12, 6)
    MIG = GPU + " GI {{gpu_instance_id}} CI {{compute_instance_id}}"
    L.add(k.timeseries("MIG memory used", [target(m(c.MIG_MEMORY_USED), MIG)], "bytes",
                       "Memory used per MIG device.", min=0), 8, 7)
    L.add(k.table("MIG BAR1 and SMs", [target(m(c.MIG_BAR1_USED)), target(m(c.MIG_BAR1_TOTAL)),
                                       target(m(c.MIG_SMS))], "short",
                  "BAR1 aperture in use and in total, and streaming multiprocessors, per MIG device.", merge=True,
                  hide=("cluster", "node", "uuid"),
                  rename={"Value #A": "BAR1 used", "Value #B": "BAR1 total", "Value #C": "SMs"}), 8, 7)
    for metric in c.MIG_GPM_METRICS.values():
        L.add(k.timeseries("MIG " + _title(metric), [target(m(metric), MIG)], "percentunit", metric.help,
                           min=0, max=1), 8, 7)

    L.row("Processes")
    L.add(k.table("Processes", [target(m(c.PROCESS_MEMORY))], "bytes",
                  "Processes on the GPUs and their device memory (opt-in family: --processes).",
                  hide=("cluster", "node", "uuid"), rename={"Value": "memory"}), 12, 8)
    L.add(k.timeseries("Process SM utilization", [target(m(c.PROCESS_SM), GPU + " pid {{pid}}")], "percentunit",
                       "SM utilization per process.", min=0, max=1), 12, 8)

    L.row("XID errors")
    L.add(k.timeseries("XID errors", [target(rate(m(c.XID_ERRORS), "increase"), GPU + " XID {{xid}}")], "short",
                       "XID errors reported by the driver, per code.", bars=True, stack=True, min=0), 12, 7)
    L.add(k.table("XID history", [target(m(c.XID_ERRORS)), target(f"{m(c.XID_LAST_SEEN)} * 1000")],
                  "short", "Count of each XID code per GPU since the exporter started, and when it was last seen.",
                  merge=True, hide=("cluster", "node"), rename={"Value #A": "count", "Value #B": "last seen"},
                  overrides=[{"matcher": {"id": "byName", "options": "last seen"},
                              "properties": [{"id": "unit", "value": "dateTimeAsIso"}]}]), 12, 7)
    L.add(k.timeseries("Kernel-log XIDs", [target(rate(m(c.KERNEL_XID_ERRORS), "increase"), GPU + " XID {{xid}}")],
                       "short", "NVRM Xid lines in the kernel log, per GPU and code: a second source beside the "
                       "NVML events (also XIDs from while the exporter was down). GpuXidFromLogs fires on those "
                       "NVML did not count.", bars=True, stack=True, min=0), 12, 7)
    L.add(k.timeseries("Kernel-log driver messages", [target(rate(m(c.KERNEL_LOG_MATCHES), "increase"),
                                                             GPU + " {{pattern}}")], "short",
                       "Kernel-log lines matched by the log-pattern catalog (Xid, ECC, NVLink/fabric), per GPU "
                       "and pattern.", bars=True, stack=True, min=0), 12, 7)

    variables = [
        k.variable("cluster", f"label_values({c.GPUS_EXPECTED.name}, cluster)", "Cluster"),
        k.variable("node", f"label_values({c.GPUS_EXPECTED.name}{{{C}}}, node)", "Node", multi=False),
        k.variable("gpu", f"label_values({sel(c.GPU_INFO, C, N)}, gpu)", "GPU"),
    ]
    links = [k.dashboard_link("Fleet overview", "fleet"), k.dashboard_link("Training job", "training"),
             k.dashboard_link("Inference service", "inference"), k.dashboard_link("Exporter health", "exporter")]
    return k.dashboard("gpuobs / Node", "node",
                       "Every metric family of one node's GPUs: utilization, profiling, memory, power, thermal, "
                       "clocks and throttling, ECC, PCIe, NVLink, MIG, processes and XID errors.",
                       L, variables, links)
