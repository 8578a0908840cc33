"""MIG: mode (current and pending), and per MIG device its GPU/compute instance ids, profile, memory,
BAR1, SM count and GPM activity.
Device-level values stay on the physical GPU's series only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx, Needs, register
from .gpm import Gpm
from .memory import memory_any

# NVML codes of a call on the handle of a MIG device destroyed since it was listed (or of any MIG
# handle once MIG mode is off): the listing is stale
GONE = (N.NVML_ERROR_NOT_FOUND, N.NVML_ERROR_INVALID_ARGUMENT)

# (MIG handle, (GPU instance id, compute instance id), MIG UUID, profile)
MigDevice = tuple[object, tuple[str, str], str, str]


def _enumerate(gpu: GpuCtx, st: "MigState") -> list[MigDevice]:
    """The MIG devices of one GPU: per index its handle and MIG UUID; the instance ids and profile
    only for a UUID not seen at the previous enumeration (a device keeps them for its life: a
    re-created instance has a new UUID). The GPU's own labels are not kept here: its index can shift
    between samples."""
    if st.max_devices is None:  # fixed by the GPU model
        st.max_devices = gpu.get(N.nvmlDeviceGetMaxMigDeviceCount)
    known = {mig_uuid: (ids, profile) for _, ids, mig_uuid, profile in st.devices}
    out = []
    for i in range(st.max_devices or 0):
        handle = gpu.get(N.nvmlDeviceGetMigDeviceHandleByIndex, i, variant=str(i), expected=(N.NVML_ERROR_NOT_FOUND,))
        if handle is None:
            continue  # NOT_FOUND: no device at this index (indexes can be sparse): an answer, not an error
        call = gpu.session.call
        try:
            mig_uuid = call(N.nvmlDeviceGetUUID, handle)
            if mig_uuid in known:
                ids, profile = known[mig_uuid]
            else:
                ids = (str(call(N.nvmlDeviceGetGpuInstanceId, handle)),
                       str(call(N.nvmlDeviceGetComputeInstanceId, handle)))
                name = call(N.nvmlDeviceGetName, handle)
                profile = name.rsplit(" MIG ", 1)[-1] if " MIG " in name else ""
        except (N.NVMLError, UnicodeDecodeError):
            continue
        out.append((handle, ids, mig_uuid, profile))
    return out


_UNREAD = object()  # MIG mode not read yet for this GPU


@dataclass
class MigState:
    """Per-GPU MIG state: the mode (1 on, 0 off, None unanswered; _UNREAD before the first listing) and the
    pending mode, the listed devices with their BAR1 and SM-count extras, and the GONE bookkeeping."""
    mode: object = _UNREAD  # 1: MIG on, 0: off, None: the GPU did not answer
    pending: int | None = None  # the mode after the next GPU reset
    max_devices: int | None = None  # nvmlDeviceGetMaxMigDeviceCount (None: not answered yet)
    devices: list[MigDevice] = field(default_factory=list)  # enumerated when the mode is read
    # per device (by its instance ids), read with the enumeration: BAR1 info and SM count (or None)
    extras: dict[tuple[str, str], tuple[Any, int | None]] = field(default_factory=dict)
    sms: dict[str, int | None] = field(default_factory=dict)  # MIG UUID -> SM count (fixed by its profile)
    relisted: int = 0  # listings made at once because a listed handle was gone
    trusted: set[str] = field(default_factory=set)  # MIG UUIDs listed again after a GONE answer: still there


def _extras(gpu: GpuCtx, devices: list[MigDevice], st: MigState) -> dict[tuple[str, str], tuple[Any, int | None]]:
    """(nvmlBAR1Memory_t, SM count) per MIG device, each None where the device does not answer; BAR1
    read on slow samples (its use moves slowly), the SM count once per device (fixed by the profile)."""
    out: dict[tuple[str, str], tuple[Any, int | None]] = {}
    sms: dict[str, int | None] = {}
    for handle, ids, mig_uuid, _ in devices:
        if not gpu.serves(c.MIG_SMS) and not gpu.serves(c.MIG_BAR1_USED):  # detail: no call by default
            out[ids] = (None, None)
            continue
        if mig_uuid in st.sms:
            sms[mig_uuid] = st.sms[mig_uuid]
        else:
            attrs = gpu.get(N.nvmlDeviceGetAttributes_v2, handle=handle, variant="mig")
            sms[mig_uuid] = None if attrs is None else attrs.multiprocessorCount
        out[ids] = (gpu.get(N.nvmlDeviceGetBAR1MemoryInfo, handle=handle, variant="mig"), sms[mig_uuid])
    st.sms = sms
    return out


@register("mig", uses=("gpm",))
class Mig(Family):
    """Reads the mode and enumerates the MIG devices on slow samples, and again at once when a
    listed MIG handle answers as a destroyed device does (GONE: a reconfiguration between
    listings), so that no later call uses a handle of the old listing. With the gpm family on, also
    samples GPM per GPU instance through it (its support probe and sample buffers)."""
    State = MigState

    def __init__(self, gpm: Gpm | None = None):
        super().__init__()
        self.gpm = gpm

    @classmethod
    def build(cls, needs: Needs) -> "Mig":
        """The family for the exporter, sampling GPM per GPU instance through the gpm family when it is built."""
        gpm = needs.built.get("gpm")
        return cls(gpm=gpm if isinstance(gpm, Gpm) else None)

    def devices(self, gpu: GpuCtx) -> list[MigDevice] | None:
        """The GPU's MIG devices as of this pass; None when the GPU is not in MIG mode."""
        st = self.state(gpu)
        return st.devices if st.mode == 1 else None

    def listed(self, uuid: str) -> list[MigDevice]:
        """The MIG devices of the GPU with this UUID as of its last listing ([] when it is not in MIG
        mode or not listed yet). Safe from another thread (the XID watcher's): it makes no state and
        no NVML call, and a listing replaces the list whole."""
        st = self._states.get(uuid)
        return list(st.devices) if st is not None and st.mode == 1 else []

    def collect(self, gpu: GpuCtx) -> None:
        """Lists the MIG devices on slow samples (and on the first pass), then emits c.MIG_MODE, c.MIG_PENDING
        and each device's memory, BAR1, SM count and GPM series; a handle found gone drops what this pass emitted from
        the old listing, lists again at once and emits from the new one."""
        st = self.state(gpu)
        if gpu.slow or st.mode is _UNREAD:
            self._list(gpu, st)
        mark = len(gpu.out)
        if self._emit(gpu, st):
            return
        # A MIG handle of the last listing is gone (instances destroyed, or MIG turned off, since
        # then): drop what this pass emitted from that listing, list again at once, and use only
        # the new handles. A device the new listing still has answered so as a matter of course
        # (trusted): its reads go on without one.
        del gpu.out[mark:]
        before = {d[2] for d in st.devices}
        self.relist(gpu)
        if {d[2] for d in st.devices} == before:  # the same devices: the driver answers so, no reconfiguration
            st.trusted = before
        self._emit(gpu, st)

    def relist(self, gpu: GpuCtx) -> None:
        """List the GPU's MIG devices again now: a caller (the processes family) found a handle of
        the current listing gone (GONE), so no later call uses it."""
        st = self.state(gpu)
        st.relisted += 1
        self._list(gpu, st)

    @staticmethod
    def gone(gpu: GpuCtx) -> bool:
        """True when the last call of gpu.get() failed as a call on a destroyed MIG device does."""
        return gpu.last_error in GONE

    def _list(self, gpu: GpuCtx, st: MigState) -> None:
        """Read the mode and enumerate the MIG devices (fresh handles) and their slow extras."""
        modes = gpu.get(N.nvmlDeviceGetMigMode)
        mode = None if modes is None else modes[0]
        if st.mode is not _UNREAD and mode != st.mode:
            # MIG toggled: what the GPU answered before (NOT_SUPPORTED in one mode) may differ now
            gpu.session.forget(gpu.uuid)
        st.mode, st.pending = mode, None if modes is None else modes[1]
        st.devices = _enumerate(gpu, st) if mode == 1 else []
        st.extras = _extras(gpu, st.devices, st)

    def _emit(self, gpu: GpuCtx, st: MigState) -> bool:
        """Emit the mode and each listed device's series; False as soon as a device's handle is
        gone (its memory read fails with a GONE code, and a listing since did not find the device
        still there), with no further call on any listed handle."""
        gpu.emit(c.MIG_MODE, st.mode if isinstance(st.mode, int) else None)  # _list ran: an int or None
        gpu.emit(c.MIG_PENDING, st.pending)
        gpm = self.gpm if self.gpm is not None and self.gpm.supported(gpu) else None
        for handle, ids, mig_uuid, profile in st.devices:
            labels = gpu.labels + ids  # this sample's index, not the one seen at enumeration
            gpu.last_error = None
            mem = memory_any(gpu, handle, variant="mig")
            if mem is None and self.gone(gpu) and mig_uuid not in st.trusted:
                return False
            gpu.emit(c.MIG_INFO, 1, mig_uuid, profile, labels=labels)
            if mem is not None:
                gpu.emit(c.MIG_MEMORY_TOTAL, mem.total, labels=labels)
                gpu.emit(c.MIG_MEMORY_USED, mem.used, labels=labels)
            bar1, sms = st.extras.get(ids, (None, None))
            if bar1 is not None:
                gpu.emit(c.MIG_BAR1_TOTAL, bar1.bar1Total, labels=labels)
                gpu.emit(c.MIG_BAR1_USED, bar1.bar1Used, labels=labels)
            gpu.emit(c.MIG_SMS, sms, labels=labels)
            if gpm is not None:
                gpm.sample(gpu, int(labels[2]), c.MIG_GPM_METRICS, labels)
        return True
