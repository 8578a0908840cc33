"""The text of an `nvidia-smi -q` capture, one value at a time: the helpers that read a parsed line
(N/A-like values as None, annotations dropped, numbers, flags) and the few derived readings (T.Limit,
SRAM uncorrected count, fabric health mask) that both the importer (gpuobs.sim.capture) and the
field tables (gpuobs.sim.smi_fields) use. It imports neither, so that they need not import each other.
"""

from __future__ import annotations

import re
from typing import Any

_NA = {"n/a", "not supported", "requested functionality has been deprecated", "unknown error",
       "insufficient permissions", "not available", ""}
_ANNOTATION = re.compile(r"^(.*?\S)\s*\[[^\[\]]*\]$")  # "13.3 [Deprecated; ...]" -> "13.3"

VALUE = "_value"  # key holding the value of a line that has both a value and a sub-block
_FLAGS = {"enabled": 1, "disabled": 0, "yes": 1, "no": 0, "active": 1, "not active": 0}


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
    m = _ANNOTATION.match(v)
    if m:  # keep the value, drop the note; a value that is only "[N/A]" has nothing before it
        v = m[1]
    low = v.strip("[]").strip().lower()
    # R610's version table says 'Deprecated, see "KMD version" instead' where a version was
    return None if low in _NA or low.startswith("deprecated") else v


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


def tlimit(t: Any) -> int | None:
    """Absolute T.Limit (C) of one `Temperature` block: GPU Current Temp + GPU T.Limit Temp (the
    margin below T.Limit). None for the consumer format, which prints absolute thresholds."""
    gpu, margin = _int(_get(t, "GPU Current Temp")), _int(_get(t, "GPU T.Limit Temp"))
    return gpu + margin if gpu is not None and margin is not None else None


def sram_uncorrected(scope: Any) -> int | None:
    """Uncorrectable SRAM errors of one `ECC Errors` scope block (Volatile or Aggregate), as
    nvmlDeviceGetMemoryErrorCounter counts them for NVML_MEMORY_LOCATION_SRAM: the one `SRAM
    Uncorrectable` line, or where nvidia-smi splits it, its `Parity` and `SEC-DED` lines summed. None
    when a term is N/A, and when `SRAM Correctable` is: the split lines come from another call
    (nvmlDeviceGetSramEccErrorStatus), which a GeForce answers with zeros while its memory error
    counters are not supported (an RTX 4080 capture: Parity and SEC-DED 0, query-gpu's
    ecc.errors.uncorrected.*.sram [N/A])."""
    if _get(scope, "SRAM Uncorrectable") is not None:
        return _int(_get(scope, "SRAM Uncorrectable"))
    parity, secded = _int(_get(scope, "SRAM Uncorrectable Parity")), _int(_get(scope, "SRAM Uncorrectable SEC-DED"))
    if parity is None or secded is None or _int(_get(scope, "SRAM Correctable")) is None:
        return None
    return parity + secded


FABRIC_STATES = {"not supported": 0, "not started": 1, "in progress": 2, "completed": 3}  # nvmlGpuFabricState_t
# nvidia-smi prints the registration status as nvmlErrorString(status); only success is read back into
# its nvmlReturn_t (other texts would need the whole error table, and no capture shows one).
FABRIC_STATUS = {"success": 0}
# Fabric/Health lines -> (shift of their NVML_GPU_FABRIC_HEALTH_MASK_* field, {text: field value}); a
# field nvidia-smi prints N/A, or a line an older driver does not print, is 0 (..._NOT_SUPPORTED).
HEALTH_FIELDS = {"Bandwidth": (0, {"degraded": 1, "true": 1, "full": 2, "false": 2}),
                 "Route Recovery in progress": (2, {"true": 1, "false": 2}),
                 "Route Unhealthy": (4, {"true": 1, "false": 2}),
                 "Access Timeout Recovery": (6, {"true": 1, "false": 2}),
                 "Incorrect Configuration": (8, {"none": 1})}
HEALTH_UNDECODED = ("Partition Assigned",)  # health lines whose mask bits gpuobs does not know


def health_mask(health: Any) -> int | None:
    """The NVML fabric health mask the `Fabric/Health` lines spell out (nvmlGpuFabricInfo_v2_t
    healthMask: 2-bit fields at bits 0, 2, 4, 6, a 4-bit field at 8). None (no mask: the driver does
    not report health) when every line is N/A; None too when a line holds a text this table does not
    know or a line it cannot place in the mask has a value: a mask is never guessed."""
    mask, seen = 0, False
    for key, (shift, values) in HEALTH_FIELDS.items():
        s = _s(_get(health, key))
        if s is None:
            continue
        if s.lower() not in values:
            return None
        mask, seen = mask | values[s.lower()] << shift, True
    if any(_s(_get(health, key)) is not None for key in HEALTH_UNDECODED):
        return None
    return mask if seen else None
