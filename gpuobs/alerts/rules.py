"""The alert pack and its recording rules, defined once in Python over catalog names.

Thresholds and windows live in `Thresholds`; `FAST` is the same pack with seconds instead of
minutes, for the demo and end-to-end tests. Alerts are data (`Alert`, keyword fields), one function
per family (FAMILIES); their rule group follows from their scope. The recording rules they and the
dashboards read are named objects in gpuobs.records; names come from there and from the catalog.

Health inputs (a target's `up`, NVML, a GPU, a collector, the XID watcher) can flap: bad every other
scrape, or one scrape in five, for hours. A plain `for:` restarts at every good scrape and never
fires on those, so health alerts read their input over windows (`_unreliable`): bad now, or bad in
more than `flap_share` of the last `long_window`'s samples and at least once in the last
`for_medium`. One failed scrape, or an exporter restart (one or two), stays under both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from urllib.parse import urlsplit

from .. import catalog as c
from .. import logpatterns as lp
from .. import records
from ..records import GPU_BY, per_link

# Where on-call finds docs/runbooks/<Alert>.md: the runbook_url annotation is "<base>/<Alert>.md". The
# project's repository; point it at your own copy (a wiki, an internal Git host) with
# `gpuobs generate --runbook-base-url URL` or GPUOBS_RUNBOOK_BASE_URL.
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
    # degradation trends: a per-GPU error rate over trend_step, its median over the last trend_window
    # against trend_factor times its median over the trend_baseline that ended trend_baseline ago
    # (medians: one burst is no trend; that far back: a rate doubling over 6 h is 1.4x what it was
    # just before the last 2 h, noise up to 1.25x), and at least a floor per second (a rate up from 0
    # to next to nothing is no trend either)
    trend_step: str = "1h"
    trend_window: str = "2h"
    trend_baseline: str = "6h"
    trend_factor: float = 1.5
    ecc_corrected_trend_per_s: float = 10 / 3600  # 10 corrected ECC errors an hour
    pcie_replays_trend_per_s: float = 0.01
    nvlink_errors_trend_per_s: float = 0.01
    remap_banks_rise: int = 2  # banks newly low on (or out of) spare rows within trend_baseline
    temp_trend_window: str = "1h"  # the temperature's pace, fitted over this window...
    temp_trend_horizon: str = "3h"  # ...reaches the slowdown threshold within this
    power_brake_episodes: int = 3  # times in the HW power brake within power_brake_window
    power_brake_window: str = "6h"
    # log patterns: a job's CUDA OOMs within for_long (one that its retry logic handled is no alert)
    oom_repeats_job: int = 3  # OOM lines of all its ranks together
    oom_repeats_rank: int = 2  # OOM lines of one rank, across its restarts
    # weekly review (gpuobs.records' WEEKLY_GROUP): MIG right-sizing and fleet reliability over
    # weekly_window, in a rule group of its own evaluated every weekly_interval (its step)
    weekly_window: str = "7d"
    weekly_interval: str = "5m"
    mig_headroom: float = 0.2  # a GPU's peak memory and SM activity plus this share must fit a MIG profile
    # allocation, use and cost (gpuobs.records' allocation section; gpuobs.report prices with the same):
    # the kube_namespace_labels label naming a namespace's team (kube-state-metrics exports it when its
    # --metric-labels-allowlist allows the namespace label: team -> label_team), and the cost of one
    # GPU-hour in `currency` per GPU model, the first (gpuobs_gpu_info `name` regex, cost) pair that
    # matches (fully, as PromQL matches), else gpu_hour_cost_default. Illustrative defaults, not
    # prices: set your own.
    team_label: str = "label_team"
    gpu_hour_costs: tuple[tuple[str, float], ...] = ((".*(H100|H200).*", 3.0), (".*A100.*", 1.5))
    gpu_hour_cost_default: float = 1.0
    currency: str = "USD"
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
                  training_stall="20s", checkpoint_seconds=2.0, trend_step="5s", trend_window="30s",
                  trend_baseline="1m", temp_trend_window="1m", temp_trend_horizon="2m", power_brake_window="1m",
                  weekly_window="1m", weekly_interval="5s")  # 5s: a few scrapes per step


# rule group per scope: cluster-wide alerts (the watchdog's too) evaluate apart, as "meta"
SCOPE_GROUPS = {"gpu": "gpu", "node": "node", "job": "job", "service": "service", "cluster": "meta"}


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert, as data. scope says what it is about (gpu, node, job, service, cluster) and drives
    inhibition and the rule group; family groups warnings under the critical alert of the same kind.
    for_ and keep_firing_for are Prometheus durations; summary is plain text, description a template
    over the alert's labels and value."""
    name: str
    expr: str
    for_: str
    severity: str
    scope: str
    family: str
    summary: str
    description: str
    keep_firing_for: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def group(self) -> str:
        """The rule group it is evaluated in (gpuobs-<group>): "links" when it reads per-link NVLink
        series (72 to 108 per GPU, apart so that on a big fleet they never delay the others), else
        its scope's group (SCOPE_GROUPS). KeyError for a scope without one."""
        return "links" if per_link(self.expr) else SCOPE_GROUPS[self.scope]


GPU = "{{ $labels.node }} GPU {{ $labels.gpu }} ({{ $labels.uuid }})"  # identity in descriptions


def _reason(reason: str) -> str:
    return f'{c.CLOCK_EVENT_ACTIVE.name}{{reason="{reason}"}} == 1'


def _xid(xids: str, t: Thresholds) -> str:
    # The event's own time, not only the counter: after an exporter restart an XID's series are gone
    # until it recurs, and come back at 1, so increase() sees nothing and a series "new within the
    # window" may well have existed before the restart. XID_LAST_SEEN is the Unix time of the last
    # event, whatever came before; the counter covers a node clock running more than rate_window
    # behind Prometheus's.
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


def _rising(rate: records.Record, floor: float, t: Thresholds) -> str:
    """A per-GPU rate record (per second) rising: its median over the last trend_window over
    trend_factor times its median over the trend_baseline that ended trend_baseline ago, and over
    floor. Medians, so that one burst (up to half the window) is no trend; the value is the recent
    median. No series until the record has trend_baseline of history trend_baseline ago."""
    recent = f"quantile_over_time(0.5, {rate.name}[{t.trend_window}])"
    return (f"{recent} > {t.trend_factor:g} * quantile_over_time(0.5, {rate.name}[{t.trend_baseline}] offset "
            f"{t.trend_baseline}) and {recent} > {floor:g}")


def _temperature_trend(t: Thresholds) -> str:
    """Temperature heading for the GPU's own slowdown threshold within temp_trend_horizon at its pace
    over temp_trend_window and over the last for_medium (a job's start, a step up then flat, has no
    pace of its own after for_medium), while not yet within temp_margin_c of it
    (GpuTemperatureNearSlowdown's case). The value is the predicted temperature, °C."""
    temp, slowdown = c.TEMPERATURE.name, c.SLOWDOWN_TEMPERATURE.name
    horizon = f"{_seconds(t.temp_trend_horizon):g}"
    # per GPU across attribution changes: after a pod change the window holds two series of the GPU
    # (the old pod's and the new), which one-to-one matching refuses for the whole rule
    pace = [records.per_gpu("max", f"predict_linear({temp}[{w}], {horizon})") for w in (t.temp_trend_window, t.for_medium)]
    limit = records.per_gpu("max", slowdown)
    return (f"{pace[0]} >= on ({GPU_BY}) {limit} and on ({GPU_BY}) {pace[1]} >= on ({GPU_BY}) {limit} "
            f"and on ({GPU_BY}) {temp} < on ({records.SAME_SERIES}) ({slowdown} - {t.temp_margin_c:g})")


DEGRADING = "The GPU is degrading: drain it and plan its replacement."  # the degradation alerts' shared idea


def _gpu_unusable(t: Thresholds) -> tuple[str, str]:
    """(GpuLost, GpuUnhealthy): one GPU down (GPU_UP 0, now or flapping) pages once, by its reason
    (GPU_UNHEALTHY, there only while it is unusable): GpuLost for `lost`, or no reason at all
    (an exporter without the metric); GpuUnhealthy, with the reason, for the others. A GPU seen lost
    within for_medium stays GpuLost whatever other reason it also gave."""
    down = _unreliable(c.GPU_UP.name, 0, t)

    def seen(match: str) -> str:
        return f'max_over_time({c.GPU_UNHEALTHY.name}{{reason{match}"lost"}}[{t.for_medium}])'
    other = f"({seen('!=')} unless on ({GPU_BY}) {seen('=')})"
    return f"({down}) unless on ({GPU_BY}) {other}", f"{other} and on ({GPU_BY}) ({down})"



JOB_BY = "cluster, job_id"  # one training job, whatever its ranks, targets and restarts
RANK_BY = "cluster, job_id, rank, node"  # one rank of a job where it runs, whatever its targets and restarts
XID_BY = "cluster, node, gpu, uuid, xid"  # one XID code of one GPU, whatever the target labels (pod, instance)
LINE_BY = "cluster, node, gpu, uuid, pci_bus_id"  # one GPU a kernel-log line names (gpu, uuid empty if none)


def _pattern(counter: c.Metric, name: str) -> str:
    """The selector of one pattern's series of a log-pattern counter (name: a gpuobs.logpatterns pattern;
    KeyError for another)."""
    return f'{counter.exposed_name}{{pattern="{lp.BY_NAME[name].name}"}}'


def _job_lines(name: str, window: str, by: str = JOB_BY) -> str:
    """Lines of log pattern `name` that a job's training processes matched within window, summed by
    `by` (every pattern is exported from 0 by each process). increase() counts across a trainer's
    restarts (its counter back at 0, its series gone and back) and nothing for a counter that
    appears at 0 or stays put."""
    return f"sum by ({by}) (increase({_pattern(c.LOG_PATTERN_MATCHES, name)}[{window}]))"


def _counted(sel: str, by: str, w: str, new: str) -> str:
    """The events a counter counted within window w, summed by `by`, in whole events: the value of a
    series that `sel unless <new>` calls new within the window (the counters of XIDs and kernel-log
    lines appear at their first event, so increase() misses that one; all they count is within the
    window), else increase() of the series (a reset counted: NVML's counter starts again at 0 with
    its exporter)."""
    return f"sum by ({by}) (({sel} unless {new}) or round(increase({sel}[{w}])))"


def _kernel_counted(sel: str, by: str, w: str) -> str:
    """_counted for a kernel-log counter (counted since boot, kept across exporter restarts): a series
    is new only if none of its `by` was there w ago while the node's watcher ran, else an exporter
    start, or a restarted pod with a name of its own, would count every line since boot."""
    return _counted(sel, by, w, f"on ({by}) {sel} offset {w} and on (cluster, node) {c.KERNEL_LOG_UP.name} "
                                f"offset {w} == 1")


def _xid_unseen_by_nvml(t: Thresholds) -> str:
    """XIDs the kernel log counted on a GPU within long_window and NVML's event path did not: more of
    a code than NVML counted, or a code NVML has no series of. NVML's series count from the exporter's
    start, so one new within the window (by all its labels) holds only events within it. The kernel's
    count since boot and go on across exporter restarts, so XIDs while the exporter was down show as
    their rise (_kernel_counted)."""
    w, xe = t.long_window, c.XID_ERRORS.exposed_name
    kernel = _kernel_counted(c.KERNEL_XID_ERRORS.exposed_name, XID_BY, w)
    nvml = _counted(xe, XID_BY, w, f"{xe} offset {w}")
    return f"{kernel} > {nvml} or {kernel} > 0 unless on ({XID_BY}) {nvml}"


def _gpu_lines(name: str, t: Thresholds) -> str:
    """Driver messages of log pattern `name` within rate_window: per GPU from the kernel log (a line
    pattern's series appears at its first line: _kernel_counted), else per node and job from the
    training processes' own logs (no GPU identity; only where the kernel log
    counted none on that node, e.g. with the kernel_log family off)."""
    kernel = f"({_kernel_counted(_pattern(c.KERNEL_LOG_MATCHES, name), LINE_BY, t.rate_window)} > 0)"
    train = _job_lines(name, t.rate_window, "cluster, node, job_id")
    return f"{kernel} or {train} > 0 unless on (cluster, node) {kernel}"


# A GPU named by a kernel-log line, or the node and job whose training logs matched (_gpu_lines)
LINE = ("{{ if $labels.job_id }}job {{ $labels.job_id }} on {{ $labels.node }}{{ else }}"
        + GPU + " at PCI {{ $labels.pci_bus_id }}{{ end }}")


# ---------------------------------------------------------------------------------------------- families
# One function per family, in the pack's order; each returns its alerts for thresholds t.
def thermal(t: Thresholds) -> list[Alert]:
    """Clock-event reasons and temperatures of the GPU and its memory."""
    alert = partial(Alert, family="thermal")
    return [
        alert(name="GpuHwThermalSlowdown", expr=_reason("hw_thermal_slowdown"), for_=t.for_now, severity="critical",
              scope="gpu", summary="GPU clocks cut by the hardware thermal slowdown.",
              description=f"{GPU} is in HW thermal slowdown: its clocks are held down to protect it.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuSwThermalSlowdown", expr=_reason("sw_thermal_slowdown"), for_=t.for_short, severity="warning",
              scope="gpu", summary="GPU clocks reduced by the driver to stay under its thermal limit.",
              description=f"{GPU} has been in SW thermal slowdown for {t.for_short}.", keep_firing_for=t.keep_firing),
        alert(name="GpuTemperatureNearSlowdown",
              expr=f"{c.TEMPERATURE.name} >= on ({records.SAME_SERIES}) ({c.SLOWDOWN_TEMPERATURE.name} - {t.temp_margin_c:g})",
              for_=t.for_short, severity="warning", scope="gpu",
              summary="GPU temperature close to its slowdown threshold.",
              description=f"{GPU} is at {{{{ $value }}}} °C, within {t.temp_margin_c:g} °C of its own slowdown "
                          "threshold."),
        alert(name="GpuMemoryTemperatureNearMax",
              expr=f"{c.MEMORY_TEMPERATURE.name} >= on ({records.SAME_SERIES}) ({c.MEMORY_MAX_TEMPERATURE.name} - "
                   f"{t.temp_margin_c:g})",
              for_=t.for_short, severity="warning", scope="gpu",
              summary="GPU memory temperature close to its maximum.",
              description=f"{GPU} memory is at {{{{ $value }}}} °C, within {t.temp_margin_c:g} °C of its maximum "
                          "operating temperature."),
        alert(name="GpuTemperatureTrendingToSlowdown", expr=_temperature_trend(t), for_=t.for_long,
              severity="warning", scope="gpu",
              summary="GPU temperature climbing towards its slowdown threshold. " + DEGRADING,
              description=f"{GPU} keeps heating up: at its pace over the last {t.temp_trend_window} it reaches "
                          f"{{{{ $value | printf \"%.0f\" }}}} °C within {t.temp_trend_horizon}, at or over its "
                          "own slowdown threshold."),
    ]


def power(t: Thresholds) -> list[Alert]:
    """Clock-event reasons of power: the brake, hardware slowdowns, the power cap."""
    alert = partial(Alert, family="power")
    return [
        alert(name="GpuHwPowerBrake", expr=_reason("hw_power_brake_slowdown"), for_=t.for_now, severity="critical",
              scope="gpu", summary="GPU clocks cut by the hardware power brake (external power signal).",
              description=f"{GPU} is in HW power brake slowdown: the node's power supply asked it to slow down.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuHwSlowdown", expr=_reason("hw_slowdown"), for_=t.for_short, severity="warning", scope="gpu",
              summary="GPU clocks cut by a hardware slowdown.",
              description=f"{GPU} has been in HW slowdown for {t.for_short}.", keep_firing_for=t.keep_firing),
        alert(name="GpuSwPowerCapSustained", expr=_reason("sw_power_cap"), for_=t.for_medium, severity="warning",
              scope="gpu", summary="GPU held at its power limit for a long time.",
              description=f"{GPU} has been capped at its power limit for {t.for_medium}: work runs slower than it "
                          "could.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuPowerBrakeRepeated",
              expr=f'changes({c.CLOCK_EVENT_ACTIVE.name}{{reason="hw_power_brake_slowdown"}}'
                   f"[{t.power_brake_window}]) >= {2 * t.power_brake_episodes - 1}",
              for_="0s", severity="warning", scope="gpu",
              summary="GPU keeps entering the HW power brake. " + DEGRADING,
              description=f"{GPU} entered or left the HW power brake {{{{ $value }}}} times in the last "
                          f"{t.power_brake_window} (at least {t.power_brake_episodes} times in it)."),
    ]


def utilization(t: Thresholds) -> list[Alert]:
    """GPUs held but idle, and idle capacity in the fleet."""
    alert = partial(Alert, family="utilization")
    return [
        alert(name="GpuAllocatedIdle",
              expr=f"{records.idle(t)} and on ({GPU_BY}) {c.MEMORY_USED.name} > {t.allocated_memory_bytes:g}",
              for_=t.for_short, severity="warning", scope="gpu", summary="GPU allocated but idle.",
              description=f"{GPU} holds memory (a process, pod or job has it) but has done no work for "
                          f"{t.for_idle}."),
        alert(name="GpuFleetIdleCapacity", expr=f"{records.CLUSTER_GPUS_IDLE.name} > 0", for_=t.for_idle,
              severity="info", scope="cluster", summary="GPUs in the fleet are idle.",
              description="{{ $value }} GPUs of cluster {{ $labels.cluster }} have been idle for " + t.for_idle + "."),
    ]


def xid(t: Thresholds) -> list[Alert]:
    """XID errors by tier of action (counters: alerts resolve once no new XID arrives)."""
    alert = partial(Alert, family="xid", for_="0s", scope="gpu", keep_firing_for=t.keep_firing)
    tiers = records.XID_TIERS  # codes by tier, shared with the weekly failure rates
    return [
        alert(name="GpuXidRebootRequired", expr=_xid(tiers["xid_reboot"], t), severity="critical",
              summary="GPU fell off the bus (XID 79): the node needs a reboot.",
              description=f"{GPU} reported XID {{{{ $labels.xid }}}}: reboot the node."),
        alert(name="GpuXidResetRequired", expr=_xid(tiers["xid_reset"], t), severity="critical",
              summary="GPU reported an XID that needs a GPU reset.",
              description=f"{GPU} reported XID {{{{ $labels.xid }}}}: drain it and reset the GPU."),
        alert(name="GpuXidApplicationError", expr=_xid(tiers["xid_application"], t), severity="warning",
              summary="GPU reported an application-level XID: restart the application.",
              description=f"{GPU} reported XID {{{{ $labels.xid }}}} (contained error): restart the affected "
                          "application."),
        alert(name="GpuXidNvlinkError", expr=_xid(tiers["xid_nvlink"], t), severity="warning",
              summary="GPU reported an NVLink error (XID 74).",
              description=f"{GPU} reported XID 74: check its NVLink links."),
        alert(name=lp.BY_NAME["nvrm_xid"].alert, expr=_xid_unseen_by_nvml(t), for_=t.for_short,
              severity="critical", keep_firing_for=None,
              summary="The kernel log has XIDs that NVML's event path did not report.",
              description=f"The kernel log counted {{{{ $value }}}} XID {{{{ $labels.xid }}}} on {GPU} in the last "
                          f"{t.long_window}, more than the exporter's NVML event path reported: the XID alerts "
                          "missed them."),
    ]


def memory(t: Thresholds) -> list[Alert]:
    """ECC errors and DRAM row remapping."""
    alert = partial(Alert, family="memory", scope="gpu")
    ecc, w = c.ECC_ERRORS.exposed_name, t.rate_window
    return [
        alert(name="GpuEccUncorrectable", expr=f"increase({ecc}{records.UNCORRECTED}[{w}]) > 0", for_="0s",
              severity="critical", summary="Uncorrectable ECC errors on a GPU.",
              description=f"{GPU} had {{{{ $value | humanize }}}} uncorrectable ECC errors in the last {w}.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuEccCorrectedRate",
              expr=f'rate({ecc}{{error_type="corrected",counter_type="volatile"}}[{t.long_window}])'
                   f" > {t.ecc_corrected_per_s:g}",
              for_=t.for_medium, severity="warning", summary="High rate of corrected ECC errors on a GPU.",
              description=f"{GPU} corrects {{{{ $value | printf \"%.3g\" }}}} ECC errors per second."),
        alert(name="GpuRowRemapPending", expr=f"{c.REMAP_PENDING.name} == 1", for_=t.for_short, severity="warning",
              summary="A GPU has a row remap pending: it needs a reset.",
              description=f"{GPU} has a DRAM row remap pending; it takes effect at the next GPU reset."),
        alert(name="GpuRowRemapFailure", expr=f"{c.REMAP_FAILURE.name} == 1", for_=t.for_now, severity="critical",
              summary="A GPU failed to remap a row: it needs service.",
              description=f"{GPU} could not remap a failing DRAM row: take it out of service."),
        alert(name="GpuEccCorrectedRising",
              expr=_rising(records.GPU_ECC_CORRECTED_RATE, t.ecc_corrected_trend_per_s, t), for_=t.for_medium,
              severity="warning", summary="Corrected ECC errors on a GPU are rising. " + DEGRADING,
              description=f"{GPU} corrects {{{{ $value | printf \"%.3g\" }}}} ECC errors per second over the last "
                          f"{t.trend_window}, over {t.trend_factor:g}x its rate {t.trend_baseline} earlier."),
        alert(name="GpuRowRemapBanksDepleting",
              expr=f"{records.GPU_REMAP_BANKS_LOW.name} - min_over_time({records.GPU_REMAP_BANKS_LOW.name}"
                   f"[{t.trend_baseline}]) >= {t.remap_banks_rise}",
              for_=t.for_short, severity="warning",
              summary="A GPU's memory banks are running out of spare rows. " + DEGRADING,
              description=f"{{{{ $value }}}} more memory banks of {GPU} have few or no spare rows left than "
                          f"at their fewest in the last {t.trend_baseline}."),
        alert(name=lp.BY_NAME["ecc_error"].alert, expr=_gpu_lines("ecc_error", t), for_="0s", severity="critical",
              summary="The logs report an uncorrectable ECC error or a failed row remap.",
              description=f"The logs of {LINE} report uncorrectable ECC or row-remap errors in the last "
                          f"{t.rate_window}.",
              keep_firing_for=t.keep_firing),
    ]


def interconnect(t: Thresholds) -> list[Alert]:
    """NVLink links and errors (per GPU, over its links: the per-link series are detail), PCIe link
    and replays."""
    nvlink = partial(Alert, family="nvlink", scope="gpu")
    pcie = partial(Alert, family="pcie", scope="gpu")
    w = t.rate_window
    return [
        nvlink(name="GpuNvlinkDown", expr=f"{c.NVLINKS_DOWN.name} > 0", for_=t.for_short, severity="critical",
               summary="An NVLink link is down.",
               description=f"{GPU} has {{{{ $value }}}} NVLink link(s) down (which: gpuobs exporter --detail nvlink "
                           f"serves {c.NVLINK_UP.name} per link)."),
        nvlink(name="GpuNvlinkErrorRate",
               expr=f"rate({c.NVLINKS_ERRORS.exposed_name}[{w}]) > {t.nvlink_errors_per_s:g}", for_=t.for_short,
               severity="warning", summary="NVLink errors are rising.",
               description=f"{GPU} has {{{{ $value | humanize }}}} NVLink data-link errors/s over its links."),
        pcie(name="GpuPcieLinkDegraded",
             expr=f"({records.pcie_below_max()}) and on ({GPU_BY}) {c.UTILIZATION.name} > {t.pcie_busy_utilization:g}",
             for_=t.for_medium, severity="warning",
             summary="PCIe link below its maximum generation or width under load.",
             description=f"{GPU} runs its PCIe link below its maximum while busy."),
        pcie(name="GpuPcieReplayRate", expr=f"rate({c.PCIE_REPLAYS.exposed_name}[{w}]) > {t.pcie_replays_per_s:g}",
             for_=t.for_short, severity="warning", summary="PCIe replays are rising.",
             description=f"{GPU} has {{{{ $value | humanize }}}} PCIe replays per second."),
        nvlink(name="GpuNvlinkErrorsRising",
               expr=_rising(records.GPU_NVLINK_ERRORS_RATE, t.nvlink_errors_trend_per_s, t), for_=t.for_medium,
               severity="warning", summary="NVLink data-link errors on a GPU are rising. " + DEGRADING,
               description=f"{GPU} has {{{{ $value | printf \"%.3g\" }}}} NVLink data-link "
                           f"errors per second over the last {t.trend_window}, over {t.trend_factor:g}x its rate "
                           f"{t.trend_baseline} earlier."),
        pcie(name="GpuPcieReplaysRising",
             expr=_rising(records.GPU_PCIE_REPLAYS_RATE, t.pcie_replays_trend_per_s, t), for_=t.for_medium,
             severity="warning", summary="PCIe replays on a GPU are rising. " + DEGRADING,
             description=f"{GPU} has {{{{ $value | printf \"%.3g\" }}}} PCIe replays per second over the last "
                         f"{t.trend_window}, over {t.trend_factor:g}x its rate {t.trend_baseline} earlier."),
        nvlink(name=lp.BY_NAME["nvlink_error"].alert, expr=_gpu_lines("nvlink_error", t), for_="0s",
               severity="warning", summary="The logs report NVLink, NVSwitch or fabric manager errors.",
               description=f"The logs of {LINE} report NVLink, NVSwitch or fabric manager errors in the last "
                           f"{t.rate_window}.",
               keep_firing_for=t.keep_firing),
    ]


def presence(t: Thresholds) -> list[Alert]:
    """A node's GPUs and NVML: lost, unusable, too slow to read, missing."""
    alert = partial(Alert, family="presence")
    lost, unhealthy = _gpu_unusable(t)
    timeouts = c.GPU_TIMEOUTS.exposed_name
    flapping = f"{t.flap_share:.0%} of the last {t.long_window}'s"
    return [
        alert(name="GpuLost", expr=lost, for_=t.for_now, severity="critical", scope="gpu",
              summary="A GPU stopped answering NVML.",
              description=f"{GPU} is lost: it no longer answers NVML, now or in more than {flapping} samples."),
        alert(name="GpuUnhealthy", expr=unhealthy, for_=t.for_now, severity="critical", scope="gpu",
              summary="A GPU is unusable: it needs a reset, its reads time out, or it cannot be read.",
              description=f"{GPU} is unusable ({{{{ $labels.reason }}}}), now or in more than {flapping} samples: "
                          "its metrics are withheld meanwhile."),
        alert(name="GpuSamplingTimeouts",
              expr=f"rate({timeouts}[{t.long_window}]) / ignoring (gpu, uuid) group_left "
                   f"rate({c.SAMPLES.exposed_name}[{t.long_window}]) > {t.gpu_timeout_share:g} "
                   f"and {timeouts}",  # not for an hour after its exporter went (other alerts' case)
              for_=t.for_medium, severity="warning", scope="gpu",
              summary="A GPU's NVML reads keep missing the sampling deadline.",
              description=f"{GPU} missed the exporter's sampling deadline in {{{{ $value | humanizePercentage }}}} "
                          f"of its sampling passes over the last {t.long_window}: its series have gaps."),
        alert(name="GpuMissing", expr=f"{c.GPUS_PRESENT.name} < {c.GPUS_EXPECTED.name}", for_=t.for_short,
              severity="critical", scope="node", summary="A node has fewer GPUs than expected.",
              description="{{ $labels.node }} has {{ $value }} GPUs, fewer than it should have."),
        alert(name="NvmlDown", expr=_unreliable(c.NVML_UP.name, 0, t), for_=t.for_short, severity="critical",
              scope="node", summary="NVML is down on a node.",
              description="NVML does not answer on {{ $labels.node }} (or has not finished initialising since "
                          f"the exporter started), now or in more than {flapping} scrapes: no GPU can be read "
                          "then."),
    ]


def exporter(t: Thresholds) -> list[Alert]:
    """The exporter: scraped, still a target, its pods, fresh, its collectors and XID watcher."""
    alert = partial(Alert, family="exporter")
    up = f'up{{job="{t.exporter_job}"}}'
    ds = f'{{daemonset="{t.exporter_daemonset}"}}'
    by_ds = "max by (cluster, namespace, daemonset)"
    flapping = f"{t.flap_share:.0%} of the last {t.long_window}'s scrapes"
    return [
        alert(name="GpuExporterDown", expr=_unreliable(up, 0, t), for_=t.for_short, severity="critical", scope="node",
              summary="A GPU exporter cannot be scraped.",
              description="The gpuobs exporter on {{ $labels.node }} ({{ $labels.instance }}) cannot be scraped, now "
                          f"or in more than {flapping}."),
        # A target that left service discovery has no `up` at all: compare with the last hour's targets.
        # By node: a restarted pod comes back with another pod name (and maybe address); by instance for
        # targets without a node label. Only while some target is left (else GpuExporterAbsent). A node
        # taken away on purpose resolves once its last scrape is long_window old.
        alert(name="GpuExporterGone",
              expr=f"max without (pod) (last_over_time({up}[{t.long_window}])) unless on (cluster, node, instance) "
                   f'{up} unless on (cluster, node) up{{job="{t.exporter_job}", node!=""}} and on () count({up})',
              for_=t.for_short, severity="critical", scope="node",
              summary="A node's GPU exporter is no longer a scrape target.",
              description="The gpuobs exporter on {{ $labels.node }} ({{ $labels.instance }}) left service discovery "
                          "while other exporters are still scraped: the node's GPUs are not monitored (it resolves "
                          f"{t.long_window} after its last scrape if the node was removed on purpose)."),
        alert(name="GpuExporterPodsUnavailable",
              expr=f"{by_ds} (kube_daemonset_status_desired_number_scheduled{ds}) - "
                   f"{by_ds} (kube_daemonset_status_number_available{ds}) > 0 unless on (cluster, namespace, "
                   f"daemonset) changes(kube_daemonset_status_updated_number_scheduled{ds}[{t.rate_window}]) > 0",
              for_=t.for_medium, severity="critical", scope="cluster",
              summary="GPU exporter pods are missing or not ready.",
              description="DaemonSet {{ $labels.namespace }}/{{ $labels.daemonset }} has {{ $value }} of its pods "
                          "unavailable and no rollout progressing: the GPUs of those nodes are not monitored."),
        alert(name="GpuExporterAbsent", expr=f"absent({up})", for_=t.for_short, severity="critical", scope="cluster",
              summary="No GPU exporter is being scraped at all.",
              description=f"Prometheus scrapes no target of job {t.exporter_job}: GPU alerts cannot fire."),
        alert(name="GpuMetricsStale", expr=_unreliable(c.SNAPSHOT_STALE.name, 1, t), for_=t.for_short,
              severity="warning", scope="node", summary="The GPU exporter serves stale data (NVML hangs).",
              description="The exporter on {{ $labels.node }} has no fresh snapshot, now or in more than "
                          f"{flapping}: NVML calls are hanging."),
        alert(name="GpuExporterCollectorFailing", expr=_unreliable(c.COLLECTOR_SUCCESS.name, 0, t),
              for_=t.for_medium, severity="warning", scope="node",
              summary="A collector of the GPU exporter keeps failing.",
              description="The {{ $labels.collector }} collector of the exporter on {{ $labels.node }} fails, now or "
                          f"in more than {flapping}: its metrics are missing and the alerts on them cannot fire."),
        alert(name="GpuXidWatcherDown", expr=_unreliable(c.XID_WATCHER_UP.name, 0, t), for_=t.for_short,
              severity="warning", scope="node",
              summary="The exporter's XID event thread is not running: XIDs may be missed.",
              description="The XID watcher of the exporter on {{ $labels.node }} is down, now or in more than "
                          f"{flapping}: XIDs on this node may be missed."),
        alert(name="GpuKernelLogWatcherDown", expr=_unreliable(c.KERNEL_LOG_UP.name, 0, t), for_=t.for_medium,
              severity="warning", scope="node",
              summary="The exporter cannot read the kernel log: kernel-log XIDs and driver messages are not counted.",
              description="The kernel-log watcher ({{ $labels.source }}) of the exporter on {{ $labels.node }} has "
                          f"not read its source for {t.for_medium}, now or in more than {flapping}: XIDs that NVML "
                          "misses and driver ECC and NVLink messages on this node go unseen."),
    ]


def telemetry(t: Thresholds) -> list[Alert]:
    """The instrumentation's own losses."""
    return [
        Alert(name="TelemetryLogRecordsDropped", expr=f"increase({c.LOGS_DROPPED.exposed_name}[{t.for_medium}]) > 0",
              for_=t.for_long, severity="warning", scope="service", family="telemetry",
              summary="A process keeps dropping its log records.",
              description="{{ $labels.job }} target {{ $labels.instance }} dropped {{ $value | humanize }} log "
                          f"records in the last {t.for_medium}, and has kept dropping them for {t.for_long}: its "
                          "Fluentd is down or too slow."),
    ]


def training(t: Thresholds) -> list[Alert]:
    """Training jobs: stalled, slower than their baseline, input bound, ranks lost, checkpoints, stragglers."""
    alert = partial(Alert, family="training", scope="job")
    last_step = c.LAST_STEP.name
    last_seen = f"last_over_time({last_step}[{t.long_window}])"
    p50 = records.JOB_STEP_P50.name
    checkpoint = c.CHECKPOINT_DURATION.name
    return [
        alert(name="TrainingStalled", expr=f"time() - {last_step} > {_seconds(t.training_stall):g}", for_="0s",
              severity="critical", summary="A training rank has made no step progress.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} has not finished a step for "
                          + t.training_stall + "."),
        alert(name="TrainingStepTimeRegression",
              expr=f"{p50} > {t.step_regression:g} * quantile_over_time(0.5, {p50}[{t.baseline_window}])",
              for_=t.for_medium, severity="warning", summary="Training steps are slower than their own baseline.",
              description="Job {{ $labels.job_id }} steps take {{ $value | humanize }} s, over "
                          + f"{t.step_regression:g}" + "x its median of the last " + t.baseline_window + "."),
        alert(name="TrainingDataLoaderBound", expr=f"{records.DATA_WAIT_RATIO.name} > {t.data_wait_share:g}",
              for_=t.for_medium, severity="warning", summary="Training waits on its data loader.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} spent {{ $value | humanizePercentage "
                          f"}}}} of the last {t.rate_window} waiting for data."),
        alert(name="TrainingRankLost",
              expr=f"{last_seen} unless on (job_id, rank) {last_step} and on (job_id) {last_step} "
                   "unless on (job, instance) up == 0",
              for_=t.for_now, severity="critical", summary="A rank of a running training job disappeared.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} stopped reporting while other ranks "
                          "of the job still run: its process exited or its target was removed."),
        alert(name="TrainingTargetDown", expr=f"{last_seen} and on (job, instance) up == 0", for_=t.for_now,
              severity="critical", summary="A training target cannot be scraped.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} ({{ $labels.instance }}) is still a "
                          "scrape target but does not answer: the process crashed or hangs."),
        alert(name="TrainingSlowCheckpoint",
              expr=f"rate({checkpoint}_sum[{t.long_window}]) / rate({checkpoint}_count[{t.long_window}]) > "
                   f"{t.checkpoint_seconds:g}",
              for_="0s", severity="warning", summary="Checkpoints take long.",
              description="Job {{ $labels.job_id }} rank {{ $labels.rank }} checkpoints take {{ $value | humanize }} "
                          "s on average."),
        alert(name="TrainingStragglerRank", expr=f"{records.STRAGGLER_RATIO.name} > {t.straggler:g}",
              for_=t.for_medium, severity="warning", summary="One rank computes slower than the rest of its job.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} computes {{ $value | printf \"%.2f\" "
                          "}}x as long per step as the job's other ranks, which wait for it in their collectives."),
    ]


def training_logs(t: Thresholds) -> list[Alert]:
    """Training jobs' log lines that explain a failure (gpuobs.logpatterns, counted by each process): a
    collective timeout, an illegal address, NCCL errors that keep coming (per rank and node), repeated
    CUDA OOM (per job). Each sums its series' targets and restarts."""
    alert = partial(Alert, family="training", scope="job")
    oom, oom_by_rank = _job_lines("cuda_oom", t.for_long), _job_lines("cuda_oom", t.for_long, f"{JOB_BY}, rank")
    return [
        alert(name=lp.BY_NAME["collective_timeout"].alert,
              expr=f'{_job_lines("collective_timeout", t.rate_window, RANK_BY)} > 0',
              for_="0s", severity="critical", keep_firing_for=t.keep_firing,
              summary="A collective of a training job timed out.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} logged a "
                          f"collective operation timeout in the last {t.rate_window}: a rank stopped taking part in "
                          "its collectives."),
        alert(name=lp.BY_NAME["cuda_oom"].alert,
              expr=f"{oom} >= {t.oom_repeats_job} or max by ({JOB_BY}) ({oom_by_rank}) >= {t.oom_repeats_rank}",
              for_="0s", severity="critical", keep_firing_for=t.keep_firing,
              summary="A training job keeps running out of GPU memory.",
              description="Job {{ $labels.job_id }} logged {{ $value | printf \"%.0f\" }} CUDA out-of-memory "
                          f"errors in the last {t.for_long} (an alert from {t.oom_repeats_job} in the job, or "
                          f"{t.oom_repeats_rank} on one rank): it is not recovering."),
        alert(name=lp.BY_NAME["cuda_illegal_address"].alert,
              expr=f'{_job_lines("cuda_illegal_address", t.rate_window, RANK_BY)} > 0', for_="0s", severity="critical",
              keep_firing_for=t.keep_firing, summary="A training job hit a CUDA illegal memory access.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} logged a CUDA "
                          f"illegal memory access in the last {t.rate_window}: its CUDA context is lost."),
        alert(name=lp.BY_NAME["nccl_error"].alert, expr=f'{_job_lines("nccl_error", t.rate_window, RANK_BY)} > 0',
              for_=t.for_medium, severity="warning", summary="A training job keeps logging NCCL errors.",
              description="Rank {{ $labels.rank }} of job {{ $labels.job_id }} on {{ $labels.node }} has logged NCCL "
                          f"warnings or errors in every {t.rate_window} for {t.for_medium}."),
    ]


def inference(t: Thresholds) -> list[Alert]:
    """Inference services: latency and failing requests, per model."""
    alert = partial(Alert, family="inference", scope="service", for_=t.for_short)
    return [
        alert(name="InferenceLatencyHigh", expr=f"{records.MODEL_REQUEST_P99.name} > {t.inference_p99_seconds:g}",
              severity="warning", summary="Inference p99 latency is high.",
              description="Model {{ $labels.gen_ai_request_model }} p99 latency is {{ $value | humanize }} s."),
        alert(name="InferenceErrorRate",
              expr=f"sum by (gen_ai_request_model) (rate({c.INFERENCE_ERRORS.exposed_name}[{t.rate_window}])) / "
                   f"{records.MODEL_REQUESTS.name} > {t.inference_error_ratio:g}",
              severity="critical", summary="Inference requests are failing.",
              description="{{ $value | humanizePercentage }} of requests to {{ $labels.gen_ai_request_model }} "
                          "fail."),
    ]


def meta(t: Thresholds) -> list[Alert]:
    """The alerting pipeline itself."""
    return [
        Alert(name="Watchdog", expr="vector(1)", for_="0s", severity="none", scope="cluster", family="meta",
              summary="Always firing: proves the alerting pipeline works end to end.",
              description="This alert always fires. If it stops arriving, Prometheus or Alertmanager is broken."),
    ]


def placement(t: Thresholds) -> list[Alert]:
    """Where multi-GPU workloads landed on a node's GPU topology (the topology family)."""
    return [
        Alert(name="GpuPodPlacementWithoutNvlink",
              # only on nodes with NVLink at all: on a PCIe-only node no placement is better
              expr=f"({records.POD_NVLINK_DOMAINS.name} > 1) "
                   f"and on (cluster, node) ({records.NODE_NVLINK_DOMAIN_MAX.name} > 1)",
              for_=t.for_medium, severity="warning", scope="node", family="placement",
              summary="A multi-GPU pod got GPUs without NVLink between them.",
              description="Pod {{ $labels.k8s_namespace }}/{{ $labels.k8s_pod }} on {{ $labels.node }} holds GPUs "
                          "of {{ $value }} NVLink domains, on a node where other GPUs share NVLink: its "
                          "GPU-to-GPU traffic between them crosses PCIe or the CPU interconnect."),
    ]


FAMILIES = (thermal, power, utilization, xid, memory, interconnect, presence, exporter, telemetry, training,
            training_logs, inference, placement, meta)


def alerts(t: Thresholds) -> list[Alert]:
    """The pack, family by family (FAMILIES). Per-GPU descriptions carry node, index and UUID; every
    alert has an explicit for."""
    return [a for family in FAMILIES for a in family(t)]


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]
