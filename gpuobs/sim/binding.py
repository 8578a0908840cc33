"""Make this process's pynvml behave as an older binding or an older driver, for in-process tests.

`bytes_strings()`: nvidia-ml-py / pynvml releases before 11.5 returned `bytes`, not `str`, from
every string call (nvmlDeviceGetName, GetUUID, GetSerial, GetVbiosVersion, GetBoardPartNumber,
GetInforomImageVersion, nvmlSystemGetDriverVersion, GetNVMLVersion, GetProcessName,
nvmlErrorString, ...) and from every char field of a returned struct (nvmlDeviceGetPciInfo().busId
and .busIdLegacy, ...), and took only `bytes` arguments (nvmlDeviceGetHandleByUUID("GPU-...")
raised TypeError). Inside the context manager the live module does the same.

`hidden_symbols(names)`: pynvml raises NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND) when it looks up
any of these NVML functions, exactly where it would on a driver without them (its
`_nvmlGetFunctionPointer`). The real thing, a library without those symbols, is for child
processes: `Simulator(spec, driver="r470").env()`; one process can load only one
libnvidia-ml.so.1, so this is the in-process stand-in:

    with binding.hidden_symbols(builder.DRIVERS["r470"]):
        ...

Both patch module attributes: code that took a reference before (`from pynvml import
nvmlDeviceGetName`) keeps the original. Both restore everything on exit; they are not meant to be
entered from several threads at once.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable, Iterator
from typing import Any

import pynvml


def _string_functions() -> dict[str, Any]:
    """pynvml's functions wrapped by its str<->bytes converter (convertStrBytes), by name."""
    probe = getattr(pynvml, "convertStrBytes", None)
    if probe is None:  # a binding that predates the conversion: nothing to undo
        return {}
    code = probe(lambda: None).__code__
    return {name: fn for name, fn in vars(pynvml).items()
            if callable(fn) and getattr(fn, "__code__", None) is code and hasattr(fn, "__wrapped__")}


@contextlib.contextmanager
def bytes_strings() -> Iterator[None]:
    """Inside: pynvml returns bytes where releases before 11.5 did; restored on exit."""
    saved = _string_functions()
    base = getattr(pynvml, "_PrintableStructure", None)
    had_getattr = base is not None and "__getattribute__" in vars(base)
    old_getattr = vars(base).get("__getattribute__") if base is not None else None
    try:
        for name, fn in saved.items():
            setattr(pynvml, name, fn.__wrapped__)  # the undecorated function: bytes in, bytes out
        # a method of pynvml's class patched on purpose (mypy refuses assigning to a method: setattr)
        if had_getattr:  # char fields read as bytes
            setattr(base, "__getattribute__", ctypes.Structure.__getattribute__)  # noqa: B010
        yield
    finally:
        for name, fn in saved.items():
            setattr(pynvml, name, fn)
        if had_getattr:
            setattr(base, "__getattribute__", old_getattr)  # noqa: B010


@contextlib.contextmanager
def hidden_symbols(names: Iterable[str]) -> Iterator[None]:
    """Inside: looking up any of `names` raises NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND), as on
    a driver without them (e.g. builder.DRIVERS["r470"]); restored on exit."""
    hidden = frozenset(names)
    original = pynvml._nvmlGetFunctionPointer

    def lookup(name):
        if name in hidden:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return original(name)

    pynvml._nvmlGetFunctionPointer = lookup
    try:
        yield
    finally:
        pynvml._nvmlGetFunctionPointer = original
