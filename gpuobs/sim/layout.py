"""Binary layout of the simulator's shared state, the one definition for both sides.

Python writes a state file with these ctypes structures; the C library maps the same
file and reads it on every call without parsing. `c_header()` renders the structures
as C so the two layouts cannot drift (the header carries static size checks).

Every numeric quantity is a `Val`: its NVML return code (0 = success, e.g. 3 =
NVML_ERROR_NOT_SUPPORTED makes the matching call fail) and how it moves over time.
"""

from __future__ import annotations

import ctypes as C
import re

MAGIC = 0x4F42534E  # "NSBO"
LAYOUT_VERSION = 6

MAX_GPUS = 64
MAX_MIG = 7
MAX_LINKS = 18
MAX_PROCS = 32
MAX_FANS = 4
MAX_FAULTS = 64
MAX_EVENTS = 256
MAX_FUNCS = 256
STR_LEN = 96
CPU_WORDS = 4  # 64-bit words of a GPU's CPU affinity mask: 256 logical CPUs

# Value shapes, evaluated by C at call time (t = CLOCK_REALTIME seconds).
SHAPE_CONST = 0  # base
SHAPE_RAMP = 1  # base + amp * clamp((t - t0) / period, 0, 1)
SHAPE_SINE = 2  # base + amp * sin(2 pi (t - t0) / period)
SHAPE_NOISE = 3  # base + amp * u, u uniform in [-1, 1], new every `period` seconds
SHAPE_COUNTER = 4  # base + amp * (t - t0): a counter growing at `amp` per second
SHAPES = {"const": SHAPE_CONST, "ramp": SHAPE_RAMP, "sine": SHAPE_SINE,
          "noise": SHAPE_NOISE, "counter": SHAPE_COUNTER}

# GPM metric ids (NVML_GPM_METRIC_*) the simulator keeps a value for, in slot order.
GPM_METRICS = {
    1: "graphics_util", 2: "sm_util", 3: "sm_occupancy", 4: "integer_util",
    5: "any_tensor_util", 6: "dfma_tensor_util", 7: "hmma_tensor_util",
    9: "imma_tensor_util", 10: "dram_bw_util", 11: "fp64_util", 12: "fp32_util",
    13: "fp16_util", 20: "pcie_tx_per_sec", 21: "pcie_rx_per_sec",
    60: "nvlink_total_rx_per_sec", 61: "nvlink_total_tx_per_sec",
}
GPM_SLOTS = len(GPM_METRICS)

# nvmlPerfPolicyType_t values kept as violation-time counters (ns).
PERF_POLICIES = 12


class Val(C.Structure):
    """One numeric value: `ret` is the NVML return code of reading it."""
    _fields_ = [("ret", C.c_int32), ("shape", C.c_int32), ("base", C.c_double),
                ("amp", C.c_double), ("period", C.c_double), ("t0", C.c_double)]


class Str(C.Structure):
    """One string value: raw bytes (need not be UTF-8) and its NVML return code."""
    _fields_ = [("ret", C.c_int32), ("s", C.c_char * STR_LEN)]


class Link(C.Structure):
    """One NVLink link. Byte counters are in bytes (NVML reports KiB for throughput fields)."""
    _fields_ = [("state", Val), ("version", Val), ("speed_mbps", Val),
                ("tx_bytes", Val), ("rx_bytes", Val), ("crc_errors", Val),
                ("replay_errors", Val), ("recovery_errors", Val), ("ecc_errors", Val),
                ("remote_bus_id", Str),
                ("remote_type", C.c_int32)]  # nvmlIntNvLinkDeviceType_t: 0 GPU, 2 NVSwitch


class Mig(C.Structure):
    """One MIG device (a compute instance inside a GPU instance)."""
    _fields_ = [("gi_id", C.c_uint32), ("ci_id", C.c_uint32),
                ("gi_profile_id", C.c_uint32), ("ci_profile_id", C.c_uint32),
                ("gi_slices", C.c_uint32), ("ci_slices", C.c_uint32),
                ("sm_count", C.c_uint32), ("ce_count", C.c_uint32),
                ("enc_count", C.c_uint32), ("dec_count", C.c_uint32),
                ("jpg_count", C.c_uint32), ("ofa_count", C.c_uint32),
                ("profile", Str), ("uuid", Str),
                ("mem_total", Val), ("mem_reserved", Val), ("mem_used", Val),
                ("bar1_total", Val), ("bar1_used", Val),
                ("gpm", Val * GPM_SLOTS)]


class Proc(C.Structure):
    """One process using a GPU. `kind` bit 1 = compute, bit 2 = graphics."""
    _fields_ = [("pid", C.c_uint32), ("kind", C.c_uint32), ("gi_id", C.c_uint32),
                ("ci_id", C.c_uint32), ("used_mem", C.c_uint64),
                ("sm_util", C.c_uint32), ("mem_util", C.c_uint32),
                ("name", Str)]


class Gpu(C.Structure):
    """One physical GPU slot. `present` = 0 takes it out of the device count; `lost` and
    `reset_required` make every call with its handle answer GPU_IS_LOST / RESET_REQUIRED."""
    _fields_ = [
        ("present", C.c_int32), ("lost", C.c_int32),
        ("name", Str), ("uuid", Str), ("serial", Str), ("vbios", Str),
        ("board_part", Str), ("bus_id", Str), ("inforom_image", Str),
        ("brand", Val), ("arch", Val), ("minor", Val), ("cc_major", Val), ("cc_minor", Val),
        ("pci_domain", Val), ("pci_bus", Val), ("pci_device", Val),
        ("pci_device_id", Val), ("pci_subsystem_id", Val),
        ("persistence", Val), ("compute_mode", Val), ("num_cores", Val),
        ("mem_total", Val), ("mem_reserved", Val), ("mem_used", Val),
        ("bar1_total", Val), ("bar1_used", Val),
        ("util_gpu", Val), ("util_mem", Val), ("util_enc", Val), ("util_dec", Val),
        ("power_mw", Val), ("power_avg_mw", Val), ("power_limit_mw", Val),
        ("enforced_limit_mw", Val), ("default_limit_mw", Val),
        ("min_limit_mw", Val), ("max_limit_mw", Val), ("energy_mj", Val),
        ("temp_gpu", Val), ("temp_mem", Val), ("temp_margin", Val),
        ("temp_threshold", Val * 8),  # index: nvmlTemperatureThresholds_t
        ("clock", Val * 4),  # index: nvmlClockType_t, MHz
        ("max_clock", Val * 4),
        ("pstate", Val), ("fan_count", Val), ("fan", Val * MAX_FANS),
        ("clock_events", Val), ("clock_events_supported", Val),
        # index: nvmlPerfPolicyType_t; 6 HW thermal, 7 HW power brake, 8 SW thermal slowdown
        ("violation_ns", Val * PERF_POLICIES),
        ("pcie_gen", Val), ("pcie_max_gen", Val), ("pcie_gpu_max_gen", Val),
        ("pcie_width", Val), ("pcie_max_width", Val), ("pcie_replay", Val),
        ("pcie_tx_bytes", Val), ("pcie_rx_bytes", Val),
        ("ecc_current", Val), ("ecc_pending", Val),
        ("ecc", Val * 4),  # [error type (0 corrected, 1 uncorrected) * 2 + counter (0 volatile, 1 aggregate)]
        ("retired_sbe", Val), ("retired_dbe", Val), ("retired_pending", Val),
        ("remap_cor", Val), ("remap_unc", Val), ("remap_pending", Val), ("remap_failure", Val),
        ("gpm_supported", Val), ("gpm", Val * GPM_SLOTS),
        ("mig_current", Val), ("mig_pending", Val),
        ("power_mem_mw", Val),  # GPU memory power, averaged (NVML_FI_DEV_POWER_AVERAGE, scope memory)
        ("enc_sessions", Val), ("enc_fps", Val), ("enc_latency_us", Val),  # nvmlDeviceGetEncoderStats
        ("fbc_sessions", Val), ("fbc_fps", Val), ("fbc_latency_us", Val),  # nvmlDeviceGetFBCStats
        # nvmlDeviceGetMemoryErrorCounter: [location (0 SRAM, 1 DRAM) * 4 + error type * 2 + counter type]
        ("ecc_location", Val * 8),
        ("remap_histogram", Val * 5),  # banks with max, high, partial, low, no spare rows left
        ("fabric_state", Val), ("fabric_status", Val), ("fabric_clique", Val),
        ("fabric_health", Val),  # healthMask of nvmlDeviceGetGpuFabricInfoV; unset: the V call answers NOT_SUPPORTED
        ("link_count", C.c_int32), ("mig_count", C.c_int32), ("proc_count", C.c_int32),
        ("reset_required", C.c_int32),  # 1: every call with its handle answers NVML_ERROR_RESET_REQUIRED
        ("supported_events", C.c_uint64),
        # topology: NUMA node (nvmlDeviceGetNumaNodeId), CPU affinity bitmask (nvmlDeviceGetCpuAffinity; all 0:
        # NOT_SUPPORTED) and, per peer slot, nvmlGpuTopologyLevel_t + 1 (0: not modelled, NOT_SUPPORTED)
        ("numa_node", Val),
        ("cpu_affinity", C.c_uint64 * CPU_WORDS),
        ("topo_level", C.c_int32 * MAX_GPUS),
        ("links", Link * MAX_LINKS),
        ("migs", Mig * MAX_MIG),
        ("procs", Proc * MAX_PROCS),
        ("unsupported", C.c_uint8 * MAX_FUNCS),  # per function id: 1 = NOT_SUPPORTED
    ]


class Fault(C.Structure):
    """An injected fault. func/gpu/field of -1 match any; remaining -1 = for ever.

    delay_ms > 0 sleeps before answering; delay_ms = -1 blocks while the fault is active.
    """
    _fields_ = [("active", C.c_int32), ("func", C.c_int32), ("gpu", C.c_int32),
                ("field", C.c_int32), ("error", C.c_int32), ("remaining", C.c_int32),
                ("delay_ms", C.c_int32), ("pad", C.c_int32)]


class Event(C.Structure):
    """One queued NVML event (e.g. nvmlEventTypeXidCriticalError with data = XID)."""
    _fields_ = [("seq", C.c_uint64), ("gpu", C.c_int32), ("gi_id", C.c_uint32),
                ("ci_id", C.c_uint32), ("pad", C.c_uint32),
                ("type", C.c_uint64), ("data", C.c_uint64)]


class State(C.Structure):
    """The whole state file."""
    _fields_ = [
        ("magic", C.c_uint32), ("version", C.c_uint32), ("size", C.c_uint64),
        ("init_error", C.c_int32), ("init_error_remaining", C.c_int32),
        ("cuda_version", C.c_int32), ("gpu_slots", C.c_int32),
        ("call_latency_us", C.c_int32), ("pad", C.c_int32),  # every call answers after this long (a sleep)
        ("driver_version", Str), ("nvml_version", Str),
        ("faults", Fault * MAX_FAULTS),
        ("event_head", C.c_uint64),
        ("events", Event * MAX_EVENTS),
        ("calls", C.c_uint64 * MAX_FUNCS),
        ("gpus", Gpu * MAX_GPUS),
    ]


_CTYPE_TO_C = {C.c_int32: "int32_t", C.c_uint32: "uint32_t", C.c_uint64: "uint64_t",
               C.c_uint8: "uint8_t", C.c_double: "double", C.c_char: "char"}


def _c_decl(name: str, ctype) -> str:
    dims = ""
    while issubclass(ctype, C.Array):
        dims += f"[{ctype._length_}]"
        ctype = ctype._type_
    base = _CTYPE_TO_C.get(ctype) or f"sim_{ctype.__name__.lower()}_t"
    return f"    {base} {name}{dims};"


def c_header(func_names: list[str], field_ids: dict[str, int] | None = None) -> str:
    """C declarations of every structure above, plus the function-id enum and name table, and a
    #define for each NVML field id the C source names (field_ids: name -> id, see field_ids())."""
    out = ["/* Generated by gpuobs.sim.layout; do not edit. */", "#pragma once",
           "#include <stdint.h>", "#include <stddef.h>",
           f"#define SIM_MAGIC 0x{MAGIC:08X}u", f"#define SIM_LAYOUT_VERSION {LAYOUT_VERSION}"]
    out.extend(f"#define {name} {value}u" for name, value in sorted((field_ids or {}).items()))
    for const in ("MAX_GPUS", "MAX_MIG", "MAX_LINKS", "MAX_PROCS", "MAX_FANS", "MAX_FAULTS",
                  "MAX_EVENTS", "MAX_FUNCS", "STR_LEN", "GPM_SLOTS", "PERF_POLICIES", "CPU_WORDS"):
        out.append(f"#define SIM_{const} {globals()[const]}")
    for name, value in SHAPES.items():
        out.append(f"#define SIM_SHAPE_{name.upper()} {value}")
    out.append("static const unsigned SIM_GPM_IDS[SIM_GPM_SLOTS] = {%s};"
               % ", ".join(str(k) for k in GPM_METRICS))
    for struct in (Val, Str, Link, Mig, Proc, Gpu, Fault, Event, State):
        out.append("typedef struct {")
        out.extend(_c_decl(f[0], f[1]) for f in struct._fields_)  # (name, type): no bit fields here
        out.append(f"}} sim_{struct.__name__.lower()}_t;")
        out.append(f"_Static_assert(sizeof(sim_{struct.__name__.lower()}_t) == "
                   f"{C.sizeof(struct)}, \"{struct.__name__} layout differs from Python\");")
    if len(func_names) > MAX_FUNCS:
        raise ValueError(f"{len(func_names)} functions exceed MAX_FUNCS={MAX_FUNCS}")
    out.append("enum {")
    out.extend(f"    F_{n} = {i}," for i, n in enumerate(func_names))
    out.append(f"    F__COUNT = {len(func_names)}")
    out.append("};")
    out.append("static const char *const SIM_FUNC_NAMES[] = {%s};"
               % ", ".join(f'"{n}"' for n in func_names))
    return "\n".join(out) + "\n"


def field_ids(c_source: str) -> dict[str, int]:
    """The NVML_FI_* field ids the C source names, with their values from pynvml (gpuobs.nvml backfills
    the ids an older binding lacks), so the simulator and the exporter share nvml.h's numbering.
    Raises ValueError for a name pynvml does not define."""
    from ..nvml import pynvml  # through gpuobs.nvml, which backfills the field ids an older pynvml lacks

    names = sorted(set(re.findall(r"\bNVML_FI_\w+", c_source)))
    unknown = [n for n in names if not isinstance(getattr(pynvml, n, None), int)]
    if unknown:
        raise ValueError(f"nvml_sim.c names field ids pynvml does not define: {', '.join(unknown)}")
    return {n: getattr(pynvml, n) for n in names}


def func_names(c_source: str) -> list[str]:
    """NVML functions the C source implements, in order of definition.

    Each is an `API nvmlReturn_t nvmlX(` definition or a `*_GETTER(nvmlX, ...)` expansion;
    each gets a function id F_nvmlX for call accounting and fault matching.
    """
    pattern = r"^API nvmlReturn_t (nvml\w+)\(|^[A-Z0-9]+_GETTER\((nvml\w+),"
    return [a or b for a, b in re.findall(pattern, c_source, flags=re.M)]
