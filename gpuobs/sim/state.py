"""The simulator's state file, seen from Python: create it, change values, inject faults.

Changes are plain writes into a shared mapping, so a process that has the simulator
library loaded sees them on its next NVML call.
"""

from __future__ import annotations

import ctypes as C
import mmap
import os
import time
import uuid
from pathlib import Path

from . import builder, layout
from .layout import Gpu, State, Val

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = 4  # NVML_ERROR_NO_PERMISSION
RESET_REQUIRED = 16  # NVML_ERROR_RESET_REQUIRED
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event no MIG instance is blamed for


def set_val(v: Val, value: float | None, shape: str = "const", amp: float = 0.0,
            period: float = 1.0) -> None:
    """Set one value; None makes its NVML call answer NVML_ERROR_NOT_SUPPORTED.

    shape is one of layout.SHAPES; "counter" grows at `amp` per second from `value` now.
    """
    if value is None:
        v.ret = NOT_SUPPORTED
        return
    v.shape = layout.SHAPES[shape]
    v.base, v.amp, v.period, v.t0 = float(value), float(amp), float(period), time.time()
    v.ret = 0


def current(v: Val) -> float:
    """The value as C would evaluate a const or counter shape now (ramps/sines/noise: their base)."""
    if v.shape == layout.SHAPE_COUNTER:
        return v.base + v.amp * max(0.0, time.time() - v.t0)
    return v.base


def set_counter(v: Val, start: float | None = None, rate: float | None = None) -> None:
    """Rebase a counter: keep it continuous while changing its rate (per second) or jumping it."""
    now = current(v) if start is None else start
    set_val(v, now, "counter", amp=v.amp if rate is None else rate)


def add_to_counter(v: Val, delta: float) -> None:
    """Increase a counter by delta now (e.g. ECC errors arriving), keeping its rate."""
    set_counter(v, start=current(v) + delta)


# futex(2)'s syscall number by machine (FUTEX_WAKE = 1): the simulator's event waits sleep on the
# state file's event head until a writer wakes them
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)
_libc = C.CDLL(None, use_errno=True)


def _futex_wake(address: int) -> None:
    """Wake every thread (of any process) sleeping on the 32-bit word at `address` of the shared
    state; without futex here the waiters see the change within their half-second cap."""
    if _SYS_FUTEX is not None:
        _libc.syscall(C.c_long(_SYS_FUTEX), C.c_void_p(address), C.c_int(1), C.c_int(2 ** 31 - 1),
                      C.c_void_p(0), C.c_void_p(0), C.c_int(0))


class SimState:
    """A mapped state file. Create one per simulated node; open it again from other processes."""

    def __init__(self, path: Path, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        self.s = State.from_buffer(mm)
        self._ids = {name: i for i, name in enumerate(builder.implemented_functions())}

    @classmethod
    def create(cls, path: str | os.PathLike) -> "SimState":
        """Create (or reset in place) a zeroed state file of the current layout."""
        path = Path(path)
        size = C.sizeof(State)
        with open(path, "a+b") as f:
            f.truncate(size)
            mm = mmap.mmap(f.fileno(), size)
        st = cls(path, mm)
        C.memset(C.addressof(st.s), 0, size)
        st.s.size = size
        st.s.version = layout.LAYOUT_VERSION
        st.s.magic = layout.MAGIC
        return st

    @classmethod
    def open(cls, path: str | os.PathLike) -> "SimState":
        """Map an existing state file; raises ValueError if it is not of this layout."""
        path = Path(path)
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), C.sizeof(State))
        st = cls(path, mm)
        if st.s.magic != layout.MAGIC or st.s.version != layout.LAYOUT_VERSION:
            raise ValueError(f"{path} is not a gpuobs simulator state file of layout {layout.LAYOUT_VERSION}")
        return st

    def close(self) -> None:
        """Unmap (the file stays for other processes). Views still held elsewhere keep it mapped."""
        del self.s
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a ctypes view; the GC unmaps it later
            pass

    # ---- GPUs --------------------------------------------------------------------------

    def gpu(self, slot: int) -> Gpu:
        """The GPU in a slot (a slot is a physical GPU; its NVML index is its rank among present ones)."""
        if not 0 <= slot < self.s.gpu_slots:
            raise IndexError(f"no GPU slot {slot} (have {self.s.gpu_slots})")
        return self.s.gpus[slot]

    def lose_gpu(self, slot: int, lost: bool = True) -> None:
        """GPU fell off the bus: every call with its handle returns NVML_ERROR_GPU_IS_LOST."""
        self.gpu(slot).lost = int(lost)

    def require_reset(self, slot: int, on: bool = True) -> None:
        """GPU needs a reset: every call with its handle returns NVML_ERROR_RESET_REQUIRED (16).

        Its handle can still be had (lookups by index, UUID, serial or bus id succeed; queries fail);
        to fail handle lookups too, add fail("nvmlDeviceGetHandleByIndex_v2", 16, gpu=slot).
        `on=False` clears it. A lost GPU answers GPU_IS_LOST first.
        """
        self.gpu(slot).reset_required = int(on)

    def remove_gpu(self, slot: int, present: bool = False) -> None:
        """Take a GPU out of the device count (indexes of later GPUs shift down), or put it back."""
        self.gpu(slot).present = int(present)

    def set_name(self, slot: int, raw: bytes) -> None:
        """Set a GPU's name to raw bytes (may be invalid UTF-8, as a corrupted VBIOS string can be)."""
        self.gpu(slot).name.s = raw[: layout.STR_LEN - 1]

    def destroy_migs(self, slot: int, keep: int = 0) -> None:
        """Destroy a GPU's MIG devices from index `keep` on (nvidia-smi mig -dci -dgi): calls on
        their handles answer NVML_ERROR_INVALID_ARGUMENT, their indexes NOT_FOUND. MIG stays on."""
        g = self.gpu(slot)
        if not 0 <= keep <= g.mig_count:
            raise ValueError(f"GPU slot {slot} has {g.mig_count} MIG devices, cannot keep {keep}")
        g.mig_count = keep

    def create_migs(self, slot: int, gpu_instance_ids: list[int],
                    compute_instance_ids: list[int] | None = None) -> list[str]:
        """Create MIG devices at indexes 0.. (nvidia-smi mig -cgi -C) with these GPU instance ids,
        these compute instance ids (default 0 each; a GPU instance listed twice with two compute
        instances is one GPU instance split into compute instances) and new MIG UUIDs, reusing the
        shapes of the scenario's devices at those indexes. Returns the new MIG UUIDs; ValueError past
        the layout's maximum or for lists of different lengths."""
        g = self.gpu(slot)
        if len(gpu_instance_ids) > layout.MAX_MIG:
            raise ValueError(f"at most {layout.MAX_MIG} MIG devices per GPU")
        cis = [0] * len(gpu_instance_ids) if compute_instance_ids is None else list(compute_instance_ids)
        if len(cis) != len(gpu_instance_ids):
            raise ValueError("one compute instance id per GPU instance id")
        uuids = []
        for i, (gi, ci) in enumerate(zip(gpu_instance_ids, cis)):
            m = g.migs[i]
            m.gi_id, m.ci_id = gi, ci
            new = f"MIG-{uuid.uuid4()}"  # a re-created instance has a new UUID, as with the driver
            m.uuid.s = new.encode()
            uuids.append(new)
        g.mig_count = len(gpu_instance_ids)
        return uuids

    # ---- faults ------------------------------------------------------------------------

    def func_id(self, name: str) -> int:
        """Function id of an implemented NVML function; KeyError names the unknown function."""
        try:
            return self._ids[name]
        except KeyError:
            raise KeyError(f"the simulator does not implement {name}") from None

    def fail(self, func: str | None, error: int, gpu: int | None = None, times: int | None = None,
             field: int | None = None, delay_ms: int = 0, hang: bool = False) -> int:
        """Make `func` (None: every function) return `error` (an NVML code; 0 = succeed).

        gpu: one slot or None for all; times: how many calls (None: until clear_fault);
        field: a field id, to fail just that value inside nvmlDeviceGetFieldValues;
        delay_ms: answer only after this long; hang: block callers until clear_fault.
        Returns the fault's index for clear_fault. Raises RuntimeError when the table is full.
        """
        for i, f in enumerate(self.s.faults):
            if f.active:
                continue
            f.func = -1 if func is None else self.func_id(func)
            f.gpu = -1 if gpu is None else gpu
            f.field = -1 if field is None else field
            f.error = error
            f.remaining = -1 if times is None else times
            f.delay_ms = -1 if hang else delay_ms
            f.active = 1
            return i
        raise RuntimeError(f"all {layout.MAX_FAULTS} fault slots are in use")

    def clear_fault(self, index: int) -> None:
        """Remove one fault (a hung call returns at once)."""
        self.s.faults[index].active = 0

    def clear_faults(self) -> None:
        """Remove every fault."""
        for f in self.s.faults:
            f.active = 0

    def fail_init(self, error: int, times: int | None = None) -> None:
        """Make nvmlInit* return `error` (e.g. 9 DRIVER_NOT_LOADED, 18 LIB_RM_VERSION_MISMATCH, 999 UNKNOWN)."""
        self.s.init_error_remaining = -1 if times is None else times
        self.s.init_error = error

    INIT_CALLS = ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags")

    def slow_init(self, delay_ms: int = 0, hang: bool = False, times: int | None = None) -> list[int]:
        """Make every nvmlInit variant answer (successfully) only after `delay_ms`, or, with `hang`,
        block its callers until the faults are cleared: a driver slow to initialise at boot, or a
        wedged GPU that never lets it finish. times: how many inits (None: every one until
        cleared). Returns the fault indices for clear_fault; RuntimeError when the table is full."""
        return [self.fail(name, 0, times=times, delay_ms=delay_ms, hang=hang) for name in self.INIT_CALLS]

    def clear_init_error(self) -> None:
        """nvmlInit succeeds again."""
        self.s.init_error = 0

    def unsupported(self, slot: int, func: str, value: bool = True) -> None:
        """Make one function answer NVML_ERROR_NOT_SUPPORTED for one GPU."""
        self.gpu(slot).unsupported[self.func_id(func)] = int(value)

    def no_permission(self, slot: int | None, func: str) -> int:
        """Make `func` answer NVML_ERROR_NO_PERMISSION (4) for one GPU slot (None: every GPU), as for
        a non-root reader of a root-only value. Returns the fault index for clear_fault."""
        if slot is not None:
            self.gpu(slot)
        return self.fail(func, NO_PERMISSION, gpu=slot)

    # ---- events ------------------------------------------------------------------------

    def queue_event(self, slot: int, event_type: int, data: int = 0,
                    gi_id: int = 0xFFFFFFFF, ci_id: int = 0xFFFFFFFF) -> None:
        """Queue an event for nvmlEventSetWait on the given GPU."""
        head = self.s.event_head
        e = self.s.events[head % layout.MAX_EVENTS]
        e.seq, e.gpu, e.type, e.data, e.gi_id, e.ci_id = head, slot, event_type, data, gi_id, ci_id
        self.s.event_head = head + 1  # published last: readers only look below the head
        _futex_wake(C.addressof(self.s) + State.event_head.offset)  # waiters sleep on the head

    def xid(self, slot: int, code: int, gi: int | None = None, ci: int | None = None) -> None:
        """Queue an XID error (nvmlEventTypeXidCriticalError with eventData = the XID code).

        gi / ci: the MIG GPU instance / compute instance the XID is attributed to, which
        nvmlEventSetWait_v2 reports as gpuInstanceId / computeInstanceId (None: 0xFFFFFFFF, not
        attributable, as for a whole-GPU XID); the event's device is the physical GPU either way.
        nvmlEventSetWait (v1) has no such fields.
        """
        if ci is not None and gi is None:
            raise ValueError("a compute instance id needs its GPU instance id (gi)")
        self.queue_event(slot, EVENT_XID, code, NO_INSTANCE if gi is None else gi,
                         NO_INSTANCE if ci is None else ci)

    # ---- call accounting ---------------------------------------------------------------

    def calls(self) -> dict[str, int]:
        """Calls per NVML function since the last reset, across every process using this state."""
        return {name: self.s.calls[i] for name, i in self._ids.items() if self.s.calls[i]}

    def set_call_latency(self, microseconds: int) -> None:
        """Make every NVML call (of every process using this state) answer after `microseconds`,
        asleep, as a real driver's calls take time; 0: at once (the default)."""
        if not 0 <= microseconds < 2 ** 31:
            raise ValueError(f"call latency must be 0 to 2^31-1 microseconds, got {microseconds}")
        self.s.call_latency_us = microseconds

    def reset_calls(self) -> None:
        """Zero every call counter."""
        for i in range(layout.MAX_FUNCS):
            self.s.calls[i] = 0
