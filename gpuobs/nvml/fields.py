"""nvmlDeviceGetFieldValues into a reused array, decoded in bulk.

pynvml's wrapper builds a new c_nvmlFieldValue_t array per call and every attribute read of its
structures goes through Python; on a node with 18 NVLink links per GPU that was a third of the
exporter's sampling CPU. The array and the call here are pynvml's own; the decoding slices typed
views of the array's memory (every return code in one slice, every 64-bit value in another), which
is valid because the layout is NVML's C ABI (checked below). A pynvml without the private names
used here, or with another layout, gets the public call.
"""

from __future__ import annotations

import ctypes
import operator
import struct
from collections.abc import Callable
from typing import Any

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
            and rec.value.offset == 32 and rec.nvmlReturn.offset == 28 and rec.valueType.offset == 24)


FAST = _fast_path_ok()

# nvmlValueType_t -> (typed view, offset, stride) of the value union, in items of that view: a record
# is 40 bytes, the union starts at byte 32 (unsigned long is 8 bytes on 64-bit Linux)
_COLUMNS = {N.NVML_VALUE_TYPE_DOUBLE: ("d", 4, 5), N.NVML_VALUE_TYPE_UNSIGNED_INT: ("I", 8, 10),
            N.NVML_VALUE_TYPE_UNSIGNED_LONG: ("Q", 4, 5), N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: ("Q", 4, 5),
            N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: ("q", 4, 5), N.NVML_VALUE_TYPE_SIGNED_INT: ("i", 8, 10),
            N.NVML_VALUE_TYPE_UNSIGNED_SHORT: ("H", 16, 20)}
_DEFAULT = _COLUMNS[N.NVML_VALUE_TYPE_UNSIGNED_INT]
# nvmlValueType_t -> member of pynvml's c_nvmlValue_t union (for the public path)
_MEMBER = {N.NVML_VALUE_TYPE_DOUBLE: "dVal", N.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
           N.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
           N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", N.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
           N.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal"}


class FieldValues:
    """A fixed list of (NVML field id, scope id) read together with nvmlDeviceGetFieldValues.

    `read(handle)` -> (return codes, values), two lists in the order given: a value is a Python
    number decoded by its entry's valueType (None unless its nvmlReturn is NVML_SUCCESS). Raises
    pynvml.NVMLError when the call as a whole fails. Not thread-safe: one instance per GPU, used by
    one reader at a time.
    """

    def __init__(self, ids: list[tuple[int, int]], fast: bool | None = None):
        self.ids = tuple(ids)
        self.fast = FAST if fast is None else fast
        if self.fast:
            self._array = (N.c_nvmlFieldValue_t * len(ids))()
            for entry, (field_id, scope) in zip(self._array, ids):
                entry.fieldId, entry.scopeId = field_id, scope
            raw = memoryview(self._array).cast("B")
            # one literal per cast: typeshed types each format's view by its item type
            self._views: dict[str, memoryview[Any]] = {
                "I": raw.cast("I"), "i": raw.cast("i"), "Q": raw.cast("Q"), "q": raw.cast("q"),
                "d": raw.cast("d"), "H": raw.cast("H")}
            self._types: list[int] | None = None  # value types of the last read, and how to decode them:
            self._columns: list[tuple[str, int, int]] = []  # the distinct (view, offset, stride) they need
            # picks each entry's value out of the columns laid end to end
            self._gather: Callable[[list[Any]], tuple[Any, ...]] | None = None

    def read(self, handle: Any) -> tuple[list[int], list[float | None] | tuple[float | None, ...]]:
        """(return codes, values) of every field, in `ids` order, for the device `handle` (pynvml's
        device pointer). A value is an int or float as NVML typed it, None where its return code is
        not NVML_SUCCESS; raises pynvml.NVMLError when the call as a whole fails."""
        if not self.fast:
            return self._read_public(handle)
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")  # pynvml caches the lookup
        N._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(self.ids)), ctypes.byref(self._array)))
        u32 = self._views["I"]
        rets, types = u32[7::10].tolist(), u32[6::10].tolist()
        if types != self._types:  # a field's type is fixed: this runs on the first read, as a rule
            self._plan(types)
        views = self._views
        columns = [views[fmt][offset::stride].tolist() for fmt, offset, stride in self._columns]
        values: list[Any] | tuple[Any, ...] = (
            columns[0] if self._gather is None else self._gather([v for col in columns for v in col]))
        if any(rets):  # NVML_SUCCESS is 0: a value that did not come back is None, not what the array held
            values = [v if r == N.NVML_SUCCESS else None for r, v in zip(rets, values)]
        return rets, values

    def _plan(self, types: list[int]) -> None:
        """Where each entry's value is, for these value types: one column (a strided slice of one
        typed view) per distinct decoding, and an itemgetter over the columns laid end to end."""
        picks = [_COLUMNS.get(t, _DEFAULT) for t in types]
        self._types, self._columns = types, sorted(set(picks))
        n = len(types)
        where = {pick: k * n for k, pick in enumerate(self._columns)}
        self._gather = None if len(self._columns) == 1 else \
            operator.itemgetter(*(where[pick] + i for i, pick in enumerate(picks)))

    def _read_public(self, handle: Any) -> tuple[list[int], list[float | None]]:
        """The same through pynvml's public call, decoded by the structure's own attributes."""
        values = N.nvmlDeviceGetFieldValues(handle, list(self.ids))
        return ([v.nvmlReturn for v in values],
                [getattr(v.value, _MEMBER.get(v.valueType, "uiVal"), None) if v.nvmlReturn == N.NVML_SUCCESS
                 else None for v in values])
