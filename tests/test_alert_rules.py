"""promtool unit tests of the alert pack (default profile).

The rule file is `rules_file(DEFAULT)` (recording rules included, so alerts that read recording rules
are fed raw series: histogram buckets, counters). Every alert has cases in `CASES`: one that fires
(exact labels and rendered annotations), one that must not fire, and where it means something, a
flapping input and one where the metric disappears. Each case becomes a promtool test group;
`promtool test rules` runs them per alert. Series sampled, and rules evaluated, every 1m; the health
alerts (a GPU, NVML, the exporter and its parts) at a realistic 30 s, where flapping is what it is:
bad every other scrape, or one scrape in five, for an hour.
"""

from __future__ import annotations

import math
import random
import subprocess
from dataclasses import dataclass, field

import pytest
import yaml
from conftest import require_tool
from rule_subset import subset

from gpuobs import catalog as c
from gpuobs.alerts.build import alert_rule, rule_groups, rules_file
from gpuobs.alerts.rules import DEFAULT, FAST, _seconds, alerts

ALERTS = {a.name: a for a in alerts(DEFAULT)}
KINDS = ("fires", "quiet", "flap", "gone")

# ------------------------------------------------------------------------------- labels, series

NODE = {"cluster": "c1", "node": "n1", "instance": "n1:9445", "job": "gpuobs"}
GPU0 = {**NODE, "gpu": "0", "uuid": "GPU-a"}
GPU1 = {**NODE, "gpu": "1", "uuid": "GPU-b"}
ON = ("cluster", "node", "instance", "gpu", "uuid")  # what `op on (cluster, node, instance, gpu, uuid)` keeps
GPU0_ON = {k: GPU0[k] for k in ON}
G = "n1 GPU 0 (GPU-a)"  # how descriptions name GPU0
TRAIN = {"cluster": "c1", "node": "n1", "instance": "n1:9464", "job": "training", "job_id": "j1"}
SERVE = {"cluster": "c1", "node": "n2", "instance": "n2:9464", "job": "inference",
         "gen_ai_operation_name": "chat", "gen_ai_request_model": "llama", "job_id": "s1", "rank": "0"}

REASON = "gpuobs_gpu_clock_event_reason_active"
RANK_INFO, GPU_INFO = "gpuobs_training_rank_info", "gpuobs_gpu_info"
XID = "gpuobs_gpu_xid_errors_total"
ECC = "gpuobs_gpu_ecc_errors_total"
STEP = "gpuobs_training_step_duration_seconds"
REQ = "gen_ai_server_request_duration_seconds"


def s(metric: str, labels: dict, values: str) -> dict:
    """One promtool input series."""
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{sel}}}", "values": values}


def alt(a, b, n: int) -> str:
    """a b a b ... (n values): an input toggling every minute."""
    return " ".join(str(a if i % 2 == 0 else b) for i in range(n))


def cum(increments) -> str:
    """Counter samples, one a minute, from per-minute increments."""
    out, total = [], 0
    for inc in increments:
        total += inc
        out.append(str(total))
    return " ".join(out)


def hist(metric: str, labels: dict, les: tuple[str, ...], minutes: list[float | None], per_min: int = 60,
         end: str = "") -> list[dict]:
    """Histogram buckets and count: minute i adds per_min observations of minutes[i] (None: no
    observations that minute). end is appended to every series (e.g. ' stale')."""
    series = []
    for le in (*les, "+Inf"):
        bound = float("inf") if le == "+Inf" else float(le)
        incs = [per_min if v is not None and v <= bound else 0 for v in minutes]
        series.append(s(f"{metric}_bucket", {**labels, "le": le}, cum(incs) + end))
    series.append(s(f"{metric}_count", labels, cum(per_min if v is not None else 0 for v in minutes) + end))
    return series


def minutes_of(duration: str | None) -> int:
    return int(_seconds(duration) // 60) if duration else 0


# ---------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    alert: str
    kind: str  # fires | quiet | flap | gone
    what: str
    series: list[dict]
    # (eval minute, [(labels that survive the expression, rendered description)]); [] = must not fire
    checks: list[tuple[float, list[tuple[dict, str]]]] = field(default_factory=list)
    interval: str = "1m"  # of the input series and of the evaluation


CASES: list[Case] = []


def case(alert, kind, what, series, *checks, interval="1m"):
    assert alert in ALERTS, alert
    assert kind in KINDS, kind
    CASES.append(Case(alert, kind, what, series, list(checks), interval))


def at(minute: float) -> str:
    """An eval time: whole minutes as "Nm", else seconds."""
    return f"{int(minute)}m" if float(minute).is_integer() else f"{round(minute * 60)}s"


def gauge_alert(alert, metric, labels, bad, good, desc, *, quiet_extra=(), gone_what="the series disappear"):
    """fires / quiet / flap / gone for an alert on one gauge of one target (`metric == bad`)."""
    a = ALERTS[alert]
    f, k = minutes_of(a.for_), minutes_of(a.keep_firing_for)
    exp = [(labels, desc)]
    other = {**labels, "gpu": "1", "uuid": "GPU-b"} if "gpu" in labels else {**labels, "node": "n9",
                                                                            "instance": "n9:9445"}
    case(alert, "fires", f"{bad} from minute 2, held {a.for_} (another target stays {good})",
         [s(metric, labels, f"{good} {good} {bad}x40"), s(metric, other, f"{good}x42")],
         (1 + f, []), (2 + f, exp), (10 + f, exp))
    quiet = [s(metric, labels, f"{good}x40"), *quiet_extra]
    checks = [(5, []), (30, [])]
    if f > 1:  # held one minute less than its for: pending only
        quiet.append(s(metric, other, f"{good} {bad}x{f - 1} {good}x30"))
        checks.append((f, []))
    case(alert, "quiet", f"stays {good}" + (f"; another target {bad} for {f - 1}m only" if f > 1 else ""),
         quiet, *checks)
    case(alert, "flap", f"toggles {bad}/{good} every minute: never held for {a.for_}",
         [s(metric, labels, alt(bad, good, 41))], (5, []), (20, []), (40, []))
    if k:
        # held, then toggling: keep_firing_for carries it through the gaps, and it resolves k after the last bad
        last = f + 3 + 5
        case(alert, "flap", f"held {bad}, then toggling: keeps firing through the gaps",
             [s(metric, labels, f"{bad}x{f + 3} {good} {bad} {good} {good} {bad} {good}x40")],
             (f + 2, exp), (f + 4, exp), (f + 6, exp), (f + 7, exp), (last + k - 1, exp), (last + k + 2, []))
        case(alert, "gone", f"fires, then {gone_what}: kept {a.keep_firing_for}, then resolved",
             [s(metric, labels, f"{bad}x{f + 3} stale")], (f + 2, exp), (f + 4 + k - 2, exp), (f + 4 + k + 2, []))
    else:
        case(alert, "gone", f"fires, then {gone_what}: resolves at once",
             [s(metric, labels, f"{bad}x{f + 3} stale")], (f + 2, exp), (f + 5, []))


# ---- clock event reasons (throttling): 1 while active
for alert, reason, desc in [
    ("GpuHwThermalSlowdown", "hw_thermal_slowdown",
     f"{G} is in HW thermal slowdown: its clocks are held down to protect it."),
    ("GpuSwThermalSlowdown", "sw_thermal_slowdown", f"{G} has been in SW thermal slowdown for 5m."),
    ("GpuHwPowerBrake", "hw_power_brake_slowdown",
     f"{G} is in HW power brake slowdown: the node's power supply asked it to slow down."),
    ("GpuHwSlowdown", "hw_slowdown", f"{G} has been in HW slowdown for 5m."),
    ("GpuSwPowerCapSustained", "sw_power_cap",
     f"{G} has been capped at its power limit for 15m: work runs slower than it could."),
]:
    other_reason = "gpu_idle" if reason != "gpu_idle" else "sw_power_cap"
    gauge_alert(alert, REASON, {**GPU0, "reason": reason}, 1, 0, desc,
                quiet_extra=[s(REASON, {**GPU0, "reason": other_reason}, "1x40")],
                gone_what="the GPU's series vanish")

# ---- temperatures, relative to the GPU's own thresholds (no keep_firing_for)
for alert, metric, limit, desc in [
    ("GpuTemperatureNearSlowdown", "gpuobs_gpu_temperature_celsius", "gpuobs_gpu_slowdown_temperature_celsius",
     f"{G} is at 85 °C, within 5 °C of its own slowdown threshold."),
    ("GpuMemoryTemperatureNearMax", "gpuobs_gpu_memory_temperature_celsius",
     "gpuobs_gpu_memory_max_operating_temperature_celsius",
     f"{G} memory is at 85 °C, within 5 °C of its maximum operating temperature."),
]:
    exp = [(GPU0_ON, desc)]
    limits = [s(limit, GPU0, "88x40"), s(limit, GPU1, "95x40")]
    case(alert, "fires", "85 °C against a limit of 88 (GPU1 at 85 has a limit of 95)",
         [s(metric, GPU0, "70 70 85x38"), s(metric, GPU1, "85x40"), *limits], (6, []), (7, exp), (20, exp))
    case(alert, "quiet", "82 °C, 6 °C under the limit", [s(metric, GPU0, "82x40"), *limits], (10, []), (30, []))
    case(alert, "flap", "85/80 every minute: never 5m in a row", [s(metric, GPU0, alt(85, 80, 41)), *limits],
         (10, []), (30, []))
    case(alert, "gone", "fires, then the temperature series vanishes: resolves",
         [s(metric, GPU0, "85x10 stale"), *limits], (8, exp), (12, []))
    # a new pod takes the GPU at minute 15 and the old pod's series stay visible for the 5 min lookback,
    # with no staleness marker (VictoriaMetrics, a backfilled history): each pod's pair still matches
    pods = [{**GPU0, "k8s_pod": p} for p in ("a", "b")]
    case(alert, "fires", "85 °C against 88 while the pod holding the GPU changes, the old series lingering",
         [s(metric, pods[0], "85x14"), s(limit, pods[0], "88x14"),
          s(metric, pods[1], "_x15 85x25"), s(limit, pods[1], "_x15 88x25")],
         (12, [({**GPU0_ON, "k8s_pod": "a"}, desc)]), (17, [({**GPU0_ON, "k8s_pod": "a"}, desc)]),
         (22, [({**GPU0_ON, "k8s_pod": "b"}, desc)]))

# ---- allocated but idle
UTIL, MEM = "gpuobs_gpu_utilization_ratio", "gpuobs_gpu_memory_used_bytes"
_idle_exp = [(GPU0, f"{G} holds memory (a process, pod or job has it) but has done no work for 30m.")]
case("GpuAllocatedIdle", "fires", "busy 10m, then idle with 2 GB allocated: 30m window + 5m for",
     [s(UTIL, GPU0, "0.9x10 0x60"), s(MEM, GPU0, "2000000000x70"),
      s(UTIL, GPU1, "0.9x70"), s(MEM, GPU1, "2000000000x70")], (44, []), (46, _idle_exp), (60, _idle_exp))
case("GpuAllocatedIdle", "quiet", "idle but holding only 500 MB (nobody has it)",
     [s(UTIL, GPU0, "0.9x10 0x60"), s(MEM, GPU0, "500000000x70")], (50, []), (70, []))
case("GpuAllocatedIdle", "flap", "allocated, idle except a burst every 20 minutes",
     [s(UTIL, GPU0, " ".join("0.5" if i % 20 == 0 else "0" for i in range(81))), s(MEM, GPU0, "2000000000x80")],
     (50, []), (80, []))
case("GpuAllocatedIdle", "gone", "fires, then the GPU's series vanish: resolves",
     [s(UTIL, GPU0, "0.9x10 0x44 stale"), s(MEM, GPU0, "2000000000x54 stale")], (50, _idle_exp), (57, []))

_fleet_exp = [({"cluster": "c1"}, "1 GPUs of cluster c1 have been idle for 30m.")]
case("GpuFleetIdleCapacity", "fires", "GPU0 idle from minute 11 (GPU1 busy): 30m window + 30m for",
     [s(UTIL, GPU0, "0.9x10 0x80"), s(UTIL, GPU1, "0.8x90")], (70, []), (71, _fleet_exp), (90, _fleet_exp))
case("GpuFleetIdleCapacity", "quiet", "every GPU busy", [s(UTIL, GPU0, "0.6x90"), s(UTIL, GPU1, "0.8x90")],
     (45, []), (90, []))
case("GpuFleetIdleCapacity", "flap", "idle except a burst every 20 minutes",
     [s(UTIL, GPU0, " ".join("0.5" if i % 20 == 0 else "0" for i in range(91)))], (60, []), (90, []))
case("GpuFleetIdleCapacity", "gone", "fires, then the idle GPU's series vanish: resolves after its 30m window",
     [s(UTIL, GPU0, "0.9x10 0x70 stale"), s(UTIL, GPU1, "0.8x110")], (75, _fleet_exp), (111, _fleet_exp),
     (112, []))

# ---- XIDs: per GPU (and MIG instance) and code, a counter born at 1 with its first event and the event's
# Unix time (a GPU without XIDs has neither). An alert fires for 5m after each event, by its time, and is
# kept 15m. promtool's clock starts at 0: events before the test have negative times.
SEEN = "gpuobs_gpu_xid_last_seen_timestamp_seconds"


def xid(labels: dict, counts: str, seen: str) -> list[dict]:
    """The two series of one XID code on one GPU: the counter and the last event's time."""
    return [s(XID, labels, counts), s(SEEN, labels, seen)]


for alert, xid_code, wrong_xid, desc in [
    ("GpuXidRebootRequired", "79", "13", f"{G} reported XID 79: reboot the node."),
    ("GpuXidResetRequired", "48", "13", f"{G} reported XID 48: drain it and reset the GPU."),
    ("GpuXidApplicationError", "13", "79",
     f"{G} reported XID 13 (contained error): restart the affected application."),
    ("GpuXidNvlinkError", "74", "13", f"{G} reported XID 74: check its NVLink links."),
]:
    lab = {**GPU0, "xid": xid_code}  # no MIG instance: its labels are empty, so absent
    exp = [(lab, desc)]
    case(alert, "fires", f"first XID {xid_code} at 10m50s (series born at 1): 5m by its time, then kept 15m",
         [*xid(lab, "_x11 1x40", "_x11 650x40"), s(UTIL, GPU1, "0.5x50")],
         (10, []), (11, exp), (15, exp), (29, exp), (31, []))
    mig = {**lab, "gpu_instance_id": "1", "compute_instance_id": "0"}
    case(alert, "fires", f"XID {xid_code} in MIG instance 1/0: the alert carries the instance",
         xid(mig, "_x11 1x20", "_x11 650x20"), (11, [(mig, desc)]), (20, [(mig, desc)]))
    case(alert, "fires", f"XID {xid_code} at minute 6, resolved, then a second XID {xid_code} at minute 31",
         xid(lab, "_x6 1x24 2x20", "_x6 350x24 1850x20"), (6, exp), (27, []), (30, []), (31, exp), (40, exp))
    case(alert, "fires", f"XID {xid_code} at minute 2; the exporter restarts at 30 (its series vanish and stay "
                         f"away); XID {xid_code} again at 40: the counter comes back at 1, as before",
         xid(lab, "_x2 1x27 stale _x9 1x30", "_x2 110x27 stale _x9 2390x30"),
         (2, exp), (25, []), (35, []), (40, exp), (55, exp), (61, []))
    case(alert, "fires", f"3 XIDs {xid_code} before the exporter restarts at 20, one after it at 30 (counter 1)",
         xid(lab, "3x19 stale _x9 1x20", "-3600x19 stale _x9 1790x20"), (10, []), (25, []), (30, exp),
         (40, exp), (51, []))
    case(alert, "quiet", f"an old XID {xid_code} count that does not grow, and a new XID {wrong_xid} (other tier)",
         [*xid(lab, "3x60", "-7200x60"), *xid({**GPU0, "xid": wrong_xid}, "_x30 1x30", "_x30 1790x30")],
         (0, []), (5, []), (31, []), (60, []))
    case(alert, "quiet", f"an old XID {xid_code}; the exporter restarts at 20 and no XID follows: its series "
                         "vanish and do not come back",
         xid(lab, "2x19 stale", "-3600x19 stale"), (10, []), (20, []), (25, []), (40, []))
    case(alert, "flap", f"XID {xid_code} every 6 minutes: fires on the first and stays up in between",
         xid(lab, "_x11 " + cum([1, 0, 0, 0, 0, 0] * 2 + [1] + [0] * 30),
             "_x11 " + " ".join(str(650 + 360 * min(i // 6, 2)) for i in range(43))),
         (11, exp), (16, exp), (20, exp), (27, exp), (33, exp), (42, exp), (43, []))
    case(alert, "gone", f"XID {xid_code} at minute 11, then the GPU's series vanish: resolves after its window",
         xid(lab, "_x11 1 stale", "_x11 650 stale"), (11, exp), (25, exp), (27, []))
    case(alert, "gone", f"XID {xid_code} at 11; the GPU's series vanish 20m (NVML hang) and come back: no new XID",
         xid(lab, "_x11 1x8 stale _x19 1x20", "_x11 650x8 stale _x19 650x20"),
         (20, exp), (35, []), (40, []), (45, []), (60, []))

# ---- memory errors
_ecc_unc = {**GPU0, "error_type": "uncorrected", "counter_type": "volatile"}
_ecc_cor = {**GPU0, "error_type": "corrected", "counter_type": "volatile"}
_unc_exp = [(_ecc_unc, f"{G} had 2 uncorrectable ECC errors in the last 5m.")]
case("GpuEccUncorrectable", "fires", "2 uncorrectable errors at minute 11",
     [s(ECC, _ecc_unc, "0x10 2x40"), s(ECC, {**_ecc_unc, "counter_type": "aggregate"}, "5x10 7x40")],
     (10, []), (11, _unc_exp), (29, _unc_exp), (31, []))
case("GpuEccUncorrectable", "quiet", "corrected errors grow, uncorrected stay flat",
     [s(ECC, _ecc_unc, "4x40"), s(ECC, _ecc_cor, "0+5x40")], (10, []), (40, []))
case("GpuEccUncorrectable", "flap", "one uncorrectable error every 6 minutes: stays up in between",
     [s(ECC, _ecc_unc, cum([0] * 11 + [1, 0, 0, 0, 0, 0] * 3 + [0] * 30))],
     (20, [(_ecc_unc, f"{G} had 1 uncorrectable ECC errors in the last 5m.")]),
     (27, [(_ecc_unc, f"{G} had 1 uncorrectable ECC errors in the last 5m.")]), (45, []))
case("GpuEccUncorrectable", "gone", "errors at minute 11, then the GPU's series vanish",
     # the last value seen is increase()'s extrapolation over a window where the series ends: 3, not 2
     [s(ECC, _ecc_unc, "0x10 2 stale")], (11, _unc_exp),
     (25, [(_ecc_unc, f"{G} had 3 uncorrectable ECC errors in the last 5m.")]), (31, []))

_cor_exp = [(_ecc_cor, f"{G} corrects 0.1 ECC errors per second.")]
case("GpuEccCorrectedRate", "fires", "6 corrected errors a minute (360/h)",
     [s(ECC, _ecc_cor, "0+6x90"), s(ECC, {**_ecc_cor, "uuid": "GPU-b", "gpu": "1"}, "0+1x90")],
     (60, _cor_exp), (90, _cor_exp))
case("GpuEccCorrectedRate", "quiet", "1 corrected error a minute (60/h, under 100/h)",
     [s(ECC, _ecc_cor, "0+1x90")], (60, []), (90, []))
case("GpuEccCorrectedRate", "flap", "a burst of 30 errors every 30 minutes (60/h on average)",
     [s(ECC, _ecc_cor, cum(([30] + [0] * 29) * 4))], (70, []), (110, []))
case("GpuEccCorrectedRate", "gone", "fires, then the counter vanishes: resolves once its samples leave the 1h window",
     [s(ECC, _ecc_cor, "0+6x80 stale")], (75, _cor_exp),
     (82, [(_ecc_cor, f"{G} corrects 0.0975 ECC errors per second.")]), (141, []))

gauge_alert("GpuRowRemapPending", "gpuobs_gpu_row_remap_pending", GPU0, 1, 0,
            f"{G} has a DRAM row remap pending; it takes effect at the next GPU reset.")
gauge_alert("GpuRowRemapFailure", "gpuobs_gpu_row_remap_failure", GPU0, 1, 0,
            f"{G} could not remap a failing DRAM row: take it out of service.")

# ---- interconnects
# the exporter's per-GPU totals over the GPU's links (the default profile: per-link series are detail)
gauge_alert("GpuNvlinkDown", "gpuobs_gpu_nvlinks_down", GPU0, 1, 0,
            f"{G} has 1 NVLink link(s) down (which: gpuobs exporter --detail nvlink serves "
            "gpuobs_gpu_nvlink_link_up per link).", quiet_extra=[s("gpuobs_gpu_nvlinks_down", GPU1, "0x40")])

NVL = "gpuobs_gpu_nvlinks_errors_total"
_nvl = GPU0
_nvl_exp = [(_nvl, f"{G} has 2 NVLink data-link errors/s over its links.")]
case("GpuNvlinkErrorRate", "fires", "120 errors a minute over the GPU's links (2/s); another GPU 10/min",
     [s(NVL, _nvl, "0+120x30"), s(NVL, GPU1, "0+10x30")], (10, _nvl_exp), (20, _nvl_exp))
case("GpuNvlinkErrorRate", "quiet", "30 errors a minute (0.5/s)", [s(NVL, _nvl, "0+30x30")], (10, []), (30, []))
case("GpuNvlinkErrorRate", "flap", "a 3-minute burst every 10 minutes: never 5m over",
     [s(NVL, _nvl, cum(([0] * 7 + [200] * 3) * 4))], (15, []), (30, []), (40, []))
case("GpuNvlinkErrorRate", "gone", "fires, then the counter vanishes: resolves after its 5m window",
     [s(NVL, _nvl, "0+120x20 stale")], (15, _nvl_exp), (25, []))

PGEN, PGENMAX = "gpuobs_gpu_pcie_link_generation", "gpuobs_gpu_pcie_link_generation_max"
PW, PWMAX = "gpuobs_gpu_pcie_link_width", "gpuobs_gpu_pcie_link_width_max"
_pcie_exp = [(GPU0_ON, f"{G} runs its PCIe link below its maximum while busy.")]
_pcie_max = [s(PGENMAX, GPU0, "5x40"), s(PWMAX, GPU0, "16x40")]
case("GpuPcieLinkDegraded", "fires", "busy at gen 4 of 5", [s(PGEN, GPU0, "4x40"), s(PW, GPU0, "16x40"),
                                                           s(UTIL, GPU0, "0.9x40"), *_pcie_max],
     (14, []), (15, _pcie_exp), (30, _pcie_exp))
case("GpuPcieLinkDegraded", "fires", "busy at x8 of x16 and gen 4 of 5 (one alert)",
     [s(PGEN, GPU0, "4x40"), s(PW, GPU0, "8x40"), s(UTIL, GPU0, "0.9x40"), *_pcie_max], (20, _pcie_exp))
case("GpuPcieLinkDegraded", "quiet", "gen 1 while idle (power saving), full link while busy",
     [s(PGEN, GPU0, "1x20 5x20"), s(PW, GPU0, "16x40"), s(UTIL, GPU0, "0.05x20 0.9x20"), *_pcie_max],
     (18, []), (40, []))
case("GpuPcieLinkDegraded", "flap", "busy/idle every minute, downshifting while idle",
     [s(PGEN, GPU0, alt(5, 1, 41)), s(PW, GPU0, "16x40"), s(UTIL, GPU0, alt(0.9, 0.05, 41)), *_pcie_max],
     (20, []), (40, []))
case("GpuPcieLinkDegraded", "gone", "fires, then the GPU's series vanish: resolves",
     [s(PGEN, GPU0, "4x20 stale"), s(PW, GPU0, "16x20 stale"), s(UTIL, GPU0, "0.9x20 stale"),
      s(PGENMAX, GPU0, "5x20 stale"), s(PWMAX, GPU0, "16x20 stale")], (18, _pcie_exp), (22, []))

PR = "gpuobs_gpu_pcie_replays_total"
_pr_exp = [(GPU0, f"{G} has 2 PCIe replays per second.")]
case("GpuPcieReplayRate", "fires", "120 replays a minute", [s(PR, GPU0, "0+120x30"), s(PR, GPU1, "0+5x30")],
     (10, _pr_exp), (30, _pr_exp))
case("GpuPcieReplayRate", "quiet", "30 replays a minute", [s(PR, GPU0, "0+30x30")], (10, []), (30, []))
case("GpuPcieReplayRate", "flap", "a 3-minute burst every 10 minutes: never 5m over",
     [s(PR, GPU0, cum(([0] * 7 + [200] * 3) * 4))], (15, []), (30, []), (40, []))
case("GpuPcieReplayRate", "gone", "fires, then the counter vanishes: resolves after its 5m window",
     [s(PR, GPU0, "0+120x20 stale")], (15, _pr_exp), (25, []))

# ---- presence and health: the GPU, NVML, the exporter and its parts, scraped every 30 s. A health alert
# fires on a sustained fault, on its input bad every other scrape or one scrape in five for an hour, and
# stays quiet on one bad scrape, an exporter restart, a new target's first failed scrapes and 5 % noise.
HOUR = 120  # scrapes in an hour


def states(*runs: tuple[str, int]) -> list[str]:
    """Scrape by scrape: "ok", "bad", or "gone" (no series: the exporter down or restarting)."""
    return [state for state, n in runs for _ in range(n)]


def every(n: int, period: int) -> list[str]:
    """n scrapes, every period-th bad (the first one)."""
    return ["bad" if i % period == 0 else "ok" for i in range(n)]


def render(tokens: list[str]) -> str:
    """promtool values from one token per scrape, runs compressed ("1x3" is four 1s, "_x3" three gaps)."""
    out, i = [], 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        tok, n = tokens[i], j - i
        out += [tok] * n if tok == "stale" or n == 1 else [f"_x{n}" if tok == "_" else f"{tok}x{n - 1}"]
        i = j
    return " ".join(out)


def gauge(st: list[str], good, bad) -> str:
    """A 0/1 health gauge: good or bad while there, a stale marker when its target goes, then gaps."""
    tokens, prev = [], "gone"
    for x in st:
        tokens.append(str(good) if x == "ok" else str(bad) if x == "bad" else "_" if prev == "gone" else "stale")
        prev = x
    return render(tokens)


def present_while_bad(st: list[str]) -> str:
    """gpuobs_gpu_unhealthy{reason}: 1 while the GPU is bad, absent otherwise."""
    tokens, prev = [], "ok"
    for x in st:
        tokens.append("1" if x == "bad" else "stale" if prev == "bad" else "_")
        prev = x
    return render(tokens)


UNHEALTHY = "gpuobs_gpu_unhealthy"


def health_alert(alert, metric, labels, bad, good, desc, *, exp_labels=None, reason=None, other=None,
                 quiet_extra=(), restart=None):
    """The cases every health alert gets, at 30 s. reason: the GPU's gpuobs_gpu_unhealthy reason while bad;
    restart: the scrapes of an exporter restart (default: its series gone for two scrapes, then one bad
    reading, as at start-up)."""
    f = _seconds(ALERTS[alert].for_) / 60
    exp = [(exp_labels or labels, desc)]
    other = other or ({**labels, "gpu": "1", "uuid": "GPU-b"} if "gpu" in labels else
                      {**labels, "node": "n9", "instance": "n9:9445"})

    def signal(st: list[str], lab=labels) -> list[dict]:
        out = [s(metric, lab, gauge(st, good, bad))]
        if reason:
            out.append(s(UNHEALTHY, {**lab, "reason": reason}, present_while_bad(st)))
        return out

    def add(kind, what, st, *checks, extra=()):
        case(alert, kind, what, [*signal(st), *extra], *checks, interval="30s")

    steady = [s(metric, other, gauge(states(("ok", 2 * HOUR)), good, bad))]
    add("fires", f"bad for 20m after an hour of good: fires after its for ({ALERTS[alert].for_}), resolves "
                 "15m after the last bad scrape (another target stays good)",
        states(("ok", HOUR), ("bad", 40), ("ok", 60)), (60 + f - 0.5, []), (60 + f, exp), (79.5, exp), (94.5, exp),
        (95, []), extra=steady)
    add("flap", "bad every other scrape for an hour: fires once a tenth of the hour's scrapes were bad",
        states(("ok", HOUR), *[("bad", 1), ("ok", 1)] * 60, ("ok", 40)), (71.5, []), (73 + f, exp), (100, exp),
        (119.5, exp), (134, exp), (135, []))
    add("flap", "bad one scrape in five for an hour",
        states(("ok", HOUR)) + every(HOUR, 5) + states(("ok", 40)), (89.5, []), (91 + f, exp), (119.5, exp),
        (132.5, exp), (133.5, []))
    add("quiet", "a single bad scrape in two hours" + ("; other targets' troubles" if quiet_extra else ""),
        states(("ok", HOUR), ("bad", 1), ("ok", HOUR - 1)), (60, []), (60.5, []), (61, []), (90, []), (119.5, []),
        extra=quiet_extra)
    add("quiet", "an exporter restart: " + ("two failed scrapes" if restart else
                                            "its series gone for two scrapes, then one bad reading"),
        restart or states(("ok", HOUR), ("gone", 2), ("bad", 1), ("ok", HOUR - 3)),
        (60.5, []), (61, []), (62, []), (75, []), (100, []))
    add("quiet", "a new target whose first two scrapes are bad",
        states(("gone", 60), ("bad", 2), ("ok", HOUR)), (31, []), (45, []), (60, []), (89.5, []))
    add("quiet", "one scrape in twenty bad (5 %) for two hours", every(2 * HOUR, 20), (60, []), (100, []),
        (119.5, []))
    add("gone", "bad for 30m, then the series vanish (the exporter or target goes: other alerts' case): resolves",
        states(("ok", HOUR), ("bad", 60), ("gone", 20)), (60 + f, exp), (89.5, exp), (90, []), (95, []))


health_alert("GpuLost", "gpuobs_gpu_up", GPU0, 0, 1,
             f"{G} is lost: it no longer answers NVML, now or in more than 10% of the last 1h's samples.",
             reason="lost")
health_alert("GpuUnhealthy", "gpuobs_gpu_up", GPU0, 0, 1,
             f"{G} is unusable (timeout), now or in more than 10% of the last 1h's samples: its metrics are "
             "withheld meanwhile.", exp_labels={**GPU0, "reason": "timeout"}, reason="timeout")
_lost_exp = [(GPU0, f"{G} is lost: it no longer answers NVML, now or in more than 10% of the last 1h's samples.")]


def _unh(reason: str) -> list:
    return [({**GPU0, "reason": reason}, f"{G} is unusable ({reason}), now or in more than 10% of the last 1h's "
                                         "samples: its metrics are withheld meanwhile.")]


_bad20 = states(("ok", HOUR), ("bad", 40), ("ok", 20))
case("GpuLost", "fires", "an exporter without gpuobs_gpu_unhealthy: gpuobs_gpu_up 0 alone is a lost GPU",
     [s("gpuobs_gpu_up", GPU0, gauge(_bad20, 1, 0))], (61, _lost_exp), (79, _lost_exp), interval="30s")
case("GpuLost", "quiet", "the GPU needs a reset (reason reset_required): GpuUnhealthy's case, not a second page",
     [s("gpuobs_gpu_up", GPU0, gauge(_bad20, 1, 0)),
      s(UNHEALTHY, {**GPU0, "reason": "reset_required"}, present_while_bad(_bad20))], (61, []), (79, []),
     interval="30s")
case("GpuUnhealthy", "quiet", "the GPU is lost (reason lost): GpuLost's case, not a second page",
     [s("gpuobs_gpu_up", GPU0, gauge(_bad20, 1, 0)),
      s(UNHEALTHY, {**GPU0, "reason": "lost"}, present_while_bad(_bad20))], (61, []), (79, []), interval="30s")
# reads time out from minute 60, then the GPU falls off the bus at 70: one page at a time, lost wins
_timeout_then_lost = [s("gpuobs_gpu_up", GPU0, gauge(_bad20, 1, 0)),
                      s(UNHEALTHY, {**GPU0, "reason": "timeout"},
                        present_while_bad(states(("ok", HOUR), ("bad", 20), ("ok", 40)))),
                      s(UNHEALTHY, {**GPU0, "reason": "lost"},
                        present_while_bad(states(("ok", HOUR + 20), ("bad", 20), ("ok", 20))))]
case("GpuUnhealthy", "fires", "reads time out at 60, then the GPU is lost at 70: GpuUnhealthy until then",
     _timeout_then_lost, (61, _unh("timeout")), (69.5, _unh("timeout")), (70, []), (75, []), interval="30s")
case("GpuLost", "fires", "reads time out at 60, then the GPU is lost at 70: GpuLost from then on",
     _timeout_then_lost, (61, []), (69.5, []), (71, _lost_exp), (79, _lost_exp), interval="30s")

TIMEOUTS, PASSES = "gpuobs_exporter_gpu_timeouts_total", "gpuobs_exporter_samples_total"


def _to_pct(pct) -> list:
    return [(GPU0, f"{G} missed the exporter's sampling deadline in {pct}% of its sampling passes over the last 1h: "
                   "its series have gaps.")]


_to_exp = _to_pct(10)
_passes = s(PASSES, NODE, "0+10x120")  # a pass every 6 s
case("GpuSamplingTimeouts", "fires", "one pass in ten times out on GPU0 (none on GPU1)",
     [_passes, s(TIMEOUTS, GPU0, "0+1x120"), s(TIMEOUTS, GPU1, "0x120")], (10, []), (17, _to_exp), (60, _to_exp),
     (110, _to_exp))
case("GpuSamplingTimeouts", "quiet", "one timeout every 20 minutes, and a burst of 5 once (under 1 %)",
     [_passes, s(TIMEOUTS, GPU0, cum(([0] * 19 + [1]) * 3 + [5] + [0] * 60))], (30, []), (61, []), (100, []))
case("GpuSamplingTimeouts", "flap", "2 timeouts every other minute (10 % on average): fires",
     [_passes, s(TIMEOUTS, GPU0, cum([2, 0] * 60))], (10, []), (30, _to_pct(10.17)), (110, _to_pct(10)))
case("GpuSamplingTimeouts", "gone", "fires, then the exporter's series vanish: resolves at once",
     [s(PASSES, NODE, "0+10x40 stale"), s(TIMEOUTS, GPU0, "0+1x40 stale")], (30, _to_exp), (40, _to_exp),
     (41, []))

_missing = "n1 has {} GPUs, fewer than it should have."
case("GpuMissing", "fires", "7 of 8 GPUs present",
     [s("gpuobs_gpus_present", NODE, "8 8 7x30"), s("gpuobs_gpus_expected", NODE, "8x32")],
     (6, []), (7, [(NODE, _missing.format(7))]), (20, [(NODE, _missing.format(7))]))
case("GpuMissing", "quiet", "8 of 8 present, on two nodes",
     [s("gpuobs_gpus_present", NODE, "8x30"), s("gpuobs_gpus_expected", NODE, "8x30"),
      s("gpuobs_gpus_present", {**NODE, "node": "n2", "instance": "n2:9445"}, "4x30"),
      s("gpuobs_gpus_expected", {**NODE, "node": "n2", "instance": "n2:9445"}, "4x30")], (10, []), (30, []))
case("GpuMissing", "flap", "one GPU in and out every minute: never 5m in a row",
     [s("gpuobs_gpus_present", NODE, alt(7, 8, 41)), s("gpuobs_gpus_expected", NODE, "8x40")], (10, []), (40, []))
case("GpuMissing", "gone", "every GPU vanishes: 0 present while 8 expected still fires",
     [s("gpuobs_gpus_present", NODE, "8 8 0x30"), s("gpuobs_gpus_expected", NODE, "8x32")],
     (7, [(NODE, _missing.format(0))]), (30, [(NODE, _missing.format(0))]))

_nvml_down = ("NVML does not answer on n1 (or has not finished initialising since the exporter started), now or in "
              "more than 10% of the last 1h's scrapes: no GPU can be read then.")
health_alert("NvmlDown", "gpuobs_nvml_up", NODE, 0, 1, _nvml_down)
# an exporter serves gpuobs_nvml_up 0 (reason "initializing") from its first scrape until its first pass
case("NvmlDown", "fires", "a new exporter whose first nvmlInit never completes: fires after its for (5m)",
     [s("gpuobs_nvml_up", NODE, gauge(states(("gone", 120), ("bad", 120)), 1, 0))],
     (64.5, []), (65, [(NODE, _nvml_down)]), (119.5, [(NODE, _nvml_down)]), interval="30s")
case("NvmlDown", "quiet", "a new exporter whose first nvmlInit takes 4 minutes, then completes",
     [s("gpuobs_nvml_up", NODE, gauge(states(("gone", 120), ("bad", 8), ("ok", 120)), 1, 0))],
     (62, []), (64, []), (65, []), (90, []), (119.5, []), interval="30s")
health_alert("GpuExporterDown", "up", NODE, 0, 1,
             "The gpuobs exporter on n1 (n1:9445) cannot be scraped, now or in more than 10% of the last 1h's "
             "scrapes.",
             quiet_extra=[s("up", {**NODE, "job": "node-exporter", "instance": "n1:9100"}, "0x240")],
             restart=states(("ok", HOUR), ("bad", 2), ("ok", HOUR - 2)))
health_alert("GpuMetricsStale", "gpuobs_exporter_snapshot_stale", NODE, 1, 0,
             "The exporter on n1 has no fresh snapshot, now or in more than 10% of the last 1h's scrapes: NVML "
             "calls are hanging.")
_coll = {**NODE, "collector": "nvlink"}
health_alert("GpuExporterCollectorFailing", "gpuobs_exporter_collector_success", _coll, 0, 1,
             "The nvlink collector of the exporter on n1 fails, now or in more than 10% of the last 1h's scrapes: "
             "its metrics are missing and the alerts on them cannot fire.",
             other={**_coll, "collector": "power"})
health_alert("GpuXidWatcherDown", "gpuobs_exporter_xid_watcher_up", NODE, 0, 1,
             "The XID watcher of the exporter on n1 is down, now or in more than 10% of the last 1h's scrapes: "
             "XIDs on this node may be missed.")

# ---- attribution: every health case in a cluster without kube-state-metrics (a Slurm cluster), then
# kube-state-metrics deciding whether the node has GPU pods to attribute
_attr = {**NODE, "source": "podresources"}
_attr_desc = ("The podresources attribution of the exporter on n1 fails, now or in more than 10% of the last 1h's "
              "scrapes: its GPUs' series carry no pod, namespace or job, so the fleet's allocation, idle-GPU and cost "
              "records and the per-pod panels miss them.")
health_alert("GpuAttributionDown", c.ATTRIBUTION_UP.name, _attr, 0, 1, _attr_desc)


def _gpu_pod(node: str, values: str) -> dict:
    """kube-state-metrics' GPU request of one pod on node."""
    return s("kube_pod_container_resource_requests", {"cluster": "c1", "namespace": "ml", "pod": f"p-{node}",
                                                      "container": "main", "node": node,
                                                      "resource": "nvidia_com_gpu", "unit": "integer"}, values)


case("GpuAttributionDown", "fires", "kube-state-metrics shows a GPU pod on the node: down from minute 10",
     [s(c.ATTRIBUTION_UP.name, _attr, "1x20 0x100"), _gpu_pod("n1", "1x130")],
     (25, []), (26, [(_attr, _attr_desc)]), (59.5, [(_attr, _attr_desc)]), interval="30s")
case("GpuAttributionDown", "quiet", "down on a node with no GPU pod (kube-state-metrics shows one on another node "
     "only): nothing to attribute", [s(c.ATTRIBUTION_UP.name, _attr, "1x20 0x100"), _gpu_pod("n2", "1x130")],
     (26, []), (45, []), (59.5, []), interval="30s")

# ---- an exporter that left service discovery (its `up` is gone), 30 s scrapes
_ns = {"namespace": "gpu-monitoring"}
_t1 = {**NODE, **_ns, "pod": "gpuobs-exporter-aaaaa"}
_t2 = {**NODE, **_ns, "node": "n2", "instance": "n2:9445", "pod": "gpuobs-exporter-bbbbb"}
_gone_exp = [({k: v for k, v in _t2.items() if k != "pod"},
              "The gpuobs exporter on n2 (n2:9445) left service discovery while other exporters are still scraped: "
              "the node's GPUs are not monitored (it resolves 1h after its last scrape if the node was removed on "
              "purpose).")]
_up1 = s("up", _t1, "1x240")
case("GpuExporterGone", "fires", "n2's target leaves service discovery at minute 10 while n1 stays; resolves an "
                                 "hour after its last scrape (a node removed on purpose)",
     [_up1, s("up", _t2, "1x19 stale")], (9.5, []), (14.5, []), (15, _gone_exp), (69.5, _gone_exp), (70, []),
     interval="30s")
case("GpuExporterGone", "quiet", "every target present, one of them down (GpuExporterDown's case)",
     [_up1, s("up", _t2, "1x20 0x100")], (15, []), (30, []), (60, []), interval="30s")
case("GpuExporterGone", "quiet", "rolling restart: n2's pod is replaced, its new pod scraped 1.5 minutes later",
     [_up1, s("up", _t2, "1x19 stale"), s("up", {**_t2, "pod": "gpuobs-exporter-ccccc"}, "_x23 1x100")],
     (11, []), (13, []), (20, []), (60, []), interval="30s")
case("GpuExporterGone", "quiet", "rolling restart where the target's instance is the pod's address: same node",
     [_up1, s("up", {**_t2, "instance": "10.0.0.2:9445"}, "1x19 stale"),
      s("up", {**_t2, "instance": "10.0.0.7:9445", "pod": "gpuobs-exporter-ccccc"}, "_x22 1x100")],
     (11, []), (15, []), (20, []), (60, []), interval="30s")
_static = {"cluster": "c1", "job": "gpuobs"}
case("GpuExporterGone", "fires", "static targets without a node label: one leaves the configuration",
     [s("up", {**_static, "instance": "h1:9445"}, "1x100"), s("up", {**_static, "instance": "h2:9445"}, "1x19 stale")],
     (14.5, []), (15, [({**_static, "instance": "h2:9445"}, "The gpuobs exporter on  (h2:9445) left service "
                        "discovery while other exporters are still scraped: the node's GPUs are not monitored (it "
                        "resolves 1h after its last scrape if the node was removed on purpose).")]), interval="30s")
case("GpuExporterGone", "flap", "n2's target drops out of discovery every other scrape: never gone 5m",
     [_up1, s("up", _t2, " ".join("1" if i % 2 == 0 else "stale" for i in range(120)))], (20, []), (59.5, []),
     interval="30s")
case("GpuExporterGone", "gone", "every target goes at once: GpuExporterAbsent's case, not one page per node",
     [s("up", _t1, "1x19 stale"), s("up", _t2, "1x19 stale")], (15, []), (30, []), interval="30s")

KSM_DESIRED, KSM_AVAILABLE, KSM_UPDATED = (f"kube_daemonset_status_{x}" for x in
                                           ("desired_number_scheduled", "number_available", "updated_number_scheduled"))
_ds = {"cluster": "c1", "job": "kube-state-metrics", "instance": "ksm:8080", **_ns, "daemonset": "gpuobs-exporter"}
_ds_exp = [({"cluster": "c1", **_ns, "daemonset": "gpuobs-exporter"},
            "DaemonSet gpu-monitoring/gpuobs-exporter has 1 of its pods unavailable and no rollout progressing: the "
            "GPUs of those nodes are not monitored.")]


def daemonset(desired: str, available: str, updated: str, labels=_ds) -> list[dict]:
    return [s(KSM_DESIRED, labels, desired), s(KSM_AVAILABLE, labels, available), s(KSM_UPDATED, labels, updated)]


case("GpuExporterPodsUnavailable", "fires", "7 of 8 exporter pods available from minute 5 (one crash-loops)",
     daemonset("8x40", "8x4 7x36", "8x40"), (19, []), (21, _ds_exp), (40, _ds_exp))
case("GpuExporterPodsUnavailable", "fires", "a rollout that stops at 2 of 8 pods updated, one unavailable",
     daemonset("8x40", "8 7x39", "0 1 2x38"), (20, []), (23, _ds_exp), (40, _ds_exp))
case("GpuExporterPodsUnavailable", "quiet", "all 8 available; another DaemonSet misses a pod",
     [*daemonset("8x40", "8x40", "8x40"), *daemonset("5x40", "4x40", "5x40", {**_ds, "daemonset": "other"})],
     (20, []), (40, []))
case("GpuExporterPodsUnavailable", "flap", "a rolling update: one pod replaced every 2 minutes for 16 minutes",
     daemonset("8x40", "8 7x16 8x22", "0 " + " ".join(str(min(8, 1 + i // 2)) for i in range(39))),
     (10, []), (20, []), (40, []))
case("GpuExporterPodsUnavailable", "gone", "fires, then kube-state-metrics' series vanish: resolves",
     daemonset("8x25 stale", "7x25 stale", "8x25 stale"), (20, _ds_exp), (25, _ds_exp), (27, []))

LOGS = "gpuobs_telemetry_log_records_dropped_total"


def _logs_exp(n: int) -> list:
    return [(NODE, f"gpuobs target n1:9445 dropped {n} log records in the last 15m, and has kept dropping them for "
                   "30m: its Fluentd is down or too slow.")]


case("TelemetryLogRecordsDropped", "fires", "Fluentd down from minute 10 to 60: 50 records dropped a minute",
     [s(LOGS, NODE, cum([0] * 10 + [50] * 50 + [0] * 40)), s(LOGS, {**NODE, "instance": "n2:9445"}, "0x100")],
     (39, []), (41, _logs_exp(750)), (60, _logs_exp(700)), (77, []))
case("TelemetryLogRecordsDropped", "quiet", "a burst of 200 drops once (a Fluentd restart), another 50m later",
     [s(LOGS, NODE, cum([0] * 20 + [200] + [0] * 49 + [30] + [0] * 40))], (30, []), (60, []), (90, []), (110, []))
case("TelemetryLogRecordsDropped", "flap", "a few drops every 10 minutes for 90 minutes: fires (recurring)",
     [s(LOGS, NODE, cum(([5] + [0] * 9) * 9))], (20, []), (39, []), (45, _logs_exp(5)), (80, _logs_exp(10)))
case("TelemetryLogRecordsDropped", "gone", "fires, then the process ends: resolves once its drops leave the window",
     [s(LOGS, NODE, cum([50] * 50) + " stale")], (45, _logs_exp(750)), (66, []))

_absent_exp = [({"job": "gpuobs"}, "Prometheus scrapes no target of job gpuobs: GPU alerts cannot fire.")]
case("GpuExporterAbsent", "fires", "no up{job=gpuobs} at all (only other jobs)",
     [s("up", {**NODE, "job": "node-exporter", "instance": "n1:9100"}, "1x20")], (4, []), (5, _absent_exp),
     (20, _absent_exp))
case("GpuExporterAbsent", "quiet", "the exporter is down but still a target (GpuExporterDown's case)",
     [s("up", NODE, "0x20")], (10, []), (20, []))
case("GpuExporterAbsent", "flap", "the target comes and goes every minute: never absent 5m",
     [s("up", NODE, " ".join("1" if i % 2 == 0 else "stale" for i in range(41)))], (10, []), (40, []))
case("GpuExporterAbsent", "gone", "the last target disappears at minute 11",
     [s("up", NODE, "1x10 stale")], (10, []), (15, []), (16, _absent_exp), (30, _absent_exp))

# ---- training
LAST = "gpuobs_training_step_last_timestamp_seconds"
ENDED = "gpuobs_training_run_end_timestamp_seconds"
_r0 = {**TRAIN, "rank": "0"}
_r1 = {**TRAIN, "rank": "1", "instance": "n2:9464"}
_stall_exp = [(_r0, "Rank 0 of job j1 has not finished a step for 10m.")]
case("TrainingStalled", "fires", "steps every minute until minute 10, then none",
     [s(LAST, _r0, "0+60x10 600x30"), s(LAST, {**TRAIN, "rank": "1"}, "0+60x40")],
     (20, []), (21, _stall_exp), (40, _stall_exp))
case("TrainingStalled", "fires", "from minute 10 every step of rank 0 raises and the loop goes on: the failed "
     "steps count in their own counter and never move the last-step time",
     [s(LAST, _r0, "0+60x10 600x30"), s("gpuobs_training_steps_failed_total", {**_r0, "exception": "Flaky"},
                                        "0x10 0+60x30")], (20, []), (21, _stall_exp), (40, _stall_exp))
case("TrainingStalled", "quiet", "a step every minute", [s(LAST, _r0, "0+60x40")], (20, []), (40, []))
case("TrainingStalled", "flap", "a step every 8 minutes (slow, but progressing)",
     [s(LAST, _r0, " ".join(str(i // 8 * 8 * 60) for i in range(41)))], (20, []), (40, []))
case("TrainingStalled", "gone", "the job ends and its series vanish: not a stall (TrainingRankLost's case)",
     [s(LAST, _r0, "0+60x10 stale")], (15, []), (30, []))

_lost_exp = [(_r1, "Rank 1 of job j1 stopped reporting while other ranks of the job still run: its process exited "
                   "or its target was removed.")]
case("TrainingRankLost", "fires", "rank 1's series vanish at minute 11 while rank 0 trains on; visible 1h",
     [s(LAST, _r0, "0+60x80"), s(LAST, _r1, "0+60x10 stale")], (11, []), (13, _lost_exp), (69, _lost_exp),
     (72, []))
case("TrainingRankLost", "quiet", "both ranks train; another job ends whole (all its ranks at once)",
     [s(LAST, _r0, "0+60x40"), s(LAST, _r1, "0+60x40"), s(LAST, {**_r0, "job_id": "j2"}, "0+60x10 stale"),
      s(LAST, {**_r1, "job_id": "j2"}, "0+60x10 stale")], (5, []), (12, []), (30, []))
case("TrainingRankLost", "flap", "rank 1's scrape fails every other minute: never lost for 1m",
     [s(LAST, _r0, "0+60x40"), s(LAST, _r1, " ".join(str(i * 60) if i % 2 == 0 else "stale" for i in range(41)))],
     (5, []), (20, []), (40, []))
case("TrainingRankLost", "quiet", "rank 1's target is down but still scraped: TrainingTargetDown's case",
     [s(LAST, _r0, "0+60x40"), s(LAST, _r1, "0+60x10 stale"), s("up", _r1 | {"rank": None} and
      {k: v for k, v in _r1.items() if k not in ("rank", "job_id")}, "1x10 0x30")], (13, []), (30, []))
case("TrainingRankLost", "quiet", "rank 1 ends normally (its last scrape marks the end) 3 minutes before rank 0",
     [s(LAST, _r0, "0+60x14 stale"), s(LAST, _r1, "0+60x11 stale"), s(ENDED, _r1, "0x10 660 stale")],
     (13, []), (14, []), (30, []))
case("TrainingRankLost", "gone", "rank 1 lost, then the rest of the job ends too: resolves",
     [s(LAST, _r0, "0+60x20 stale"), s(LAST, _r1, "0+60x10 stale")], (13, _lost_exp), (20, _lost_exp), (22, []))

_up0 = {k: v for k, v in _r0.items() if k not in ("rank", "job_id")}  # the target's own labels
_down_exp = [(_r0, "Rank 0 of job j1 (n1:9464) is still a scrape target but does not answer: the process crashed "
                   "or hangs.")]
case("TrainingTargetDown", "fires", "the rank's process crashes at minute 11; its target stays down: fires until "
     "the target goes, past the 1h its last step is looked for",
     [s(LAST, _r0, "0+60x10 stale"), s(ENDED, _r0, "0x10 stale"), s("up", _up0, "1x10 0x150")], (11, []),
     (13, _down_exp), (69, _down_exp), (72, _down_exp), (160, _down_exp))
case("TrainingTargetDown", "fires", "crashes at minute 11, restarted at minute 31 on the same target: resolves",
     [s(LAST, _r0, "0+60x10 _x20 1860+60x20"), s(ENDED, _r0, "0x10 _x20 0x20"), s("up", _up0, "1x10 0x20 1x20")],
     (13, _down_exp), (30, _down_exp), (32, []), (50, []))
case("TrainingTargetDown", "fires", "a run ends normally at minute 11; the next run on its target crashes at 31",
     [s(LAST, _r0, "0+60x11 _x9 1200+60x10 stale"), s(ENDED, _r0, "0x10 660 _x9 0x10 stale"),
      s("up", _up0, "1x11 0x8 1x10 0x30")], (15, []), (25, []), (34, _down_exp), (60, _down_exp))
case("TrainingTargetDown", "quiet", "the target answers; a down target that never exported training series",
     [s(LAST, _r0, "0+60x40"), s("up", _up0, "1x40"), s("up", {**_up0, "instance": "n9:9445", "job": "gpuobs"},
                                                       "0x40")], (5, []), (30, []))
case("TrainingTargetDown", "quiet", "the run ends normally at minute 11 (its last scrape marks the end); its static "
     "target stays, down",
     [s(LAST, _r0, "0+60x11 stale"), s(ENDED, _r0, "0x10 660 stale"), s("up", _up0, "1x11 0x100")],
     (13, []), (30, []), (70, []), (100, []))
case("TrainingTargetDown", "flap", "every other scrape fails: never down for 1m",
     [s(LAST, _r0, " ".join(str(i * 60) if i % 2 == 0 else "stale" for i in range(41))),
      s("up", _up0, alt(1, 0, 41))], (5, []), (20, []), (40, []))
case("TrainingTargetDown", "gone", "fires, then the target is removed from service discovery: resolves",
     [s(LAST, _r0, "0+60x10 stale"), s("up", _up0, "1x10 0x5 stale")], (13, _down_exp), (15, _down_exp),
     (17, []))

STEP_Q = "gpuobs_training_step_duration_quantile_seconds"
_p50 = {**_r0, "quantile": "0.5"}
_reg_exp = [({"job_id": "j1"}, "Job j1 steps take 1.04 s, over 1.2x its median of the last 6h.")]
case("TrainingStepTimeRegression", "fires", "2h at 0.8 s a step, then 1.3x slower (1.04 s)",
     [s(STEP_Q, _p50, "0.8x120 1.04x60")], (128, []), (140, _reg_exp), (180, _reg_exp))
case("TrainingStepTimeRegression", "quiet", "1.1x slower after 2h; and a job slow from its start (its own baseline)",
     [s(STEP_Q, _p50, "0.8x120 0.88x60"), s(STEP_Q, {**_p50, "job_id": "j2"}, "1.5x180")], (150, []), (180, []))
case("TrainingStepTimeRegression", "flap", "a 10-minute slowdown: shorter than its for (15m)",
     [s(STEP_Q, _p50, "0.8x120 1.5x10 0.8x50")], (130, []), (140, []), (170, []))
case("TrainingStepTimeRegression", "gone", "fires, then the job ends and its series vanish: resolves",
     [s(STEP_Q, _p50, "0.8x120 1.04x40 stale")], (158, _reg_exp), (161, _reg_exp), (163, []))

_reg_cause = [({"job_id": "j1", "cause": "thermal", "cause_gpu": "GPU-b", "cause_rank": "1"},
               "Job j1 steps take 1.04 s, over 1.2x its median of the last 6h. Likely cause: thermal on rank 1 "
               "(GPU GPU-b).")]
case("TrainingStepTimeRegression", "fires", "after 2h steps 1.3x slower while rank 1's GPU-b is in HW thermal "
     "slowdown: the job's cause names rank and GPU",
     [s(STEP_Q, _p50, "0.8x120 1.04x60"), s(RANK_INFO, {**_r0, "rank": "1", "host": "n1", "uuid": "GPU-b"}, "1x180"),
      s(RANK_INFO, {**_r0, "host": "n1", "uuid": "GPU-a"}, "1x180"), s(GPU_INFO, GPU0, "1x180"),
      s(GPU_INFO, GPU1, "1x180"), s(REASON, {**GPU1, "reason": "hw_thermal_slowdown"}, "0x120 1x60")],
     (128, []), (140, _reg_cause), (180, _reg_cause))

BAD = "gpuobs_training_badput_seconds_total"
_wait = {**_r0, "cause": "data_wait"}
_wait_exp = [({"job_id": "j1", "rank": "0"}, "Rank 0 of job j1 spent 40% of the last 5m waiting for data.")]
case("TrainingDataLoaderBound", "fires", "waits 24 s a minute (40 %), another rank 6 s (10 %)",
     # rate() divides by the whole window: 0.4 is read once the 5m window is full (minute 5), + for 15m
     [s(BAD, _wait, "0+24x40"), s(BAD, {**_wait, "rank": "1"}, "0+6x40")], (18, []), (21, _wait_exp), (40, _wait_exp))
case("TrainingDataLoaderBound", "quiet", "a few slow batches: one 30 s wait in a minute of 3 s waits",
     [s(BAD, _wait, cum([3] * 10 + [30] + [3] * 30))], (12, []), (30, []))
case("TrainingDataLoaderBound", "flap", "24 s of waiting every other minute: 20 % on average",
     [s(BAD, _wait, cum([24, 0] * 20))], (20, []), (40, []))
case("TrainingDataLoaderBound", "gone", "fires, then training stops (the counter stops growing): resolves",
     [s(BAD, _wait, "0+24x25 600x20")], (21, _wait_exp), (25, _wait_exp), (31, []))

CKPT = "gpuobs_training_checkpoint_duration_seconds"
_ckpt_exp = [(_r0, "Job j1 rank 0 checkpoints take 900 s on average.")]
case("TrainingSlowCheckpoint", "fires", "one checkpoint of 900 s at minute 11; leaves the 1h window at 71",
     [s(f"{CKPT}_sum", _r0, "0x10 900x70"), s(f"{CKPT}_count", _r0, "0x10 1x70")],
     (10, []), (11, _ckpt_exp), (70, _ckpt_exp), (72, []))
case("TrainingSlowCheckpoint", "quiet", "checkpoints of 120 s every 20 minutes",
     [s(f"{CKPT}_sum", _r0, cum(([120] + [0] * 19) * 4)), s(f"{CKPT}_count", _r0, cum(([1] + [0] * 19) * 4))],
     (30, []), (79, []))
case("TrainingSlowCheckpoint", "gone", "one slow checkpoint, then the job ends: resolves when it leaves the 1h window",
     [s(f"{CKPT}_sum", _r0, "0x10 900x10 stale"), s(f"{CKPT}_count", _r0, "0x10 1x10 stale")],
     (15, _ckpt_exp), (70, _ckpt_exp), (71, []))

COMPUTE, STEPS = "gpuobs_training_compute_seconds_total", "gpuobs_training_steps_total"


def ranks(n: int, per_step: dict[int, list[float]], end: dict[int, str] | None = None) -> list[dict]:
    """n ranks stepping 60 times a minute; per_step[r] is rank r's compute seconds per step by
    minute (default 0.8 s every minute); end[r] is appended to rank r's series (e.g. ' stale')."""
    out = []
    minutes = max(len(v) for v in per_step.values())
    for r in range(n):
        labels = {**TRAIN, "rank": str(r)}
        compute = per_step.get(r, [0.8] * minutes)
        tail = (end or {}).get(r, "")
        out += [s(COMPUTE, labels, cum(60 * x for x in compute) + tail),
                s(STEPS, labels, cum([60] * len(compute)) + tail)]
    return out


NO_CAUSE = " No cause found on its GPUs: look at the host (CPU, memory, NIC, other jobs)."


def _strag(rank: str, ratio: str, cause: str = "none", gpu: str = "") -> list:
    """The straggler alert on rank `rank` of j1, with the cause the slowdown records name."""
    labels = {"job_id": "j1", "rank": rank, "cause": cause, **({"cause_gpu": gpu} if gpu else {})}
    why = NO_CAUSE if cause == "none" else f" Likely cause: {cause}" + (f" on GPU {gpu}." if gpu else ".")
    return [(labels, f"Rank {rank} of job j1 computes {ratio}x as long per step as the job's other ranks, which "
                     "wait for it in their collectives." + why)]


case("TrainingStragglerRank", "fires", "4 ranks; rank 2 computes 1.3x as long per step (1.04 vs 0.8 s)",
     ranks(4, {2: [1.04] * 41}), (15, []), (17, _strag("2", "1.30")), (40, _strag("2", "1.30")))
case("TrainingStragglerRank", "fires", "2 ranks, rank 1 1.3x: against the other rank, not the mean of both",
     ranks(2, {1: [1.04] * 41}), (15, []), (17, _strag("1", "1.30")), (40, _strag("1", "1.30")))
case("TrainingStragglerRank", "quiet", "4 ranks all at 0.8 s; 2 ranks 1.1x apart; a job of one rank",
     ranks(4, {0: [0.8] * 41}) + [x for x in ranks(2, {1: [0.88] * 41}) if not (x.update(
         series=x["series"].replace('job_id="j1"', 'job_id="j2"')))] + [
         s(COMPUTE, {**TRAIN, "job_id": "j3", "rank": "0"}, "0+48x40"),
         s(STEPS, {**TRAIN, "job_id": "j3", "rank": "0"}, "0+60x40")], (20, []), (40, []))
case("TrainingStragglerRank", "flap", "rank 2 slow 10 minutes only: shorter than its for (15m)",
     ranks(4, {2: [0.8] * 10 + [1.04] * 10 + [0.8] * 21}), (20, []), (30, []), (40, []))
case("TrainingStragglerRank", "gone", "fires, then the slow rank dies and its series vanish: resolves",
     # the dead rank's rate() still reads its last 5 minutes of samples
     ranks(4, {2: [1.04] * 31}, end={2: " stale"}), (28, _strag("2", "1.30")), (30, _strag("2", "1.30")),
     (37, []))

# ---- slowdown causes (gpuobs.records.slowdown): the straggler names its GPU's cause through each path
N2 = {**NODE, "node": "n2", "instance": "n2:9445"}


def placed(rank: int, n: int, host: str = "n1", **where) -> dict:
    """Rank `rank` of j1's info gauge over n samples: its host and, where given, uuid, k8s_namespace, k8s_pod."""
    return s(RANK_INFO, {**TRAIN, "rank": str(rank), "host": host, **where}, f"1x{n}")


def gpu_state(labels: dict, n: int, **reasons: str) -> list[dict]:
    """A GPU's info series and its clock-event reasons (reason -> values; every other default reason 0)."""
    out = [s(GPU_INFO, labels, f"1x{n}")]
    for reason in ("sw_power_cap", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"):
        out.append(s(REASON, {**labels, "reason": reason}, reasons.get(reason, f"0x{n}")))
    return out


_slow = ranks(2, {1: [1.04] * 41})  # rank 1 computes 1.3x as long as rank 0
_pod = {"k8s_namespace": "ml"}
case("TrainingStragglerRank", "fires", "rank 1 on GPU-b (its UUID) in HW thermal slowdown, also at its power cap: "
     "thermal; rank 0's GPU-a and n2's GPU throttle at their power cap (not its GPUs, lower too)",
     _slow + [placed(0, 41, uuid="GPU-a"), placed(1, 41, uuid="GPU-b")]
     + gpu_state(GPU0, 41, sw_power_cap="1x41") + gpu_state(GPU1, 41, hw_thermal_slowdown="1x41", sw_power_cap="1x41")
     + gpu_state({**N2, "gpu": "0", "uuid": "GPU-c"}, 41, hw_thermal_slowdown="1x41"),
     (17, _strag("1", "1.30", "thermal", "GPU-b")), (40, _strag("1", "1.30", "thermal", "GPU-b")))
case("TrainingStragglerRank", "fires", "rank 1's GPU-b healthy while rank 0's GPU-a is in HW thermal slowdown: no "
     "cause (the other rank's GPU is never named)",
     _slow + [placed(0, 41, uuid="GPU-a"), placed(1, 41, uuid="GPU-b")]
     + gpu_state(GPU0, 41, hw_thermal_slowdown="1x41") + gpu_state(GPU1, 41), (17, _strag("1", "1.30")),
     (40, _strag("1", "1.30")))
case("TrainingStragglerRank", "fires", "pod path (no UUIDs): rank 1 in pod ml/p1, whose GPU-b is in SW thermal "
     "slowdown; pod ml/p0 (rank 0) holds GPU-a at its power cap",
     _slow + [placed(0, 41, k8s_pod="p0", **_pod), placed(1, 41, k8s_pod="p1", **_pod)]
     + gpu_state({**GPU0, "k8s_pod": "p0", **_pod}, 41, sw_power_cap="1x41")
     + gpu_state({**GPU1, "k8s_pod": "p1", **_pod}, 41, sw_thermal_slowdown="1x41"),
     (17, _strag("1", "1.30", "thermal", "GPU-b")))
case("TrainingStragglerRank", "fires", "Slurm path: job j1 holds GPU-a on n1 (at its power cap alone: named), "
     "Slurm job j9 holds GPU-b in HW thermal slowdown (another job's: never named)",
     _slow + [placed(0, 41), placed(1, 41)] + gpu_state({**GPU0, "hpc_job": "j1"}, 41, sw_power_cap="1x41")
     + gpu_state({**GPU1, "hpc_job": "j9"}, 41, hw_thermal_slowdown="1x41"),
     (17, _strag("1", "1.30", "power_cap", "GPU-a")))
case("TrainingStragglerRank", "fires", "bare-host path: rank 1 on host n2, whose GPU-c brakes (HW power brake); n1's "
     "GPUs (rank 0's) are held by a pod and in thermal slowdown",
     _slow + [placed(0, 41), placed(1, 41, host="n2")]
     + gpu_state({**GPU0, "k8s_pod": "other", **_pod}, 41, hw_thermal_slowdown="1x41")
     + gpu_state({**N2, "gpu": "0", "uuid": "GPU-c"}, 41, hw_power_brake_slowdown="1x41"),
     (17, _strag("1", "1.30", "power_brake", "GPU-c")))
case("TrainingStragglerRank", "fires", "rank 1's GPU-b throttles (HW thermal) for one 30 s scrape at minute 16: "
     "under the evidence share (cause_min_share of 5m), no cause",
     ranks(2, {1: [1.04] * 82}) + [placed(0, 82, uuid="GPU-a"), placed(1, 82, uuid="GPU-b")]
     + gpu_state(GPU0, 82) + gpu_state(GPU1, 82, hw_thermal_slowdown="0x31 1 0x50"),
     (17, _strag("1", "1.30")), (18, _strag("1", "1.30")), interval="30s")

FAILED = "gpuobs_training_steps_failed_total"


def stepping(labels: dict, done: list[float], failed: list[float] | None, exception: str = "Flaky",
             end: str = "") -> list[dict]:
    """One rank's completed steps and failed steps (label exception) per minute, as counters; None:
    no such series (a rank that never failed; done=[]: one that never completed a step)."""
    out = [s(STEPS, labels, cum(done) + end)] if done else []
    if failed is not None:
        out.append(s(FAILED, {**labels, "exception": exception}, cum(failed) + end))
    return out


def _failing_exp(rank: str, pct: str, job: str = "j1") -> tuple[dict, str]:
    return ({"job_id": job, "rank": rank}, f"{pct} of the steps of rank {rank} of job {job} raised an exception "
                                           "over the last 5m: the loop catches it and goes on, but those steps "
                                           "train nothing.")


_r0j2 = {**_r0, "job_id": "j2"}
case("TrainingStepsFailing", "fires", "from minute 10 half of rank 0's steps raise; rank 1 healthy; a rank of "
     "another job whose every step fails from its start (no step counter at all)",
     stepping(_r0, [60] * 10 + [30] * 40, [0] * 10 + [30] * 40) + stepping(_r1, [60] * 50, None)
     + stepping(_r0j2, [], [60] * 50),
     (9, []), (20, [_failing_exp("0", "100%", "j2")]), (24, [_failing_exp("0", "100%", "j2")]),
     (30, [_failing_exp("0", "50%"), _failing_exp("0", "100%", "j2")]))
case("TrainingStepsFailing", "quiet", "one isolated failure (its series appearing at 1); one a minute in 60 steps",
     stepping(_r0, [60] * 40, [0] * 10 + [1] + [0] * 29) + stepping(_r1, [59] * 40, [1] * 40),
     (11, []), (30, []), (40, []))
case("TrainingStepsFailing", "flap", "a bad shard: 3 minutes of failing steps every 20 minutes (15 % overall)",
     stepping(_r0, ([60] * 17 + [0] * 3) * 3, ([0] * 17 + [60] * 3) * 3), (20, []), (40, []), (60, []))
case("TrainingStepsFailing", "quiet", "the trainer restarts at minute 15 (series gone 2 minutes, back from 0), one "
     "failed step before and one after",
     [s(STEPS, _r0, cum([60] * 15) + " stale stale " + cum([60] * 25)),
      s(FAILED, {**_r0, "exception": "Flaky"}, cum([0] * 5 + [1] + [0] * 9) + " stale stale " +
        cum([0] * 3 + [1] + [0] * 21))], (16, []), (18, []), (25, []), (42, []))
case("TrainingStepsFailing", "gone", "fires, then the job ends and its series vanish: resolves",
     stepping(_r0, [30] * 35, [30] * 35, end=" stale"), (25, [_failing_exp("0", "50%")]),
     (35, [_failing_exp("0", "50%")]), (42, []))

# Born at its first event: the rank's "other" series is at 0 from its start (gpuobs.instrument.train), a new
# exception type's series appears at the steps that failed before the next scrape (here a burst of 20)
_other = {**_r0, "exception": "other"}
case("TrainingStepsFailing", "fires", "10 steps a minute; from minute 10 half fail, the ValueError series born at 20 "
     "(a burst): counted from minute 10, so it fires at 25 (from increase() alone, at 26)",
     [s(STEPS, _r0, "0+10x40"), s(FAILED, _other, "0x40"), s(FAILED, {**_r0, "exception": "ValueError"},
                                                              "_x10 20+10x30")],
     (9, []), (24, []), (25, [_failing_exp("0", "50%")]), (40, [_failing_exp("0", "50%")]))
case("TrainingStepsFailing", "quiet", "a restarted Prometheus (or a newly found target) first sees a rank with 700 "
     "failed steps of long ago beside its 0 series: born with the others, not counted",
     [s(STEPS, _r0, "9000+10x30"), s(FAILED, _other, "0x30"), s(FAILED, {**_r0, "exception": "ValueError"}, "700x30")],
     (0, []), (5, []), (16, []), (30, []))

_dw = {"cause": "data_wait"}


def waits(n: int, per_min: dict[int, list[float]], minutes: int, job: str = "j1", end: str = "") -> list[dict]:
    """n ranks' data-wait badput counters: per_min[r] is rank r's seconds waited each minute (default
    1.5 s, a 2.5 % share)."""
    return [s(BAD, {**TRAIN, "job_id": job, "rank": str(r), **_dw}, cum(per_min.get(r, [1.5] * minutes)) + end)
            for r in range(n)]


def _loader_exp(rank: str, ratio: str) -> list:
    return [({"job_id": "j1", "rank": rank, "cause": "data_loader"},
             f"Rank {rank} of job j1 waits {ratio}x as long for its batches as the job's other ranks, which wait for "
             "it in their collectives: its data loader (storage, workers, host) is slow. Likely cause: data_loader.")]


case("TrainingDataLoaderStraggler", "fires", "4 ranks at 2.5 % data wait; from minute 10 rank 3 waits 23 % (the "
     "real job's 0.026 -> 0.231)", waits(4, {3: [1.5] * 10 + [14] * 40}, 50),
     (10, []), (24, []), (30, _loader_exp("3", "9.3")), (50, _loader_exp("3", "9.3")))
case("TrainingDataLoaderStraggler", "fires", "2 ranks: rank 1 against the other rank, not the mean of both",
     waits(2, {1: [1.5] * 10 + [9] * 40}, 50), (30, _loader_exp("1", "6.0")))
case("TrainingDataLoaderStraggler", "quiet", "every rank's wait rises alike to 23 %; a rank at 3x the others' "
     "1 % (5 % of its time); a job of one rank",
     waits(4, {r: [1.5] * 10 + [14] * 30 for r in range(4)}, 40)
     + waits(2, {0: [0.6] * 40, 1: [0.6] * 10 + [1.8] * 30}, 40, job="j2")
     + waits(1, {0: [30] * 40}, 40, job="j3"), (20, []), (30, []), (40, []))
case("TrainingDataLoaderStraggler", "flap", "rank 2 stalls 30 s on a batch every 12 minutes: up for 5m, never 15m",
     waits(4, {2: ([30] + [1.5] * 11) * 5}, 60), (20, []), (40, []), (60, []))
case("TrainingDataLoaderStraggler", "quiet", "rank 1 restarts at minute 15 (gone 2 minutes, back from 0) and warms "
     "its loader for a minute (20 s wait)",
     waits(4, {}, 40)[:1] + [s(BAD, {**_r1, **_dw}, cum([1.5] * 15) + " stale stale " + cum([0, 20] + [1.5] * 23))]
     + waits(4, {}, 40)[2:], (16, []), (20, []), (30, []), (40, []))
case("TrainingDataLoaderStraggler", "gone", "fires, then the slow rank's series vanish: resolves",
     waits(3, {}, 40) + [s(BAD, {**TRAIN, "rank": "3", **_dw}, cum([14] * 30) + " stale")],
     (20, _loader_exp("3", "9.3")), (30, _loader_exp("3", "9.3")), (37, []))

COLL = "gpuobs_training_collective_wait_seconds_total"


def job_phases(n: int, phases: list[tuple[int, float, float, float]], slow_rank: tuple[int, float] | None = None,
               job: str = "j1", gap: str = "", end: str = "") -> list[dict]:
    """n ranks of a synchronous job through phases of (minutes, compute s/step, collective wait
    s/step, data wait s/step): steps/min follow from the step time. slow_rank=(r, x): rank r computes
    x times as long and waits that much less in its collectives (the others wait for it). gap is put
    between the phases' series halves after the first phase (e.g. ' stale stale' for a restart)."""
    out = []
    for r in range(n):
        labels = {**TRAIN, "job_id": job, "rank": str(r)}
        parts: dict[str, list[list[float]]] = {"steps": [], "compute": [], "coll": []}
        for i, (minutes, compute, coll, data) in enumerate(phases):
            step = compute + coll + data
            x = slow_rank[1] if slow_rank and slow_rank[0] == r and i else 1.0
            c_r, w_r = compute * x, max(0.0, coll - compute * (x - 1))
            per_min = 60 / step
            parts["steps"].append([per_min] * minutes)
            parts["compute"].append([per_min * c_r] * minutes)
            parts["coll"].append([per_min * w_r] * minutes)
        out += [s(name, labels, _phased(parts[key], gap) + end)
                for name, key in ((STEPS, "steps"), (COMPUTE, "compute"), (COLL, "coll"))]
    return out


def _phased(per_phase: list[list[float]], gap: str) -> str:
    """Counter samples of per-minute increments by phase; with a gap (a restart) after the first phase
    the counter starts again from its first increment."""
    first, rest = per_phase[0], [v for p in per_phase[1:] for v in p]
    return (cum(first) + gap + " " + cum(rest)) if gap else cum(first + rest)


def _coll_exp(pct: str) -> list:
    return [({"job_id": "j1", "cause": "none"},
             f"The ranks of job j1 spend {pct} of their time blocked in collectives, over 1.5x their median of the "
             "last 6h, while their compute per step is unchanged: the network (or a collective's algorithm or peers) "
             "slowed down. No cause found on its GPUs: look at the hosts.")]


_base = (120, 0.8, 0.1, 0.1)  # 2h: 1.0 s steps, 10 % of them in collectives
case("TrainingCollectivesSlowing", "fires", "4 ranks; after 2h every rank's all-reduce takes 0.4 s instead of 0.1 "
     "(a third of the time), compute unchanged",
     job_phases(4, [_base, (60, 0.8, 0.4, 0.0)]), (125, []), (150, _coll_exp("33.33%")), (180, _coll_exp("33.33%")))
case("TrainingCollectivesSlowing", "quiet", "compute rises too (1.3x on every rank: throttling, a bigger model); "
     "a straggler (rank 1 1.3x, the others wait for it); compute 0.8 -> 0.3 s (a faster kernel, same collectives)",
     job_phases(4, [_base, (60, 1.04, 0.4, 0.0)]) + job_phases(4, [_base, (60, 0.8, 0.34, 0.1)], slow_rank=(1, 1.3),
                                                                job="j2")
     + job_phases(2, [_base, (60, 0.3, 0.1, 0.0)], job="j3"), (150, []), (180, []))
case("TrainingCollectivesSlowing", "quiet", "a job with little communication: 2 % -> 6 % (3x, 4 points)",
     job_phases(2, [(120, 0.9, 0.02, 0.08), (60, 0.9, 0.06, 0.04)]), (150, []), (180, []))
case("TrainingCollectivesSlowing", "flap", "noisy collectives (0.05 / 0.15 s, alternating) and a 5-minute spike "
     "to 0.5 s: never 15m",
     job_phases(2, [(1, 0.8, 0.05 if i % 2 else 0.15, 0.1) for i in range(150)]
                + [(5, 0.8, 0.5, 0.0), (40, 0.8, 0.1, 0.1)]), (150, []), (160, []), (190, []))
case("TrainingCollectivesSlowing", "quiet", "the job restarts at 2h (gone 3 minutes, counters back from 0) at the "
     "same pace", job_phases(4, [_base, (60, 0.8, 0.1, 0.1)], gap=" stale stale stale"), (124, []), (130, []),
     (180, []))
case("TrainingCollectivesSlowing", "gone", "fires, then the job ends and its series vanish: resolves",
     job_phases(2, [_base, (40, 0.8, 0.4, 0.0)], end=" stale"), (150, _coll_exp("33.33%")),
     (160, _coll_exp("33.33%")), (167, []))

# ---- inference
REQ_Q = "gpuobs_inference_request_duration_quantile_seconds"
_q99 = {**SERVE, "quantile": "0.99"}
_lat_exp = [({"gen_ai_request_model": "llama"}, "Model llama p99 latency is 7 s.")]
case("InferenceLatencyHigh", "fires", "p99 of 7 s on one replica, 0.7 s on another (the worst counts)",
     [s(REQ_Q, _q99, "7x30"), s(REQ_Q, {**_q99, "rank": "1", "instance": "n3:9464"}, "0.7x30"),
      s(REQ_Q, {**_q99, "gen_ai_request_model": "mistral"}, "0.7x30")], (4, []), (6, _lat_exp), (30, _lat_exp))
case("InferenceLatencyHigh", "quiet", "p99 of 0.7 s", [s(REQ_Q, _q99, "0.7x30")], (10, []), (30, []))
case("InferenceLatencyHigh", "quiet", "no requests for 20 minutes: the quantile series is absent, no alert",
     [s(REQ_Q, _q99, "0.7x5 stale")], (20, []), (30, []))
case("InferenceLatencyHigh", "gone", "fires, then the model is unloaded and its series vanish",
     [s(REQ_Q, _q99, "7x20 stale")], (15, _lat_exp), (20, _lat_exp), (22, []))

ERR = "gpuobs_inference_errors_total"
_err = {**SERVE, "error_type": "timeout"}
_err_exp = [({"gen_ai_request_model": "llama"}, "10% of requests to llama fail.")]
case("InferenceErrorRate", "fires", "10 of 100 requests a minute fail",
     [s(f"{REQ}_count", SERVE, "0+100x30"), s(ERR, _err, "0+10x30")], (5, []), (10, _err_exp), (30, _err_exp))
_err_zero = {**SERVE, "error_type": "_OTHER"}  # gpuobs.instrument.inference: at 0 from the model's first request
case("InferenceErrorRate", "fires", "20 requests a minute; from minute 10 timeouts, their series born at 20 (a burst "
     "before the next scrape) then 10 a minute: counted from minute 10, it fires at 15 (from increase() alone, at 16)",
     [s(f"{REQ}_count", SERVE, "0+20x30"), s(ERR, _err_zero, "0x30"), s(ERR, _err, "_x10 20+10x20"),
      s(f"{REQ}_count", _err, "_x10 20+10x20")],
     (9, []), (14, []), (15, [({"gen_ai_request_model": "llama"}, "33.33% of requests to llama fail.")]),
     (30, [({"gen_ai_request_model": "llama"}, "33.33% of requests to llama fail.")]))
case("InferenceErrorRate", "quiet", "a restarted Prometheus first sees 900 timeouts of long ago beside the model's 0 "
     "series: born with the others, not counted",
     [s(f"{REQ}_count", SERVE, "5000+100x30"), s(ERR, _err_zero, "0x30"), s(ERR, _err, "900x30"),
      s(f"{REQ}_count", _err, "900x30")], (0, []), (5, []), (10, []), (30, []))
case("InferenceErrorRate", "quiet", "1 of 100 requests a minute fails, and a model with no error series",
     [s(f"{REQ}_count", SERVE, "0+100x30"), s(ERR, _err, "0+1x30"),
      s(f"{REQ}_count", {**SERVE, "gen_ai_request_model": "mistral"}, "0+100x30")], (10, []), (30, []))
case("InferenceErrorRate", "flap", "an error burst of 3 minutes every 10: never 5m over 5%",
     [s(f"{REQ}_count", SERVE, "0+100x40"), s(ERR, _err, cum(([0] * 7 + [10] * 3) * 4))], (20, []), (40, []))
case("InferenceErrorRate", "gone", "fires, then the model's series vanish: resolves",
     [s(f"{REQ}_count", SERVE, "0+100x20 stale"), s(ERR, _err, "0+10x20 stale")],
     (15, _err_exp), (24, _err_exp), (25, []))

# ---- degradation trends: hours of 1 min samples; counters drawn from a Poisson process (seeded) for the
# normal noise of error counts, temperatures with jitter
H = 60  # minutes


def poisson(per_min: list[float], seed: int) -> list[int]:
    """Errors a minute for the given expected counts a minute (Knuth's method, seeded: the same every run)."""
    rng, out = random.Random(seed), []
    for lam in per_min:
        k, p, floor = 0, rng.random(), math.exp(-lam)
        while p > floor:
            k, p = k + 1, p * rng.random()
        out.append(k)
    return out


def ramp(start: float, end: float, minutes: int) -> list[float]:
    """A rate climbing linearly from start to end over minutes."""
    return [start + (end - start) * i / minutes for i in range(minutes)]


def burst(per_min: list[int], minute: int, extra: int) -> list[int]:
    """per_min with extra errors at one minute."""
    return [n + extra * (i == minute) for i, n in enumerate(per_min)]


# corrected ECC errors: 40/h for 8 h, then doubling to 80/h over the next 6 h, held 4 h
_ecc_up = cum(poisson([40 / H] * 8 * H + ramp(40 / H, 80 / H, 6 * H) + [80 / H] * 4 * H, seed=1))
_ecc_steady = poisson([40 / H] * 16 * H, seed=2)


def _ecc_rise_exp(v):
    return [(_ecc_cor, f"{G} corrects {v} ECC errors per second over the last 2h, over 1.5x "
            "its rate 6h earlier.")]


case("GpuEccCorrectedRising", "fires", "40/h for 8 h, then doubling to 80/h over 6 h, held 4 h",
     [s(ECC, _ecc_cor, _ecc_up)], (11 * H, []), (13 * H, _ecc_rise_exp(0.0183)), (15 * H, _ecc_rise_exp(0.0203)))
case("GpuEccCorrectedRising", "quiet", "a steady 40/h with Poisson jitter",
     [s(ECC, _ecc_cor, cum(_ecc_steady))], *((h * H, []) for h in range(8, 17, 2)))
case("GpuEccCorrectedRising", "quiet", "a steady 40/h and one burst of 300 errors at 10 h",
     [s(ECC, _ecc_cor, cum(burst(_ecc_steady, 10 * H, 300)))], *((10 * H + m, []) for m in range(0, 6 * H, 30)))


# row-remap banks: a GPU of 640 banks; banks leave max for low and none as rows are remapped
def banks(low: str, none: str, minutes: int) -> list[dict]:
    """The bank histogram of GPU0: low and none as promtool values, the rest at max."""
    return [s("gpuobs_gpu_row_remap_banks", {**GPU0, "availability": a}, v) for a, v in
            (("max", f"640x{minutes}"), ("high", f"0x{minutes}"), ("partial", f"0x{minutes}"), ("low", low),
             ("none", none))]


def _bank_exp(n):
    return [(GPU0, f"{n} more memory banks of {G} have few or no spare rows left than at "
            "their fewest in the last 6h.")]


case("GpuRowRemapBanksDepleting", "fires", "a bank goes low at 2 h, another at 3 h, one runs out at 4 h",
     banks(f"0x{2 * H} 1x{H} 2x{3 * H}", f"0x{4 * H} 1x{2 * H}", 6 * H),
     (2 * H + 30, []), (3 * H + 3, []), (3 * H + 10, _bank_exp(2)), (5 * H, _bank_exp(3)))
case("GpuRowRemapBanksDepleting", "quiet", "one bank goes low at 1 h and runs out at 3 h",
     banks(f"0x{H} 1x{2 * H} 0x{3 * H}", f"0x{3 * H} 1x{3 * H}", 6 * H), (2 * H, []), (4 * H, []), (6 * H, []))

# NVLink CRC errors of two links, 0.5/min each (a GPU sum of 1/min); link 3 climbs to 4/min over 3 h.
# The exporter serves their sum (gpuobs_gpu_nvlinks_errors_total): each minute's errors of both links.
_nvl_base = poisson([0.5] * 12 * H, seed=3)


def _links_sum(*per_minute: list[int]) -> str:
    """The per-GPU counter of links whose errors per minute are given (summed minute by minute)."""
    return cum([sum(minute) for minute in zip(*per_minute)])


def _nvl_rise_exp(v):
    return [(GPU0, f"{G} has {v} NVLink data-link errors per second over the last 2h, over "
            "1.5x its rate 6h earlier.")]


case("GpuNvlinkErrorsRising", "fires", "link 3 climbs from 0.5 to 4 CRC errors a minute over 3 h; link 5 steady",
     [s(NVL, _nvl, _links_sum(poisson([0.5] * 8 * H + ramp(0.5, 4, 3 * H) + [4] * H, seed=4), _nvl_base))],
     (9 * H, []), (11 * H + 30, _nvl_rise_exp(0.0572)))
case("GpuNvlinkErrorsRising", "quiet", "steady noise, and one burst of 500 CRC errors on link 3 at 9 h",
     [s(NVL, _nvl, _links_sum(burst(poisson([0.5] * 12 * H, seed=5), 9 * H, 500), _nvl_base))],
     *((9 * H + m, []) for m in range(0, 3 * H, 30)))

def _pr_rise_exp(v):
    return [(GPU0, f"{G} has {v} PCIe replays per second over the last 2h, over 1.5x its rate 6h "
            "earlier.")]


# PCIe replays: 3 a minute, then climbing to 9 a minute over 3 h
case("GpuPcieReplaysRising", "fires", "3 replays a minute for 8 h, then climbing to 9 a minute over 3 h",
     [s(PR, GPU0, cum(poisson([3] * 8 * H + ramp(3, 9, 3 * H) + [9] * H, seed=6)))],
     (9 * H, []), (11 * H + 30, _pr_rise_exp(0.119)))
case("GpuPcieReplaysRising", "quiet", "3 a minute with jitter, and one burst of 5000 replays at 9 h",
     [s(PR, GPU0, cum(burst(poisson([3] * 12 * H, seed=7), 9 * H, 5000)))],
     *((9 * H + m, []) for m in range(0, 3 * H, 30)))

# temperature: its own slowdown threshold at 90 °C
TEMP, SLOW = "gpuobs_gpu_temperature_celsius", "gpuobs_gpu_slowdown_temperature_celsius"
_jitter = [0.3, -0.2, 0.1, -0.3, 0.2]
_climb = " ".join(f"{60 + max(0, i - 2 * H) / 10 + _jitter[i % 5]:.1f}" for i in range(2 * H + 300))


def _trend_exp(v):
    return [(GPU0_ON, f"{G} keeps heating up: at its pace over the last 1h it reaches {v} °C within "
            "3h, at or over its own slowdown threshold.")]


case("GpuTemperatureTrendingToSlowdown", "fires", "60 °C, then climbing 1 °C every 10 min from 2 h",
     [s(TEMP, GPU0, _climb), s(SLOW, GPU0, f"90x{2 * H + 300}")],
     (2 * H, []), (2 * H + 170, _trend_exp(95)), (2 * H + 220, _trend_exp(100)), (2 * H + 260, []))
_split = 2 * H + 100  # a new pod takes the GPU: its series carry the new pod's labels from then on
_climb_values = _climb.split()
case("GpuTemperatureTrendingToSlowdown", "fires", "climbing as above, the pod holding the GPU changes at 3 h 40 min",
     [s(TEMP, {**GPU0, "k8s_pod": "a"}, " ".join(_climb_values[:_split]) + " stale"),
      s(TEMP, {**GPU0, "k8s_pod": "b"}, " ".join(["_"] * _split + _climb_values[_split:])),
      s(SLOW, {**GPU0, "k8s_pod": "a"}, f"90x{_split - 1} stale"),
      s(SLOW, {**GPU0, "k8s_pod": "b"}, f"_x{_split} 90x{2 * H + 300 - _split - 1}")],
     (2 * H, []), (2 * H + 170, _trend_exp(95)), (2 * H + 220, _trend_exp(100)), (2 * H + 260, []))
case("GpuTemperatureTrendingToSlowdown", "quiet", "oscillating 55-65 °C every 20 min",
     [s(TEMP, GPU0, " ".join(f"{60 + 5 * math.sin(2 * math.pi * i / 20):.1f}" for i in range(5 * H))),
      s(SLOW, GPU0, f"90x{5 * H}")], *((h * H, []) for h in range(1, 6)))
case("GpuTemperatureTrendingToSlowdown", "quiet", "a job starts: 35 °C, then 80 °C and flat",
     [s(TEMP, GPU0, f"35x{H} " + " ".join(f"{80 + _jitter[i % 5]:.1f}" for i in range(3 * H))),
      s(SLOW, GPU0, f"90x{4 * H}")], *((H + m, []) for m in range(0, 3 * H, 10)))

# power brake: three 2 min episodes within 2 h, against one long one and two
_brake = {**GPU0, "reason": "hw_power_brake_slowdown"}


def _brake_exp(n):
    return [(_brake, f"{G} entered or left the HW power brake {n} times in the last 6h (at least 3 "
            "times in it).")]


_episode = "0x39 1 1"  # 40 min without, then 2 min in the brake
case("GpuPowerBrakeRepeated", "fires", "three 2 min brakes 40 min apart",
     [s(REASON, _brake, f"{_episode} {_episode} {_episode} 0x300")],
     (84, []), (124, _brake_exp(5)), (130, _brake_exp(6)), (300, _brake_exp(6)))
case("GpuPowerBrakeRepeated", "quiet", "one brake of 10 min, and two of 2 min on another GPU",
     [s(REASON, _brake, "0x30 1x10 0x300"), s(REASON, {**_brake, "gpu": "1", "uuid": "GPU-b"},
                                               f"{_episode} {_episode} 0x300")], (40, []), (100, []), (300, []))

# ---- log patterns: a training job's log lines, per job (its ranks, targets and restarts summed)
LPM = "gpuobs_log_pattern_matches_total"
JOB = {"cluster": "c1", "job_id": "j1"}  # what the job-level log alerts keep


def lines(pattern: str, rank: int, values: str, **extra) -> dict:
    """One rank's counter of one log pattern (exported from 0 by each training process)."""
    return s(LPM, {**TRAIN, "rank": str(rank), "pattern": pattern, **extra}, values)


def crashed(rank: int, values: str, **extra) -> dict:
    """One rank's crash mark (gpuobs.instrument.ending: the time it died of an uncaught exception)."""
    return s(c.RUN_CRASH.exposed_name, {**TRAIN, "rank": str(rank), **extra}, values)


def quiet_patterns(pattern: str, n: int) -> list[dict]:
    """The other patterns of the same ranks, some of them rising: they must not count."""
    return [lines(p, r, f"0x10 0+1x{n - 11}") for p in ("nccl_error", "cuda_oom", "collective_timeout")
            if p != pattern for r in (0, 1)]


def _rank(rank: int) -> dict:
    """What the per-rank log alerts keep: the job, the rank, its node."""
    return {**JOB, "rank": str(rank), "node": "n1"}


def _timeout_exp(*ranks: int) -> list:
    return [(_rank(r), f"Rank {r} of job j1 on n1 logged a collective operation timeout in the last 5m: a rank "
                       "stopped taking part in its collectives.") for r in ranks]


case("TrainingCollectiveTimeout", "fires", "rank 1 logs a timeout at minute 10 and dies, rank 0 one at 11",
     [lines("collective_timeout", 1, "0x9 1 1 stale"), lines("collective_timeout", 0, "0x10 1 1 stale")],
     (9, []), (10, _timeout_exp(1)), (12, _timeout_exp(0, 1)), (25, _timeout_exp(0, 1)), (33, []))
case("TrainingCollectiveTimeout", "quiet", "counters that appear at 0 mid-job; other patterns rising",
     [lines("collective_timeout", 0, "0x60"), lines("collective_timeout", 1, "_x20 0x40"),
      *quiet_patterns("collective_timeout", 60)], (10, []), (21, []), (40, []), (59, []))
case("TrainingCollectiveTimeout", "quiet", "trainer restarts: a counter back at 0, a series gone and back at 0 "
     "under a new target", [lines("collective_timeout", 0, "3x20 0x40"),
                            lines("collective_timeout", 1, "2x20 stale"),
                            lines("collective_timeout", 1, "_x22 0x38", instance="n1:9465")],
     (20, []), (21, []), (23, []), (40, []))
case("TrainingCollectiveTimeout", "fires", "rank 1 dies of its timeout before its first scrape: its series "
     "appears at 1 (the exit grace serves it) and is gone 2 minutes later",
     [lines("collective_timeout", 0, "0x30"), lines("collective_timeout", 1, "_x10 1 1 stale"),
      crashed(1, "_x10 600 600 stale")],
     (9, []), (10, _timeout_exp(1)), (12, _timeout_exp(1)), (28, _timeout_exp(1)), (33, []))
case("TrainingCollectiveTimeout", "quiet", "a long-running rank first scraped (a restarted Prometheus) with a timeout "
     "it logged and survived long ago: a new series at 1, no crash", [lines("collective_timeout", 0, "_x10 1x30")],
     (10, []), (11, []), (20, []))
case("TrainingCollectiveTimeout", "gone", "fires, then every rank's series vanish: kept 15m, then resolved",
     [lines("collective_timeout", 0, "0x10 1 stale")], (11, _timeout_exp(0)), (24, _timeout_exp(0)), (33, []))


def _peer_exp(*ranks: int) -> list:
    return [(_rank(r), f"Rank {r} of job j1 on n1 logged in the last 5m that a peer of its collectives closed its "
                       "connection: that rank crashed, was killed or gave up after its own timeout.") for r in ranks]


case("TrainingCollectivePeerCrash", "fires", "rank 2 dies at minute 10: ranks 0 and 1 log its closed connection",
     [lines("collective_peer_crash", 0, "0x9 1 1 stale"), lines("collective_peer_crash", 1, "0x9 2 2 stale"),
      lines("collective_peer_crash", 2, "0x9 stale")],
     (9, []), (10, _peer_exp(0, 1)), (25, _peer_exp(0, 1)), (33, []))
case("TrainingCollectivePeerCrash", "quiet", "counters at 0 across a restart (gone and back at 0); other patterns",
     [lines("collective_peer_crash", 0, "0x20 stale _ 0x20"), lines("collective_peer_crash", 1, "2x20 0x22"),
      *quiet_patterns("collective_peer_crash", 42)], (10, []), (21, []), (23, []), (40, []))


def _oom_exp(n: int) -> list:
    return [(JOB, f"Job j1 logged {n} CUDA out-of-memory errors in the last 30m (an alert from 3 in the job, or 2 on "
                  "one rank): it is not recovering.")]


case("TrainingCudaOOM", "fires", "rank 1 OOMs, restarts (series gone, back at 0) and OOMs again 10 min later",
     [lines("cuda_oom", 0, "0x60"), lines("cuda_oom", 1, "0x10 1 1 stale _ 0x5 1x40")],
     (12, []), (20, []), (21, _oom_exp(2)), (40, _oom_exp(2)), (66, []))
case("TrainingCudaOOM", "fires", "three ranks OOM once each within 20 minutes (a batch size that does not fit)",
     [lines("cuda_oom", r, f"0x{5 + 10 * r} 1x{45 - 10 * r}") for r in range(3)],
     (15, []), (25, []), (26, _oom_exp(3)), (35, _oom_exp(3)), (45, _oom_exp(3)), (56, []))
case("TrainingCudaOOM", "fires", "three ranks OOM at their first step, each before its first scrape: series born "
     "at 1 (a batch that never fits, restarted by torchrun with new targets)",
     [x for r in range(3) for x in (lines("cuda_oom", r, f"_x{5 + 3 * r} 1 1 stale", instance=f"n1:{9500 + r}"),
                                    crashed(r, f"_x{5 + 3 * r} 60 60 stale", instance=f"n1:{9500 + r}"))],
     (6, []), (11, _oom_exp(3)), (20, _oom_exp(3)), (45, _oom_exp(3)), (58, []))
case("TrainingCudaOOM", "quiet", "one OOM that the job's retry logic handled; another rank OOMs once 40 min later",
     [lines("cuda_oom", 0, "0x10 1x80"), lines("cuda_oom", 1, "0x50 1x40"), lines("cuda_oom", 2, "0x90"),
      *quiet_patterns("cuda_oom", 90)], (11, []), (20, []), (51, []), (60, []), (89, []))
case("TrainingCudaOOM", "quiet", "OOMs on three ranks 35 minutes apart: never 3 within 30m",
     [lines("cuda_oom", r, f"0x{5 + 35 * r} 1x{100 - 35 * r}") for r in range(3)],
     *((m, []) for m in (6, 41, 76, 90, 100)))


_illegal_exp = [(_rank(3), "Rank 3 of job j1 on n1 logged a CUDA illegal memory access in the last 5m: its CUDA "
                           "context is lost.")]


case("TrainingCudaIllegalAddress", "fires", "rank 3 hits an illegal address at minute 10 and exits",
     [lines("cuda_illegal_address", 3, "0x9 1 1 stale"), lines("cuda_illegal_address", 0, "0x30")],
     (9, []), (10, _illegal_exp), (20, _illegal_exp), (32, []))
case("TrainingCudaIllegalAddress", "quiet", "counters at 0 across a restart (gone and back at 0); other patterns",
     [lines("cuda_illegal_address", 0, "0x20 stale _ 0x20"), *quiet_patterns("cuda_illegal_address", 42)],
     (10, []), (22, []), (40, []))


_nccl_exp = [(_rank(2), "Rank 2 of job j1 on n1 has logged NCCL warnings or errors in every 5m for 15m.")]


_nccl_every = lambda gap, n: cum([1 if i >= 10 and (i - 10) % gap == 0 else 0 for i in range(n)])  # noqa: E731
case("TrainingNcclError", "fires", "rank 2 logs an NCCL error every 3 minutes from minute 10",
     [lines("nccl_error", 2, _nccl_every(3, 60)), lines("nccl_error", 0, "0x60")],
     (24, []), (26, _nccl_exp), (45, _nccl_exp))
case("TrainingNcclError", "quiet", "one NCCL WARN line; a start-up burst, one WARN on each of 8 ranks",
     [lines("nccl_error", 0, "0x30 1x30"), *(lines("nccl_error", r, "0 0 1x58") for r in range(1, 9))],
     (3, []), (10, []), (20, []), (31, []), (50, []))
case("TrainingNcclError", "flap", "an NCCL error every 7 minutes: gaps of 2 min without one, never sustained",
     [lines("nccl_error", 0, _nccl_every(7, 80))], (20, []), (40, []), (60, []), (79, []))

# ---- XIDs in the kernel log that NVML's event path did not report
KXID = "gpuobs_gpu_kernel_xid_errors_total"
KLOG = "gpuobs_exporter_kernel_log_up"
KLM = "gpuobs_gpu_kernel_log_matches_total"
_kgpu = {**GPU0, "pci_bus_id": "00000000:18:00.0"}
_xid_on = {k: GPU0[k] for k in ("cluster", "node", "gpu", "uuid")}


def kxid(xid: str, values: str, **extra) -> dict:
    return s(KXID, {**_kgpu, "xid": xid, **extra}, values)


def nxid(xid: str, values: str, **extra) -> dict:
    return s(XID, {**GPU0, "xid": xid, "gpu_instance_id": "", "compute_instance_id": "", **extra}, values)


def watcher(values: str) -> dict:
    return s(KLOG, {**NODE, "source": "kmsg"}, values)


def _unseen_exp(n: int, xid: str) -> list:
    return [({**_xid_on, "xid": xid}, f"The kernel log counted {n} XID {xid} on {G} in the last 1h, more than the "
                                      "exporter's NVML event path reported: the XID alerts missed them.")]


H2 = 2 * H  # the XID cases run after 2 h of history: NVML's series an hour old, the watcher an hour up
case("GpuXidFromLogs", "fires", "two XID 13 while the exporter was down (minutes 120-130): the kernel log's count "
     "since boot jumps when it is back, NVML's counter starts again empty",
     [kxid("13", f"2x{H2} stale _x8 4x60"), nxid("13", f"2x{H2} stale"), watcher(f"1x{H2} stale _x8 1x60")],
     (H2 + 10, []), (H2 + 15, _unseen_exp(2, "13")), (H2 + 50, _unseen_exp(2, "13")), (H2 + 72, []))
case("GpuXidFromLogs", "fires", "XID 79 in the kernel log only: the GPU fell off the bus before NVML reported it",
     [kxid("79", f"_x{H2} 1x40"), kxid("13", f"2x{H2 + 40}"), nxid("13", f"2x{H2 + 40}"), watcher(f"1x{H2 + 40}")],
     (H2 + 4, []), (H2 + 6, _unseen_exp(1, "79")), (H2 + 30, _unseen_exp(1, "79")))
case("GpuXidFromLogs", "fires", "a burst of 3 XID 13 of which NVML's event thread reported 1",
     [kxid("13", f"2x{H2} 5x60"), nxid("13", f"2x{H2} 3x60"), watcher(f"1x{H2 + 60}")],
     (H2 + 4, []), (H2 + 6, _unseen_exp(3, "13")), (H2 + 50, _unseen_exp(3, "13")))
case("GpuXidFromLogs", "quiet", "both sources see the same XIDs: two more XID 13, a first XID 79 (NVML's one "
     "scrape later), a first XID 43 on both",
     [kxid("13", f"2x{H2} 4x90"), nxid("13", f"2x{H2} 4x90"), kxid("79", f"_x{H2 + 10} 1x80"),
      nxid("79", f"_x{H2 + 11} 1x79"), kxid("43", f"_x{H2 + 20} 3x70"), nxid("43", f"_x{H2 + 20} 3x70"),
      watcher(f"1x{H2 + 90}")], *((H2 + m, []) for m in (1, 6, 11, 12, 16, 21, 30, 60, 89)))
case("GpuXidFromLogs", "quiet", "exporter restarts: no XID meanwhile, the kernel count goes on; one XID after it "
     "that both count (NVML's counter from 0 again)",
     [kxid("13", f"5x{H2} stale _ 5x17 6x40"), nxid("13", f"5x{H2} stale _x18 1x40"),
      watcher(f"1x{H2} stale _ 1x58")], *((H2 + m, []) for m in (2, 5, 20, 21, 25, 40, 59)))
case("GpuXidFromLogs", "quiet", "exporter down for 80 minutes, a restarted pod of another name: since-boot counts "
     "come back under new series; new XIDs seen by both",
     [kxid("13", f"5x{H2} stale", pod="a"), nxid("13", f"5x{H2} stale", pod="a"), watcher(f"1x{H2} stale"),
      kxid("13", f"_x{H2 + 80} 5x10 6x30", pod="b"), nxid("13", f"_x{H2 + 90} 1x30", pod="b"),
      s(KLOG, {**NODE, "source": "kmsg", "pod": "b"}, f"_x{H2 + 80} 1x40")],
     *((H2 + m, []) for m in (1, 30, 81, 85, 91, 96, 110, 119)))

# ---- driver messages in the kernel log (per GPU), or in training logs where the kernel log counted none
_line_gpu = {**_xid_on, "pci_bus_id": "00000000:18:00.0"}
_job_node = {"cluster": "c1", "node": "n1", "job_id": "j1"}


def _ecc_log_exp(labels=_line_gpu, who=f"{G} at PCI 00000000:18:00.0") -> list:
    return [(labels, f"The logs of {who} report uncorrectable ECC or row-remap errors in the last 5m.")]


def kline(pattern: str, values: str) -> dict:
    return s(KLM, {**_kgpu, "pattern": pattern}, values)


case("GpuEccErrorFromLogs", "fires", "the kernel log reports an uncorrectable ECC error at minute 10",
     [kline("ecc_error", "0x10 1x40"), kline("nvlink_error", "0x50"), watcher("1x50")],
     (10, []), (11, _ecc_log_exp()), (20, _ecc_log_exp()), (25, _ecc_log_exp()), (32, []))
case("GpuEccErrorFromLogs", "fires", "no kernel log (family off): a training rank logs cudaErrorECCUncorrectable",
     [lines("ecc_error", 0, "0x10 1 1 stale")],
     (10, []), (11, _ecc_log_exp(_job_node, "job j1 on n1")), (25, _ecc_log_exp(_job_node, "job j1 on n1")),
     (32, []))
case("GpuEccErrorFromLogs", "fires", "the first ECC line since boot: its series appears at 1 (the watcher up)",
     [kline("ecc_error", "_x10 1x30"), watcher("1x40")], (9, []), (10, _ecc_log_exp()), (25, _ecc_log_exp()),
     (31, []))
case("GpuEccErrorFromLogs", "quiet", "the exporter back after 10 minutes down: since-boot counts come back, under "
     "a pod of another name too", [kline("ecc_error", "2x20 stale"), watcher("1x20 stale"),
                                   s(KLM, {**_kgpu, "pattern": "ecc_error", "pod": "b"}, "_x30 2x20"),
                                   s(KLOG, {**NODE, "source": "kmsg", "pod": "b"}, "_x30 1x20")],
     (21, []), (31, []), (35, []), (50, []))
case("GpuEccErrorFromLogs", "quiet", "counters at 0 across an exporter restart (since boot: unchanged); NVLink "
     "lines", [kline("ecc_error", "2x20 stale _ 2x20"), kline("nvlink_error", "0x10 0+1x30"),
               lines("ecc_error", 0, "0x42")], (10, []), (22, []), (30, []), (41, []))


_nvl_log_exp = [(_line_gpu, f"The logs of {G} at PCI 00000000:18:00.0 report NVLink, NVSwitch or fabric manager "
                             "errors in the last 5m.")]


case("GpuNvlinkErrorFromLogs", "fires", "the kernel log reports NVLink errors at minutes 10 and 11",
     [kline("nvlink_error", "0x10 1 2x30"), watcher("1x40")], (10, []), (11, _nvl_log_exp), (20, _nvl_log_exp),
     (30, _nvl_log_exp), (33, []))
case("GpuNvlinkErrorFromLogs", "quiet", "no new lines: a count since boot across an exporter restart; ECC lines",
     [kline("nvlink_error", "4x20 stale _x3 4x20"), kline("ecc_error", "0x10 1x30")], (10, []), (25, []), (40, []))

health_alert("GpuKernelLogWatcherDown", KLOG, {**NODE, "source": "kmsg"}, 0, 1,
             "The kernel-log watcher (kmsg) of the exporter on n1 has not read its source for 15m, now or in more "
             "than 10% of the last 1h's scrapes: XIDs that NVML misses and driver ECC and NVLink messages on this "
             "node go unseen.")
case("GpuKernelLogWatcherDown", "quiet", "the kernel_log family off: no series at all", [s("up", NODE, "1x120")],
     (30, []), (90, []), interval="30s")


# ---- placement: a multi-GPU pod on GPUs without NVLink between them (topology family)
# The exporter's NVLink domain per GPU (the lowest index it shares NVLink with), as it serves it by
# default: the GPU pairs (gpuobs_gpu_topology_nvlink_links) are detail.
DOMAIN, INFO = "gpuobs_gpu_topology_nvlink_domain", "gpuobs_gpu_info"
_pod = {"k8s_namespace": "ml", "k8s_pod": "p1"}


def _placement(links_ab: int, links_ac: int, n: int = 40, end: str = "") -> list[dict]:
    """GPU0 and GPU1 in pod ml/p1 (links_ab NVLinks between them), GPU2 unattributed (links_ac to GPU0):
    their domains as the exporter computes them from those links."""
    gpu2 = {**NODE, "gpu": "2", "uuid": "GPU-c"}
    d1, d2 = (0 if links_ab else 1), (0 if links_ac else 2)
    return [s(INFO, {**GPU0, **_pod}, f"1x{n}{end}"), s(INFO, {**GPU1, **_pod}, f"1x{n}{end}"), s(INFO, gpu2, f"1x{n}"),
            s(DOMAIN, {**GPU0, **_pod}, f"0x{n}{end}"), s(DOMAIN, {**GPU1, **_pod}, f"{d1}x{n}{end}"),
            s(DOMAIN, gpu2, f"{d2}x{n}")]


_place_exp = [({"cluster": "c1", "node": "n1", **_pod},
               "Pod ml/p1 on n1 holds GPUs of 2 NVLink domains, on a node where other GPUs share NVLink: its "
               "GPU-to-GPU traffic between them crosses PCIe or the CPU interconnect.")]
case("GpuPodPlacementWithoutNvlink", "fires", "a pod's two GPUs without NVLink, the node's third NVLinked to one",
     _placement(0, 18), (14, []), (16, _place_exp), (35, _place_exp))
case("GpuPodPlacementWithoutNvlink", "quiet", "the pod's two GPUs joined by NVLink (NVSwitch)",
     _placement(18, 18), (16, []), (35, []))
case("GpuPodPlacementWithoutNvlink", "quiet", "a PCIe-only node: no pair has NVLink, so no placement is better",
     _placement(0, 0), (16, []), (35, []))
case("GpuPodPlacementWithoutNvlink", "gone", "fires, then the pod ends (its labels go): resolves",
     _placement(0, 18, 20, " stale") + [s(INFO, GPU0, "_x21 1x20"), s(INFO, GPU1, "_x21 1x20")],
     (18, _place_exp), (25, []))

def test_every_log_pattern_feeds_an_alert_of_its_severity():
    """Each pattern of gpuobs.logpatterns names the alert that reads its matches (gpuobs/logpatterns.py
    `alert=`): that alert exists, at the pattern's severity, and reads the pattern's series."""
    from gpuobs import logpatterns as lp

    for p in lp.PATTERNS:
        assert p.alert in ALERTS, p.name
        assert ALERTS[p.alert].severity == p.severity, (p.name, p.alert)
        if p.name != "nvrm_xid":  # read as XID codes (gpuobs_gpu_kernel_xid_errors_total), not as lines
            assert f'pattern="{p.name}"' in ALERTS[p.alert].expr, (p.name, p.alert)


# ---- meta: always fires (no quiet case can exist)
case("Watchdog", "fires", "always", [s("up", NODE, "1x10")],
     (0, [({}, "This alert always fires. If it stops arriving, Prometheus or Alertmanager is broken.")]),
     (10, [({}, "This alert always fires. If it stops arriving, Prometheus or Alertmanager is broken.")]))
case("Watchdog", "gone", "no series at all: still fires", [s("up", NODE, "stale")],
     (5, [({}, "This alert always fires. If it stops arriving, Prometheus or Alertmanager is broken.")]))

# ------------------------------------------------------------------------------- promtool files


def unit_test(c: Case) -> dict:
    a = ALERTS[c.alert]
    rule = alert_rule(a, DEFAULT)
    return {
        "name": f"{c.alert} [{c.kind}] {c.what}",
        "interval": c.interval,
        "input_series": c.series,
        "alert_rule_test": [
            {"eval_time": at(minute), "alertname": c.alert,
             "exp_alerts": [{"exp_labels": {**labels, **rule["labels"]},
                             "exp_annotations": {**rule["annotations"], "description": description}}
                            for labels, description in expected]}
            for minute, expected in c.checks],
    }


def alert_rule_file(alert: str) -> dict:
    """The rule file, cut down to one alert and the recording rules it reads (transitively): promtool
    evaluates every rule of its files at every step, and the cases run hours of 30 s steps."""
    return {"groups": subset(yaml.safe_load(rules_file(DEFAULT))["groups"], [], (alert,))}


def promtool_tests(cases: list[Case], rule_file: str = "gpuobs.rules.yml", groups: list[str] | None = None) -> str:
    # recording rules first: promtool's group order is otherwise random, and alerts that read a recording
    # rule would see it one evaluation late only some of the time
    order = groups or [g["name"] for g in rule_groups(DEFAULT)]
    every = min((c.interval for c in cases), key=_seconds)
    return yaml.safe_dump({"rule_files": [rule_file], "evaluation_interval": every,
                           "group_eval_order": order, "tests": [unit_test(c) for c in cases]},
                          sort_keys=False, allow_unicode=True, width=200)


@pytest.fixture(scope="module")
def rule_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("rules")
    (d / "gpuobs.rules.yml").write_text(rules_file(DEFAULT))
    return d


def promtool(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules(rule_dir):
    out = promtool("check", "rules", "gpuobs.rules.yml", cwd=rule_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    rendered = yaml.safe_load((rule_dir / "gpuobs.rules.yml").read_text())
    names = [r["alert"] for g in rendered["groups"] for r in g["rules"] if "alert" in r]
    assert sorted(names) == sorted(ALERTS), "every alert of the pack must be in the rule file, once"


@pytest.mark.parametrize("alert", list(ALERTS))
def test_promtool_unit_tests(rule_dir, alert):
    cases = [c for c in CASES if c.alert == alert]
    assert cases, f"{alert} has no cases"
    rules = alert_rule_file(alert)
    assert [r for g in rules["groups"] for r in g["rules"] if "alert" in r] == [alert_rule(ALERTS[alert], DEFAULT)]
    (rule_dir / f"rules_{alert}.yml").write_text(yaml.safe_dump(rules, sort_keys=False, width=120))
    path = rule_dir / f"test_{alert}.yml"
    path.write_text(promtool_tests(cases, f"rules_{alert}.yml", [g["name"] for g in rules["groups"]]))
    out = promtool("test", "rules", path.name, cwd=rule_dir)
    assert out.returncode == 0, f"{path}\n{out.stdout}{out.stderr}"


def test_every_alert_has_a_firing_and_a_quiet_case():
    for name, _a in ALERTS.items():
        checks = [(c, expected) for c in CASES if c.alert == name for _, expected in c.checks]
        assert any(expected and c.kind == "fires" for c, expected in checks), f"{name}: no firing case"
        for _c, expected in checks:
            for _labels, description in expected:
                assert description and "{{" not in description, f"{name}: description not rendered"
        if name != "Watchdog":  # vector(1): it always fires, there is nothing to keep quiet
            assert any(c.kind == "quiet" and not any(e for _, e in c.checks) for c in CASES if c.alert == name), \
                f"{name}: no case where it must not fire"
    assert {c.alert for c in CASES} == set(ALERTS)
    assert sum(c.kind == "flap" for c in CASES) >= 30 and sum(c.kind == "gone" for c in CASES) >= 30


def test_per_node_fleet_recording_rules(rule_dir):
    """The per-node aggregates the fleet dashboard reads instead of per-GPU series: NVLink rates and
    links down (from the exporter's per-GPU totals over the links), degraded PCIe links and pending
    row remaps per node; no rule reads a per-link series."""
    n2 = {**NODE, "node": "n2", "instance": "n2:9445"}
    gpu2 = {**n2, "gpu": "0", "uuid": "GPU-c"}
    series = [
        # NVLink errors over each GPU's links: 60/min on GPU0, 120/min on GPU1, 30/min on n2's GPU
        s("gpuobs_gpu_nvlinks_errors_total", GPU0, "0+60x10"),
        s("gpuobs_gpu_nvlinks_errors_total", GPU1, "0+120x10"),
        s("gpuobs_gpu_nvlinks_errors_total", gpu2, "0+30x10"),
        s("gpuobs_gpu_nvlinks_transmit_bytes_total", GPU0, "0+6600x10"),
        s("gpuobs_gpu_nvlinks_down", GPU0, "1x10"), s("gpuobs_gpu_nvlinks_down", GPU1, "1x10"),
        s("gpuobs_gpu_nvlinks_down", gpu2, "0x10"),
        s("gpuobs_gpu_pcie_link_generation", GPU0, "4x10"), s("gpuobs_gpu_pcie_link_generation_max", GPU0, "5x10"),
        s("gpuobs_gpu_pcie_link_width", GPU0, "16x10"), s("gpuobs_gpu_pcie_link_width_max", GPU0, "16x10"),
        s("gpuobs_gpu_pcie_link_generation", GPU1, "5x10"), s("gpuobs_gpu_pcie_link_generation_max", GPU1, "5x10"),
        s("gpuobs_gpu_pcie_link_width", GPU1, "16x10"), s("gpuobs_gpu_pcie_link_width_max", GPU1, "16x10"),
        s("gpuobs_gpu_temperature_celsius", GPU0, "60x10"), s("gpuobs_gpu_temperature_celsius", GPU1, "71x10"),
        s("gpuobs_gpu_temperature_celsius", gpu2, "55x10"),
        s("gpuobs_gpu_row_remap_pending", GPU0, "1x10"), s("gpuobs_gpu_row_remap_pending", GPU1, "1x10"),
        s("gpuobs_gpu_row_remap_pending", gpu2, "0x10"),
    ]
    at = "8m"
    node = {"cluster": "c1", "node": "n1"}
    checks = [
        ('cluster_node:gpuobs_gpu_nvlinks_errors:rate{node="n1"}', [(node, 3)]),
        ('cluster_node:gpuobs_gpu_nvlinks_errors:rate{node="n2"}', [({"cluster": "c1", "node": "n2"}, 0.5)]),
        ("cluster_node:gpuobs_gpu_nvlinks_transmit_bytes:rate", [(node, 110)]),
        ('cluster_node:gpuobs_gpu_nvlinks_down:sum{node="n1"}', [(node, 2)]),
        ("cluster_node:gpuobs_gpus_pcie_degraded:count", [(node, 1)]),
        ("cluster_node:gpuobs_gpu_row_remap_pending:sum", [(node, 2), ({"cluster": "c1", "node": "n2"}, 0)]),
        ("cluster_node:gpuobs_gpu_temperature_celsius:max",
         [(node, 71), ({"cluster": "c1", "node": "n2"}, 55)]),
    ]
    test = {"rule_files": ["gpuobs.rules.yml"], "evaluation_interval": "1m",
            "group_eval_order": [g["name"] for g in rule_groups(DEFAULT)],
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
                {"expr": expr, "eval_time": at, "exp_samples": [
                    {"labels": expr.split("{")[0] + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
                     "value": value}
                    for labels, value in want]}
                for expr, want in checks]}]}
    groups = {g["name"]: [r["record"] for r in g["rules"] if "record" in r] for g in rule_groups(DEFAULT)}
    # no record reads a per-link series (the default profile serves none): no links group
    from gpuobs.records import RECORDS, per_link
    assert not {r.name for r in RECORDS if per_link(r.expr(DEFAULT))} and "gpuobs-recording-links" not in groups
    (rule_dir / "fleet_records_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = promtool("test", "rules", "fleet_records_test.yml", cwd=rule_dir)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("profile", ["default", "fast"])
def test_degradation_windows_keep_their_order(profile):
    """What the degradation alerts' quiet cases rely on, in both profiles: a temperature step (a job's
    start) leaves the short fit window (for_medium) before the alert's for_ runs out; a rate sample
    (trend_step) is shorter than the recent window, itself no longer than the baseline."""
    t = FAST if profile == "fast" else DEFAULT
    pack = {a.name: a for a in alerts(t)}
    assert _seconds(pack["GpuTemperatureTrendingToSlowdown"].for_) > _seconds(t.for_medium)
    assert f"[{t.for_medium}]" in pack["GpuTemperatureTrendingToSlowdown"].expr
    assert _seconds(t.trend_step) < _seconds(t.trend_window) <= _seconds(t.trend_baseline)
    assert _seconds(t.temp_trend_window) > _seconds(t.for_medium)


def test_log_pattern_alerts_fire_in_the_fast_profile(tmp_path):
    """The demo and the end-to-end test run the FAST rules (1 s evaluations): a collective timeout pages
    within seconds and a GPU's ECC line in its kernel log too; one OOM stays quiet there as well."""
    pack = {a.name: a for a in alerts(FAST)}
    (tmp_path / "fast.yml").write_text(rules_file(FAST))
    series = [lines("collective_timeout", 1, "0x4 1x30"), lines("cuda_oom", 0, "0x4 1x30"),
              kline("ecc_error", "0x9 1x25")]
    timeout = "Rank 1 of job j1 on n1 logged a collective operation timeout in the last 20s: a rank stopped " \
              "taking part in its collectives."
    ecc = f"The logs of {G} at PCI 00000000:18:00.0 report uncorrectable ECC or row-remap errors in the last 20s."
    tests = [{"eval_time": f"{sec}s", "alertname": name, "exp_alerts": [
        {"exp_labels": {**labels, **alert_rule(pack[name], FAST)["labels"]},
         "exp_annotations": {**alert_rule(pack[name], FAST)["annotations"], "description": desc}}
        for labels, desc in want]}
        for sec, name, want in [(3, "TrainingCollectiveTimeout", []),
                                (6, "TrainingCollectiveTimeout", [(_rank(1), timeout)]),
                                (12, "GpuEccErrorFromLogs", [(_line_gpu, ecc)]), (20, "TrainingCudaOOM", [])]]
    doc = {"rule_files": ["fast.yml"], "evaluation_interval": FAST.eval_interval,
           "group_eval_order": [g["name"] for g in rule_groups(FAST)],
           "tests": [{"interval": "1s", "input_series": series, "alert_rule_test": tests}]}
    (tmp_path / "fast_test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    out = promtool("test", "rules", "fast_test.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rank_gpus_maps_each_rank_through_the_first_path_that_finds_it(tmp_path):
    """RANK_GPUS (gpuobs.records.slowdown): job a's ranks by UUID (two ranks on one GPU), job b's rank by
    its pod (every GPU of the pod), Slurm job c's one rank on n2 by hpc_job and host, job d's rank by its
    bare host (the node's unheld GPU only); job e's two ranks share a pod without UUIDs (no pairs: PromQL
    joins one-to-many only, RANK_CAUSE joins them at the pod); a UUID no GPU has falls to the next path."""
    from gpuobs import records

    n2, n3 = {**NODE, "node": "n2", "instance": "n2:9445"}, {**NODE, "node": "n3", "instance": "n3:9445"}
    info = [({**GPU0}, "a"), ({**GPU1, "k8s_namespace": "ml", "k8s_pod": "pb"}, "b"),
            ({**n2, "gpu": "0", "uuid": "GPU-c", "hpc_job": "c"}, "c"), ({**n3, "gpu": "0", "uuid": "GPU-d"}, "d"),
            ({**n3, "gpu": "1", "uuid": "GPU-d1", "hpc_job": "other"}, "d"),
            ({**n2, "gpu": "1", "uuid": "GPU-e", "k8s_namespace": "ml", "k8s_pod": "pe"}, "e"),
            ({**n2, "gpu": "2", "uuid": "GPU-e2", "k8s_namespace": "ml", "k8s_pod": "pe"}, "e")]
    ranks_ = [("a", "0", {"host": "n1", "uuid": "GPU-a"}), ("a", "1", {"host": "n1", "uuid": "GPU-a"}),
              ("b", "0", {"host": "pb", "k8s_namespace": "ml", "k8s_pod": "pb", "uuid": "GPU-zz"}),
              ("c", "0", {"host": "n2"}), ("d", "0", {"host": "n3"}),
              ("e", "0", {"host": "pe", "k8s_namespace": "ml", "k8s_pod": "pe"}),
              ("e", "1", {"host": "pe", "k8s_namespace": "ml", "k8s_pod": "pe"})]
    series = [s(GPU_INFO, labels, "1x10") for labels, _ in info]
    series += [s(RANK_INFO, {**TRAIN, "job_id": job, "rank": rank, **where}, "1x10") for job, rank, where in ranks_]
    want = [("a", "0", "n1", "0", "GPU-a"), ("a", "1", "n1", "0", "GPU-a"), ("b", "0", "n1", "1", "GPU-b"),
            ("c", "0", "n2", "0", "GPU-c"), ("d", "0", "n3", "0", "GPU-d")]
    name = records.RANK_GPUS.name
    samples = [{"labels": name + "{" + ",".join(f'{k}="{v}"' for k, v in zip(
        ("job_id", "rank", "node", "gpu", "uuid"), row)) + "}", "value": 1} for row in want]
    groups = subset(yaml.safe_load(rules_file(DEFAULT))["groups"], [name])
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    test = {"rule_files": ["r.yml"], "evaluation_interval": "1m", "group_eval_order": [g["name"] for g in groups],
            "tests": [{"interval": "1m", "input_series": series,
                       "promql_expr_test": [{"expr": name, "eval_time": "5m", "exp_samples": samples}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
