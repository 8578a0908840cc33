"""nvmlDeviceGetFieldValues into a reused array, decoded in one pass.

pynvml's wrapper builds a new c_nvmlFieldValue_t array per call and every attribute read of its
structures goes through Python; on a node with 18 NVLink links per GPU that was a third of the
exporter's sampling CPU. The array and the call here are pynvml's own; only the decoding reads the
array's bytes with `struct`, which is valid because the layout is NVML's C ABI (checked below).
"""

from __future__ import annotations

import ctypes
import struct

import pynvml as N

# c_nvmlFieldValue_t: fieldId u32, scopeId u32, timestamp i64, latencyUsec i64, valueType i32,
# nvmlReturn i32, value (8-byte union)
_RECORD = struct.Struct("<IIqqii8s")
if (_RECORD.size != ctypes.sizeof(N.c_nvmlFieldValue_t) or N.c_nvmlFieldValue_t.value.offset != 32
        or N.c_nvmlFieldValue_t.nvmlReturn.offset != 28):
    raise ImportError("pynvml's c_nvmlFieldValue_t layout is not NVML's C ABI as gpuobs expects")

# nvmlValueType_t -> decoder of the value union (unsigned long is 8 bytes on 64-bit Linux)
_DECODE = {N.NVML_VALUE_TYPE_DOUBLE: struct.Struct("<d").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("<I").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("<Q").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("<Q").unpack_from,
           N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("<q").unpack_from,
           N.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("<i").unpack_from,
           N.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("<H").unpack_from}
_DEFAULT = _DECODE[N.NVML_VALUE_TYPE_UNSIGNED_INT]


class FieldValues:
    """A fixed list of (NVML field id, scope id) read together with nvmlDeviceGetFieldValues.

    `read(handle)` -> [(nvmlReturn, value)] in the order given: value is a Python number decoded by
    the entry's valueType (None unless nvmlReturn is NVML_SUCCESS). Raises pynvml.NVMLError when the
    call as a whole fails. Not thread-safe: one instance per GPU, used by the sampling thread.
    """

    def __init__(self, ids: list[tuple[int, int]]):
        self.ids = tuple(ids)
        self._array = (N.c_nvmlFieldValue_t * len(ids))()
        for entry, (field_id, scope) in zip(self._array, ids):
            entry.fieldId, entry.scopeId = field_id, scope

    def read(self, handle) -> list[tuple[int, float | None]]:
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")  # pynvml caches the lookup
        N._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(self.ids)), ctypes.byref(self._array)))
        return [(ret, _DECODE.get(vtype, _DEFAULT)(raw)[0] if ret == N.NVML_SUCCESS else None)
                for _, _, _, _, vtype, ret, raw in _RECORD.iter_unpack(bytes(self._array))]
