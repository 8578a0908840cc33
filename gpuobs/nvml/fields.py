"""nvmlDeviceGetFieldValues into a reused array, decoded in one pass.

pynvml's wrapper builds a new c_nvmlFieldValue_t array per call and every attribute read of its
structures goes through Python; on a node with 18 NVLink links per GPU that was a third of the
exporter's sampling CPU. The array and the call here are pynvml's own; only the decoding reads the
array's bytes with `struct`, which is valid because the layout is NVML's C ABI (checked below).
A pynvml without the private names used here, or with another layout, gets the public call.
"""

from __future__ import annotations

import ctypes
import struct

import pynvml as N

# c_nvmlFieldValue_t: fieldId u32, scopeId u32, timestamp i64, latencyUsec i64, valueType i32,
# nvmlReturn i32, value (8-byte union)
_RECORD = struct.Struct("<IIqqii8s")


def _fast_path_ok() -> bool:
    """True if this pynvml has the private names the fast path uses and NVML's C layout; else
    the public nvmlDeviceGetFieldValues is used (slower, same values)."""
    if not all(hasattr(N, n) for n in ("_nvmlGetFunctionPointer", "_nvmlCheckReturn", "c_nvmlFieldValue_t")):
        return False
    rec = N.c_nvmlFieldValue_t
    return (_RECORD.size == ctypes.sizeof(rec) and getattr(rec, "value", None) is not None
            and rec.value.offset == 32 and rec.nvmlReturn.offset == 28)


FAST = _fast_path_ok()

# nvmlValueType_t -> decoder of the value union (unsigned long is 8 bytes on 64-bit Linux)
_DECODE = {N.NVML_VALUE_TYPE_DOUBLE: struct.Struct("<d").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("<I").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("<Q").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("<Q").unpack_from,
           N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("<q").unpack_from,
           N.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("<i").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("<H").unpack_from}
_DEFAULT = _DECODE[N.NVML_VALUE_TYPE_UNSIGNED_INT]
# nvmlValueType_t -> member of pynvml's c_nvmlValue_t union (for the public path)
_MEMBER = {N.NVML_VALUE_TYPE_DOUBLE: "dVal", N.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
           N.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
           N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", N.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
           N.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal"}


class FieldValues:
    """A fixed list of (NVML field id, scope id) read together with nvmlDeviceGetFieldValues.

    `read(handle)` -> [(nvmlReturn, value)] in the order given: value is a Python number decoded by
    the entry's valueType (None unless nvmlReturn is NVML_SUCCESS). Raises pynvml.NVMLError when the
    call as a whole fails. Not thread-safe: one instance per GPU, used by the sampling thread.
    """

    def __init__(self, ids: list[tuple[int, int]], fast: bool | None = None):
        self.ids = tuple(ids)
        self.fast = FAST if fast is None else fast
        if self.fast:
            self._array = (N.c_nvmlFieldValue_t * len(ids))()
            for entry, (field_id, scope) in zip(self._array, ids):
                entry.fieldId, entry.scopeId = field_id, scope

    def read(self, handle) -> list[tuple[int, float | None]]:
        if not self.fast:
            return self._read_public(handle)
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")  # pynvml caches the lookup
        N._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(self.ids)), ctypes.byref(self._array)))
        return [(ret, _DECODE.get(vtype, _DEFAULT)(raw)[0] if ret == N.NVML_SUCCESS else None)
                for _, _, _, _, vtype, ret, raw in _RECORD.iter_unpack(bytes(self._array))]

    def _read_public(self, handle) -> list[tuple[int, float | None]]:
        """The same through pynvml's public call, decoded by the structure's own attributes."""
        values = N.nvmlDeviceGetFieldValues(handle, list(self.ids))
        return [(v.nvmlReturn, getattr(v.value, _MEMBER.get(v.valueType, "uiVal"), None)
                 if v.nvmlReturn == N.NVML_SUCCESS else None) for v in values]
