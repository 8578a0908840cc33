"""What every family of the alert pack shares (gpuobs.alerts.families, assembled by
gpuobs.alerts.rules, which re-exports the public names): the tunables (`Thresholds`, `DEFAULT`,
`FAST`), the `Alert` record and the PromQL and description helpers more than one family uses. A
helper only one family uses lives in that family's module.

Health inputs (a target's `up`, NVML, a GPU, a collector, the XID watcher) can flap: bad every other
scrape, or one scrape in five, for hours. A plain `for:` restarts at every good scrape and never
fires on those, so health alerts read their input over windows (`_unreliable`): bad now, or bad in
more than `flap_share` of the last `long_window`'s samples and at least once in the last
`for_medium`. One failed scrape, or an exporter restart (one or two), stays under both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .. import catalog as c
from .. import logpatterns as lp
from .. import records
from ..records import per_link

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


LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def check_grid_intensities(overrides: tuple[tuple[str, str, float], ...], default: float) -> None:
    """ValueError unless every override is (a Prometheus label name, a valid regex, a finite
    intensity >= 0 in gCO2e/kWh) and the default is a finite intensity >= 0."""
    for label, regex, value in overrides:
        if not LABEL_NAME.fullmatch(label):
            raise ValueError(f"grid intensity override: {label!r} is no label name")
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"grid intensity override {label}={regex!r}: not a regex ({e})") from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"grid intensity override {label}={regex!r}: {value!r} is no intensity (gCO2e/kWh >= 0)")
    if not (math.isfinite(default) and default >= 0):
        raise ValueError(f"grid_intensity_default: {default!r} is no intensity (gCO2e/kWh >= 0)")


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
    # failed steps (a loop that catches its steps' exceptions): a rank failing more than this share of
    # its steps for for_medium (an isolated bad batch, or a burst shorter than for_medium, is no alert)
    failed_step_share: float = 0.2
    # a rank slowed in its data loader: its data-wait share over the mean of the job's other ranks', and
    # at least this share of its time (a rise from 1 % to 3 % is no slowdown)
    data_wait_straggler: float = 2.0
    data_wait_straggler_share: float = 0.1
    # slowdown causes (gpuobs.records' slowdown family): a clock-event reason holding the clocks down in more
    # than this share of rate_window's samples is a cause (a blip of one 30 s scrape in 5m is not)
    cause_min_share: float = 0.1
    # a job slowed in its collectives: its ranks' collective-wait share over collective_rise times its
    # median over baseline_window and collective_rise_share more of wall time than that median, while the
    # slowest rank's compute per step stays within compute_steady of its own median (either way: a
    # straggler, or compute that changed, shifts the collective wait without any network fault)
    collective_rise: float = 1.5
    collective_rise_share: float = 0.1
    compute_steady: float = 1.1
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
    # energy and carbon (gpuobs.records' energy section; gpuobs.report reads the same): the grid's carbon
    # intensity in gCO2e per kWh, a configured average (not a live feed), per GPU the first
    # (label, regex, intensity) of grid_intensities whose regex matches fully, else
    # grid_intensity_default. label is a label of the GPU's own series (cluster, node) or, starting with
    # label_, one of kube-state-metrics' kube_node_labels (e.g. label_topology_kubernetes_io_region).
    # Illustrative default (about a world average), not a measurement: set your grid's.
    grid_intensities: tuple[tuple[str, str, float], ...] = ()
    grid_intensity_default: float = 400.0
    exporter_job: str = "gpuobs"
    exporter_daemonset: str = "gpuobs-exporter"  # exporters/kubernetes/daemonset.yaml, as kube-state-metrics names it
    runbook_base: str = DEFAULT_RUNBOOK_BASE  # absolute http(s) URL of docs/runbooks

    def __post_init__(self):
        object.__setattr__(self, "runbook_base", check_runbook_base(self.runbook_base))
        check_grid_intensities(self.grid_intensities, self.grid_intensity_default)

    def runbook_url(self, alert: str) -> str:
        """The runbook of the alert named alert: <runbook_base>/<alert>.md (an absolute http(s) URL,
        runbook_base checked by check_runbook_base), as the alert's runbook_url annotation."""
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


DEGRADING = "The GPU is degrading: drain it and plan its replacement."  # the degradation alerts' shared idea


JOB_BY = "cluster, job_id"  # one training job, whatever its ranks, targets and restarts


LINE_BY = "cluster, node, gpu, uuid, pci_bus_id"  # one GPU a kernel-log line names (gpu, uuid empty if none)


def _pattern(counter: c.Metric, name: str) -> str:
    """The selector of one pattern's series of a log-pattern counter (name: a gpuobs.logpatterns pattern;
    KeyError for another)."""
    return f'{counter.exposed_name}{{pattern="{lp.BY_NAME[name].name}"}}'


def _job_lines(name: str, window: str, by: str = JOB_BY) -> str:
    """Lines of log pattern `name` that a job's training processes matched within window, summed by
    `by`: increase() of each process's counter (exported from 0, so a restarted trainer's counter back
    at 0 is a reset), and for a process that died of its error within the window (it marked the crash:
    catalog RUN_CRASH) a series new within the window counts its largest value: dying before its first
    scrape (a CUDA OOM at the first step, a timeout at start-up), it was first scraped at 1 during the
    exit grace, which increase() cannot see. Only then: a series new to Prometheus (a restarted
    Prometheus, a newly discovered target) may carry lines logged long before, which must not page."""
    sel = _pattern(c.LOG_PATTERN_MATCHES, name)
    crashed = f"last_over_time({c.RUN_CRASH.exposed_name}[{window}])"
    # max_over_time, not the instant value: the process that counted is gone by now
    born = f"max_over_time({sel}[{window}]) unless {sel} offset {window}"
    counted = f"round(increase({sel}[{window}]))"
    new = f"({counted} > ({born}) or ({born})) and on (cluster, job, instance) {crashed}"
    return f"sum by ({by}) (({new}) or {counted})"


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


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]

