"""Turn a real `nvidia-smi` capture file into GPU profile dicts for the NVML simulator.

A capture (see shared/captures/README.md) is a series of sections, each opened by a banner::

    ################################################################################
    # load :: query (-q)
    # $ nvidia-smi -q
    ################################################################################

`sections` splits a file at these banners (gpuobs.sim.smi_tree, which also reads a bare
`nvidia-smi -q` text; `-q -x` XML is refused), `parse_query` turns one `nvidia-smi -q` text
into nested dicts, and `load_capture` maps those onto the profile schema the simulator is
seeded from. Anything the capture shows as N/A, `[N/A]`, `Not available`, `[Not Supported]`,
deprecated, or does not show at all becomes None (the simulator answers NVML_ERROR_NOT_SUPPORTED),
never 0. A trailing annotation in square brackets (R610: `610.57.04 [Deprecated; ...]`) is dropped
and the value before it kept. Formats from R470 to R610+ are read, Windows (WDDM) captures included;
a line the importer cannot place is logged once by name (logger `gpuobs.sim.capture`) and listed in
the profile's `unplaced` key, never raised.
"""

from __future__ import annotations

import logging
import re
import statistics
from pathlib import Path
from typing import Any, Iterator

from .smi_fields import known  # the field tables: a line neither read nor listed there is unplaced
from .smi_text import (
    FABRIC_STATES,
    FABRIC_STATUS,
    VALUE,
    _first,
    _flag,
    _get,
    _hex,
    _int,
    _list,
    _num,
    _s,
    health_mask,
    sram_uncorrected,
    tlimit,
)
from .smi_tree import GPU_KEY as _GPU_KEY
from .smi_tree import QUERY, parse_query, read_sections, sections
from .smi_tree import tree as _tree

__all__ = ["field_paths", "load_capture", "parse_query", "pmon_usage", "sections", "unplaced"]

log = logging.getLogger(__name__)
PHASES = ("idle", "load")  # the capture phases a -q section is taken in

# Clocks Event Reasons (née Clocks Throttle Reasons) -> nvmlClocksEventReason* bits.
_REASON_BITS = {"Idle": 0x1, "GPU Idle": 0x1, "Applications Clocks Setting": 0x2,
                "SW Power Cap": 0x4, "HW Slowdown": 0x8, "Sync Boost": 0x10,
                "SW Thermal Slowdown": 0x20, "HW Thermal Slowdown": 0x40,
                "HW Power Brake Slowdown": 0x80, "Display Clock Setting": 0x100}
_COUNTERS = {"power": "SW Power Capping", "sync_boost": "Sync Boost",
             "sw_thermal": "SW Thermal Slowdown", "hw_thermal": "HW Thermal Slowdown",
             "hw_power_brake": "HW Power Braking"}
_COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}


# ---------------------------------------------------------------- profile pieces

def _temperature(t: Any, limit: int | None) -> dict[str, int | None]:
    """Temperatures in C. `limit` is the GPU's absolute T.Limit, derived once per GPU (see
    load_capture) so that both phases of one GPU get the same thresholds."""
    out = {"gpu": _int(_get(t, "GPU Current Temp")), "memory": _int(_get(t, "Memory Current Temp")),
           "target": _int(_get(t, "GPU Target Temperature")), "margin": _int(_get(t, "GPU T.Limit Temp"))}
    if _get(t, "GPU Shutdown T.Limit Temp") is not None or _get(t, "GPU Max Operating T.Limit Temp") is not None:
        # Datacenter format: thresholds printed relative to T.Limit (absolute = T.Limit - value).
        def rel(key: str) -> int | None:
            d = _int(_get(t, key))
            return None if limit is None or d is None else limit - d

        out |= {"shutdown": rel("GPU Shutdown T.Limit Temp"), "slowdown": rel("GPU Slowdown T.Limit Temp"),
                "gpu_max": rel("GPU Max Operating T.Limit Temp"),
                # The memory T.Limit is relative to the memory sensor's own limit, whose margin
                # nvidia-smi does not print; reusing the GPU's would invent a number, so None.
                "memory_max": _int(_get(t, "Memory Max Operating Temp"))}
    else:  # consumer / older format: absolute thresholds
        out |= {"shutdown": _int(_get(t, "GPU Shutdown Temp")), "slowdown": _int(_get(t, "GPU Slowdown Temp")),
                "gpu_max": _int(_get(t, "GPU Max Operating Temp")),
                "memory_max": _int(_get(t, "Memory Max Operating Temp"))}
    return {k: out[k] for k in ("gpu", "memory", "shutdown", "slowdown", "gpu_max", "memory_max",
                                "target", "margin")}


LIMITS = ("Current Power Limit", "Enforced Power Limit", "Requested Power Limit", "Power Limit",
          "Default Power Limit", "Min Power Limit", "Max Power Limit")
CEILING = "GPU Ceiling Power Limit"  # R610: some or all limits moved into this sub-block (or it is one line)


def _limit(p: Any, *keys: str) -> float | None:
    """The first of `keys` with a value in the readings block `p`, else in its R610 ceiling sub-block:
    R610 may print some limits (Min/Max) beside the block and the others inside it."""
    return _num(_first(p, *((k,) for k in keys), *((CEILING, k) for k in keys)))


def _power(g: dict) -> dict[str, float | None]:
    """Power in W. Each limit is read from the readings block, else from R610's `GPU Ceiling Power
    Limit` block (line by line: neither block needs to hold all of them); a one-line ceiling is kept
    as `ceiling_limit`."""
    p = _get(g, "GPU Power Readings") or _get(g, "Power Readings")
    ceiling = _get(p, CEILING)
    memory = _get(g, "GPU Memory Power Readings")
    return {"draw": _num(_first(p, ("Instantaneous Power Draw",), ("Power Draw",))),
            "average": _num(_get(p, "Average Power Draw")),
            "memory_average": _num(_get(memory, "Average Power Draw")),
            "limit": _limit(p, "Requested Power Limit", "Power Limit"),
            "enforced_limit": _limit(p, "Current Power Limit", "Enforced Power Limit"),
            "default_limit": _limit(p, "Default Power Limit"),
            "min_limit": _limit(p, "Min Power Limit"),
            "max_limit": _limit(p, "Max Power Limit"),
            "ceiling_limit": None if isinstance(ceiling, dict) else _num(ceiling)}


def _clock_reasons(g: dict) -> int | None:
    block = _get(g, "Clocks Event Reasons") or _get(g, "Clocks Throttle Reasons")
    if not isinstance(block, dict):
        return None
    mask, seen = 0, False

    def walk(d: dict) -> None:
        nonlocal mask, seen
        for key, v in d.items():
            f = _flag(v)
            if key in _REASON_BITS and f is not None:
                seen = True
                mask |= _REASON_BITS[key] if f else 0
            if isinstance(v, dict):
                walk(v)
    walk(block)
    return mask if seen else None


def _ecc(g: dict) -> dict[str, int | None]:
    e = _get(g, "ECC Errors")

    def count(scope: str, new: str, old: str) -> int | None:
        s = _get(e, scope)
        if _get(s, new) is not None:
            return _int(_get(s, new))
        return _int(_first(s, (old, "Device Memory"), (old, "Total")))  # pre-R470 layout

    out = {"mode": _flag(_get(g, "ECC Mode", "Current")), "pending": _flag(_get(g, "ECC Mode", "Pending")),
           "corrected_volatile": count("Volatile", "DRAM Correctable", "Single Bit"),
           "corrected_aggregate": count("Aggregate", "DRAM Correctable", "Single Bit"),
           "uncorrected_volatile": count("Volatile", "DRAM Uncorrectable", "Double Bit"),
           "uncorrected_aggregate": count("Aggregate", "DRAM Uncorrectable", "Double Bit")}
    for scope in ("volatile", "aggregate"):
        s = _get(e, scope.capitalize())
        # device memory is DRAM to NVML (NVML_MEMORY_LOCATION_DEVICE_MEMORY == ..._DRAM): the same counts
        out |= {f"dram_corrected_{scope}": out[f"corrected_{scope}"],
                f"dram_uncorrected_{scope}": out[f"uncorrected_{scope}"],
                f"sram_corrected_{scope}": _int(_get(s, "SRAM Correctable")),
                f"sram_uncorrected_{scope}": sram_uncorrected(s)}
    return out


def _retired(g: dict) -> dict[str, int | None] | None:
    r = _get(g, "Retired Pages")
    out = {"sbe": _int(_first(r, ("Single Bit ECC",), ("Single Bit ECC", "Count"))),
           "dbe": _int(_first(r, ("Double Bit ECC",), ("Double Bit ECC", "Count"))),
           "pending": _flag(_first(r, ("Pending Page Blacklist",), ("Pending",)))}
    return None if all(v is None for v in out.values()) else out


def _remapped(g: dict) -> dict[str, int | dict[str, int | None] | None] | None:
    r = _get(g, "Remapped Rows")
    if not isinstance(r, dict):
        return None
    h = _get(r, "Bank Remap Availability Histogram")
    histogram = {k: _int(_get(h, k.capitalize())) for k in ("max", "high", "partial", "low", "none")}
    return {"correctable": _int(_get(r, "Correctable Error")),
            "uncorrectable": _int(_get(r, "Uncorrectable Error")),
            # R595+ (L40S 595.80) prints these beside the counts above; no NVML call in gpuobs reads them
            "inactive_correctable": _int(_get(r, "Inactive Correctable Error")),
            "inactive_uncorrectable": _int(_get(r, "Inactive Uncorrectable Error")),
            "pending": _flag(_get(r, "Pending")), "failure": _flag(_get(r, "Remapping Failure Occurred")),
            "histogram": None if all(v is None for v in histogram.values()) else histogram}


def _session_stats(block: Any) -> dict[str, int | None] | None:
    """`Encoder Stats` / `FBC Stats`: sessions, average FPS and latency (us); None without the block."""
    if not isinstance(block, dict):
        return None
    return {"sessions": _int(_get(block, "Active Sessions")), "average_fps": _int(_get(block, "Average FPS")),
            "average_latency_us": _int(_get(block, "Average Latency"))}


def _fabric(g: dict) -> dict[str, int | None] | None:
    """`Fabric`: registration state, status (nvmlReturn_t), clique id and health mask; None where the
    GPU has no fabric state (N/A: not an NVSwitch system, or a consumer GPU)."""
    f = _get(g, "Fabric")
    state = _s(_get(f, "State"))
    if not isinstance(f, dict) or state is None or state.lower() not in FABRIC_STATES:
        return None
    status = _s(_get(f, "Status"))
    return {"state": FABRIC_STATES[state.lower()],
            "status": None if status is None else FABRIC_STATUS.get(status.lower()),
            "clique_id": _int(_get(f, "CliqueId")), "health_mask": health_mask(_get(f, "Health"))}


def _mem(block: Any, reserved: bool = True) -> dict[str, int | None]:
    out = {"total": _int(_get(block, "Total"))}
    if reserved:
        out["reserved"] = _int(_get(block, "Reserved"))
    return out | {"used": _int(_get(block, "Used"))}


def _mig(g: dict, names: dict[int, str]) -> dict | None:
    mode = _flag(_get(g, "MIG Mode", "Current"))
    if mode is None:
        return None
    devices = []
    for d in _list(_get(g, "MIG Device")):
        attrs = _get(d, "Device Attributes", "Shared")
        index = _int(_get(d, "Index"))
        devices.append({
            "index": index, "gi_id": _int(_get(d, "GPU Instance ID")), "ci_id": _int(_get(d, "Compute Instance ID")),
            "profile": names.get(index) if index is not None else None,
            "sm_count": _int(_first(attrs, ("Multiprocessor count",), ("SM count",))),
            "ce_count": _int(_get(attrs, "Copy Engine count")),
            "enc_count": _int(_get(attrs, "Encoder count")), "dec_count": _int(_get(attrs, "Decoder count")),
            "jpg_count": _int(_get(attrs, "JPG count")), "ofa_count": _int(_get(attrs, "OFA count")),
            "memory_mib": _mem(_get(d, "Shared FB Memory Usage") or _get(d, "FB Memory Usage")),
            "bar1_mib": _mem(_get(d, "Shared BAR1 Memory") or _get(d, "BAR1 Memory Usage"), reserved=False)})
    return {"mode": mode, "pending": _flag(_get(g, "MIG Mode", "Pending")), "devices": devices}


def _processes(g: dict, usage: dict[int, dict[str, int | None]]) -> list[dict]:
    """The `Processes` block: pid, name, type, used MiB (None where the driver says "Not available",
    as WDDM does), MIG ids, and SM / memory utilization % from `usage` (pmon; None when unsampled)."""
    p = _get(g, "Processes")
    if not isinstance(p, dict):  # "Processes : None" or absent
        return []
    pids = _list(p.get("Process ID"))
    gis, cis = _list(p.get("GPU instance ID")), _list(p.get("Compute instance ID"))
    aligned = len(gis) == len(cis) == len(pids)
    out = []
    for i, pid in enumerate(pids):
        n = _int(pid)
        util = usage.get(n, {}) if n is not None else {}
        out.append({"pid": n, "name": _s(_get(pid, "Name")) or "", "type": _s(_get(pid, "Type")),
                    "used_mib": _int(_get(pid, "Used GPU Memory")),
                    "gi_id": _int(gis[i]) if aligned else None, "ci_id": _int(cis[i]) if aligned else None,
                    "sm_util": util.get("sm"), "mem_util": util.get("mem")})
    return out


def pmon_usage(text: str) -> dict[int, dict[int, dict[str, int | None]]]:
    """`nvidia-smi pmon` text -> {GPU index: {pid: {"sm": %, "mem": %}}}.

    pmon prints one row per process and sample, "-" where the process had no sample in that
    interval. Each value is the mean of the process's sampled rows, rounded to an integer; None
    when it was never sampled (never 0 for "no sample")."""
    header: list[str] = []
    seen: dict[tuple[int, int], dict[str, list[int]]] = {}
    for line in text.splitlines():
        words = line.lstrip("#").split()
        if line.startswith("#"):
            header = words if "pid" in words and not header else header
            continue
        if not header or len(words) < len(header) - 1 or not words[0].isdigit() or not words[1].isdigit():
            continue
        row = dict(zip(header, words))
        got = seen.setdefault((int(row["gpu"]), int(row["pid"])), {"sm": [], "mem": []})
        for key in ("sm", "mem"):
            if row.get(key, "-").isdigit():
                got[key].append(int(row[key]))
    out: dict[int, dict[int, dict[str, int | None]]] = {}
    for (gpu, pid), got in seen.items():
        out.setdefault(gpu, {})[pid] = {k: round(statistics.fmean(v)) if v else None for k, v in got.items()}
    return out


def _clocks(block: Any) -> dict[str, int | None]:
    return {k: _int(_get(block, key)) for k, key in
            (("graphics", "Graphics"), ("sm", "SM"), ("memory", "Memory"), ("video", "Video"))}


def _profile(g: dict, top: dict, mig_names: dict[int, str], limit: int | None,
             usage: dict[int, dict[str, int | None]]) -> dict:
    name = _s(_get(g, "Product Name"))
    if name is None:
        raise ValueError("GPU block without a Product Name")
    pci, link = _get(g, "PCI"), _get(g, "PCI", "GPU Link Info")
    mode = _s(_get(g, "Compute Mode"))
    pstate = _s(_get(g, "Performance State"))
    counters = _get(g, "Clocks Event Reasons Counters") or _get(g, "Clocks Throttle Reasons Counters")
    util = _get(g, "Utilization")
    return {
        "name": name, "brand": _s(_get(g, "Product Brand")), "architecture": _s(_get(g, "Product Architecture")),
        "serial": _s(_get(g, "Serial Number")), "uuid": _s(_get(g, "GPU UUID")),
        "vbios": _s(_get(g, "VBIOS Version")), "board_part_number": _s(_get(g, "Board Part Number")),
        "inforom_image": _s(_get(g, "Inforom Version", "Image Version")),
        "minor_number": _int(_get(g, "Minor Number")),
        "persistence_mode": _flag(_get(g, "Persistence Mode")),
        "compute_mode": _COMPUTE_MODES.get(re.sub(r"[\s-]+", "_", mode.lower())) if mode else None,
        "pci": {"bus_id": _s(_get(pci, "Bus Id")), "domain": _hex(_get(pci, "Domain")),
                "bus": _hex(_get(pci, "Bus")), "device": _hex(_get(pci, "Device")),
                "device_id": _hex(_get(pci, "Device Id")), "subsystem_id": _hex(_get(pci, "Sub System Id"))},
        "memory_mib": _mem(_get(g, "FB Memory Usage")),
        "bar1_mib": _mem(_get(g, "BAR1 Memory Usage"), reserved=False),
        "utilization_pct": {k: _int(_get(util, key)) for k, key in
                            (("gpu", "GPU"), ("memory", "Memory"), ("encoder", "Encoder"), ("decoder", "Decoder"))},
        "power_w": _power(g),
        "temperature_c": _temperature(_get(g, "Temperature"), limit),
        "clocks_mhz": _clocks(_get(g, "Clocks")),
        "max_clocks_mhz": _clocks(_get(g, "Max Clocks")),
        "pstate": int(pstate[1:]) if pstate and re.fullmatch(r"P\d+", pstate) else None,
        "fan_speed_pct": _int(_get(g, "Fan Speed")),
        "clock_event_reasons": _clock_reasons(g),
        "violation_us": {k: _int(_get(counters, key)) for k, key in _COUNTERS.items()},
        "pcie": {"gen": _int(_get(link, "PCIe Generation", "Current")),
                 "max_gen": _int(_get(link, "PCIe Generation", "Max")),
                 "gpu_max_gen": _int(_get(link, "PCIe Generation", "Device Max")),
                 "width": _int(_get(link, "Link Width", "Current")),
                 "max_width": _int(_get(link, "Link Width", "Max")),
                 "replay": _int(_get(pci, "Replays Since Reset")),
                 "tx_kbps": _int(_get(pci, "Tx Throughput")), "rx_kbps": _int(_get(pci, "Rx Throughput"))},
        "encoder_stats": _session_stats(_get(g, "Encoder Stats")),
        "fbc_stats": _session_stats(_get(g, "FBC Stats")),
        "ecc": _ecc(g),
        "retired_pages": _retired(g),
        "remapped_rows": _remapped(g),
        "fabric": _fabric(g),
        "mig": _mig(g, mig_names),
        "processes": _processes(g, usage),
        "driver_version": _s(top.get("Driver Version")),
        "cuda_version": _s(top.get("CUDA Version")),
    }


def _mig_names(listing: str) -> list[dict[int, str]]:
    """`nvidia-smi -L` text -> per GPU (in listed order) {MIG device index: profile name}."""
    out: list[dict[int, str]] = []
    for line in listing.splitlines():
        if re.match(r"GPU \d+:", line):
            out.append({})
        elif (m := re.match(r"\s+MIG\s+(\S+)\s+Device\s+(\d+):", line)) and out:
            out[-1][int(m[2])] = m[1]
    return out


def field_paths(node: dict, prefix: str = "") -> Iterator[tuple[str, Any, dict]]:
    """Every line of a parsed `-q` tree that holds a value: (path, node, context), path being the keys
    from `node` down joined with "/" (e.g. "GPU Power Readings/Current Power Limit"), list items
    flattened. context names the MIG device ({"mig": device node}) or process ({"process": node}) a
    line belongs to. Bare headers (blocks without a value of their own) are not yielded."""
    yield from _walk(node, prefix, {})


def _walk(node: dict, prefix: str, ctx: dict) -> Iterator[tuple[str, Any, dict]]:
    for key, value in node.items():
        if key == VALUE:
            continue
        path = f"{prefix}{key}"
        for item in _list(value):
            inner = ctx | ({"mig": item} if key == "MIG Device" else {"process": item} if key == "Process ID" else {})
            if not isinstance(item, dict) or item.get(VALUE):
                yield path, item, inner
            if isinstance(item, dict):
                yield from _walk(item, f"{path}/", inner)


def unplaced(root: dict) -> list[str]:
    """Paths of the lines of a parsed `-q` text (top level and GPU blocks) that the importer neither
    reads nor lists as not exported (gpuobs.sim.smi_fields' tables), each once, in input order."""
    found: dict[str, None] = {}
    for key, value in root.items():
        if _GPU_KEY.match(key) and isinstance(value, dict):
            found |= dict.fromkeys(path for path, _, _ in field_paths(value) if not known(path))
        elif not known(key):
            found[key] = None
    return list(found)


def _versions(root: dict, secs: dict[tuple[str, str], str]) -> dict[str, Any]:
    """Driver and CUDA versions from the top of `-q` (R610: KMD / CUDA UMD Version), else the
    capture's version section."""
    version = _tree(secs.get(("capabilities", "version"), ""))
    return {"Driver Version": _first(root, ("Driver Version",), ("KMD Version",))
            or _first(version, ("DRIVER version",), ("KMD version",)),
            "CUDA Version": _first(root, ("CUDA Version",), ("CUDA UMD Version",))
            or _first(version, ("CUDA Version",), ("CUDA UMD version",), ("CUDA UMD Version",))}


def _gpus(root: dict) -> list[dict]:
    return [v for k, v in root.items() if _GPU_KEY.match(k) and isinstance(v, dict)]


def _pmon(secs: dict[tuple[str, str], str], phase: str) -> dict[int, dict[int, dict[str, int | None]]]:
    return next((pmon_usage(body) for (ph, title), body in secs.items() if ph == phase and title.startswith("pmon")),
                {})


def load_capture(path: str | Path, phase: str = "load", warn: bool = True) -> list[dict]:
    """Read a capture file and return one profile dict per GPU of `phase`'s `-q` section.

    Falls back to the other phase when `phase` has no `query (-q)` section. MIG profile names
    come from the `capabilities :: list (-L)` section, matched by GPU order and MIG device
    index; per-process SM / memory utilization from the same phase's `pmon` section.
    driver_version / cuda_version come from the top of the `-q` output (falling back to
    the `capabilities :: version` section). Temperature thresholds printed relative to T.Limit are
    made absolute with the T.Limit of the idle phase's reading of the same GPU (see tlimit), so
    both phases agree. Units are in the key names (MiB, W, C, MHz, KB/s, us, %); unavailable values
    are None. Each profile's `unplaced` lists the lines the importer could not place (each also
    logged once as a warning, unless `warn` is False).
    A bare `nvidia-smi -q` text (no banners) is read as the load phase's `-q` section
    (gpuobs.sim.smi_tree.read_sections), whichever phase is asked for.
    Raises FileNotFoundError for a missing file, ValueError for a phase other than idle/load,
    when neither phase has a `-q` section, for `-q -x` XML (not read), or when a GPU block has no Product Name.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    secs = read_sections(Path(path).read_text(encoding="utf-8", errors="replace"))
    other = PHASES[1 - PHASES.index(phase)]
    used = phase if (phase, QUERY) in secs else other
    body = secs.get((used, QUERY))
    if body is None:
        raise ValueError(f"{path}: no '{phase}' or '{other}' query (-q) section, and not a bare nvidia-smi -q text")
    root = _tree(body)
    top, usage = _versions(root, secs), _pmon(secs, used)
    names = _mig_names(secs.get(("capabilities", "list (-L)"), ""))
    idle = _gpus(_tree(secs.get(("idle", QUERY), "")))
    lost = unplaced(root)
    for name in lost if warn else ():
        log.warning("%s: nvidia-smi -q line not understood, ignored: %s", Path(path).name, name)
    out = []
    for i, g in enumerate(_gpus(root)):
        limit = tlimit(_get(idle[i], "Temperature")) if i < len(idle) else None
        limit = tlimit(_get(g, "Temperature")) if limit is None else limit
        out.append(_profile(g, top, names[i] if i < len(names) else {}, limit, usage.get(i, {})) | {"unplaced": lost})
    return out
