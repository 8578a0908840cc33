"""The clock_events family: what holds the clocks down (throttle reasons), now and in total."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, default_values, detail

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
                                ("sync_boost",): "DCGM_FI_DEV_SYNC_BOOST_VIOLATION"}, dcgm_scale=1e9, dcgm_int=True)
# DCGM's thermal violation is NVML's thermal perf-policy counter (field 75, the nvmlPerfPolicyType_t
# NVML_PERF_POLICY_THERMAL of nvmlDeviceGetViolationStatus), not the SW thermal slowdown clock-event
# counter (field 269): DCGM's dcgm_fields.cpp gives DCGM_FI_DEV_THERMAL_VIOLATION the NVML field
# NVML_FI_DEV_PERF_POLICY_THERMAL; its violation fields are in nanoseconds (dcgm_fields.h).
THERMAL_POLICY_FIELD = 75
THERMAL_POLICY_VIOLATION = _m("gpu_thermal_policy_violation_seconds", "counter", "seconds",
                              "Time the thermal policy held clocks down (NVML's thermal perf-policy violation "
                              "time, DCGM's thermal violation).", "clock_events",
                              "NVML_FI_DEV_PERF_POLICY_THERMAL (nanoseconds) / 1e9",
                              dcgm={(): "DCGM_FI_DEV_THERMAL_VIOLATION"}, dcgm_scale=1e9, dcgm_int=True)

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY); of a default_values metric the default profile serves only those label values
detail(CLOCK_EVENT_REASONS_MASK, CLOCK_EVENT_DURATION, THERMAL_POLICY_VIOLATION)
default_values(CLOCK_EVENT_ACTIVE, "reason", {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                                              "hw_thermal_slowdown", "hw_power_brake_slowdown"})
