"""XID events, on their own thread: an NVML event set waits for nvmlEventTypeXidCriticalError and
counts each event once per GPU and XID code. Exported as counters plus a last-seen time, so alerts
on increase() resolve, unlike a last-value gauge."""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time

import pynvml as N

from .. import catalog as c
from ..nvml import Session
from .base import Family, GpuCtx, Sample

log = logging.getLogger("gpuobs.xid")


def _addr(handle) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """Waits on an event set in a daemon thread. `register(uuid, handle)` adds GPUs as the sampler
    sees them; counts survive NVML re-initialisation (the set is rebuilt)."""

    def __init__(self, session: Session, wait_ms: int = 500):
        self.session = session
        self.wait_ms = wait_ms
        self.counts: collections.Counter[tuple[str, int]] = collections.Counter()
        self.last_seen: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._handles: dict[str, object] = {}
        self._registered: set[str] = set()
        self._set = None
        self._sync_lock = threading.Lock()  # event set and registrations: watcher and sampler threads
        self._generation = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuobs-xid", daemon=True)

    def start(self) -> "XidWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.wait_ms / 1000 + 0.5)

    def register(self, uuid: str, handle: object) -> None:
        """Watch this GPU (called by the sampler for every GPU it sees). A new GPU is registered at
        once, on the caller's thread, so that no XID is missed while the watcher waits."""
        with self._lock:
            new = self._handles.get(uuid) is not handle
            self._handles[uuid] = handle
        if new and self.session.up:
            try:
                self._sync()
            except N.NVMLError as e:
                log.warning("cannot create the XID event set", extra={"error": str(e)})

    def _sync(self) -> None:
        with self._sync_lock:
            if self.session.generation != self._generation:  # NVML re-initialised: set and handles are void
                self._free_set()
                self._registered = set()
                self._generation = self.session.generation
            if self._set is None:
                self._set = self.session.call("nvmlEventSetCreate", N.nvmlEventSetCreate)
            self._register_pending()

    def _free_set(self) -> None:
        old, self._set = self._set, None
        if old is not None:
            try:
                N.nvmlEventSetFree(old)
            except N.NVMLError:
                pass  # already void after re-initialisation

    def _register_pending(self) -> None:
        with self._lock:
            pending = [(u, h) for u, h in self._handles.items() if u not in self._registered]
        for uuid, handle in pending:
            try:
                self.session.call("nvmlDeviceRegisterEvents", N.nvmlDeviceRegisterEvents, handle,
                                  N.nvmlEventTypeXidCriticalError, self._set)
            except N.NVMLError as e:
                log.warning("cannot watch XID events", extra={"uuid": uuid, "error": str(e)})
            self._registered.add(uuid)  # registered or unsupported: do not retry every loop

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.session.up:
                self._stop.wait(0.5)
                continue
            try:
                self._sync()
                event = N.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except N.NVMLError_Timeout:
                continue
            except N.NVMLError as e:
                log.warning("xid event wait failed", extra={"error": str(e)})
                with self._sync_lock:
                    self._free_set()
                    self._registered = set()
                self._stop.wait(0.5)
                continue
            if event.eventType & N.nvmlEventTypeXidCriticalError:
                self._record(event)

    def _record(self, event) -> None:
        try:
            uuid = self.session.call("nvmlDeviceGetUUID", N.nvmlDeviceGetUUID, event.device)
        except (N.NVMLError, UnicodeDecodeError):
            with self._lock:  # a lost GPU's handle may not answer: find it among ours
                uuid = next((u for u, h in self._handles.items() if _addr(h) == _addr(event.device)), "")
        key = (uuid, int(event.eventData))
        with self._lock:
            self.counts[key] += 1
            self.last_seen[key] = time.time()
        log.error("xid error", extra={"uuid": uuid, "xid": key[1]})

    def totals(self) -> list[tuple[str, int, int, float]]:
        """[(uuid, xid, count, last seen unix time)]."""
        with self._lock:
            return [(u, x, n, self.last_seen[(u, x)]) for (u, x), n in self.counts.items()]


class Xid(Family):
    """Registers each GPU with the watcher, and exports its counters for every GPU ever seen: an
    XID 79 arrives as its GPU falls off the bus, and must stay visible while the GPU is lost."""
    name = "xid"

    def __init__(self, watcher: XidWatcher):
        self.watcher = watcher

    def collect(self, gpu: GpuCtx) -> None:
        self.watcher.register(gpu.uuid, gpu.handle)

    def node_samples(self, known: dict[str, int]) -> list[Sample]:
        out = []
        for uuid, xid, count, seen in self.watcher.totals():
            labels = (str(known.get(uuid, "")), uuid, str(xid))
            out += [Sample(c.XID_ERRORS, labels, float(count)), Sample(c.XID_LAST_SEEN, labels, seen)]
        return out
