"""Turn a real `nvidia-smi` capture file into GPU profile dicts for the NVML simulator.

A capture (see shared/captures/README.md) is a series of sections, each opened by a banner::

    ################################################################################
    # load :: query (-q)
    # $ nvidia-smi -q
    ################################################################################

`sections` splits a file at these banners, `parse_query` turns one `nvidia-smi -q` text
into nested dicts, and `load_capture` maps those onto the profile schema the simulator is
seeded from. Anything the capture shows as N/A, `[Not Supported]`, deprecated, or does not
show at all becomes None (the simulator answers NVML_ERROR_NOT_SUPPORTED), never 0.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["parse_query", "sections", "load_capture"]

_BANNER = re.compile(r"^#{20,}\n# ([\w-]+) :: (.+?)[ \t]*\n(?:#[^\n]*\n)*?#{20,}[ \t]*\n", re.M)
_LINE = re.compile(r"^( *)(\S.*?)\s*:(?:\s+(.*?))?\s*$")  # "Key   : value" (value optional)
_GPU_KEY = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+$")
_NA = {"n/a", "not supported", "requested functionality has been deprecated", "unknown error",
       "insufficient permissions", "not available", ""}
PHASES = ("idle", "load")  # the capture phases a -q section is taken in
VALUE = "_value"  # key holding the value of a line that has both a value and a sub-block

# Clocks Event Reasons (née Clocks Throttle Reasons) -> nvmlClocksEventReason* bits.
_REASON_BITS = {"Idle": 0x1, "GPU Idle": 0x1, "Applications Clocks Setting": 0x2,
                "SW Power Cap": 0x4, "HW Slowdown": 0x8, "Sync Boost": 0x10,
                "SW Thermal Slowdown": 0x20, "HW Thermal Slowdown": 0x40,
                "HW Power Brake Slowdown": 0x80, "Display Clock Setting": 0x100}
_COUNTERS = {"power": "SW Power Capping", "sync_boost": "Sync Boost",
             "sw_thermal": "SW Thermal Slowdown", "hw_thermal": "HW Thermal Slowdown",
             "hw_power_brake": "HW Power Braking"}
_COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
_FLAGS = {"enabled": 1, "disabled": 0, "yes": 1, "no": 0, "active": 1, "not active": 0}


# ---------------------------------------------------------------- generic tree parsing

def _tree(text: str) -> dict[str, Any]:
    """Parse an indented `Key : Value` text into nested dicts (see parse_query)."""
    rows: list[tuple[int, str, str | None]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith(("#", "====")):
            continue
        m = _LINE.match(raw)
        if m:
            rows.append((len(m[1]), m[2], m[3] if m[3] is not None else ""))
        else:  # a bare header such as "GPU 00000000:00:09.0" or "    PCI"
            rows.append((len(raw) - len(raw.lstrip(" ")), raw.strip(), None))
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for i, (indent, key, value) in enumerate(rows):
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        node: Any = value if value is not None else ""
        if i + 1 < len(rows) and rows[i + 1][0] > indent:  # opens a sub-block
            node = {VALUE: value} if value else {}
            stack.append((indent, node))
        if key in parent:
            if not isinstance(parent[key], list):
                parent[key] = [parent[key]]
            parent[key].append(node)
        else:
            parent[key] = node
    return root


def parse_query(text: str) -> list[dict]:
    """Parse one `nvidia-smi -q` output into one tree per `GPU dddddddd:bb:dd.f` block.

    Each tree maps keys to raw (stripped) value strings, to dicts for sub-blocks, or to lists
    when a key repeats in the same block (e.g. several `MIG Device`, `Process ID`). A line with
    both a value and a sub-block (`Process ID : 1234` + Type/Name, `HW Slowdown : Active` +
    its sub-reasons) becomes a dict whose `"_value"` key holds the value. Trees keep input order.
    Returns [] when the text holds no GPU block; never raises on odd lines (they are kept as keys).
    """
    return [v for k, v in _tree(text).items() if _GPU_KEY.match(k) and isinstance(v, dict)]


def sections(text: str) -> dict[tuple[str, str], str]:
    """Split a capture file into {(phase, title): body}, e.g. ("load", "query (-q)").

    phase is the banner's first word ("capabilities", "idle", "load"), title the rest after
    "::". The body is the text between the banner and the next one, without leading/trailing
    blank lines. A repeated (phase, title) keeps the last body. Text before the first banner
    (the file header) is dropped.
    """
    marks = list(_BANNER.finditer(text))
    out: dict[tuple[str, str], str] = {}
    for m, nxt in zip(marks, marks[1:] + [None]):
        body = text[m.end(): nxt.start() if nxt else len(text)]
        out[(m[1], m[2].strip())] = body.strip("\n")
    return out


# ---------------------------------------------------------------- value helpers

def _get(node: Any, *path: str) -> Any:
    """Walk dict keys; None where a key is missing or a level is not a dict."""
    for key in path:
        if isinstance(node, list):
            node = node[0] if node else None
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _first(node: Any, *paths: tuple[str, ...]) -> Any:
    """The first of several key paths whose value is not N/A (fallback key names)."""
    for path in paths:
        v = _get(node, *path)
        if _s(v) is not None:
            return v
    return None


def _s(v: Any) -> str | None:
    """A raw value as a string, or None for N/A-like / missing values."""
    if isinstance(v, list):
        v = v[0] if v else None
    if isinstance(v, dict):
        v = v.get(VALUE)
    if v is None:
        return None
    v = v.strip()
    return None if v.strip("[]").strip().lower() in _NA else v


def _num(v: Any) -> float | None:
    s = _s(v)
    m = re.match(r"[-+]?\d+(?:\.\d+)?", s) if s else None
    return float(m[0]) if m else None


def _int(v: Any) -> int | None:
    x = _num(v)
    return None if x is None else int(x)


def _hex(v: Any) -> int | None:
    s = _s(v)
    try:
        return int(s, 16) if s else None
    except ValueError:
        return None


def _flag(v: Any) -> int | None:
    s = _s(v)
    return _FLAGS.get(s.lower()) if s else None


def _list(v: Any) -> list:
    return [] if v is None else v if isinstance(v, list) else [v]


# ---------------------------------------------------------------- profile pieces

def _temperature(t: Any) -> dict[str, int | None]:
    gpu, margin = _int(_get(t, "GPU Current Temp")), _int(_get(t, "GPU T.Limit Temp"))
    out = {"gpu": gpu, "memory": _int(_get(t, "Memory Current Temp")),
           "target": _int(_get(t, "GPU Target Temperature")), "margin": margin}
    if _get(t, "GPU Shutdown T.Limit Temp") is not None or _get(t, "GPU Max Operating T.Limit Temp") is not None:
        # Datacenter format: thresholds relative to T.Limit (= gpu + margin, absolute C).
        tlimit = gpu + margin if gpu is not None and margin is not None else None

        def rel(key: str) -> int | None:
            d = _int(_get(t, key))
            return None if tlimit is None or d is None else tlimit - d

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


def _power(g: dict) -> dict[str, float | None]:
    p = _get(g, "GPU Power Readings") or _get(g, "Power Readings")
    return {"draw": _num(_first(p, ("Instantaneous Power Draw",), ("Power Draw",))),
            "average": _num(_get(p, "Average Power Draw")),
            "limit": _num(_first(p, ("Requested Power Limit",), ("Power Limit",))),
            "enforced_limit": _num(_first(p, ("Current Power Limit",), ("Enforced Power Limit",))),
            "default_limit": _num(_get(p, "Default Power Limit")),
            "min_limit": _num(_get(p, "Min Power Limit")),
            "max_limit": _num(_get(p, "Max Power Limit"))}


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

    return {"mode": _flag(_get(g, "ECC Mode", "Current")), "pending": _flag(_get(g, "ECC Mode", "Pending")),
            "corrected_volatile": count("Volatile", "DRAM Correctable", "Single Bit"),
            "corrected_aggregate": count("Aggregate", "DRAM Correctable", "Single Bit"),
            "uncorrected_volatile": count("Volatile", "DRAM Uncorrectable", "Double Bit"),
            "uncorrected_aggregate": count("Aggregate", "DRAM Uncorrectable", "Double Bit")}


def _retired(g: dict) -> dict[str, int | None] | None:
    r = _get(g, "Retired Pages")
    out = {"sbe": _int(_first(r, ("Single Bit ECC",), ("Single Bit ECC", "Count"))),
           "dbe": _int(_first(r, ("Double Bit ECC",), ("Double Bit ECC", "Count"))),
           "pending": _flag(_first(r, ("Pending Page Blacklist",), ("Pending",)))}
    return None if all(v is None for v in out.values()) else out


def _remapped(g: dict) -> dict[str, int | None] | None:
    r = _get(g, "Remapped Rows")
    if not isinstance(r, dict):
        return None
    return {"correctable": _int(_get(r, "Correctable Error")),
            "uncorrectable": _int(_get(r, "Uncorrectable Error")),
            "pending": _flag(_get(r, "Pending")), "failure": _flag(_get(r, "Remapping Failure Occurred"))}


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
            "sm_count": _int(_get(attrs, "Multiprocessor count")), "ce_count": _int(_get(attrs, "Copy Engine count")),
            "enc_count": _int(_get(attrs, "Encoder count")), "dec_count": _int(_get(attrs, "Decoder count")),
            "jpg_count": _int(_get(attrs, "JPG count")), "ofa_count": _int(_get(attrs, "OFA count")),
            "memory_mib": _mem(_get(d, "Shared FB Memory Usage") or _get(d, "FB Memory Usage")),
            "bar1_mib": _mem(_get(d, "Shared BAR1 Memory") or _get(d, "BAR1 Memory Usage"), reserved=False)})
    return {"mode": mode, "pending": _flag(_get(g, "MIG Mode", "Pending")), "devices": devices}


def _processes(g: dict) -> list[dict]:
    p = _get(g, "Processes")
    if not isinstance(p, dict):  # "Processes : None" or absent
        return []
    pids = _list(p.get("Process ID"))
    gis, cis = _list(p.get("GPU instance ID")), _list(p.get("Compute instance ID"))
    aligned = len(gis) == len(cis) == len(pids)
    return [{"pid": _int(pid), "name": _s(_get(pid, "Name")) or "", "type": _s(_get(pid, "Type")) or "",
             "used_mib": _int(_get(pid, "Used GPU Memory")),
             "gi_id": _int(gis[i]) if aligned else None, "ci_id": _int(cis[i]) if aligned else None}
            for i, pid in enumerate(pids)]


def _clocks(block: Any) -> dict[str, int | None]:
    return {k: _int(_get(block, key)) for k, key in
            (("graphics", "Graphics"), ("sm", "SM"), ("memory", "Memory"), ("video", "Video"))}


def _profile(g: dict, top: dict, mig_names: dict[int, str]) -> dict:
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
        "temperature_c": _temperature(_get(g, "Temperature")),
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
        "ecc": _ecc(g),
        "retired_pages": _retired(g),
        "remapped_rows": _remapped(g),
        "mig": _mig(g, mig_names),
        "processes": _processes(g),
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


def load_capture(path: str | Path, phase: str = "load") -> list[dict]:
    """Read a capture file and return one profile dict per GPU of `phase`'s `-q` section.

    Falls back to the "idle" phase when `phase` has no `query (-q)` section. MIG profile names
    come from the `capabilities :: list (-L)` section, matched by GPU order and MIG device
    index. driver_version / cuda_version come from the top of the `-q` output (falling back to
    the `capabilities :: version` section). Units are in the key names (MiB, W, C, MHz, KB/s,
    us, %); unavailable values are None.
    Raises FileNotFoundError for a missing file, ValueError for a phase other than idle/load,
    when neither phase has a `-q` section, or when a GPU block has no Product Name.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    secs = sections(Path(path).read_text(encoding="utf-8", errors="replace"))
    body = secs.get((phase, "query (-q)")) or secs.get(("idle", "query (-q)"))
    if body is None:
        raise ValueError(f"{path}: no '{phase}' or 'idle' query (-q) section")
    root = _tree(body)
    version = _tree(secs.get(("capabilities", "version"), ""))
    top = {"Driver Version": _first(root, ("Driver Version",)) or _get(version, "DRIVER version"),
           "CUDA Version": _first(root, ("CUDA Version",)) or _get(version, "CUDA Version")}
    names = _mig_names(secs.get(("capabilities", "list (-L)"), ""))
    gpus = [v for k, v in root.items() if _GPU_KEY.match(k) and isinstance(v, dict)]
    return [_profile(g, top, names[i] if i < len(names) else {}) for i, g in enumerate(gpus)]
