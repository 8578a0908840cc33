"""The field tables of the capture-fidelity report: where each line of `nvidia-smi -q` is exported
(EXPORTED: a catalog metric, its labels and the unit conversion) or why it is not (NOT_EXPORTED).

The importer (gpuobs.sim.capture) asks `known()` which lines it can place; the report
(gpuobs.sim.fidelity) compares the exported values with the capture's. Metrics are named by their
catalog objects, so a rename in the catalog is followed here.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import catalog as c
from . import smi_text as text

__all__ = ["EXPORTED", "NOT_EXPORTED", "Export", "classify", "known"]

MIB = 1024 * 1024
GPU_TREE = "_gpu"  # key of the profile dict handed to converters that holds the capture's parsed GPU block
CONTEXT = "_context"  # ... and the row's MIG device or process node (text.field_paths' context)


def _n(raw: str) -> float | None:
    """The leading number of a capture value (after the importer's N/A and annotation handling)."""
    return text._num(raw)


def _scaled(factor: float) -> Callable[[str, dict], float | None]:
    return lambda raw, p: None if (n := _n(raw)) is None else n * factor


def _active(raw: str, p: dict) -> float | None:
    s = text._s(raw)
    return None if s is None else float(s.lower() == "active")


def _enabled(raw: str, p: dict) -> float | None:
    f = text._flag(raw)
    return None if f is None else float(f)


def _pstate(raw: str, p: dict) -> float | None:
    s = text._s(raw)
    return float(s[1:]) if s and re.fullmatch(r"P\d+", s) else None


def _below_tlimit(raw: str, p: dict) -> float | None:
    """A threshold printed relative to T.Limit, made absolute as the importer does."""
    d, t = _n(raw), p.get("tlimit")
    return None if d is None or t is None else float(t - d)


def _text(raw: str, p: dict) -> str | None:
    return text._s(raw)


def _snake(raw: str, p: dict) -> str | None:
    """nvidia-smi's text as the label value gpuobs uses: "Exclusive_Process" -> "exclusive_process",
    "In Progress" -> "in_progress"."""
    s = text._s(raw)
    return None if s is None else re.sub(r"[\s-]+", "_", s.lower())


_PROCESS_TYPES = {"C": "compute", "G": "graphics", "C+G": "compute_graphics"}


def _process_type(raw: str, p: dict) -> str | None:
    """nvidia-smi's C, G, C+G as the process_type label gpuobs uses."""
    s = text._s(raw)
    return None if s is None else _PROCESS_TYPES.get(s, s)


def _listed(raw: Any, p: dict) -> float | None:
    """A `Process ID` line: its process must be served (gpu_process_info is 1), memory known or not."""
    return None if _n(raw) is None else 1.0


def _fabric_completed(p: dict) -> bool:
    """Status and clique id are valid, and exported, only once the registration completed."""
    return (text._s(text._get(p.get(GPU_TREE), "Fabric", "State")) or "").lower() == "completed"


def _fabric_status(raw: str, p: dict) -> float | None:
    s = text._s(raw)
    code = None if s is None else text.FABRIC_STATUS.get(s.lower())
    return None if code is None or not _fabric_completed(p) else float(code)


def _fabric_clique(raw: str, p: dict) -> float | None:
    return _n(raw) if _fabric_completed(p) else None


def _fabric_health(raw: str, p: dict) -> float | None:
    """Each Health line is compared with the whole mask the block's lines spell out (None: absent)."""
    mask = text.health_mask(text._get(p.get(GPU_TREE), "Fabric", "Health"))
    return None if mask is None else float(mask)


def _sram_uncorrected(scope: str) -> Callable[[str, dict], float | None]:
    """The SEC-DED line stands for the sum of its scope's Parity and SEC-DED lines (NVML's SRAM count)."""
    def convert(raw: str, p: dict) -> float | None:
        n = text.sram_uncorrected(text._get(p.get(GPU_TREE), "ECC Errors", scope))
        return None if n is None else float(n)
    return convert


@dataclass(frozen=True)
class Export:
    """Where a capture field is exported: `metric` (the catalog Metric, looked up by the sample name
    it is served under, `_total` included) with `labels` (plus the MIG device's or process's own),
    compared by value after `convert` (raw capture text, profile -> exported unit) within `tolerance`
    (exported unit), or by the value of label `label` of that series (`one_hot`: of the series whose
    value is 1, for one-series-per-state metrics). `also` lists further series the same line must
    match (one line exported twice)."""
    metric: c.Metric
    labels: dict[str, str] = field(default_factory=dict)
    convert: Callable[[Any, dict], Any] = _scaled(1.0)  # the raw value may be None (a line with only a block)
    label: str | None = None
    tolerance: float = 0.0
    one_hot: bool = False
    also: tuple["Export", ...] = ()


def _info(label: str) -> Export:
    return Export(c.GPU_INFO, label=label, convert=_text)


_LIMITS = {"Current Power Limit": c.POWER_LIMIT, "Enforced Power Limit": c.POWER_LIMIT,
           "Default Power Limit": c.POWER_DEFAULT_LIMIT,
           "Min Power Limit": c.POWER_MIN_LIMIT, "Max Power Limit": c.POWER_MAX_LIMIT}
_REASONS = {"Idle": "gpu_idle", "GPU Idle": "gpu_idle", "Applications Clocks Setting": "applications_clocks_setting",
            "SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown", "Sync Boost": "sync_boost",
            "SW Thermal Slowdown": "sw_thermal_slowdown", "HW Slowdown/HW Thermal Slowdown": "hw_thermal_slowdown",
            "HW Slowdown/HW Power Brake Slowdown": "hw_power_brake_slowdown",
            "Display Clock Setting": "display_clock_setting"}
_COUNTERS = {"SW Power Capping": "sw_power_cap", "Sync Boost": "sync_boost",
             "SW Thermal Slowdown": "sw_thermal_slowdown",
             "HW Thermal Slowdown": "hw_thermal_slowdown", "HW Power Braking": "hw_power_brake_slowdown"}
_CLOCKS = {"Graphics": "graphics", "SM": "sm", "Memory": "memory", "Video": "video"}
_ECC = {"DRAM Correctable": "corrected", "DRAM Uncorrectable": "uncorrected",
        "Single Bit/Device Memory": "corrected", "Double Bit/Device Memory": "uncorrected"}
# (block, line) -> (metric, factor): nvidia-smi prints the latency in us
_SESSIONS = {(block, key): (metric, factor)
             for block, metrics in (("Encoder Stats", (c.ENCODER_SESSIONS, c.ENCODER_FPS, c.ENCODER_LATENCY)),
                                    ("FBC Stats", (c.FBC_SESSIONS, c.FBC_FPS, c.FBC_LATENCY)))
             for (key, factor), metric in zip((("Active Sessions", 1.0), ("Average FPS", 1.0),
                                               ("Average Latency", 1e-6)), metrics)}
_HEALTH = ("Bandwidth", "Route Recovery in progress", "Route Unhealthy", "Access Timeout Recovery",
           "Incorrect Configuration")


def _ecc_location(location: str, kind: str, scope: str) -> Export:
    return Export(c.ECC_LOCATION_ERRORS,
                  {"location": location, "error_type": kind, "counter_type": scope.lower()})


def _enabled_as(metric: c.Metric) -> Export:
    return Export(metric, convert=_enabled)

# Capture field path (keys below the GPU block, "/"-joined; fnmatch patterns) -> where it is exported.
EXPORTED: dict[str, Export] = {
    "Driver Version": _info("driver_version"), "KMD Version": _info("driver_version"),
    "CUDA Version": _info("cuda_version"), "CUDA UMD Version": _info("cuda_version"),
    "Product Name": _info("name"), "VBIOS Version": _info("vbios_version"), "PCI/Bus Id": _info("pci_bus_id"),
    "Product Architecture": Export(c.GPU_INFO, label="architecture",
                                   # NVML's enum name: "Ada Lovelace" is NVML_DEVICE_ARCH_ADA
                                   convert=lambda raw, p: (text._s(raw) or "").lower().split(" ")[0] or None),
    "FB Memory Usage/Total": Export(c.MEMORY_TOTAL, convert=_scaled(MIB)),
    "FB Memory Usage/Reserved": Export(c.MEMORY_RESERVED, convert=_scaled(MIB)),
    "FB Memory Usage/Used": Export(c.MEMORY_USED, convert=_scaled(MIB)),
    # The simulator serves free = total - reserved - used; nvidia-smi rounds each of the four to MiB from
    # byte counts of its own, and in the captures its free differs from that difference by up to 2 MiB.
    "FB Memory Usage/Free": Export(c.MEMORY_FREE, convert=_scaled(MIB), tolerance=2 * MIB),
    "BAR1 Memory Usage/Total": Export(c.BAR1_TOTAL, convert=_scaled(MIB)),
    "BAR1 Memory Usage/Used": Export(c.BAR1_USED, convert=_scaled(MIB)),
    "Utilization/GPU": Export(c.UTILIZATION, convert=_scaled(0.01)),
    "Utilization/Memory": Export(c.MEMORY_UTILIZATION, convert=_scaled(0.01)),
    "Utilization/Encoder": Export(c.ENCODER_UTILIZATION, convert=_scaled(0.01)),
    "Utilization/Decoder": Export(c.DECODER_UTILIZATION, convert=_scaled(0.01)),
    "Fan Speed": Export(c.FAN_SPEED, convert=_scaled(0.01)),
    "Performance State": Export(c.PSTATE, convert=_pstate),
    "ECC Mode/Current": Export(c.ECC_MODE, convert=_enabled),
    "MIG Mode/Current": Export(c.MIG_MODE, convert=_enabled),
    "ECC Mode/Pending": _enabled_as(c.ECC_PENDING),
    "MIG Mode/Pending": _enabled_as(c.MIG_PENDING),
    "Persistence Mode": _enabled_as(c.PERSISTENCE_MODE),
    "Compute Mode": Export(c.COMPUTE_MODE, label="mode", one_hot=True, convert=_snake),
    "GPU Memory Power Readings/Average Power Draw": Export(c.MEMORY_POWER),
    **{f"{block}/{key}": Export(metric, convert=_scaled(factor))
       for (block, key), (metric, factor) in _SESSIONS.items()},
    **{f"Remapped Rows/Bank Remap Availability Histogram/{a.capitalize()}":
       Export(c.REMAP_BANKS, {"availability": a}) for a in ("max", "high", "partial", "low", "none")},
    "MIG Device/Shared BAR1 Memory/Total": Export(c.MIG_BAR1_TOTAL, convert=_scaled(MIB)),
    "MIG Device/Shared BAR1 Memory/Used": Export(c.MIG_BAR1_USED, convert=_scaled(MIB)),
    **dict.fromkeys([f"MIG Device/Device Attributes/Shared/{key}" for key in ("Multiprocessor count", "SM count")],
                    Export(c.MIG_SMS)),
    # every listed process is served (WDDM ones too, whose memory is "Not available"): a lost one fails
    "Processes/Process ID": Export(c.PROCESS_INFO, convert=_listed),
    "Processes/Process ID/Type": Export(c.PROCESS_INFO, label="process_type", convert=_process_type),
    "Processes/Process ID/Name": Export(c.PROCESS_INFO, label="process_name", convert=_text),
    "Fabric/State": Export(c.FABRIC_STATE, label="state", one_hot=True, convert=_snake),
    "Fabric/Status": Export(c.FABRIC_STATUS, convert=_fabric_status),
    "Fabric/CliqueId": Export(c.FABRIC_CLIQUE, convert=_fabric_clique),
    **{f"Fabric/Health/{key}": Export(c.FABRIC_HEALTH, convert=_fabric_health) for key in _HEALTH},
    "Temperature/GPU Current Temp": Export(c.TEMPERATURE),
    "Temperature/Memory Current Temp": Export(c.MEMORY_TEMPERATURE),
    "Temperature/GPU T.Limit Temp": Export(c.TEMPERATURE_MARGIN),  # signed: negative above T.Limit
    "Temperature/GPU Shutdown T.Limit Temp": Export(c.SHUTDOWN_TEMPERATURE, convert=_below_tlimit),
    "Temperature/GPU Slowdown T.Limit Temp": Export(c.SLOWDOWN_TEMPERATURE, convert=_below_tlimit),
    "Temperature/GPU Max Operating T.Limit Temp": Export(c.MAX_OPERATING_TEMPERATURE,
                                                         convert=_below_tlimit),
    "Temperature/GPU Shutdown Temp": Export(c.SHUTDOWN_TEMPERATURE),
    "Temperature/GPU Slowdown Temp": Export(c.SLOWDOWN_TEMPERATURE),
    "Temperature/GPU Max Operating Temp": Export(c.MAX_OPERATING_TEMPERATURE),
    "Temperature/Memory Max Operating Temp": Export(c.MEMORY_MAX_TEMPERATURE),
    "PCI/GPU Link Info/PCIe Generation/Current": Export(c.PCIE_GENERATION),
    "PCI/GPU Link Info/PCIe Generation/Max": Export(c.PCIE_MAX_GENERATION),
    "PCI/GPU Link Info/Link Width/Current": Export(c.PCIE_WIDTH),
    "PCI/GPU Link Info/Link Width/Max": Export(c.PCIE_MAX_WIDTH),
    "PCI/Replays Since Reset": Export(c.PCIE_REPLAYS),
    "Retired Pages/Single Bit ECC": Export(c.RETIRED_PAGES, {"cause": "single_bit_ecc"}),
    "Retired Pages/Double Bit ECC": Export(c.RETIRED_PAGES, {"cause": "double_bit_ecc"}),
    "Retired Pages/Pending Page Blacklist": Export(c.RETIRED_PAGES_PENDING, convert=_enabled),
    "Remapped Rows/Correctable Error": Export(c.REMAPPED_ROWS, {"error_type": "correctable"}),
    "Remapped Rows/Uncorrectable Error": Export(c.REMAPPED_ROWS, {"error_type": "uncorrectable"}),
    "Remapped Rows/Pending": Export(c.REMAP_PENDING, convert=_enabled),
    "Remapped Rows/Remapping Failure Occurred": Export(c.REMAP_FAILURE, convert=_enabled),
    "MIG Device/GPU Instance ID": Export(c.MIG_INFO, label="gpu_instance_id", convert=_text),
    "MIG Device/Compute Instance ID": Export(c.MIG_INFO, label="compute_instance_id", convert=_text),
    "MIG Device/Shared FB Memory Usage/Total": Export(c.MIG_MEMORY_TOTAL, convert=_scaled(MIB)),
    "MIG Device/Shared FB Memory Usage/Used": Export(c.MIG_MEMORY_USED, convert=_scaled(MIB)),
    "Processes/Process ID/Used GPU Memory": Export(c.PROCESS_MEMORY, convert=_scaled(MIB)),
    "pmon/sm": Export(c.PROCESS_SM, convert=_scaled(0.01)),
    **{f"{block}/Instantaneous Power Draw": Export(c.POWER_USAGE)
       for block in ("GPU Power Readings", "Power Readings")},
    # R470-R550 print the draw as "Power Draw" (under "Power Readings", from R535 "GPU Power Readings")
    **{f"{block}/Power Draw": Export(c.POWER_USAGE) for block in ("GPU Power Readings", "Power Readings")},
    **{f"{block}/Average Power Draw": Export(c.POWER_AVERAGE)
       for block in ("GPU Power Readings", "Power Readings")},
    # NVML's "power management limit" (R470's Power Limit) is the requested one; the enforced one may be lower
    **dict.fromkeys(["GPU Power Readings/Requested Power Limit", "Power Readings/Requested Power Limit",
                     "Power Readings/Power Limit", "GPU Power Readings/GPU Ceiling Power Limit/Requested Power Limit"],
                    Export(c.POWER_REQUESTED_LIMIT)),
    **{f"{block}/{key}": Export(metric) for key, metric in _LIMITS.items()
       for block in ("GPU Power Readings", "Power Readings", "GPU Power Readings/GPU Ceiling Power Limit")},
    **{f"{block}/{key}": Export(c.CLOCK_EVENT_ACTIVE, {"reason": reason}, _active)
       for key, reason in _REASONS.items() for block in ("Clocks Event Reasons", "Clocks Throttle Reasons")},
    **{f"{block}/{key}": Export(c.CLOCK_EVENT_DURATION, {"reason": reason}, _scaled(1e-6))
       for key, reason in _COUNTERS.items()
       for block in ("Clocks Event Reasons Counters", "Clocks Throttle Reasons Counters")},
    **{f"{block}/{key}": Export(metric, {"clock": clock}, _scaled(1e6))
       for key, clock in _CLOCKS.items() for block, metric in (("Clocks", c.CLOCK), ("Max Clocks", c.MAX_CLOCK))},
    # device memory is DRAM (NVML_MEMORY_LOCATION_DEVICE_MEMORY == NVML_MEMORY_LOCATION_DRAM): counted twice
    **{f"ECC Errors/{scope}/{key}": Export(c.ECC_ERRORS,
                                           {"error_type": kind, "counter_type": scope.lower()},
                                           also=(_ecc_location("dram", kind, scope),))
       for key, kind in _ECC.items() for scope in ("Volatile", "Aggregate")},
    **{f"ECC Errors/{scope}/SRAM Correctable": _ecc_location("sram", "corrected", scope)
       for scope in ("Volatile", "Aggregate")},
    **{f"ECC Errors/{scope}/SRAM Uncorrectable": _ecc_location("sram", "uncorrected", scope)
       for scope in ("Volatile", "Aggregate")},
    **{f"ECC Errors/{scope}/SRAM Uncorrectable SEC-DED": Export(
        c.ECC_LOCATION_ERRORS, {"location": "sram", "error_type": "uncorrected",
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
    "Product Brand": f"exported as the NVML brand enum's name ({c.GPU_INFO.exposed_name} brand), not nvidia-smi's text",
    "Minor Number": "the /dev/nvidiaN number: not a metric",
    "GPU Power Readings/GPU Ceiling Power Limit": "R610's power ceiling: no NVML call in gpuobs reads it "
                                                  "(the limits inside its block are exported)",
    "GPU Power Readings/Power Management": "whether power management is on: the limits show it",
    "Power Readings/Power Management": "whether power management is on: the limits show it",
    "Power Readings/Power State": f"the performance state, exported as {c.PSTATE.exposed_name}",
    "GPU Memory Power Readings/*": "the memory's instant draw: gpuobs reads only the memory's one-second "
                                   f"average ({c.MEMORY_POWER.exposed_name})",
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
    **dict.fromkeys(["Remapped Rows/Inactive Correctable Error", "Remapped Rows/Inactive Uncorrectable Error"],
                    "inactive remapped-row counts (R595+, e.g. L40S 595.80), beside the counts exported as "
                    f"{c.REMAPPED_ROWS.exposed_name}: " + _UNREAD),
    "ECC Errors/Channel Repair Pending": _UNREAD, "ECC Errors/TPC Repair Pending": _UNREAD,
    "ECC Errors/Unrepairable Memory": _UNREAD,
    "MIG Device/Index": "orders the MIG devices; their series are keyed by GPU and compute instance id",
    "MIG Device/Shared BAR1 Memory/Free": "total − used",
    "MIG Device/Device Attributes/Shared/*": "engine counts of a MIG profile: fixed by the profile name "
                                             f"({c.MIG_INFO.exposed_name})",
    "MIG Device/Shared FB Memory Usage/Free": "total − reserved − used",
    "MIG Device/Shared FB Memory Usage/Reserved": _UNREAD,
    "BAR1 Memory Usage/Free": "total − used",
    "Processes/GPU instance ID": _LABEL, "Processes/Compute instance ID": _LABEL,
    "Fabric/ClusterUUID": "the NVLink cluster's UUID: an identifier, not a metric (masked in captures)",
    "Fabric/Health/Partition Assigned": "whether the GPU is in a fabric partition: a health-mask field gpuobs "
                                        "does not decode (with a value there, the capture gives no mask)",
    "Fabric/Health/Summary": "the driver's one-word health summary (nvmlGpuFabricInfo_v3): the health mask "
                             f"({c.FABRIC_HEALTH.exposed_name}) carries each condition",
    "Temperature/Memory Max Operating T.Limit Temp": "relative to the memory's own T.Limit, "
                                                     "which nvidia-smi does not print",
    "Temperature/GPU Target Temperature": "a fan-control target on consumer boards: " + _UNREAD,
    "PCI/GPU Link Info/PCIe Generation/Device Max": "the GPU's own maximum; gpuobs exports the link's (Max)",
    "PCI/GPU Link Info/PCIe Generation/Device Current": "equal to Current on a trained link",
    "PCI/GPU Link Info/PCIe Generation/Host Max": "the host bridge's maximum: " + _UNREAD,
    "PCI/Tx Throughput": f"a rate: exported as the byte counter {c.PCIE_TX.exposed_name}, "
                         "which the simulator grows at this rate",
    "PCI/Rx Throughput": f"a rate: exported as the byte counter {c.PCIE_RX.exposed_name}, "
                         "which the simulator grows at this rate",
    "PCI/Bus": f"part of the bus id ({c.GPU_INFO.exposed_name} pci_bus_id)", "PCI/Device": "part of the bus id",
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
