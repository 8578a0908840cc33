"""The alert pack and its recording rules, defined once in Python over catalog names.

Thresholds and windows live in `Thresholds`; `FAST` is the same pack with seconds instead of
minutes, for the demo and end-to-end tests. Recording rules are named `level:metric:operations`
and are the contract that dashboards and alerts both read.

Health inputs (a target's `up`, NVML, a GPU, a collector, the XID watcher) can flap: bad every other
scrape, or one scrape in five, for hours. A plain `for:` restarts at every good scrape and never
fires on those, so health alerts read their input over windows (`_unreliable`): bad now, or bad in
more than `flap_share` of the last `long_window`'s samples and at least once in the last
`for_medium`. One failed scrape, or an exporter restart (one or two), stays under both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .. import catalog as c

# Where on-call finds docs/runbooks/<Alert>.md: the runbook_url annotation is "<base>/<Alert>.md". The
# project's repository; point it at your own copy (a wiki, an internal Git host) with
# `gpuobs alerts build --runbook-base-url URL` or GPUOBS_RUNBOOK_BASE_URL.
DEFAULT_RUNBOOK_BASE = "https://github.com/gpuobs/gpuobs/blob/main/docs/runbooks"


def check_runbook_base(url: str) -> str:
    """The runbook base URL without its trailing slash; ValueError unless it is an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment \
            or any(ch.isspace() for ch in url):
        raise ValueError(f"runbook base must be an absolute http(s) URL without query or fragment, not {url!r}")
    return url.rstrip("/")


SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Thresholds:
    """Every tunable of the pack, in one place. Durations are Prometheus duration strings."""
    profile: str = "default"
    eval_interval: str = "30s"
    rate_window: str = "5m"  # rate()/increase() windows for counters
    long_window: str = "1h"
    baseline_window: str = "6h"  # step-time regression baseline
    for_now: str = "1m"  # hardware states that matter at once
    for_short: str = "5m"
    for_medium: str = "15m"
    for_idle: str = "30m"  # allocated-but-idle
    for_long: str = "30m"  # drops of telemetry: recurring this long
    keep_firing: str = "15m"  # flapping inputs (throttle bits, XIDs) keep an alert up this long
    flap_share: float = 0.1  # a health input bad in more than this share of long_window's samples flaps
    gpu_timeout_share: float = 0.05  # sampling passes in which a GPU missed its deadline
    temp_margin_c: float = 5.0  # alert this close to the GPU's own slowdown threshold
    idle_utilization: float = 0.01
    allocated_memory_bytes: float = 1024 ** 3  # memory in use that means "someone holds this GPU"
    ecc_corrected_per_s: float = 100 / 3600  # corrected ECC errors per second (100/h)
    nvlink_errors_per_s: float = 1.0
    pcie_replays_per_s: float = 1.0
    pcie_busy_utilization: float = 0.5  # PCIe downshifts at idle to save power: check only when busy
    training_stall: str = "10m"
    step_regression: float = 1.2  # between the 1.1x noise it must ignore and the 1.3x slowdown it must catch
    data_wait_share: float = 0.3
    checkpoint_seconds: float = 600.0
    straggler: float = 1.2  # a rank's compute per step over the mean of the job's other ranks
    inference_p99_seconds: float = 5.0
    inference_error_ratio: float = 0.05
    exporter_job: str = "gpuobs"
    exporter_daemonset: str = "gpuobs-exporter"  # exporters/kubernetes/daemonset.yaml, as kube-state-metrics names it
    runbook_base: str = DEFAULT_RUNBOOK_BASE  # absolute http(s) URL of docs/runbooks

    def __post_init__(self):
        object.__setattr__(self, "runbook_base", check_runbook_base(self.runbook_base))

    def runbook_url(self, alert: str) -> str:
        return f"{self.runbook_base}/{alert}.md"


DEFAULT = Thresholds()
FAST = Thresholds(profile="fast", eval_interval="1s", rate_window="20s", long_window="1m", baseline_window="2m",
                  for_now="2s", for_short="5s", for_medium="10s", for_idle="15s", for_long="15s", keep_firing="10s",
                  training_stall="20s", checkpoint_seconds=2.0)
PROFILES = {"default": DEFAULT, "fast": FAST}


@dataclass(frozen=True)
class Record:
    """A recording rule; group "recording-links" holds those that read per-link NVLink series (72 to
    108 per GPU), in a group of their own so that on a big fleet they never delay the others."""
    record: str
    expr: str
    group: str = "recording"


@dataclass(frozen=True)
class Alert:
    """One alert. scope says what it is about (gpu, node, job, service, cluster) and drives
    inhibition; family groups warnings under the critical alert of the same kind."""
    name: str
    group: str
    expr: str
    for_: str
    severity: str
    scope: str
    family: str
    summary: str
    description: str
    keep_firing_for: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)


GPU = "{{ $labels.node }} GPU {{ $labels.gpu }} ({{ $labels.uuid }})"  # identity in descriptions
COMPUTE_PER_STEP = "job_id_rank:gpuobs_training_compute_seconds:per_step"
STRAGGLER_RATIO = "job_id_rank:gpuobs_training_compute_seconds:ratio_to_others"
DATA_WAIT_RATIO = "job_id_rank:gpuobs_training_data_wait:ratio"
MFU_RATIO = "job_id_rank:gpuobs_training_mfu:ratio"
GPU_BY = "cluster, node, instance, gpu, uuid"


def recording_rules(t: Thresholds) -> list[Record]:
    """Fleet aggregates read by dashboards (and cheap to query on thousands of GPUs)."""
    w = t.rate_window
    reason = f"{c.CLOCK_EVENT_ACTIVE.name}"
    return [
        Record("cluster_node:gpuobs_gpus_expected:sum", f"sum by (cluster, node) ({c.GPUS_EXPECTED.name})"),
        Record("cluster_node:gpuobs_gpus_present:sum", f"sum by (cluster, node) ({c.GPUS_PRESENT.name})"),
        Record("cluster:gpuobs_gpus_expected:sum", "sum by (cluster) (cluster_node:gpuobs_gpus_expected:sum)"),
        Record("cluster:gpuobs_gpus_present:sum", "sum by (cluster) (cluster_node:gpuobs_gpus_present:sum)"),
        Record("cluster:gpuobs_gpus_lost:count", f"count by (cluster) ({c.GPU_UP.name} == 0)"),
        Record("cluster_node:gpuobs_gpu_utilization_ratio:avg", f"avg by (cluster, node) ({c.UTILIZATION.name})"),
        Record("cluster:gpuobs_gpu_utilization_ratio:avg", f"avg by (cluster) ({c.UTILIZATION.name})"),
        Record("cluster:gpuobs_gpu_sm_active_ratio:avg", f"avg by (cluster) ({c.GPM_METRICS[2].name})"),
        Record("cluster_node:gpuobs_gpu_power_usage_watts:sum", f"sum by (cluster, node) ({c.POWER_USAGE.name})"),
        Record("cluster:gpuobs_gpu_power_usage_watts:sum", f"sum by (cluster) ({c.POWER_USAGE.name})"),
        Record("cluster:gpuobs_gpu_power_limit_watts:sum", f"sum by (cluster) ({c.POWER_LIMIT.name})"),
        Record("cluster_reason:gpuobs_gpu_clock_event_reason_active:sum",
               f"sum by (cluster, reason) ({reason}{{reason!=\"gpu_idle\"}})"),
        Record("cluster:gpuobs_gpu_temperature_celsius:max", f"max by (cluster) ({c.TEMPERATURE.name})"),
        Record("cluster_node:gpuobs_gpu_temperature_celsius:max", f"max by (cluster, node) ({c.TEMPERATURE.name})"),
        # Per node, so the fleet dashboard's node filter still applies: per-link NVLink series are
        # 108 per H100, and over 6 h on thousands of GPUs their raw rates take seconds to query.
        *[Record(f"cluster_node:{m.exposed_name.removesuffix('_total')}:rate",
                 f"sum by (cluster, node) (rate({m.exposed_name}[{w}]))",
                 "recording-links" if "link" in m.labels else "recording")
          for m in (c.NVLINK_TX, c.NVLINK_RX, c.PCIE_TX, c.PCIE_RX, c.PCIE_REPLAYS)],
        Record("cluster_node_error_type:gpuobs_gpu_nvlink_errors:rate",
               f"sum by (cluster, node, error_type) (rate({c.NVLINK_ERRORS.exposed_name}[{w}]))", "recording-links"),
        Record("cluster_node:gpuobs_gpu_nvlink_links_down:count",
               f"count by (cluster, node) ({c.NVLINK_UP.name} == 0)", "recording-links"),
        *[Record(f"cluster_node:{m.name}:sum", f"sum by (cluster, node) ({m.name})")
          for m in (c.REMAP_PENDING, c.REMAP_FAILURE)],
        Record("cluster_node:gpuobs_gpus_pcie_degraded:count",
               f"count by (cluster, node) ({c.PCIE_GENERATION.name} < on ({GPU_BY}) {c.PCIE_MAX_GENERATION.name}"
               f" or {c.PCIE_WIDTH.name} < on ({GPU_BY}) {c.PCIE_MAX_WIDTH.name})"),
        Record("uuid:gpuobs_gpu_allocated:bool",
               f"{c.MEMORY_USED.name} > bool {t.allocated_memory_bytes:g}"),
        Record("cluster:gpuobs_gpus_idle:count",
               f"count by (cluster) (max_over_time({c.UTILIZATION.name}[{t.for_idle}]) <= {t.idle_utilization:g})"),
        Record("cluster:gpuobs_gpus_allocated_idle:count",
               f"count by (cluster) ((max_over_time({c.UTILIZATION.name}[{t.for_idle}]) <= {t.idle_utilization:g})"
               f" and on ({GPU_BY}) uuid:gpuobs_gpu_allocated:bool == 1)"),
        # a series born within the window (its first XID) counts with its value: increase() misses it
        Record("cluster_xid:gpuobs_gpu_xid_errors:increase",
               f"sum by (cluster, xid) (increase({c.XID_ERRORS.exposed_name}[{t.long_window}]) or "
               f"({c.XID_ERRORS.exposed_name} unless {c.XID_ERRORS.exposed_name} offset {t.long_window}))"),
        Record("cluster:gpuobs_gpu_ecc_uncorrected:increase",
               f"sum by (cluster) (increase({c.ECC_ERRORS.exposed_name}{{error_type=\"uncorrected\","
               f"counter_type=\"volatile\"}}[{t.long_window}]))"),
        # Step-time quantiles are computed exactly in each rank's process over its recent steps
        # (gpuobs.instrument.quantiles): histogram_quantile over coarse buckets missed a 1.8x
        # regression and doubled on an 8 % one. One series per rank: max by only drops scrape labels.
        *[Record(f"job_id_rank:{c.STEP_DURATION.name}:p{q}",
                 f'max by (job_id, rank) ({c.STEP_QUANTILE.name}{{quantile="{q / 100:g}"}})') for q in (50, 99)],
        Record(f"job_id:{c.STEP_DURATION.name}:p50",
               f"quantile by (job_id) (0.5, job_id_rank:{c.STEP_DURATION.name}:p50)"),
        Record("job_id:gpuobs_training_tokens:rate",
               f"sum by (job_id) (rate({c.TOKENS_TRAINED.exposed_name}[{w}]))"),
        Record("job_id:gpuobs_training_samples:rate",
               f"sum by (job_id) (rate({c.SAMPLES_TRAINED.exposed_name}[{w}]))"),
        # Straggler: in a synchronous job every rank's step takes as long as the slowest rank's, so
        # compare what differs, the compute time per step (step less data and collective waits)...
        Record(COMPUTE_PER_STEP, f"sum by (job_id, rank) (rate({c.COMPUTE.exposed_name}[{w}])) / "
                                 f"sum by (job_id, rank) (rate({c.STEPS.exposed_name}[{w}]))"),
        # ...with the mean of the *other* ranks: the job's median is the mean with 2 ranks, which
        # hides a 1.3x skew (2 * 1.3 / 2.3 = 1.13); leaving the rank out is exact for 2 ranks and robust
        # for 64. Jobs of one rank have no others and no ratio.
        Record(STRAGGLER_RATIO, f"{COMPUTE_PER_STEP} / ((sum by (job_id) ({COMPUTE_PER_STEP}) - on (job_id) "
                                f"group_right {COMPUTE_PER_STEP}) / on (job_id) group_left () "
                                f"((count by (job_id) ({COMPUTE_PER_STEP}) > 1) - 1))"),
        # Shares of wall time from counters over the window, not the last step's ratio
        Record(DATA_WAIT_RATIO, f'sum by (job_id, rank) (rate({c.BADPUT.exposed_name}{{cause="data_wait"}}[{w}]))'),
        Record("job_id:gpuobs_training_data_wait:ratio", f"avg by (job_id) ({DATA_WAIT_RATIO})"),
        Record("job_id_rank:gpuobs_training_goodput:ratio",
               f"sum by (job_id, rank) (rate({c.GOODPUT.exposed_name}[{w}]))"),
        Record(MFU_RATIO, f"sum by (job_id, rank) (rate({c.FLOPS.exposed_name}[{w}]))"
               f" / max by (job_id, rank) ({c.PEAK_FLOPS.name})"),
        *[Record(f"model:{m.name}:p99", f'max by (gen_ai_request_model) ({q.name}{{quantile="0.99"}})')
          for m, q in ((c.REQUEST_DURATION, c.REQUEST_QUANTILE), (c.TIME_TO_FIRST_TOKEN, c.TTFT_QUANTILE))],
        Record("model:gen_ai_server_requests:rate",
               f"sum by (gen_ai_request_model) (rate({c.REQUEST_DURATION.name}_count[{w}]))"),
    ]


def _reason(reason: str) -> str:
    return f'{c.CLOCK_EVENT_ACTIVE.name}{{reason="{reason}"}} == 1'


def _xid(xids: str, t: Thresholds) -> str:
    # The event's own time, not only the counter: after an exporter restart an XID's series are gone
    # until it recurs, and come back at 1, so increase() sees nothing and a series "new within the
    # window" may well have existed before the restart. gpuobs_gpu_xid_last_seen_timestamp_seconds
    # is the Unix time of the last event, whatever came before; the counter covers a node clock
    # running more than rate_window behind Prometheus's.
    seen = f'{c.XID_LAST_SEEN.name}{{xid=~"{xids}"}}'
    count = f'{c.XID_ERRORS.exposed_name}{{xid=~"{xids}"}}'
    return f"time() - {seen} < {_seconds(t.rate_window):g} or increase({count}[{t.rate_window}]) > 0"


def _unreliable(sel: str, bad: int, t: Thresholds) -> str:
    """A 0/1 health gauge that is `bad` now, or flaps: bad in more than flap_share of its samples over
    long_window and at least once in the last for_medium, on a series that is there now and was
    for_medium ago (a new target's first failed scrapes are no share of an hour). It stays true up to
    for_medium after the last bad sample of a flapping input, and resolves at once when the series
    goes (the exporter down, the target removed: other alerts' cases)."""
    if bad == 0:
        share = f"avg_over_time({sel}[{t.long_window}]) < {1 - t.flap_share:g}"
        recent = f"min_over_time({sel}[{t.for_medium}]) == 0"
    else:
        share = f"avg_over_time({sel}[{t.long_window}]) > {t.flap_share:g}"
        recent = f"max_over_time({sel}[{t.for_medium}]) == 1"
    return (f"{sel} == {bad} or {share} and {recent} and {sel} and "
            f"present_over_time({sel}[{t.long_window}] offset {t.for_medium})")


def _gpu_unusable(t: Thresholds) -> tuple[str, str]:
    """(GpuLost, GpuUnhealthy): one GPU down (gpuobs_gpu_up 0, now or flapping) pages once, by its reason
    (gpuobs_gpu_unhealthy, there only while it is unusable): GpuLost for `lost`, or no reason at all
    (an exporter without the metric); GpuUnhealthy, with the reason, for the others. A GPU seen lost
    within for_medium stays GpuLost whatever other reason it also gave."""
    down = _unreliable(c.GPU_UP.name, 0, t)

    def seen(match: str) -> str:
        return f'max_over_time({c.GPU_UNHEALTHY.name}{{reason{match}"lost"}}[{t.for_medium}])'
    other = f"({seen('!=')} unless on ({GPU_BY}) {seen('=')})"
    return f"({down}) unless on ({GPU_BY}) {other}", f"{other} and on ({GPU_BY}) ({down})"


def alerts(t: Thresholds) -> list[Alert]:
    """The pack. Per-GPU descriptions carry node, index and UUID; every alert has an explicit for."""
    w = t.rate_window
    a = []
    add = a.append
    # ---- throttling and thermals
    add(Alert("GpuHwThermalSlowdown", "gpu", _reason("hw_thermal_slowdown"), t.for_now, "critical", "gpu",
              "thermal", "GPU clocks cut by the hardware thermal slowdown.",
              f"{GPU} is in HW thermal slowdown: its clocks are held down to protect it.", t.keep_firing))
    add(Alert("GpuSwThermalSlowdown", "gpu", _reason("sw_thermal_slowdown"), t.for_short, "warning", "gpu",
              "thermal", "GPU clocks reduced by the driver to stay under its thermal limit.",
              f"{GPU} has been in SW thermal slowdown for {t.for_short}.", t.keep_firing))
    add(Alert("GpuTemperatureNearSlowdown", "gpu",
              f"{c.TEMPERATURE.name} >= on ({GPU_BY}) ({c.SLOWDOWN_TEMPERATURE.name} - {t.temp_margin_c:g})",
              t.for_short, "warning", "gpu", "thermal", "GPU temperature close to its slowdown threshold.",
              f"{GPU} is at {{{{ $value }}}} °C, within {t.temp_margin_c:g} °C of its own slowdown threshold."))
    add(Alert("GpuMemoryTemperatureNearMax", "gpu",
              f"{c.MEMORY_TEMPERATURE.name} >= on ({GPU_BY}) ({c.MEMORY_MAX_TEMPERATURE.name} - {t.temp_margin_c:g})",
              t.for_short, "warning", "gpu", "thermal", "GPU memory temperature close to its maximum.",
              f"{GPU} memory is at {{{{ $value }}}} °C, within {t.temp_margin_c:g} °C of its maximum operating "
              "temperature."))
    add(Alert("GpuHwPowerBrake", "gpu", _reason("hw_power_brake_slowdown"), t.for_now, "critical", "gpu", "power",
              "GPU clocks cut by the hardware power brake (external power signal).",
              f"{GPU} is in HW power brake slowdown: the node's power supply asked it to slow down.",
              t.keep_firing))
    add(Alert("GpuHwSlowdown", "gpu", _reason("hw_slowdown"), t.for_short, "warning", "gpu", "power",
              "GPU clocks cut by a hardware slowdown.", f"{GPU} has been in HW slowdown for {t.for_short}.",
              t.keep_firing))
    add(Alert("GpuSwPowerCapSustained", "gpu", _reason("sw_power_cap"), t.for_medium, "warning", "gpu", "power",
              "GPU held at its power limit for a long time.",
              f"{GPU} has been capped at its power limit for {t.for_medium}: work runs slower than it could.",
              t.keep_firing))
    # ---- allocation
    add(Alert("GpuAllocatedIdle", "gpu",
              f"max_over_time({c.UTILIZATION.name}[{t.for_idle}]) <= {t.idle_utilization:g}"
              f" and on ({GPU_BY}) {c.MEMORY_USED.name} > {t.allocated_memory_bytes:g}",
              t.for_short, "warning", "gpu", "utilization", "GPU allocated but idle.",
              f"{GPU} holds memory (a process, pod or job has it) but has done no work for {t.for_idle}."))
    add(Alert("GpuFleetIdleCapacity", "meta", "cluster:gpuobs_gpus_idle:count > 0", t.for_idle, "info",
              "cluster", "utilization", "GPUs in the fleet are idle.",
              "{{ $value }} GPUs of cluster {{ $labels.cluster }} have been idle for " + t.for_idle + "."))
    # ---- XID by tier (counters: alerts resolve once no new XID arrives)
    add(Alert("GpuXidRebootRequired", "gpu", _xid("79", t), "0s", "critical", "gpu", "xid",
              "GPU fell off the bus (XID 79): the node needs a reboot.",
              f"{GPU} reported XID {{{{ $labels.xid }}}}: reboot the node.", t.keep_firing))
    add(Alert("GpuXidResetRequired", "gpu", _xid("48|62|63|64|95|119|120", t), "0s", "critical", "gpu", "xid",
              "GPU reported an XID that needs a GPU reset.",
              f"{GPU} reported XID {{{{ $labels.xid }}}}: drain it and reset the GPU.", t.keep_firing))
    add(Alert("GpuXidApplicationError", "gpu", _xid("94|13|31|43|45", t), "0s", "warning", "gpu", "xid",
              "GPU reported an application-level XID: restart the application.",
              f"{GPU} reported XID {{{{ $labels.xid }}}} (contained error): restart the affected application.",
              t.keep_firing))
    add(Alert("GpuXidNvlinkError", "gpu", _xid("74", t), "0s", "warning", "gpu", "xid",
              "GPU reported an NVLink error (XID 74).",
              f"{GPU} reported XID 74: check its NVLink links.", t.keep_firing))
    # ---- memory errors
    add(Alert("GpuEccUncorrectable", "gpu",
              f'increase({c.ECC_ERRORS.exposed_name}{{error_type="uncorrected",counter_type="volatile"}}[{w}]) > 0',
              "0s", "critical", "gpu", "memory", "Uncorrectable ECC errors on a GPU.",
              f"{GPU} had {{{{ $value | humanize }}}} uncorrectable ECC errors in the last {w}.", t.keep_firing))
    add(Alert("GpuEccCorrectedRate", "gpu",
              f'rate({c.ECC_ERRORS.exposed_name}{{error_type="corrected",counter_type="volatile"}}[{t.long_window}])'
              f" > {t.ecc_corrected_per_s:g}", t.for_medium, "warning", "gpu", "memory",
              "High rate of corrected ECC errors on a GPU.",
              f"{GPU} corrects {{{{ $value | printf \"%.3g\" }}}} ECC errors per second."))
    add(Alert("GpuRowRemapPending", "gpu", f"{c.REMAP_PENDING.name} == 1", t.for_short, "warning", "gpu",
              "memory", "A GPU has a row remap pending: it needs a reset.",
              f"{GPU} has a DRAM row remap pending; it takes effect at the next GPU reset."))
    add(Alert("GpuRowRemapFailure", "gpu", f"{c.REMAP_FAILURE.name} == 1", t.for_now, "critical", "gpu", "memory",
              "A GPU failed to remap a row: it needs service.",
              f"{GPU} could not remap a failing DRAM row: take it out of service."))
    # ---- interconnects
    add(Alert("GpuNvlinkDown", "links", f"{c.NVLINK_UP.name} == 0", t.for_short, "critical", "gpu", "nvlink",
              "An NVLink link is down.", f"{GPU} NVLink link {{{{ $labels.link }}}} is down."))
    add(Alert("GpuNvlinkErrorRate", "links", f"rate({c.NVLINK_ERRORS.exposed_name}[{w}]) > {t.nvlink_errors_per_s:g}",
              t.for_short, "warning", "gpu", "nvlink", "NVLink errors are rising.",
              f"{GPU} link {{{{ $labels.link }}}} has {{{{ $value | humanize }}}} {{{{ $labels.error_type }}}} "
              "errors/s."))
    add(Alert("GpuPcieLinkDegraded", "gpu",
              f"({c.PCIE_GENERATION.name} < on ({GPU_BY}) {c.PCIE_MAX_GENERATION.name}"
              f" or {c.PCIE_WIDTH.name} < on ({GPU_BY}) {c.PCIE_MAX_WIDTH.name})"
              f" and on ({GPU_BY}) {c.UTILIZATION.name} > {t.pcie_busy_utilization:g}",
              t.for_medium, "warning", "gpu", "pcie", "PCIe link below its maximum generation or width under load.",
              f"{GPU} runs its PCIe link below its maximum while busy."))
    add(Alert("GpuPcieReplayRate", "gpu", f"rate({c.PCIE_REPLAYS.exposed_name}[{w}]) > {t.pcie_replays_per_s:g}",
              t.for_short, "warning", "gpu", "pcie", "PCIe replays are rising.",
              f"{GPU} has {{{{ $value | humanize }}}} PCIe replays per second."))
    # ---- presence and health of the node's GPUs and of the exporter
    lost, unhealthy = _gpu_unusable(t)
    add(Alert("GpuLost", "gpu", lost, t.for_now, "critical", "gpu", "presence",
              "A GPU stopped answering NVML.",
              f"{GPU} is lost: it no longer answers NVML, now or in more than "
              f"{t.flap_share:.0%} of the last {t.long_window}'s samples."))
    add(Alert("GpuUnhealthy", "gpu", unhealthy, t.for_now, "critical", "gpu", "presence",
              "A GPU is unusable: it needs a reset, its reads time out, or it cannot be read.",
              f"{GPU} is unusable ({{{{ $labels.reason }}}}), now or in more than {t.flap_share:.0%} of the "
              f"last {t.long_window}'s samples: its metrics are withheld meanwhile."))
    add(Alert("GpuSamplingTimeouts", "gpu",
              f"rate({c.GPU_TIMEOUTS.exposed_name}[{t.long_window}]) / ignoring (gpu, uuid) group_left "
              f"rate({c.SAMPLES.exposed_name}[{t.long_window}]) > {t.gpu_timeout_share:g} "
              f"and {c.GPU_TIMEOUTS.exposed_name}",  # not for an hour after its exporter went (other alerts' case)
              t.for_medium, "warning", "gpu", "presence", "A GPU's NVML reads keep missing the sampling deadline.",
              f"{GPU} missed the exporter's sampling deadline in {{{{ $value | humanizePercentage }}}} of its "
              f"sampling passes over the last {t.long_window}: its series have gaps."))
    add(Alert("GpuMissing", "node", f"{c.GPUS_PRESENT.name} < {c.GPUS_EXPECTED.name}", t.for_short, "critical",
              "node", "presence", "A node has fewer GPUs than expected.",
              "{{ $labels.node }} has {{ $value }} GPUs, fewer than it should have."))
    add(Alert("NvmlDown", "node", _unreliable(c.NVML_UP.name, 0, t), t.for_short, "critical", "node", "presence",
              "NVML is down on a node.",
              "NVML does not answer on {{ $labels.node }}, now or in more than "
              f"{t.flap_share:.0%} of the last {t.long_window}'s scrapes: no GPU can be read then."))
    up = f'up{{job="{t.exporter_job}"}}'
    add(Alert("GpuExporterDown", "node", _unreliable(up, 0, t), t.for_short, "critical", "node",
              "exporter", "A GPU exporter cannot be scraped.",
              "The gpuobs exporter on {{ $labels.node }} ({{ $labels.instance }}) cannot be scraped, now or in "
              f"more than {t.flap_share:.0%} of the last {t.long_window}'s scrapes."))
    # A target that left service discovery has no `up` at all: compare with the last hour's targets.
    # By node: a restarted pod comes back with another pod name (and maybe address); by instance for
    # targets without a node label. Only while some target is left (else GpuExporterAbsent). A node
    # taken away on purpose resolves once its last scrape is long_window old.
    add(Alert("GpuExporterGone", "node",
              f"max without (pod) (last_over_time({up}[{t.long_window}])) unless on (cluster, node, instance) {up}"
              f' unless on (cluster, node) up{{job="{t.exporter_job}", node!=""}} and on () count({up})',
              t.for_short, "critical", "node", "exporter", "A node's GPU exporter is no longer a scrape target.",
              "The gpuobs exporter on {{ $labels.node }} ({{ $labels.instance }}) left service discovery while "
              f"other exporters are still scraped: the node's GPUs are not monitored (it resolves "
              f"{t.long_window} after its last scrape if the node was removed on purpose)."))
    ds = f'{{daemonset="{t.exporter_daemonset}"}}'
    by_ds = "max by (cluster, namespace, daemonset)"
    add(Alert("GpuExporterPodsUnavailable", "meta",
              f"{by_ds} (kube_daemonset_status_desired_number_scheduled{ds}) - "
              f"{by_ds} (kube_daemonset_status_number_available{ds}) > 0 unless on (cluster, namespace, daemonset) "
              f"changes(kube_daemonset_status_updated_number_scheduled{ds}[{t.rate_window}]) > 0",
              t.for_medium, "critical", "cluster", "exporter", "GPU exporter pods are missing or not ready.",
              "DaemonSet {{ $labels.namespace }}/{{ $labels.daemonset }} has {{ $value }} of its pods unavailable "
              "and no rollout progressing: the GPUs of those nodes are not monitored."))
    add(Alert("GpuExporterAbsent", "meta", f"absent({up})", t.for_short, "critical",
              "cluster", "exporter", "No GPU exporter is being scraped at all.",
              f"Prometheus scrapes no target of job {t.exporter_job}: GPU alerts cannot fire."))
    add(Alert("GpuMetricsStale", "node", _unreliable(c.SNAPSHOT_STALE.name, 1, t), t.for_short, "warning", "node",
              "exporter", "The GPU exporter serves stale data (NVML hangs).",
              "The exporter on {{ $labels.node }} has no fresh snapshot, now or in more than "
              f"{t.flap_share:.0%} of the last {t.long_window}'s scrapes: NVML calls are hanging."))
    add(Alert("GpuExporterCollectorFailing", "node", _unreliable(c.COLLECTOR_SUCCESS.name, 0, t), t.for_medium,
              "warning", "node", "exporter", "A collector of the GPU exporter keeps failing.",
              "The {{ $labels.collector }} collector of the exporter on {{ $labels.node }} fails, now or in more "
              f"than {t.flap_share:.0%} of the last {t.long_window}'s scrapes: its metrics are missing and the "
              "alerts on them cannot fire."))
    add(Alert("GpuXidWatcherDown", "node", _unreliable(c.XID_WATCHER_UP.name, 0, t), t.for_short, "warning",
              "node", "exporter", "The exporter's XID event thread is not running: XIDs may be missed.",
              "The XID watcher of the exporter on {{ $labels.node }} is down, now or in more than "
              f"{t.flap_share:.0%} of the last {t.long_window}'s scrapes: XIDs on this node may be missed."))
    add(Alert("TelemetryLogRecordsDropped", "service",
              f"increase({c.LOGS_DROPPED.exposed_name}[{t.for_medium}]) > 0", t.for_long, "warning", "service",
              "telemetry", "A process keeps dropping its log records.",
              "{{ $labels.job }} target {{ $labels.instance }} dropped {{ $value | humanize }} log records in the "
              f"last {t.for_medium}, and has kept dropping them for {t.for_long}: its Fluentd is down or too slow."))
    # ---- training
    add(Alert("TrainingStalled", "job", f"time() - {c.LAST_STEP.name} > {_seconds(t.training_stall):g}", "0s",
              "critical", "job", "training", "A training rank has made no step progress.",
              "Rank {{ $labels.rank }} of job {{ $labels.job_id }} has not finished a step for "
              + t.training_stall + "."))
    add(Alert("TrainingStepTimeRegression", "job",
              f"job_id:gpuobs_training_step_duration_seconds:p50 > {t.step_regression:g} * "
              f"quantile_over_time(0.5, job_id:gpuobs_training_step_duration_seconds:p50[{t.baseline_window}])",
              t.for_medium, "warning", "job", "training", "Training steps are slower than their own baseline.",
              "Job {{ $labels.job_id }} steps take {{ $value | humanize }} s, over " + f"{t.step_regression:g}"
              + "x its median of the last " + t.baseline_window + "."))
    add(Alert("TrainingDataLoaderBound", "job", f"{DATA_WAIT_RATIO} > {t.data_wait_share:g}", t.for_medium,
              "warning", "job", "training", "Training waits on its data loader.",
              "Rank {{ $labels.rank }} of job {{ $labels.job_id }} spent {{ $value | humanizePercentage }} of the "
              f"last {w} waiting for data."))
    last_seen = f"last_over_time({c.LAST_STEP.name}[{t.long_window}])"
    add(Alert("TrainingRankLost", "job", f"{last_seen} unless on (job_id, rank) {c.LAST_STEP.name} "
              f"and on (job_id) {c.LAST_STEP.name} unless on (job, instance) up == 0", t.for_now, "critical",
              "job", "training", "A rank of a running training job disappeared.",
              "Rank {{ $labels.rank }} of job {{ $labels.job_id }} stopped reporting while other ranks of the job "
              "still run: its process exited or its target was removed."))
    add(Alert("TrainingTargetDown", "job", f"{last_seen} and on (job, instance) up == 0", t.for_now, "critical",
              "job", "training", "A training target cannot be scraped.",
              "Rank {{ $labels.rank }} of job {{ $labels.job_id }} ({{ $labels.instance }}) is still a scrape target "
              "but does not answer: the process crashed or hangs."))
    add(Alert("TrainingSlowCheckpoint", "job",
              f"rate({c.CHECKPOINT_DURATION.name}_sum[{t.long_window}]) / "
              f"rate({c.CHECKPOINT_DURATION.name}_count[{t.long_window}]) > {t.checkpoint_seconds:g}",
              "0s", "warning", "job", "training", "Checkpoints take long.",
              "Job {{ $labels.job_id }} rank {{ $labels.rank }} checkpoints take {{ $value | humanize }} s on "
              "average."))
    add(Alert("TrainingStragglerRank", "job", f"{STRAGGLER_RATIO} > {t.straggler:g}", t.for_medium, "warning",
              "job", "training", "One rank computes slower than the rest of its job.",
              "Rank {{ $labels.rank }} of job {{ $labels.job_id }} computes {{ $value | printf \"%.2f\" }}x as long per "
              "step as the job's other ranks, which wait for it in their collectives."))
    # ---- inference
    add(Alert("InferenceLatencyHigh", "service", f"model:gen_ai_server_request_duration_seconds:p99 > "
              f"{t.inference_p99_seconds:g}", t.for_short, "warning", "service", "inference",
              "Inference p99 latency is high.",
              "Model {{ $labels.gen_ai_request_model }} p99 latency is {{ $value | humanize }} s."))
    add(Alert("InferenceErrorRate", "service",
              f"sum by (gen_ai_request_model) (rate({c.INFERENCE_ERRORS.exposed_name}[{w}])) / "
              f"model:gen_ai_server_requests:rate > {t.inference_error_ratio:g}", t.for_short, "critical", "service",
              "inference", "Inference requests are failing.",
              "{{ $value | humanizePercentage }} of requests to {{ $labels.gen_ai_request_model }} fail."))
    # ---- meta
    add(Alert("Watchdog", "meta", "vector(1)", "0s", "none", "cluster", "meta",
              "Always firing: proves the alerting pipeline works end to end.",
              "This alert always fires. If it stops arriving, Prometheus or Alertmanager is broken."))
    return a


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]
