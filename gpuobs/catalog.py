"""The one catalog of metrics: every series gpuobs exports is defined here, once.

The collectors emit these definitions, the exporter renders them (native or DCGM names),
docs/metrics.md is generated from them, and rules and dashboards refer to them by their
Python names. Naming follows Prometheus conventions: one `gpuobs_` namespace, base units
(bytes, watts, joules, celsius, hertz, seconds, ratio 0-1) and `_total` only on counters
(prometheus_client adds it to counter families at exposition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from .nvml import pynvml as N  # gpuobs.nvml first: it backfills the NVML ids an older pynvml lacks

NAMESPACE = "gpuobs"
GPU_LABELS = ("gpu", "uuid")  # identity on every per-GPU series: NVML index and UUID
MIG_LABELS = GPU_LABELS + ("gpu_instance_id", "compute_instance_id")


Kind = Literal["gauge", "counter", "info", "histogram"]


@dataclass(frozen=True, eq=False)  # each Metric is a singleton: identity is equality
class Metric:
    """One exported metric.

    name: exposition name without `_total` (counters get it at exposition).
    kind: "gauge", "counter", "info" (a gauge of 1 whose labels carry the data) or "histogram" (OTel only).
    labels: every label, identity first. source: where NVML gives the value, with its unit.
    dcgm: dcgm-exporter field names, keyed by the values of the labels after the identity
    ones (() for a metric without such labels); dcgm_scale converts our unit to DCGM's.
    """
    name: str
    kind: Kind
    unit: str
    help: str
    family: str
    source: str
    labels: tuple[str, ...] = GPU_LABELS
    dcgm: dict[tuple[str, ...], str] = field(default_factory=dict)
    dcgm_scale: float = 1.0
    max_value: float | None = None  # values above this are impossible and dropped
    min_value: float = 0.0  # values below this are impossible and dropped; signed NVML values declare theirs
    otel_name: str | None = None  # instrument name, for metrics recorded through OpenTelemetry
    otel_unit: str = ""  # UCUM unit of the instrument (its Prometheus name carries the converted unit)

    @property
    def valid(self) -> tuple[float, float]:
        """The declared valid range (lowest, highest; inf when unbounded) in base units: a collected
        value outside it is impossible, dropped and counted (gpuobs.collect.base.checked)."""
        return (self.min_value, math.inf if self.max_value is None else self.max_value)

    @property
    def identity(self) -> tuple[str, ...]:
        """The identity labels this metric starts with: MIG_LABELS, GPU_LABELS or none."""
        for base in (MIG_LABELS, GPU_LABELS):
            if self.labels[: len(base)] == base:
                return base
        return ()

    @property
    def extra_labels(self) -> tuple[str, ...]:
        """Labels after the identity labels."""
        return self.labels[len(self.identity):]

    @property
    def exposed_name(self) -> str:
        """The name as it appears in /metrics (counters with `_total`, info with `_info`)."""
        return self.name + {"counter": "_total", "info": "_info"}.get(self.kind, "")

    @property
    def prometheus_samples(self) -> tuple[str, ...]:
        """Sample names in a scrape: a histogram's _bucket/_sum/_count, else the exposed name."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        return (self.exposed_name,)


def _m(name: str, kind: Kind, unit: str, help: str, family: str, source: str, **kw) -> Metric:
    return Metric(f"{NAMESPACE}_{name}", kind, unit, help, family, source, **kw)


MIB = 1 / (1024 * 1024)
# ---------------------------------------------------------------------------------------- identity
GPU_INFO = _m("gpu", "info", "", "GPU identity; value 1, identity in the labels.", "identity",
              "nvmlDeviceGetName/GetUUID/GetPciInfo_v3/GetSerial/GetVbiosVersion/GetCudaComputeCapability/"
              "GetBrand/GetArchitecture, nvmlSystemGetDriverVersion/GetCudaDriverVersion",
              labels=GPU_LABELS + ("name", "pci_bus_id", "serial", "vbios_version", "driver_version",
                                   "cuda_version", "compute_capability", "brand", "architecture"))
GPU_UP = _m("gpu_up", "gauge", "", "1 if the GPU answered NVML in the last pass, 0 if it is lost, missing, "
            "unusable or timed out (see gpuobs_gpu_unhealthy); its value series are absent while 0.", "identity",
            "nvmlDeviceGetHandleByIndex_v2 / GPU_IS_LOST / RESET_REQUIRED / the pass deadline")
GPU_UNHEALTHY = _m("gpu_unhealthy", "gauge", "", "1 with the reason while the GPU is not usable: lost (GPU_IS_LOST), "
                   "reset_required (RESET_REQUIRED), timeout (its reads missed the pass deadline) or "
                   "unreadable (its handle or UUID cannot be read). Absent while the GPU is healthy.", "identity",
                   "NVML return codes of the GPU's calls; the sampler's pass deadline",
                   labels=GPU_LABELS + ("reason",))
PERSISTENCE_MODE = _m("gpu_persistence_mode_enabled", "gauge", "", "1 if persistence mode is enabled (the driver "
                      "stays loaded without clients), else 0.", "identity", "nvmlDeviceGetPersistenceMode",
                      dcgm={(): "DCGM_FI_DEV_PERSISTENCE_MODE"}, max_value=1)
COMPUTE_MODES = ("default", "exclusive_thread", "prohibited", "exclusive_process")  # nvmlComputeMode_t order
COMPUTE_MODE = _m("gpu_compute_mode", "gauge", "", "1 for the compute mode the GPU is in, 0 for each other mode "
                  "(default, exclusive_thread, prohibited, exclusive_process), one series per mode.", "identity",
                  "nvmlDeviceGetComputeMode", labels=GPU_LABELS + ("mode",), max_value=1)
# ------------------------------------------------------------------------------------- utilization
UTILIZATION = _m("gpu_utilization_ratio", "gauge", "ratio", "Fraction of the sample period a kernel ran on the GPU.",
                 "utilization", "nvmlDeviceGetUtilizationRates .gpu (percent) / 100",
                 dcgm={(): "DCGM_FI_DEV_GPU_UTIL"}, dcgm_scale=100, max_value=1.0)
MEMORY_UTILIZATION = _m("gpu_memory_utilization_ratio", "gauge", "ratio",
                        "Fraction of the sample period device memory was read or written.", "utilization",
                        "nvmlDeviceGetUtilizationRates .memory (percent) / 100",
                        dcgm={(): "DCGM_FI_DEV_MEM_COPY_UTIL"}, dcgm_scale=100, max_value=1.0)
ENCODER_UTILIZATION = _m("gpu_encoder_utilization_ratio", "gauge", "ratio", "Video encoder utilization.",
                         "utilization", "nvmlDeviceGetEncoderUtilization (percent) / 100",
                         dcgm={(): "DCGM_FI_DEV_ENC_UTIL"}, dcgm_scale=100, max_value=1.0)
DECODER_UTILIZATION = _m("gpu_decoder_utilization_ratio", "gauge", "ratio", "Video decoder utilization.",
                         "utilization", "nvmlDeviceGetDecoderUtilization (percent) / 100",
                         dcgm={(): "DCGM_FI_DEV_DEC_UTIL"}, dcgm_scale=100, max_value=1.0)
ENCODER_SESSIONS = _m("gpu_encoder_sessions", "gauge", "", "Video encoder (NVENC) sessions active now.",
                      "utilization", "nvmlDeviceGetEncoderStats sessionCount")
ENCODER_FPS = _m("gpu_encoder_frames_per_second", "gauge", "", "Average frames per second over the active "
                 "encoder sessions (0 without sessions).", "utilization", "nvmlDeviceGetEncoderStats averageFps")
ENCODER_LATENCY = _m("gpu_encoder_average_latency_seconds", "gauge", "seconds", "Average encode latency over the "
                     "active encoder sessions (0 without sessions).", "utilization",
                     "nvmlDeviceGetEncoderStats averageLatency (microseconds) / 1e6")
FBC_SESSIONS = _m("gpu_fbc_sessions", "gauge", "", "Frame buffer capture (NVFBC) sessions active now.",
                  "utilization", "nvmlDeviceGetFBCStats .sessionsCount")
FBC_FPS = _m("gpu_fbc_frames_per_second", "gauge", "", "Average frames per second over the active frame buffer "
             "capture sessions.", "utilization", "nvmlDeviceGetFBCStats .averageFPS")
FBC_LATENCY = _m("gpu_fbc_average_latency_seconds", "gauge", "seconds", "Average capture latency over the active "
                 "frame buffer capture sessions.", "utilization",
                 "nvmlDeviceGetFBCStats .averageLatency (microseconds) / 1e6")
# ------------------------------------------------------------------------- profiling (GPM, Hopper+)
# (metric, nvmlGpmMetricId_t, DCGM profiling field); gpuobs.nvml backfills the ids older pynvml lacks
_GPM = [("sm_active", N.NVML_GPM_METRIC_SM_UTIL, "DCGM_FI_PROF_SM_ACTIVE", "Fraction of SMs busy."),
        ("sm_occupancy", N.NVML_GPM_METRIC_SM_OCCUPANCY, "DCGM_FI_PROF_SM_OCCUPANCY",
         "Resident warps over the SMs' maximum."),
        ("tensor_active", N.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
         "Fraction of cycles any tensor pipe was active."),
        ("dram_active", N.NVML_GPM_METRIC_DRAM_BW_UTIL, "DCGM_FI_PROF_DRAM_ACTIVE",
         "Fraction of peak DRAM bandwidth used."),
        ("fp64_active", N.NVML_GPM_METRIC_FP64_UTIL, "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
         "Fraction of cycles the FP64 pipe was active."),
        ("fp32_active", N.NVML_GPM_METRIC_FP32_UTIL, "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
         "Fraction of cycles the FP32 pipe was active."),
        ("fp16_active", N.NVML_GPM_METRIC_FP16_UTIL, "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
         "Fraction of cycles the FP16 pipe was active."),
        ("graphics_active", N.NVML_GPM_METRIC_GRAPHICS_UTIL, "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
         "Fraction of time the graphics engine was active.")]
GPM_METRICS: dict[int, Metric] = {
    gid: _m(f"gpu_{name}_ratio", "gauge", "ratio", help, "gpm",
            f"nvmlGpmMetricsGet metric {gid} (percent) / 100 over two nvmlGpmSampleGet samples",
            dcgm={(): dcgm}, max_value=1.0)
    for name, gid, dcgm, help in _GPM}
MIG_GPM_METRICS: dict[int, Metric] = {
    gid: _m(f"mig_{name}_ratio", "gauge", "ratio", f"{help} Per MIG GPU instance.", "mig",
            f"nvmlGpmMetricsGet metric {gid} (percent) / 100 over two nvmlGpmMigSampleGet samples",
            labels=MIG_LABELS, dcgm={(): dcgm}, max_value=1.0)
    for name, gid, dcgm, help in _GPM}
# ------------------------------------------------------------------------------------------ memory
MEMORY_TOTAL = _m("gpu_memory_total_bytes", "gauge", "bytes", "Device memory in total.", "memory",
                  "nvmlDeviceGetMemoryInfo_v2 .total", dcgm={(): "DCGM_FI_DEV_FB_TOTAL"}, dcgm_scale=MIB)
MEMORY_USED = _m("gpu_memory_used_bytes", "gauge", "bytes", "Device memory allocated, reserved memory excluded.",
                 "memory", "nvmlDeviceGetMemoryInfo_v2 .used", dcgm={(): "DCGM_FI_DEV_FB_USED"}, dcgm_scale=MIB)
MEMORY_RESERVED = _m("gpu_memory_reserved_bytes", "gauge", "bytes", "Device memory reserved by the driver and firmware.",
                     "memory", "nvmlDeviceGetMemoryInfo_v2 .reserved", dcgm={(): "DCGM_FI_DEV_FB_RESERVED"},
                     dcgm_scale=MIB)
MEMORY_FREE = _m("gpu_memory_free_bytes", "gauge", "bytes", "Device memory free.", "memory",
                 "nvmlDeviceGetMemoryInfo_v2 .free", dcgm={(): "DCGM_FI_DEV_FB_FREE"}, dcgm_scale=MIB)
BAR1_TOTAL = _m("gpu_bar1_total_bytes", "gauge", "bytes", "BAR1 aperture size.", "memory",
                "nvmlDeviceGetBAR1MemoryInfo .bar1Total", dcgm={(): "DCGM_FI_DEV_BAR1_TOTAL"}, dcgm_scale=MIB)
BAR1_USED = _m("gpu_bar1_used_bytes", "gauge", "bytes", "BAR1 aperture in use.", "memory",
               "nvmlDeviceGetBAR1MemoryInfo .bar1Used", dcgm={(): "DCGM_FI_DEV_BAR1_USED"}, dcgm_scale=MIB)
# ------------------------------------------------------------------------------------------- power
POWER_USAGE = _m("gpu_power_usage_watts", "gauge", "watts", "Power draw of the GPU board.", "power",
                 "NVML_FI_DEV_POWER_INSTANT (milliwatts) / 1000, else nvmlDeviceGetPowerUsage",
                 dcgm={(): "DCGM_FI_DEV_POWER_USAGE"})
POWER_LIMIT = _m("gpu_power_limit_watts", "gauge", "watts", "Power limit the driver enforces now.", "power",
                 "NVML_FI_DEV_POWER_CURRENT_LIMIT (milliwatts) / 1000",
                 dcgm={(): "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"})
POWER_DEFAULT_LIMIT = _m("gpu_power_default_limit_watts", "gauge", "watts", "Default power limit.", "power",
                         "NVML_FI_DEV_POWER_DEFAULT_LIMIT (milliwatts) / 1000")
POWER_MIN_LIMIT = _m("gpu_power_min_limit_watts", "gauge", "watts", "Lowest settable power limit.", "power",
                     "NVML_FI_DEV_POWER_MIN_LIMIT (milliwatts) / 1000",
                     dcgm={(): "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN"})
POWER_MAX_LIMIT = _m("gpu_power_max_limit_watts", "gauge", "watts", "Highest settable power limit.", "power",
                     "NVML_FI_DEV_POWER_MAX_LIMIT (milliwatts) / 1000",
                     dcgm={(): "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX"})
ENERGY = _m("gpu_energy_consumption_joules", "counter", "joules", "Energy used since the driver was loaded.",
            "power", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (millijoules) / 1000",
            dcgm={(): "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}, dcgm_scale=1000)
POWER_AVERAGE = _m("gpu_power_average_watts", "gauge", "watts", "Power draw of the GPU averaged over one second "
                   "(Ampere and newer, GA100 excepted).", "power",
                   "NVML_FI_DEV_POWER_AVERAGE, scope NVML_POWER_SCOPE_GPU (milliwatts) / 1000")
MEMORY_POWER = _m("gpu_memory_power_average_watts", "gauge", "watts", "Power draw of the GPU's memory averaged over "
                  "one second (nvidia-smi's GPU Memory Power Readings).", "power",
                  "NVML_FI_DEV_POWER_AVERAGE, scope NVML_POWER_SCOPE_MEMORY (milliwatts) / 1000")
POWER_REQUESTED_LIMIT = _m("gpu_power_requested_limit_watts", "gauge", "watts", "Power limit requested (set with "
                           "nvidia-smi -pl or the default); the enforced limit may be lower.", "power",
                           "NVML_FI_DEV_POWER_REQUESTED_LIMIT (milliwatts) / 1000",
                           dcgm={(): "DCGM_FI_DEV_POWER_MGMT_LIMIT"})
# ----------------------------------------------------------------------------------------- thermal
TEMPERATURE = _m("gpu_temperature_celsius", "gauge", "celsius", "GPU core temperature.", "thermal",
                 "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", dcgm={(): "DCGM_FI_DEV_GPU_TEMP"},
                 max_value=200)
MEMORY_TEMPERATURE = _m("gpu_memory_temperature_celsius", "gauge", "celsius", "HBM/GDDR temperature.", "thermal",
                        "NVML_FI_DEV_MEMORY_TEMP", dcgm={(): "DCGM_FI_DEV_MEMORY_TEMP"}, max_value=200)
SLOWDOWN_TEMPERATURE = _m("gpu_slowdown_temperature_celsius", "gauge", "celsius",
                          "GPU temperature at which the hardware slows its clocks.", "thermal",
                          "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)",
                          dcgm={(): "DCGM_FI_DEV_SLOWDOWN_TEMP"}, max_value=200)
SHUTDOWN_TEMPERATURE = _m("gpu_shutdown_temperature_celsius", "gauge", "celsius",
                          "GPU temperature at which the hardware shuts down.", "thermal",
                          "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)", dcgm={(): "DCGM_FI_DEV_SHUTDOWN_TEMP"},
                          max_value=200)
MAX_OPERATING_TEMPERATURE = _m("gpu_max_operating_temperature_celsius", "gauge", "celsius",
                               "Highest GPU temperature for normal operation.", "thermal",
                               "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_GPU_MAX)", max_value=200)
MEMORY_MAX_TEMPERATURE = _m("gpu_memory_max_operating_temperature_celsius", "gauge", "celsius",
                            "Highest memory temperature for normal operation.", "thermal",
                            "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX)", max_value=200)
TEMPERATURE_MARGIN = _m("gpu_temperature_margin_celsius", "gauge", "celsius", "Degrees the GPU core is below its "
                        "T.Limit (the temperature at which it starts slowing its clocks); negative above it.",
                        "thermal", "nvmlDeviceGetMarginTemperature .marginTemperature (signed), read every slow pass",
                        min_value=-200, max_value=200)
FAN_SPEED = _m("gpu_fan_speed_ratio", "gauge", "ratio", "Fan speed as a fraction of its maximum.", "thermal",
               "nvmlDeviceGetFanSpeed (percent) / 100", dcgm={(): "DCGM_FI_DEV_FAN_SPEED"}, dcgm_scale=100,
               max_value=1.0)
# ------------------------------------------------------------------------------------------ clocks
CLOCKS = ("graphics", "sm", "memory", "video")  # nvmlClockType_t order
CLOCK = _m("gpu_clock_hertz", "gauge", "hertz", "Current clock frequency per clock domain.", "clocks",
           "nvmlDeviceGetClockInfo (MHz) * 1e6", labels=GPU_LABELS + ("clock",),
           dcgm={("sm",): "DCGM_FI_DEV_SM_CLOCK", ("memory",): "DCGM_FI_DEV_MEM_CLOCK",
                 ("video",): "DCGM_FI_DEV_VIDEO_CLOCK"}, dcgm_scale=1e-6, max_value=20e9)
MAX_CLOCK = _m("gpu_max_clock_hertz", "gauge", "hertz", "Maximum clock frequency per clock domain.", "clocks",
               "nvmlDeviceGetMaxClockInfo (MHz) * 1e6", labels=GPU_LABELS + ("clock",),
               dcgm={("sm",): "DCGM_FI_DEV_MAX_SM_CLOCK", ("memory",): "DCGM_FI_DEV_MAX_MEM_CLOCK",
                     ("video",): "DCGM_FI_DEV_MAX_VIDEO_CLOCK"}, dcgm_scale=1e-6, max_value=20e9)
PSTATE = _m("gpu_performance_state", "gauge", "", "Performance state: 0 (P0, maximum) to 15 (minimum).", "clocks",
            "nvmlDeviceGetPerformanceState", dcgm={(): "DCGM_FI_DEV_PSTATE"}, max_value=15)
# ------------------------------------------------------------------------------------ clock events
# nvmlClocksEventReason* bits; unknown bits are exported as bit_N.
CLOCK_EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                       0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                       0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
                       0x100: "display_clock_setting"}
CLOCK_EVENT_ACTIVE = _m("gpu_clock_event_reason_active", "gauge", "",
                        "1 while this reason holds clocks down (throttling), else 0.", "clock_events",
                        "nvmlDeviceGetCurrentClocksEventReasons, one series per bit",
                        labels=GPU_LABELS + ("reason",))
CLOCK_EVENT_REASONS_MASK = _m("gpu_clock_event_reasons", "gauge", "",
                              "Bitmask of the reasons holding clocks down now (nvmlClocksEventReason* bits, "
                              "0: none); gpuobs_gpu_clock_event_reason_active has one series per bit.", "clock_events",
                              "nvmlDeviceGetCurrentClocksEventReasons (else ...ClocksThrottleReasons)",
                              dcgm={(): "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"})
# DCGM field names that name the same field as another (DCGM renamed throttle reasons to clock
# events, as NVML did in R535, and kept the old name): dcgm naming serves the series under each name.
DCGM_ALIASES: dict[str, tuple[str, ...]] = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",)}
# Clock-event reason counters, batched as field values (nanoseconds): field id -> reason label.
CLOCK_EVENT_COUNTER_FIELDS = {74: "sw_power_cap", 76: "sync_boost", 269: "sw_thermal_slowdown",
                              270: "hw_thermal_slowdown", 271: "hw_power_brake_slowdown"}
CLOCK_EVENT_DURATION = _m("gpu_clock_event_duration_seconds", "counter", "seconds",
                          "Time clocks were held down, per reason (nvidia-smi's Clocks Event Reasons Counters).",
                          "clock_events",
                          "NVML_FI_DEV_CLOCKS_EVENT_REASON_{SW_POWER_CAP,SYNC_BOOST,SW_THERM_SLOWDOWN,"
                          "HW_THERM_SLOWDOWN,HW_POWER_BRAKE_SLOWDOWN} (nanoseconds) / 1e9",
                          labels=GPU_LABELS + ("reason",),
                          dcgm={("sw_power_cap",): "DCGM_FI_DEV_POWER_VIOLATION",
                                ("sw_thermal_slowdown",): "DCGM_FI_DEV_THERMAL_VIOLATION",
                                ("sync_boost",): "DCGM_FI_DEV_SYNC_BOOST_VIOLATION"}, dcgm_scale=1e6)
# --------------------------------------------------------------------------------------------- ECC
ECC_MODE = _m("gpu_ecc_enabled", "gauge", "", "1 if ECC is enabled now.", "ecc", "nvmlDeviceGetEccMode current")
ECC_ERRORS = _m("gpu_ecc_errors", "counter", "", "ECC errors in device memory.", "ecc",
                "NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL", labels=GPU_LABELS + ("error_type", "counter_type"),
                dcgm={("corrected", "volatile"): "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                      ("uncorrected", "volatile"): "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                      ("corrected", "aggregate"): "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
                      ("uncorrected", "aggregate"): "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"})
RETIRED_PAGES = _m("gpu_retired_pages", "counter", "", "Memory pages retired (pre-Ampere page retirement).", "ecc",
                   "NVML_FI_DEV_RETIRED_SBE / NVML_FI_DEV_RETIRED_DBE", labels=GPU_LABELS + ("cause",),
                   dcgm={("single_bit_ecc",): "DCGM_FI_DEV_RETIRED_SBE", ("double_bit_ecc",): "DCGM_FI_DEV_RETIRED_DBE"})
RETIRED_PAGES_PENDING = _m("gpu_retired_pages_pending", "gauge", "", "1 if a page retirement waits for a reset.",
                           "ecc", "NVML_FI_DEV_RETIRED_PENDING", dcgm={(): "DCGM_FI_DEV_RETIRED_PENDING"})
REMAPPED_ROWS = _m("gpu_remapped_rows", "counter", "", "DRAM rows remapped after ECC errors.", "ecc",
                   "NVML_FI_DEV_REMAPPED_COR / NVML_FI_DEV_REMAPPED_UNC", labels=GPU_LABELS + ("error_type",),
                   dcgm={("correctable",): "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                         ("uncorrectable",): "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"})
REMAP_PENDING = _m("gpu_row_remap_pending", "gauge", "", "1 if a row remap waits for a GPU reset.", "ecc",
                   "NVML_FI_DEV_REMAPPED_PENDING", dcgm={(): "DCGM_FI_DEV_ROW_REMAP_PENDING"})
REMAP_FAILURE = _m("gpu_row_remap_failure", "gauge", "", "1 if a row remap failed (the GPU needs service).", "ecc",
                   "NVML_FI_DEV_REMAPPED_FAILURE", dcgm={(): "DCGM_FI_DEV_ROW_REMAP_FAILURE"})
ECC_PENDING = _m("gpu_ecc_pending_enabled", "gauge", "", "1 if ECC will be enabled after the next reboot "
                 "(differs from gpuobs_gpu_ecc_enabled while a change waits).", "ecc",
                 "nvmlDeviceGetEccMode pending", dcgm={(): "DCGM_FI_DEV_ECC_PENDING"}, max_value=1)
ECC_LOCATIONS = ("sram", "dram")  # NVML_MEMORY_LOCATION_SRAM, NVML_MEMORY_LOCATION_DRAM
ECC_LOCATION_ERRORS = _m("gpu_ecc_location_errors", "counter", "", "ECC errors by memory location: on-chip SRAM "
                         "(caches, register files) or DRAM (device memory); refreshed every few passes.", "ecc",
                         "nvmlDeviceGetMemoryErrorCounter(NVML_MEMORY_ERROR_TYPE_{CORRECTED,UNCORRECTED}, "
                         "NVML_{VOLATILE,AGGREGATE}_ECC, NVML_MEMORY_LOCATION_{SRAM,DRAM})",
                         labels=GPU_LABELS + ("location", "error_type", "counter_type"),
                         dcgm={(loc, kind, counter): f"DCGM_FI_DEV_ECC_{bit}_{cnt}_{dcgm_loc}"
                               for loc, dcgm_loc in (("sram", "SRM"), ("dram", "DEV"))
                               for kind, bit in (("corrected", "SBE"), ("uncorrected", "DBE"))
                               for counter, cnt in (("volatile", "VOL"), ("aggregate", "AGG"))})
REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")  # nvmlRowRemapperHistogramValues_t fields
REMAP_BANKS = _m("gpu_row_remap_banks", "gauge", "", "Memory banks by how many spare rows they have left for "
                 "remapping: max, high, partial, low, none (banks with none cannot remap another row).", "ecc",
                 "nvmlDeviceGetRowRemapperHistogram .max/.high/.partial/.low/.none",
                 labels=GPU_LABELS + ("availability",),
                 dcgm={(a,): f"DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_{a.upper()}" for a in REMAP_AVAILABILITY})
# -------------------------------------------------------------------------------------------- PCIe
PCIE_GENERATION = _m("gpu_pcie_link_generation", "gauge", "", "PCIe link generation in use now.", "pcie",
                     "nvmlDeviceGetCurrPcieLinkGeneration", dcgm={(): "DCGM_FI_DEV_PCIE_LINK_GEN"})
PCIE_MAX_GENERATION = _m("gpu_pcie_link_generation_max", "gauge", "", "Highest PCIe generation the link supports.",
                         "pcie", "nvmlDeviceGetMaxPcieLinkGeneration", dcgm={(): "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"})
PCIE_WIDTH = _m("gpu_pcie_link_width", "gauge", "", "PCIe lanes in use now.", "pcie",
                "nvmlDeviceGetCurrPcieLinkWidth", dcgm={(): "DCGM_FI_DEV_PCIE_LINK_WIDTH"})
PCIE_MAX_WIDTH = _m("gpu_pcie_link_width_max", "gauge", "", "Most PCIe lanes the link supports.", "pcie",
                    "nvmlDeviceGetMaxPcieLinkWidth", dcgm={(): "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"})
PCIE_TX = _m("gpu_pcie_transmit_bytes", "counter", "bytes", "Bytes the GPU sent over PCIe.", "pcie",
             "NVML_FI_DEV_PCIE_COUNT_TX_BYTES")
PCIE_RX = _m("gpu_pcie_receive_bytes", "counter", "bytes", "Bytes the GPU received over PCIe.", "pcie",
             "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
PCIE_THROUGHPUT = _m("gpu_pcie_throughput_bytes_per_second", "gauge", "bytes_per_second",
                     "PCIe bytes per second between the last two passes, by direction (transmit, receive).",
                     "pcie", "NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES: increase between passes / time between them",
                     labels=GPU_LABELS + ("direction",),
                     dcgm={("transmit",): "DCGM_FI_PROF_PCIE_TX_BYTES", ("receive",): "DCGM_FI_PROF_PCIE_RX_BYTES"})
PCIE_REPLAYS = _m("gpu_pcie_replays", "counter", "", "PCIe replays (link-level retransmissions).", "pcie",
                  "NVML_FI_DEV_PCIE_REPLAY_COUNTER", dcgm={(): "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"})
# ------------------------------------------------------------------------------------------ NVLink
NVLINK_UP = _m("gpu_nvlink_link_up", "gauge", "", "1 if the NVLink link is active.", "nvlink",
               "NVML_FI_DEV_NVLINK_GET_STATE, scope = link", labels=GPU_LABELS + ("link",))
NVLINK_TX = _m("gpu_nvlink_transmit_bytes", "counter", "bytes", "Data bytes sent on the link.", "nvlink",
               "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB) * 1024, scope = link", labels=GPU_LABELS + ("link",))
NVLINK_RX = _m("gpu_nvlink_receive_bytes", "counter", "bytes", "Data bytes received on the link.", "nvlink",
               "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (KiB) * 1024, scope = link", labels=GPU_LABELS + ("link",))
NVLINK_ERRORS = _m("gpu_nvlink_errors", "counter", "", "NVLink data-link errors per link.", "nvlink",
                   "NVML_FI_DEV_NVLINK_ERROR_DL_{CRC,REPLAY,RECOVERY}, scope = link",
                   labels=GPU_LABELS + ("link", "error_type"))
# The same, summed over the GPU's links: what the alerts and records read (one series per GPU where
# the per-link ones are 18 x 6 on an H100 SXM; those are detail, --detail nvlink)
NVLINKS_DOWN = _m("gpu_nvlinks_down", "gauge", "", "NVLink links of the GPU that are not active (of those it "
                  "reports, NVML_FI_DEV_NVLINK_LINK_COUNT); 0 when every link is up.", "nvlink",
                  "NVML_FI_DEV_NVLINK_GET_STATE per link, counted where not NVML_FEATURE_ENABLED", max_value=64)
NVLINKS_TX = _m("gpu_nvlinks_transmit_bytes", "counter", "bytes", "Data bytes sent over all the GPU's NVLink links.",
                "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB) * 1024 summed over links")
NVLINKS_RX = _m("gpu_nvlinks_receive_bytes", "counter", "bytes", "Data bytes received over all the GPU's NVLink "
                "links.", "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (KiB) * 1024 summed over links")
NVLINKS_ERRORS = _m("gpu_nvlinks_errors", "counter", "", "NVLink data-link errors (CRC, replay and recovery) over "
                    "all the GPU's links.", "nvlink",
                    "NVML_FI_DEV_NVLINK_ERROR_DL_{CRC,REPLAY,RECOVERY} summed over links")
NVLINK_THROUGHPUT = _m("gpu_nvlink_throughput_bytes_per_second", "gauge", "bytes_per_second",
                       "NVLink data bytes sent plus received per second over all links, between the last two "
                       "passes.", "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX} (KiB) * 1024 summed over "
                       "links: increase between passes / time between them",
                       dcgm={(): "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}, dcgm_scale=1e-6)
# ------------------------------------------------------------------------------------------ fabric
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")  # nvmlGpuFabricState_t order
FABRIC_STATE = _m("gpu_fabric_state", "gauge", "", "1 for the NVSwitch fabric registration state the GPU is in "
                  "(not_supported, not_started, in_progress, completed), 0 for the others.", "fabric",
                  "nvmlDeviceGetGpuFabricInfoV (else nvmlDeviceGetGpuFabricInfo) .state",
                  labels=GPU_LABELS + ("state",), max_value=1)
FABRIC_STATUS = _m("gpu_fabric_status", "gauge", "", "NVML return code of the fabric registration (0: success); "
                   "set once the state is completed.", "fabric",
                   "nvmlDeviceGetGpuFabricInfoV (else nvmlDeviceGetGpuFabricInfo) .status",
                   dcgm={(): "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"})
FABRIC_CLIQUE = _m("gpu_fabric_clique_id", "gauge", "", "Fabric clique the GPU belongs to (GPUs of one clique "
                   "reach each other over NVLink); set once the state is completed.", "fabric",
                   "nvmlDeviceGetGpuFabricInfoV (else nvmlDeviceGetGpuFabricInfo) .cliqueId",
                   dcgm={(): "DCGM_FI_DEV_FABRIC_CLIQUE_ID"})
FABRIC_HEALTH = _m("gpu_fabric_health_mask", "gauge", "", "Fabric health bitmask (NVML_GPU_FABRIC_HEALTH_MASK_*: "
                   "degraded bandwidth, route recovery, route unhealthy, access timeout recovery, incorrect "
                   "configuration, ...); absent where the driver does not report it.", "fabric",
                   "nvmlDeviceGetGpuFabricInfoV .healthMask (nvmlGpuFabricInfo_v2)",
                   dcgm={(): "DCGM_FI_DEV_FABRIC_HEALTH_MASK"})
# ---------------------------------------------------------------------------------------- topology
# One series per ordered pair of GPUs on a node: n * (n - 1), 56 on an 8-GPU node, read at probe.
# link_type: the closest path between the two (nvlink: NVLink links straight to the peer, an NVLink
# bridge or mesh; nvswitch: through NVSwitches; else the PCIe path); pcie_path: the PCIe common
# ancestor (nvmlGpuTopologyLevel_t) whatever the NVLink path, as `nvidia-smi topo -m` names them.
TOPOLOGY_PCIE_PATHS = {0: "internal", 10: "pcie_switch", 20: "pcie_switches", 30: "host_bridge", 40: "numa_node",
                       50: "system"}  # NVML_TOPOLOGY_INTERNAL/SINGLE/MULTIPLE/HOSTBRIDGE/NODE/SYSTEM
TOPOLOGY_NVLINK = _m("gpu_topology_nvlink_links", "gauge", "", "NVLink links between this GPU and the peer GPU "
                     "(through NVSwitches: all of this GPU's active switch links, as nvidia-smi topo -m prints "
                     "NV18); 0 when the pair has no NVLink path. link_type is the closest path (nvlink, "
                     "nvswitch, or the PCIe path), pcie_path the PCIe common ancestor: internal, pcie_switch "
                     "(PIX), pcie_switches (PXB), host_bridge (PHB), numa_node (NODE: same socket), system "
                     "(SYS: across sockets).", "topology",
                     "nvmlDeviceGetP2PStatus(NVML_P2P_CAPS_INDEX_NVLINK), nvmlDeviceGetNvLinkState/"
                     "RemoteDeviceType/RemotePciInfo_v2 per link, nvmlDeviceGetTopologyCommonAncestor",
                     labels=GPU_LABELS + ("peer_gpu", "peer_uuid", "link_type", "pcie_path"), max_value=64)
NUMA_NODE = _m("gpu_numa_node", "gauge", "", "NUMA node the GPU is attached to (its CPU socket on most "
               "servers); absent where the system has no NUMA information.", "topology", "nvmlDeviceGetNumaNodeId")
NVLINK_DOMAIN = _m("gpu_topology_nvlink_domain", "gauge", "", "Lowest NVML index among this GPU and the GPUs of "
                   "the node it reaches over NVLink (straight or through NVSwitches): GPUs with the same value "
                   "share NVLink (on NVSwitch systems every GPU, with NVLink bridges each bridged set); a GPU "
                   "without NVLink peers has its own index.", "topology",
                   "the pairs of gpuobs_gpu_topology_nvlink_links with links > 0", max_value=1024)
CPU_AFFINITY = _m("gpu_cpu_affinity", "info", "", "The CPUs closest to the GPU (ideal CPU affinity), as a "
                  "CPU list such as 0-55,112-167 in the cpus label.", "topology",
                  "nvmlDeviceGetCpuAffinity (a bitmask of 64-bit words)", labels=GPU_LABELS + ("cpus",))
# --------------------------------------------------------------------------------------------- MIG
MIG_MODE = _m("gpu_mig_enabled", "gauge", "", "1 if MIG mode is enabled now.", "mig", "nvmlDeviceGetMigMode current")
MIG_INFO = _m("mig", "info", "", "One MIG device (GPU instance and compute instance) of a GPU.", "mig",
              "nvmlDeviceGetMigDeviceHandleByIndex, GetGpuInstanceId, GetComputeInstanceId, GetName, GetUUID",
              labels=MIG_LABELS + ("mig_uuid", "profile"))
MIG_MEMORY_TOTAL = _m("mig_memory_total_bytes", "gauge", "bytes", "Memory of the MIG device.", "mig",
                      "nvmlDeviceGetMemoryInfo_v2(MIG handle) .total", labels=MIG_LABELS,
                      dcgm={(): "DCGM_FI_DEV_FB_TOTAL"}, dcgm_scale=MIB)
MIG_MEMORY_USED = _m("mig_memory_used_bytes", "gauge", "bytes", "Memory used on the MIG device.", "mig",
                     "nvmlDeviceGetMemoryInfo_v2(MIG handle) .used", labels=MIG_LABELS,
                     dcgm={(): "DCGM_FI_DEV_FB_USED"}, dcgm_scale=MIB)
MIG_PENDING = _m("gpu_mig_pending_enabled", "gauge", "", "1 if MIG mode will be enabled after the next GPU reset "
                 "(differs from gpuobs_gpu_mig_enabled while a change waits).", "mig", "nvmlDeviceGetMigMode pending",
                 max_value=1)
MIG_BAR1_TOTAL = _m("mig_bar1_total_bytes", "gauge", "bytes", "BAR1 aperture of the MIG device.", "mig",
                    "nvmlDeviceGetBAR1MemoryInfo(MIG handle) .bar1Total", labels=MIG_LABELS)
MIG_BAR1_USED = _m("mig_bar1_used_bytes", "gauge", "bytes", "BAR1 aperture in use on the MIG device.", "mig",
                   "nvmlDeviceGetBAR1MemoryInfo(MIG handle) .bar1Used", labels=MIG_LABELS)
MIG_SMS = _m("mig_multiprocessors", "gauge", "", "Streaming multiprocessors (SMs) of the MIG device.", "mig",
             "nvmlDeviceGetAttributes_v2(MIG handle) .multiprocessorCount", labels=MIG_LABELS)
# --------------------------------------------------------------------------------------- processes
PROCESS_MEMORY = _m("gpu_process_memory_used_bytes", "gauge", "bytes", "Device memory used by one process "
                    "(in MIG mode, on one MIG device: gpu_instance_id/compute_instance_id set); process_type: "
                    "compute, graphics or compute_graphics (nvidia-smi's C, G, C+G).",
                    "processes", "nvmlDeviceGetComputeRunningProcesses_v3/GetGraphicsRunningProcesses_v3 .usedGpuMemory "
                    "(else _v2), per MIG device handle in MIG mode; the list a pid is in gives its type",
                    labels=GPU_LABELS + ("pid", "process_name", "gpu_instance_id", "compute_instance_id",
                                         "process_type"))
PROCESS_SM = _m("gpu_process_sm_utilization_ratio", "gauge", "ratio", "SM utilization of one process.",
                "processes", "nvmlDeviceGetProcessUtilization .smUtil (percent) / 100",
                labels=GPU_LABELS + ("pid",), max_value=1.0)
# --------------------------------------------------------------------------------------------- XID
# gpu_instance_id/compute_instance_id: the MIG instance the event names (empty when it names none);
# mig_uuid: its MIG device's UUID, by which attribution finds the pod holding it. After the xid
# label, so that the series keep the GPU identity (not a MIG device's).
XID_LABELS = GPU_LABELS + ("xid", "gpu_instance_id", "compute_instance_id", "mig_uuid")
XID_ERRORS = _m("gpu_xid_errors", "counter", "", "XID errors reported by the driver, per XID code (and MIG instance). "
                "mig_uuid: the UUID of the MIG device the event names (pods on it get its attribution labels); "
                "for an event naming only a GPU instance, the UUIDs of its compute instances' devices joined "
                "with commas (one series: each event counted once); empty when it names none, or with the mig "
                "family off.",
                "xid", "nvmlEventSetWait_v2 (else nvmlEventSetWait) nvmlEventTypeXidCriticalError .eventData, "
                ".gpuInstanceId, .computeInstanceId; mig_uuid from the mig family's last listing "
                "(nvmlDeviceGetMigDeviceHandleByIndex, GetUUID)", labels=XID_LABELS)
XID_LAST_SEEN = _m("gpu_xid_last_seen_timestamp_seconds", "gauge", "seconds",
                   "Unix time the XID code was last reported.", "xid", "time of the nvmlEventSetWait_v2 event",
                   labels=XID_LABELS)
# -------------------------------------------------------------------------------------- kernel log
# A second XID source beside the NVML events: the driver's own "NVRM: Xid" lines in the kernel log,
# counted since boot (the watcher keeps its read position across exporter restarts), so XIDs from
# while the exporter was down, or missed by the event thread, are seen. pci_bus_id is NVML's form
# (00000000:18:00.0); gpu/uuid are those of the GPU the exporter saw at that address (also after it
# fell off the bus), empty for an address no GPU seen since the exporter started has.
KERNEL_LABELS = GPU_LABELS + ("pci_bus_id",)
KERNEL_XID_ERRORS = _m("gpu_kernel_xid_errors", "counter", "", "XID errors the NVIDIA driver wrote to the kernel "
                       "log since boot, per GPU and XID code (a second source beside gpuobs_gpu_xid_errors_total).",
                       "kernel_log", "/dev/kmsg (or journalctl -k) lines 'NVRM: Xid (PCI:<address>): <code>'; the "
                       "address matched to a GPU by nvmlDeviceGetPciInfo_v3 .busId", labels=KERNEL_LABELS + ("xid",))
KERNEL_LOG_MATCHES = _m("gpu_kernel_log_matches", "counter", "", "NVIDIA driver messages in the kernel log since boot "
                        "that matched a pattern of the log-pattern catalog (gpuobs.logpatterns: nvrm_xid, ecc_error, "
                        "nvlink_error, ...), per GPU where the line names one.", "kernel_log",
                        "/dev/kmsg (or journalctl -k) lines matched by gpuobs.logpatterns.match",
                        labels=KERNEL_LABELS + ("pattern",))
# ------------------------------------------------------------------------------------ self-health
NVML_UP = _m("nvml_up", "gauge", "", "1 if NVML is initialised and answering.", "exporter", "nvmlInit_v2",
             labels=())
NVML_INIT_ERROR = _m("nvml_init_error", "gauge", "", "1 with the NVML error that keeps NVML down (its NVML code "
                     "name; 'initializing' while the first nvmlInit and sampling pass have not completed).", "exporter",
                     "nvmlInit_v2 error", labels=("reason",))
BUILD_INFO = _m("exporter_build", "info", "", "The exporter's own version and the Python that runs it; served from "
                "the first request on, before NVML answers.", "exporter", "gpuobs.__version__, platform",
                labels=("version", "python_version"))
NVML_INFO = _m("nvml", "info", "", "Driver and NVML versions.", "exporter",
               "nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion",
               labels=("driver_version", "nvml_version", "cuda_version"))
GPUS_EXPECTED = _m("gpus_expected", "gauge", "", "GPUs this node should have (--expected-gpus, else the most seen).",
                   "exporter", "configuration / nvmlDeviceGetCount_v2 high-water mark", labels=())
GPUS_PRESENT = _m("gpus_present", "gauge", "", "GPUs the driver counts (each has a gpuobs_gpu_up series, 1 or 0).",
                  "exporter", "nvmlDeviceGetCount_v2", labels=())
COLLECTION_DURATION = _m("exporter_collection_duration_seconds", "gauge", "seconds",
                         "Wall time of the last complete sampling pass.", "exporter", "sampler clock", labels=())
LAST_SUCCESS = _m("exporter_last_success_timestamp_seconds", "gauge", "seconds",
                  "Unix time the last complete sampling pass started: its values were read after it.", "exporter",
                  "sampler clock", labels=())
SNAPSHOT_STALE = _m("exporter_snapshot_stale", "gauge", "",
                    "1 when the last snapshot is older than two intervals; GPU series are then withheld.",
                    "exporter", "sampler clock", labels=())
NVML_ERRORS = _m("exporter_nvml_errors", "counter", "", "NVML calls that returned an error, by call and code.",
                 "exporter", "NVMLError.value of each failed call", labels=("call", "code"))
NVML_CALLS = _m("exporter_nvml_calls_per_sample", "gauge", "", "NVML calls made in the last sampling pass.",
                "exporter", "call accounting in gpuobs.nvml", labels=())
DROPPED = _m("exporter_dropped_values", "counter", "", "Values dropped as impossible (sentinels, out of range).",
             "exporter", "validation in gpuobs.collect", labels=("metric", "reason"))
NVML_REINITS = _m("exporter_nvml_reinits", "counter", "", "NVML re-initialisations after repeated driver-level errors.",
                  "exporter", "nvmlShutdown + nvmlInit_v2", labels=())
SAMPLES = _m("exporter_samples", "counter", "", "Sampling passes completed.", "exporter", "sampler", labels=())
GPU_TIMEOUTS = _m("exporter_gpu_timeouts", "counter", "", "Sampling passes in which a GPU's NVML reads missed "
                  "the pass deadline (its series were withheld from that pass).", "exporter", "sampler deadline")
COLLECTOR_SUCCESS = _m("exporter_collector_success", "gauge", "", "1 if the collector ran without raising in the "
                       "last pass (on every GPU), else 0; as node_exporter's scrape_collector_success.", "exporter",
                       "exceptions raised by gpuobs.collect families and the sampler", labels=("collector",))
COLLECTOR_ERRORS = _m("exporter_collector_errors", "counter", "", "Exceptions raised by a collector (per GPU and "
                      "pass) or by the sampler itself; each is logged, rate-limited.", "exporter",
                      "exceptions raised by gpuobs.collect families and the sampler", labels=("collector",))
NVML_UNAVAILABLE = _m("exporter_nvml_unavailable_calls", "gauge", "", "GPUs (0 for a node-wide call: 1) on which an "
                      "NVML call gives no value by design: not_supported, no_permission, or function_not_found / "
                      "argument_version_mismatch (an older driver; a fallback call is used where one exists). "
                      "Re-probed every few minutes and after MIG mode changes.", "exporter",
                      "NVML return codes remembered by gpuobs.nvml", labels=("call", "reason"))
XID_WATCHER_UP = _m("exporter_xid_watcher_up", "gauge", "", "1 if the XID event thread runs and waits on its "
                    "event set; 0 while it cannot (XIDs may be missed then).", "exporter",
                    "nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2", labels=())
XID_WATCHER_ERRORS = _m("exporter_xid_watcher_errors", "counter", "", "Errors of the XID event thread, by NVML code "
                        "(restarted: the thread died and was started again).", "exporter",
                        "nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2", labels=("code",))
KERNEL_LOG_UP = _m("exporter_kernel_log_up", "gauge", "", "1 if the kernel-log watcher reads its source; 0 while "
                   "it cannot (missing, not permitted, failed): kernel-log XIDs and driver messages are not counted "
                   "then. Absent with the kernel_log family off.", "exporter",
                   "open/read of /dev/kmsg, a kernel-log file, or journalctl -k", labels=("source",))
KERNEL_LOG_LOST = _m("exporter_kernel_log_records_lost", "counter", "", "Kernel-log records the kernel overwrote in "
                     "its ring buffer before the watcher read them (their XIDs and messages are not counted).",
                     "exporter", "EPIPE from read(2) on /dev/kmsg; sequence-number gaps", labels=())
KERNEL_LOG_OVERFLOW = _m("exporter_kernel_log_label_overflow", "counter", "", "Kernel-log records matched but not "
                         "counted in gpuobs_gpu_kernel_xid_errors_total or gpuobs_gpu_kernel_log_matches_total because "
                         "their (PCI address, code) label set would pass the cap (256 per counter and node, 64 of "
                         "them for addresses no GPU of the node has), or their XID code is not one (over 4 digits): "
                         "forged lines, or a node logging for far more devices than it has.", "exporter",
                         "the kernel-log watcher's label-set cap (gpuobs.collect.kernel_log.MAX_LABEL_SETS)", labels=())
KERNEL_LOG_TRUNCATED = _m("exporter_kernel_log_truncations", "counter", "", "Times the kernel-log file was found "
                          "truncated (shorter than the position read to, or its bytes before that position changed: "
                          "truncated and written again): it is read again from its start, and records written "
                          "between the last read and the truncation may be lost (possibly lost records).", "exporter",
                          "fstat(2) size and pread(2) of the last bytes read of a regular --kernel-log file",
                          labels=())
SCRAPES = _m("exporter_scrapes", "counter", "", "Metrics responses served, by exposition format (text: 0.0.4; "
             "openmetrics: 1.0.0, what Prometheus asks for) and content encoding (gzip when the scraper accepts "
             "it, else identity).", "exporter", "Accept and Accept-Encoding of each request",
             labels=("format", "encoding"))
HTTP_REFUSED = _m("exporter_http_connections_refused", "counter", "", "HTTP connections closed without an "
                  "answer, by reason: limit (every connection slot taken), client_limit (the client's address "
                  "holds its share of them), deadline (request headers, TLS handshake or response not done in "
                  "time; no byte restarts it), open_files (accept() failed for want of file descriptors; the "
                  "server backed off 1 s). Rising: a client holds connections open (e.g. slowloris).", "exporter",
                  "the exporter's HTTP server (connection caps and deadlines, accept errors)", labels=("reason",))
ATTRIBUTION_UP = _m("exporter_attribution_up", "gauge", "",
                    "1 if the attribution source answered at its last refresh; only with attribution on.", "exporter",
                    "kubelet PodResources List() (podresources); the job-mapping directory is there (slurm)",
                    labels=("source",))

# ------------------------------------------------------------- training and inference (OpenTelemetry)
# Recorded by gpuobs.instrument through the OTel SDK; `name` is what OTel's Prometheus conversion
# makes of `otel_name` and `otel_unit` (dots to underscores, "s" to _seconds, _total on counters;
# unit "1" adds nothing, so ratios carry _ratio in the instrument name).
RUN_LABELS = ("rank", "job_id")  # not "job": Prometheus's target label


def _otel(otel_name: str, kind: Kind, otel_unit: str, prom_name: str, help: str, family: str,
          labels: tuple[str, ...] = RUN_LABELS, unit: str = "") -> Metric:
    return Metric(prom_name, kind, unit, help, family, f"OpenTelemetry instrument {otel_name}", labels=labels,
                  otel_name=otel_name, otel_unit=otel_unit, max_value=1.0 if unit == "ratio" else None)


STEP_DURATION = _otel("gpuobs.training.step.duration", "histogram", "s", "gpuobs_training_step_duration_seconds",
                      "Duration of one optimizer step, data wait included (CUDA events when on a GPU).",
                      "training", unit="seconds")
STEPS = _otel("gpuobs.training.steps", "counter", "{step}", "gpuobs_training_steps",
              "Optimizer steps completed.", "training")
MICRO_STEPS = _otel("gpuobs.training.micro_steps", "counter", "{step}", "gpuobs_training_micro_steps",
                    "Micro-steps (gradient-accumulation passes) completed.", "training")
LAST_STEP = _otel("gpuobs.training.step.last_timestamp", "gauge", "s",
                  "gpuobs_training_step_last_timestamp_seconds",
                  "Unix time the last step finished (training stalls when it stops moving).", "training",
                  unit="seconds")
DATA_WAIT = _otel("gpuobs.training.data_wait.duration", "histogram", "s",
                  "gpuobs_training_data_wait_duration_seconds",
                  "Time a step waited for its batch inside the data loader's __next__.", "training", unit="seconds")
CHECKPOINT_DURATION = _otel("gpuobs.training.checkpoint.duration", "histogram", "s",
                            "gpuobs_training_checkpoint_duration_seconds", "Duration of a checkpoint save.",
                            "training", unit="seconds")
SAMPLES_TRAINED = _otel("gpuobs.training.samples", "counter", "{sample}", "gpuobs_training_samples",
                        "Samples trained on (rate() gives samples/s).", "training")
TOKENS_TRAINED = _otel("gpuobs.training.tokens", "counter", "{token}", "gpuobs_training_tokens",
                       "Tokens trained on (rate() gives tokens/s).", "training")
LOSS = _otel("gpuobs.training.loss", "gauge", "", "gpuobs_training_loss", "Last reported training loss.", "training")
GRAD_NORM = _otel("gpuobs.training.grad_norm", "gauge", "", "gpuobs_training_grad_norm",
                  "Last reported gradient norm.", "training")
LEARNING_RATE = _otel("gpuobs.training.learning_rate", "gauge", "", "gpuobs_training_learning_rate",
                      "Learning rate, read at the reporting interval.", "training")
NONFINITE = _otel("gpuobs.training.nonfinite_reports", "counter", "{report}", "gpuobs_training_nonfinite_reports",
                  "Reported loss, grad norm or learning rate that was NaN or infinite (a diverging run).",
                  "training", labels=RUN_LABELS + ("value",))
FLOPS = _otel("gpuobs.training.flops", "counter", "{flop}", "gpuobs_training_flops",
              "Model FLOPs of the steps completed (flops_per_step per step); rate() over peak FLOP/s is MFU.",
              "training")
PEAK_FLOPS = _otel("gpuobs.training.peak_flops", "gauge", "{flop}/s", "gpuobs_training_peak_flops_per_second",
                   "Peak FLOP/s of the hardware one rank runs on (given, or looked up for the GPU and dtype).",
                   "training")
COMPUTE = _otel("gpuobs.training.compute", "counter", "s", "gpuobs_training_compute_seconds",
                "Time inside steps spent computing: step time less data wait, time blocked in collectives "
                "and checkpoints. Per step, the straggler signal.", "training", unit="seconds")
COLLECTIVE_WAIT = _otel("gpuobs.training.collective_wait", "counter", "s", "gpuobs_training_collective_wait_seconds",
                        "Time inside steps blocked in collective communication (DDP gradient all-reduce tail, "
                        "run.collective() blocks): the fast ranks of a synchronous job wait for the slow one.",
                        "training", unit="seconds")
GOODPUT = _otel("gpuobs.training.goodput", "counter", "s", "gpuobs_training_goodput_seconds",
                "Time spent in steps, data wait and checkpoints excluded (collective waits included: the job "
                "as a whole is progressing).", "training", unit="seconds")
BADPUT = _otel("gpuobs.training.badput", "counter", "s", "gpuobs_training_badput_seconds",
               "Time not spent computing steps, by cause: data_wait, checkpoint, startup, idle.", "training",
               labels=RUN_LABELS + ("cause",), unit="seconds")
LOG_PATTERN_MATCHES = _otel("gpuobs.log.pattern_matches", "counter", "{record}", "gpuobs_log_pattern_matches",
                           "Log records of this process that matched a pattern of the log-pattern catalog "
                           "(gpuobs.logpatterns: NCCL timeout or error, CUDA OOM, illegal address, Xid, ECC, "
                           "NVLink), by pattern; every pattern is exported from 0.", "training",
                           labels=RUN_LABELS + ("pattern",))
# duration histogram -> its in-process windowed quantiles (what rules and alerts read)
QUANTILES: dict[Metric, Metric] = {}


def _quantile(duration: Metric, otel_name: str, what: str) -> Metric:
    """The exact quantiles of a duration histogram's recent observations (gpuobs.instrument.quantiles),
    a gauge with a `quantile` label, registered in QUANTILES."""
    labels = tuple(label for label in duration.labels if label != "error_type") + ("quantile",)
    metric = _otel(otel_name, "gauge", "s", otel_name.replace(".", "_") + "_seconds",
                   f"Exact quantiles (0.5, 0.9, 0.99) of {what} in the last quantile window (default 5 min, at "
                   "most 4096 observations), computed in the process.", duration.family, labels=labels,
                   unit="seconds")
    QUANTILES[duration] = metric
    return metric


STEP_QUANTILE = _quantile(STEP_DURATION, "gpuobs.training.step.duration.quantile", "the step durations")
DATA_WAIT_QUANTILE = _quantile(DATA_WAIT, "gpuobs.training.data_wait.duration.quantile", "the data waits")
CHECKPOINT_QUANTILE = _quantile(CHECKPOINT_DURATION, "gpuobs.training.checkpoint.duration.quantile",
                                "the checkpoint saves")
GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_request_model", "rank", "job_id")
REQUEST_DURATION = _otel("gen_ai.server.request.duration", "histogram", "s", "gen_ai_server_request_duration_seconds",
                         "Duration of one inference request (GenAI semantic conventions).", "inference",
                         labels=GENAI_LABELS + ("error_type",), unit="seconds")
TIME_TO_FIRST_TOKEN = _otel("gen_ai.server.time_to_first_token", "histogram", "s",
                            "gen_ai_server_time_to_first_token_seconds",
                            "Time from the request's start to its first output token.", "inference",
                            labels=GENAI_LABELS, unit="seconds")
INFERENCE_TOKENS = _otel("gpuobs.inference.tokens", "counter", "{token}", "gpuobs_inference_tokens",
                         "Tokens processed, by gen_ai.token.type (input or output).", "inference",
                         labels=GENAI_LABELS + ("gen_ai_token_type",))
BATCH_SIZE = _otel("gpuobs.inference.batch_size", "histogram", "{request}", "gpuobs_inference_batch_size",
                   "Requests batched together per inference call.", "inference", labels=GENAI_LABELS)
INFERENCE_ERRORS = _otel("gpuobs.inference.errors", "counter", "{request}", "gpuobs_inference_errors",
                         "Requests that failed, by error.type.", "inference", labels=GENAI_LABELS + ("error_type",))

TIME_PER_OUTPUT_TOKEN = _otel("gen_ai.server.time_per_output_token", "histogram", "s",
                              "gen_ai_server_time_per_output_token_seconds",
                              "Time per output token after the first: (duration - time to first token) / "
                              "(output tokens - 1).", "inference", labels=GENAI_LABELS, unit="seconds")
ACTIVE_REQUESTS = _otel("gpuobs.inference.active_requests", "gauge", "{request}",
                        "gpuobs_inference_active_requests", "Requests in flight (an OTel UpDownCounter).", "inference",
                        labels=GENAI_LABELS)
REQUEST_QUANTILE = _quantile(REQUEST_DURATION, "gpuobs.inference.request.duration.quantile",
                             "the request durations")
TTFT_QUANTILE = _quantile(TIME_TO_FIRST_TOKEN, "gpuobs.inference.time_to_first_token.quantile",
                          "the times to first token")
TPOT_QUANTILE = _quantile(TIME_PER_OUTPUT_TOKEN, "gpuobs.inference.time_per_output_token.quantile",
                          "the times per output token")
# Self-health of the instrumentation, on the same endpoint and OTLP stream as what it records.
SPANS_DROPPED = _otel("gpuobs.telemetry.spans_dropped", "counter", "{span}", "gpuobs_telemetry_spans_dropped",
                      "Spans dropped because the export queue was full (the trace endpoint was slow or down).",
                      "telemetry", labels=())
LOGS_DROPPED = _otel("gpuobs.telemetry.log_records_dropped", "counter", "{record}",
                     "gpuobs_telemetry_log_records_dropped",
                     "Log records the Fluentd handlers of this process dropped (full queue, send failures).",
                     "telemetry", labels=())
LOG_LINES_TRUNCATED = _otel("gpuobs.telemetry.log_lines_truncated", "counter", "{line}",
                            "gpuobs_telemetry_log_lines_truncated",
                            "Log lines of this process (log record messages; the exporter's kernel-log records) "
                            "longer than the log-pattern catalog's cap (gpuobs.logpatterns.MAX_LINE_CHARS): only "
                            "their start was matched.", "telemetry", labels=())
ALL: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric)) + \
    tuple(GPM_METRICS.values()) + tuple(MIG_GPM_METRICS.values())
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}
# ------------------------------------------------------------------------------------------ tiers
# What the default profile leaves out (docs/cardinality.md): every series an alert, a recording rule
# or a default panel reads is served; the rest is detail, served with --profile full or per family
# with --detail FAMILY. A per-GPU total stands in for per-link NVLink series, the NVLink domain for
# the GPU pairs. The budget (tests/test_cardinality.py): at most 40 series per H100 SXM GPU.
DETAIL: frozenset[Metric] = frozenset({
    PERSISTENCE_MODE, COMPUTE_MODE,
    MEMORY_UTILIZATION, ENCODER_UTILIZATION, DECODER_UTILIZATION, ENCODER_SESSIONS, ENCODER_FPS, ENCODER_LATENCY,
    FBC_SESSIONS, FBC_FPS, FBC_LATENCY,
    MEMORY_RESERVED, MEMORY_FREE, BAR1_TOTAL, BAR1_USED,
    POWER_DEFAULT_LIMIT, POWER_MIN_LIMIT, POWER_MAX_LIMIT, POWER_AVERAGE, MEMORY_POWER, POWER_REQUESTED_LIMIT,
    SHUTDOWN_TEMPERATURE, MAX_OPERATING_TEMPERATURE, TEMPERATURE_MARGIN, FAN_SPEED,
    MAX_CLOCK, PSTATE, CLOCK_EVENT_REASONS_MASK, CLOCK_EVENT_DURATION,
    ECC_MODE, ECC_PENDING, ECC_LOCATION_ERRORS, REMAPPED_ROWS,
    PCIE_THROUGHPUT,
    NVLINK_UP, NVLINK_TX, NVLINK_RX, NVLINK_ERRORS, NVLINK_THROUGHPUT,
    FABRIC_STATE, FABRIC_STATUS, FABRIC_CLIQUE, FABRIC_HEALTH,
    TOPOLOGY_NVLINK, CPU_AFFINITY,
    MIG_PENDING, MIG_BAR1_TOTAL, MIG_BAR1_USED, MIG_SMS,
    *(m for m in GPM_METRICS.values() if m.name not in ("gpuobs_gpu_sm_active_ratio",
                                                        "gpuobs_gpu_tensor_active_ratio")),
    *MIG_GPM_METRICS.values()})
# Metrics of which the default profile serves only some label values: (label, values served)
DEFAULT_VALUES: dict[Metric, tuple[str, frozenset[str]]] = {
    CLOCK: ("clock", frozenset({"sm"})),
    CLOCK_EVENT_ACTIVE: ("reason", frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                                              "hw_thermal_slowdown", "hw_power_brake_slowdown"})),
    ECC_ERRORS: ("counter_type", frozenset({"volatile"})),
    REMAP_BANKS: ("availability", frozenset({"low", "none"})),
}
# The exporter's families (names, default on/off) are registered with their collectors: gpuobs.collect.REGISTRY
APP_FAMILIES = ("training", "inference", "telemetry")  # recorded by gpuobs.instrument, not the exporter
# What the exporter emits: every non-OTel metric, plus its own dropped log records (gpuobs.logs in its process)
# and its truncated log lines (the kernel-log watcher's, through gpuobs.logpatterns.match)
EXPORTED: tuple[Metric, ...] = tuple(m for m in ALL if not m.otel_name) + (LOGS_DROPPED, LOG_LINES_TRUNCATED)
OTEL: tuple[Metric, ...] = tuple(m for m in ALL if m.otel_name)  # opt-in: per-process series are unbounded by nature
