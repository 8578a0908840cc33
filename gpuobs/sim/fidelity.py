"""Capture fidelity: does the exporter, on a GPU seeded from an `nvidia-smi` capture, report what
the capture says?

`check(path, phase, exported)` imports the capture (gpuobs.sim.capture), seeds a simulated node
with its first GPU (gpuobs.sim.scenario), runs the real exporter on it through `exported`
(gpuobs.smi.exported_samples: in this process, the NVML session, every collector family, the
sampler and the renderer, i.e. the /metrics body) and compares, line by line of the capture's
`-q` section (plus the `pmon` per-process utilization):

- a field in EXPORTED must be exported with the capture's value after unit conversion, and be
  absent where the capture says N/A, `[N/A]`, `Not available` or `[Not Supported]`;
- a field matching NOT_EXPORTED is listed with the reason it is not exported;
- any other field is UNKNOWN, and fails the check like a mismatch.

`gpuobs sim check-capture FILE [--phase idle|load]` prints the report and exits 1 on a failure.
The importer uses `known()` to tell the lines it cannot place (logged once by name).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import capture

__all__ = ["EXPORTED", "NOT_EXPORTED", "Export", "Row", "check", "classify", "known", "report"]

MIB = 1024 * 1024
GPU_TREE = "_gpu"  # key of the profile dict handed to converters that holds the capture's parsed GPU block
CONTEXT = "_context"  # ... and the row's MIG device or process node (capture.field_paths' context)


def _n(raw: str) -> float | None:
    """The leading number of a capture value (after the importer's N/A and annotation handling)."""
    return capture._num(raw)


def _scaled(factor: float) -> Callable[[str, dict], float | None]:
    return lambda raw, p: None if _n(raw) is None else _n(raw) * factor


def _active(raw: str, p: dict) -> float | None:
    s = capture._s(raw)
    return None if s is None else float(s.lower() == "active")


def _enabled(raw: str, p: dict) -> float | None:
    f = capture._flag(raw)
    return None if f is None else float(f)


def _pstate(raw: str, p: dict) -> float | None:
    s = capture._s(raw)
    return float(s[1:]) if s and re.fullmatch(r"P\d+", s) else None


def _below_tlimit(raw: str, p: dict) -> float | None:
    """A threshold printed relative to T.Limit, made absolute as the importer does."""
    d, t = _n(raw), p.get("tlimit")
    return None if d is None or t is None else float(t - d)


def _text(raw: str, p: dict) -> str | None:
    return capture._s(raw)


def _snake(raw: str, p: dict) -> str | None:
    """nvidia-smi's text as the label value gpuobs uses: "Exclusive_Process" -> "exclusive_process",
    "In Progress" -> "in_progress"."""
    s = capture._s(raw)
    return None if s is None else re.sub(r"[\s-]+", "_", s.lower())


_PROCESS_TYPES = {"C": "compute", "G": "graphics", "C+G": "compute_graphics"}


def _process_type(raw: str, p: dict) -> str | None:
    """The type is a label of the process's memory series, absent where the memory is not available
    (WDDM): then the label has no series to show on."""
    s = capture._s(raw)
    memory = _n(capture._get(p.get(CONTEXT, {}).get("process"), "Used GPU Memory"))
    return None if s is None or memory is None else _PROCESS_TYPES.get(s, s)


def _fabric_completed(p: dict) -> bool:
    """Status and clique id are valid, and exported, only once the registration completed."""
    return (capture._s(capture._get(p.get(GPU_TREE), "Fabric", "State")) or "").lower() == "completed"


def _fabric_status(raw: str, p: dict) -> float | None:
    s = capture._s(raw)
    code = None if s is None else capture.FABRIC_STATUS.get(s.lower())
    return None if code is None or not _fabric_completed(p) else float(code)


def _fabric_clique(raw: str, p: dict) -> float | None:
    return _n(raw) if _fabric_completed(p) else None


def _fabric_health(raw: str, p: dict) -> float | None:
    """Each Health line is compared with the whole mask the block's lines spell out (None: absent)."""
    mask = capture.health_mask(capture._get(p.get(GPU_TREE), "Fabric", "Health"))
    return None if mask is None else float(mask)


def _sram_uncorrected(scope: str) -> Callable[[str, dict], float | None]:
    """The SEC-DED line stands for the sum of its scope's Parity and SEC-DED lines (NVML's SRAM count)."""
    def convert(raw: str, p: dict) -> float | None:
        n = capture.sram_uncorrected(capture._get(p.get(GPU_TREE), "ECC Errors", scope))
        return None if n is None else float(n)
    return convert


@dataclass(frozen=True)
class Export:
    """Where a capture field is exported: `metric` (the sample name as served, `_total` included)
    with `labels` (plus the MIG device's or process's own), compared by value after `convert`
    (raw capture text, profile -> exported unit) within `tolerance` (exported unit), or by the value of
    label `label` of that series (`one_hot`: of the series whose value is 1, for one-series-per-state
    metrics). `also` lists further series the same line must match (one line exported twice)."""
    metric: str
    labels: dict[str, str] = field(default_factory=dict)
    convert: Callable[[str, dict], Any] = _scaled(1.0)
    label: str | None = None
    tolerance: float = 0.0
    one_hot: bool = False
    also: tuple["Export", ...] = ()


def _info(label: str) -> Export:
    return Export("gpuobs_gpu_info", label=label, convert=_text)


_LIMITS = {"Current Power Limit": "gpuobs_gpu_power_limit_watts", "Enforced Power Limit": "gpuobs_gpu_power_limit_watts",
           "Default Power Limit": "gpuobs_gpu_power_default_limit_watts",
           "Min Power Limit": "gpuobs_gpu_power_min_limit_watts", "Max Power Limit": "gpuobs_gpu_power_max_limit_watts"}
_REASONS = {"Idle": "gpu_idle", "GPU Idle": "gpu_idle", "Applications Clocks Setting": "applications_clocks_setting",
            "SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown", "Sync Boost": "sync_boost",
            "SW Thermal Slowdown": "sw_thermal_slowdown", "HW Slowdown/HW Thermal Slowdown": "hw_thermal_slowdown",
            "HW Slowdown/HW Power Brake Slowdown": "hw_power_brake_slowdown",
            "Display Clock Setting": "display_clock_setting"}
_COUNTERS = {"SW Power Capping": "sw_power_cap", "Sync Boost": "sync_boost", "SW Thermal Slowdown": "sw_thermal_slowdown",
             "HW Thermal Slowdown": "hw_thermal_slowdown", "HW Power Braking": "hw_power_brake_slowdown"}
_CLOCKS = {"Graphics": "graphics", "SM": "sm", "Memory": "memory", "Video": "video"}
_ECC = {"DRAM Correctable": "corrected", "DRAM Uncorrectable": "uncorrected",
        "Single Bit/Device Memory": "corrected", "Double Bit/Device Memory": "uncorrected"}
_SESSIONS = {"Active Sessions": ("sessions", 1.0), "Average FPS": ("frames_per_second", 1.0),
             "Average Latency": ("average_latency_seconds", 1e-6)}  # nvidia-smi prints the latency in us
_HEALTH = ("Bandwidth", "Route Recovery in progress", "Route Unhealthy", "Access Timeout Recovery",
           "Incorrect Configuration")


def _ecc_location(location: str, kind: str, scope: str) -> Export:
    return Export("gpuobs_gpu_ecc_location_errors_total",
                  {"location": location, "error_type": kind, "counter_type": scope.lower()})


def _enabled_as(metric: str) -> Export:
    return Export(metric, convert=_enabled)

# Capture field path (keys below the GPU block, "/"-joined; fnmatch patterns) -> where it is exported.
EXPORTED: dict[str, Export] = {
    "Driver Version": _info("driver_version"), "KMD Version": _info("driver_version"),
    "CUDA Version": _info("cuda_version"), "CUDA UMD Version": _info("cuda_version"),
    "Product Name": _info("name"), "VBIOS Version": _info("vbios_version"), "PCI/Bus Id": _info("pci_bus_id"),
    "Product Architecture": Export("gpuobs_gpu_info", label="architecture",
                                   # NVML's enum name: "Ada Lovelace" is NVML_DEVICE_ARCH_ADA
                                   convert=lambda raw, p: (capture._s(raw) or "").lower().split(" ")[0] or None),
    "FB Memory Usage/Total": Export("gpuobs_gpu_memory_total_bytes", convert=_scaled(MIB)),
    "FB Memory Usage/Reserved": Export("gpuobs_gpu_memory_reserved_bytes", convert=_scaled(MIB)),
    "FB Memory Usage/Used": Export("gpuobs_gpu_memory_used_bytes", convert=_scaled(MIB)),
    # The simulator serves free = total - reserved - used; nvidia-smi rounds each of the four to MiB from
    # byte counts of its own, and in the captures its free differs from that difference by up to 2 MiB.
    "FB Memory Usage/Free": Export("gpuobs_gpu_memory_free_bytes", convert=_scaled(MIB), tolerance=2 * MIB),
    "BAR1 Memory Usage/Total": Export("gpuobs_gpu_bar1_total_bytes", convert=_scaled(MIB)),
    "BAR1 Memory Usage/Used": Export("gpuobs_gpu_bar1_used_bytes", convert=_scaled(MIB)),
    "Utilization/GPU": Export("gpuobs_gpu_utilization_ratio", convert=_scaled(0.01)),
    "Utilization/Memory": Export("gpuobs_gpu_memory_utilization_ratio", convert=_scaled(0.01)),
    "Utilization/Encoder": Export("gpuobs_gpu_encoder_utilization_ratio", convert=_scaled(0.01)),
    "Utilization/Decoder": Export("gpuobs_gpu_decoder_utilization_ratio", convert=_scaled(0.01)),
    "Fan Speed": Export("gpuobs_gpu_fan_speed_ratio", convert=_scaled(0.01)),
    "Performance State": Export("gpuobs_gpu_performance_state", convert=_pstate),
    "ECC Mode/Current": Export("gpuobs_gpu_ecc_enabled", convert=_enabled),
    "MIG Mode/Current": Export("gpuobs_gpu_mig_enabled", convert=_enabled),
    "ECC Mode/Pending": _enabled_as("gpuobs_gpu_ecc_pending_enabled"),
    "MIG Mode/Pending": _enabled_as("gpuobs_gpu_mig_pending_enabled"),
    "Persistence Mode": _enabled_as("gpuobs_gpu_persistence_mode_enabled"),
    "Compute Mode": Export("gpuobs_gpu_compute_mode", label="mode", one_hot=True, convert=_snake),
    "GPU Memory Power Readings/Average Power Draw": Export("gpuobs_gpu_memory_power_average_watts"),
    **{f"{block}/{key}": Export(f"gpuobs_gpu_{prefix}_{metric}", convert=_scaled(factor))
       for block, prefix in (("Encoder Stats", "encoder"), ("FBC Stats", "fbc"))
       for key, (metric, factor) in _SESSIONS.items()},
    **{f"Remapped Rows/Bank Remap Availability Histogram/{a.capitalize()}":
       Export("gpuobs_gpu_row_remap_banks", {"availability": a}) for a in ("max", "high", "partial", "low", "none")},
    "MIG Device/Shared BAR1 Memory/Total": Export("gpuobs_mig_bar1_total_bytes", convert=_scaled(MIB)),
    "MIG Device/Shared BAR1 Memory/Used": Export("gpuobs_mig_bar1_used_bytes", convert=_scaled(MIB)),
    **dict.fromkeys([f"MIG Device/Device Attributes/Shared/{key}" for key in ("Multiprocessor count", "SM count")],
                    Export("gpuobs_mig_multiprocessors")),
    "Processes/Process ID/Type": Export("gpuobs_gpu_process_memory_used_bytes", label="process_type",
                                        convert=_process_type),
    "Fabric/State": Export("gpuobs_gpu_fabric_state", label="state", one_hot=True, convert=_snake),
    "Fabric/Status": Export("gpuobs_gpu_fabric_status", convert=_fabric_status),
    "Fabric/CliqueId": Export("gpuobs_gpu_fabric_clique_id", convert=_fabric_clique),
    **{f"Fabric/Health/{key}": Export("gpuobs_gpu_fabric_health_mask", convert=_fabric_health) for key in _HEALTH},
    "Temperature/GPU Current Temp": Export("gpuobs_gpu_temperature_celsius"),
    "Temperature/Memory Current Temp": Export("gpuobs_gpu_memory_temperature_celsius"),
    "Temperature/GPU Shutdown T.Limit Temp": Export("gpuobs_gpu_shutdown_temperature_celsius", convert=_below_tlimit),
    "Temperature/GPU Slowdown T.Limit Temp": Export("gpuobs_gpu_slowdown_temperature_celsius", convert=_below_tlimit),
    "Temperature/GPU Max Operating T.Limit Temp": Export("gpuobs_gpu_max_operating_temperature_celsius",
                                                         convert=_below_tlimit),
    "Temperature/GPU Shutdown Temp": Export("gpuobs_gpu_shutdown_temperature_celsius"),
    "Temperature/GPU Slowdown Temp": Export("gpuobs_gpu_slowdown_temperature_celsius"),
    "Temperature/GPU Max Operating Temp": Export("gpuobs_gpu_max_operating_temperature_celsius"),
    "Temperature/Memory Max Operating Temp": Export("gpuobs_gpu_memory_max_operating_temperature_celsius"),
    "PCI/GPU Link Info/PCIe Generation/Current": Export("gpuobs_gpu_pcie_link_generation"),
    "PCI/GPU Link Info/PCIe Generation/Max": Export("gpuobs_gpu_pcie_link_generation_max"),
    "PCI/GPU Link Info/Link Width/Current": Export("gpuobs_gpu_pcie_link_width"),
    "PCI/GPU Link Info/Link Width/Max": Export("gpuobs_gpu_pcie_link_width_max"),
    "PCI/Replays Since Reset": Export("gpuobs_gpu_pcie_replays_total"),
    "Retired Pages/Single Bit ECC": Export("gpuobs_gpu_retired_pages_total", {"cause": "single_bit_ecc"}),
    "Retired Pages/Double Bit ECC": Export("gpuobs_gpu_retired_pages_total", {"cause": "double_bit_ecc"}),
    "Retired Pages/Pending Page Blacklist": Export("gpuobs_gpu_retired_pages_pending", convert=_enabled),
    "Remapped Rows/Correctable Error": Export("gpuobs_gpu_remapped_rows_total", {"error_type": "correctable"}),
    "Remapped Rows/Uncorrectable Error": Export("gpuobs_gpu_remapped_rows_total", {"error_type": "uncorrectable"}),
    "Remapped Rows/Pending": Export("gpuobs_gpu_row_remap_pending", convert=_enabled),
    "Remapped Rows/Remapping Failure Occurred": Export("gpuobs_gpu_row_remap_failure", convert=_enabled),
    "MIG Device/GPU Instance ID": Export("gpuobs_mig_info", label="gpu_instance_id", convert=_text),
    "MIG Device/Compute Instance ID": Export("gpuobs_mig_info", label="compute_instance_id", convert=_text),
    "MIG Device/Shared FB Memory Usage/Total": Export("gpuobs_mig_memory_total_bytes", convert=_scaled(MIB)),
    "MIG Device/Shared FB Memory Usage/Used": Export("gpuobs_mig_memory_used_bytes", convert=_scaled(MIB)),
    "Processes/Process ID/Used GPU Memory": Export("gpuobs_gpu_process_memory_used_bytes", convert=_scaled(MIB)),
    "pmon/sm": Export("gpuobs_gpu_process_sm_utilization_ratio", convert=_scaled(0.01)),
    **{f"{block}/Instantaneous Power Draw": Export("gpuobs_gpu_power_usage_watts")
       for block in ("GPU Power Readings", "Power Readings")},
    "Power Readings/Power Draw": Export("gpuobs_gpu_power_usage_watts"),
    **{f"{block}/Average Power Draw": Export("gpuobs_gpu_power_average_watts")
       for block in ("GPU Power Readings", "Power Readings")},
    # NVML's "power management limit" (R470's Power Limit) is the requested one; the enforced one may be lower
    **dict.fromkeys(["GPU Power Readings/Requested Power Limit", "Power Readings/Requested Power Limit",
                     "Power Readings/Power Limit", "GPU Power Readings/GPU Ceiling Power Limit/Requested Power Limit"],
                    Export("gpuobs_gpu_power_requested_limit_watts")),
    **{f"{block}/{key}": Export(metric) for key, metric in _LIMITS.items()
       for block in ("GPU Power Readings", "Power Readings", "GPU Power Readings/GPU Ceiling Power Limit")},
    **{f"{block}/{key}": Export("gpuobs_gpu_clock_event_reason_active", {"reason": reason}, _active)
       for key, reason in _REASONS.items() for block in ("Clocks Event Reasons", "Clocks Throttle Reasons")},
    **{f"{block}/{key}": Export("gpuobs_gpu_clock_event_duration_seconds_total", {"reason": reason}, _scaled(1e-6))
       for key, reason in _COUNTERS.items()
       for block in ("Clocks Event Reasons Counters", "Clocks Throttle Reasons Counters")},
    **{f"{block}/{key}": Export(f"gpuobs_gpu_{metric}_hertz", {"clock": clock}, _scaled(1e6))
       for key, clock in _CLOCKS.items() for block, metric in (("Clocks", "clock"), ("Max Clocks", "max_clock"))},
    # device memory is DRAM (NVML_MEMORY_LOCATION_DEVICE_MEMORY == NVML_MEMORY_LOCATION_DRAM): counted twice
    **{f"ECC Errors/{scope}/{key}": Export("gpuobs_gpu_ecc_errors_total",
                                           {"error_type": kind, "counter_type": scope.lower()},
                                           also=(_ecc_location("dram", kind, scope),))
       for key, kind in _ECC.items() for scope in ("Volatile", "Aggregate")},
    **{f"ECC Errors/{scope}/SRAM Correctable": _ecc_location("sram", "corrected", scope)
       for scope in ("Volatile", "Aggregate")},
    **{f"ECC Errors/{scope}/SRAM Uncorrectable": _ecc_location("sram", "uncorrected", scope)
       for scope in ("Volatile", "Aggregate")},
    **{f"ECC Errors/{scope}/SRAM Uncorrectable SEC-DED": Export(
        "gpuobs_gpu_ecc_location_errors_total", {"location": "sram", "error_type": "uncorrected",
                                                 "counter_type": scope.lower()}, _sram_uncorrected(scope))
       for scope in ("Volatile", "Aggregate")},
}

_LABEL = "a label of the per-process series (pid, process_name, gpu_instance_id, compute_instance_id), not a value"
_CLOCK_SETTINGS = "clock settings, not readings: gpuobs exports current and max clocks"
_PLATFORM = "board, platform and firmware inventory: not a metric"
_UNREAD = "no NVML call in gpuobs reads it"

# Capture field path patterns (fnmatch, like EXPORTED) -> why the field is not exported.
NOT_EXPORTED: dict[str, str] = {
    "Timestamp": "when nvidia-smi ran: the exporter stamps its own samples",
    **dict.fromkeys(["Remapped Rows", "Retired Pages", "Processes", "ECC Errors", "Fabric", "MIG Devices"],
                    "a block shown as one value (N/A, None): the GPU has none of it, and its series are absent"),
    "Attached GPUs": "a scenario entry seeds one simulated GPU from the capture's first GPU",
    "GPU UUID": "masked (all zeros) in captures: the simulator makes a UUID per slot",
    "Serial Number": "masked in captures: the simulator makes the serial distinct per slot",
    "Product Brand": "exported as the NVML brand enum's name (gpuobs_gpu_info brand), not nvidia-smi's text",
    "Minor Number": "the /dev/nvidiaN number: not a metric",
    "GPU Power Readings/GPU Ceiling Power Limit": "R610's power ceiling: no NVML call in gpuobs reads it "
                                                  "(the limits inside its block are exported)",
    "GPU Power Readings/Power Management": "whether power management is on: the limits show it",
    "Power Readings/Power Management": "whether power management is on: the limits show it",
    "Power Readings/Power State": "the performance state, exported as gpuobs_gpu_performance_state",
    "GPU Memory Power Readings/*": "the memory's instant draw: gpuobs reads only the memory's one-second "
                                   "average (gpuobs_gpu_memory_power_average_watts)",
    "Module Power Readings/*": "module (Grace Hopper superchip) power: " + _UNREAD,
    "ECC Errors/*/SRAM Uncorrectable Parity": "summed with SEC-DED into the SRAM uncorrected count "
                                              "(compared on the SEC-DED line)",
    "ECC Errors/*/SRAM Threshold Exceeded": "whether SRAM errors passed the driver's threshold "
                                            "(nvmlDeviceGetSramEccErrorStatus): " + _UNREAD,
    "ECC Errors/Aggregate Uncorrectable SRAM Sources/*": "uncorrectable SRAM errors by unit "
                                                         "(nvmlDeviceGetSramEccErrorStatus): " + _UNREAD,
    "MIG Device/ECC Errors/*": "a MIG device's own ECC counts: gpuobs exports ECC per GPU, not per MIG device",
    "ECC Errors/*/Single Bit/*": "pre-R470 per-unit ECC counts: only device memory is exported",
    "ECC Errors/*/Double Bit/*": "pre-R470 per-unit ECC counts: only device memory is exported",
    "ECC Errors/Channel Repair Pending": _UNREAD, "ECC Errors/TPC Repair Pending": _UNREAD,
    "ECC Errors/Unrepairable Memory": _UNREAD,
    "MIG Device/Index": "orders the MIG devices; their series are keyed by GPU and compute instance id",
    "MIG Device/Shared BAR1 Memory/Free": "total − used",
    "MIG Device/Device Attributes/Shared/*": "engine counts of a MIG profile: fixed by the profile name (gpuobs_mig_info)",
    "MIG Device/Shared FB Memory Usage/Free": "total − reserved − used",
    "MIG Device/Shared FB Memory Usage/Reserved": _UNREAD,
    "BAR1 Memory Usage/Free": "total − used",
    "Processes/Process ID": _LABEL, "Processes/Process ID/Name": _LABEL,
    "Processes/GPU instance ID": _LABEL, "Processes/Compute instance ID": _LABEL,
    "Fabric/ClusterUUID": "the NVLink cluster's UUID: an identifier, not a metric (masked in captures)",
    "Fabric/Health/Partition Assigned": "whether the GPU is in a fabric partition: a health-mask field gpuobs "
                                        "does not decode (with a value there, the capture gives no mask)",
    "Fabric/Health/Summary": "the driver's one-word health summary (nvmlGpuFabricInfo_v3): the health mask "
                             "(gpuobs_gpu_fabric_health_mask) carries each condition",
    "Temperature/GPU T.Limit Temp": "the margin to T.Limit: made absolute into the thresholds above; no metric of its own",
    "Temperature/Memory Max Operating T.Limit Temp": "relative to the memory's own T.Limit, which nvidia-smi does not print",
    "Temperature/GPU Target Temperature": "a fan-control target on consumer boards: " + _UNREAD,
    "PCI/GPU Link Info/PCIe Generation/Device Max": "the GPU's own maximum; gpuobs exports the link's (Max)",
    "PCI/GPU Link Info/PCIe Generation/Device Current": "equal to Current on a trained link",
    "PCI/GPU Link Info/PCIe Generation/Host Max": "the host bridge's maximum: " + _UNREAD,
    "PCI/Tx Throughput": "a rate: exported as the byte counter gpuobs_gpu_pcie_transmit_bytes_total, "
                         "which the simulator grows at this rate",
    "PCI/Rx Throughput": "a rate: exported as the byte counter gpuobs_gpu_pcie_receive_bytes_total, "
                         "which the simulator grows at this rate",
    "PCI/Bus": "part of the bus id (gpuobs_gpu_info pci_bus_id)", "PCI/Device": "part of the bus id",
    "PCI/Domain": "part of the bus id", "PCI/Device Id": _PLATFORM, "PCI/Sub System Id": _PLATFORM,
    "PCI/Base Classcode": _PLATFORM, "PCI/Sub Classcode": _PLATFORM, "PCI/Bridge Chip/*": _PLATFORM,
    "PCI/Atomic Caps *": _PLATFORM, "PCI/Replay Number Rollovers": "rollovers of the 8-bit replay counter: " + _UNREAD,
    "Applications Clocks/*": _CLOCK_SETTINGS, "Default Applications Clocks/*": _CLOCK_SETTINGS,
    "Deferred Clocks/*": _CLOCK_SETTINGS, "Max Customer Boost Clocks/*": _CLOCK_SETTINGS,
    "Clock Policy/*": _CLOCK_SETTINGS,
    "Utilization/JPEG": _UNREAD, "Utilization/OFA": _UNREAD,
    **dict.fromkeys(["Driver Model/Current", "Driver Model/Pending"],
                    "the Windows driver model (WDDM or TCC), now and after a reboot: a platform property, "
                    "not a metric"),
    **dict.fromkeys(["Board ID", "Board Part Number", "GPU Part Number", "FRU Part Number", "GPU PDI",
                     "MultiGPU Board", "Inforom Version/*", "Inforom BBX Object Flush/*", "GSP Firmware Version",
                     "Platform Info/*", "Module ID", "Chassis Serial Number"], _PLATFORM),
    **dict.fromkeys(["Display Mode", "Display Active", "Display Attached", "Addressing Mode", "Accounting Mode",
                     "Accounting Mode Buffer Size", "GPU Operation Mode/*", "GPU C2C Mode",
                     "GPU Virtualization Mode/*", "IBMNPU/*", "Capabilities/*", "Conf Compute Protected Memory Usage/*",
                     "DRAM Encryption Mode/*", "EDPp Multiplier", "GPU Recovery Action", "Power Smoothing",
                     "Workload Power Profiles/*", "Sparse Operation Mode", "GPU Reset Status/*"],
                    "a mode or setting: " + _UNREAD),
    **dict.fromkeys(["Clocks Event Reasons/*/*", "Clocks Throttle Reasons/*/*"],
                    "a sub-reason gpuobs has no clock-event bit for (its parent reason is exported)"),
}


def classify(path: str) -> Export | str | None:
    """The Export of a capture field path, else its not-exported reason, else None (unknown).
    Exact paths win over patterns; EXPORTED wins over NOT_EXPORTED."""
    for table in (EXPORTED, NOT_EXPORTED):
        if path in table:
            return table[path]
    for table in (EXPORTED, NOT_EXPORTED):
        for pattern, value in table.items():
            if fnmatch.fnmatchcase(path, pattern):
                return value
    return None


def known(path: str) -> bool:
    """True when the field path is exported or listed as not exported (the importer's notion of a
    line it can place)."""
    return classify(path) is not None


@dataclass
class Row:
    """One line of the report: field, the capture's value (raw text), the exported value (None:
    absent) and the verdict: "match", "mismatch", "not exported: <reason>" or "unknown"."""
    field: str
    capture: str
    exported: Any
    verdict: str

    @property
    def failed(self) -> bool:
        return self.verdict.startswith(("mismatch", "unknown"))


# ---------------------------------------------------------------- comparing

Sample = tuple[str, dict[str, str], float]  # (sample name as served, labels, value)
Exported = Callable[[dict], list[Sample]]  # scenario mapping -> the exporter's samples on it (gpuobs.smi)


def _lookup(samples: list[Sample], spec: Export, labels: dict[str, str]) -> Any:
    """The exported value (or label value) of GPU 0's series of `spec` with `labels`; None if absent."""
    want = {**spec.labels, **labels}
    found = [(lab, v) for n, lab, v in samples if n == spec.metric and lab.get("gpu", "0") == "0"
             and all(lab.get(k) == v2 for k, v2 in want.items()) and (not spec.one_hot or v == 1)]
    if not found:
        return None
    lab, value = found[0]
    return (lab.get(spec.label) or None) if spec.label else value


def _same(expected: Any, got: Any, tolerance: float = 0.0) -> bool:
    if expected is None or got is None:
        return expected is None and got is None
    if isinstance(expected, str) or isinstance(got, str):
        return str(expected) == str(got)
    return math.isclose(float(expected), float(got), rel_tol=1e-6, abs_tol=max(tolerance, 1e-9))


def _context_labels(ctx: dict) -> dict[str, str]:
    """The labels that pick a MIG device's or a process's own series out of the metric's."""
    if "process" in ctx:
        return {"pid": str(capture._int(ctx["process"]))}
    if "mig" in ctx:
        mig = ctx["mig"]
        return {"gpu_instance_id": capture._s(capture._get(mig, "GPU Instance ID")) or "",
                "compute_instance_id": capture._s(capture._get(mig, "Compute Instance ID")) or ""}
    return {}


def _row(path: str, raw: Any, ctx: dict, profile: dict, samples: list[Sample]) -> Row:
    text = capture._s(raw)
    shown = text if text is not None else (str(raw.get(capture.VALUE)) if isinstance(raw, dict) else str(raw))
    where = classify(path)
    name = path + "".join(f"[{k}={v}]" for k, v in _context_labels(ctx).items())
    if where is None:
        return Row(name, shown, None, "unknown")
    if isinstance(where, str):
        return Row(name, shown, None, f"not exported: {where}")
    value = raw.get(capture.VALUE) if isinstance(raw, dict) else raw
    got = None
    for spec in (where, *where.also):  # the row shows the first series; every one must match
        expected = spec.convert(value, profile | {CONTEXT: ctx})
        found = _lookup(samples, spec, _context_labels(ctx))
        got = found if spec is where else got
        if not _same(expected, found, spec.tolerance):
            return Row(name, shown, got, f"mismatch (expected {expected!r} in {spec.metric})")
    return Row(name, shown, got, "match")


def _pmon_rows(profile: dict, samples: list[Sample]) -> list[Row]:
    """Per-process SM utilization from the capture's pmon section (means of the sampled rows)."""
    spec = EXPORTED["pmon/sm"]
    rows = []
    for proc in profile.get("processes") or []:
        if "C" not in (proc.get("type") or "C"):
            continue  # NVML samples utilization of compute processes only
        sm = proc.get("sm_util")
        got = _lookup(samples, spec, {"pid": str(proc["pid"])})
        expected = None if sm is None else sm / 100
        rows.append(Row(f"pmon/sm[pid={proc['pid']}]", "-" if sm is None else f"{sm} %", got,
                        "match" if _same(expected, got) else f"mismatch (expected {expected!r})"))
    return rows


def check(path: str | Path, phase: str, exported: Exported) -> list[Row]:
    """One Row per value-bearing line of the first GPU's `-q` block of `phase` (and the top of the
    `-q` output), plus the pmon per-process rows; see the module docstring. `exported(spec)` runs
    the real exporter on a simulated node seeded from a scenario mapping and returns its samples
    (gpuobs.smi.exported_samples: the exporter is a higher layer than the simulator).

    Raises FileNotFoundError, ValueError (as load_capture) or ScenarioError when the capture cannot
    be imported, and whatever `exported` raises."""
    path = Path(path)
    profiles = capture.load_capture(path, phase, warn=False)  # the scenario's import warns; the rows say it too
    if not profiles:
        raise ValueError(f"{path}: no GPU in the {phase} query (-q) section")
    secs = capture.sections(path.read_text(encoding="utf-8", errors="replace"))
    other = "load" if phase == "idle" else "idle"  # load_capture's fallback
    root = capture._tree(secs.get((phase, "query (-q)")) or secs[(other, "query (-q)")])
    gpu = next(v for k, v in root.items() if capture._GPU_KEY.match(k) and isinstance(v, dict))
    profile = profiles[0] | {"tlimit": _tlimit(secs, gpu), GPU_TREE: gpu}
    samples = exported({"gpus": [{"capture": str(path.resolve()), "phase": phase}]})
    rows = [_row(key, value, {}, profile, samples) for key, value in root.items()
            if not capture._GPU_KEY.match(key) and not isinstance(value, dict)]
    rows += [_row(p, raw, ctx, profile, samples) for p, raw, ctx in capture.field_paths(gpu)]
    return rows + _pmon_rows(profile, samples)


def _tlimit(secs: dict, gpu: dict) -> int | None:
    """The absolute T.Limit the importer uses for the first GPU: its idle reading, else this one."""
    idle = [v for k, v in capture._tree(secs.get(("idle", "query (-q)"), "")).items()
            if capture._GPU_KEY.match(k) and isinstance(v, dict)]
    limit = capture.tlimit(capture._get(idle[0], "Temperature")) if idle else None
    return capture.tlimit(capture._get(gpu, "Temperature")) if limit is None else limit


def report(rows: list[Row]) -> list[str]:
    """The rows as aligned text lines (field, capture value, exported value, verdict) and a summary."""
    w = max([len(r.field) for r in rows] + [5])
    lines = [f"{'field':<{w}}  {'capture':<28}  {'exported':<22}  verdict"]
    for r in rows:
        got = "(absent)" if r.exported is None else f"{r.exported:g}" if isinstance(r.exported, float) else r.exported
        lines.append(f"{r.field:<{w}}  {r.capture[:28]:<28}  {str(got)[:22]:<22}  {r.verdict}")
    counts = {k: sum(1 for r in rows if r.verdict.startswith(k)) for k in ("match", "mismatch", "not exported",
                                                                          "unknown")}
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    return lines
