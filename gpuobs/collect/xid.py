"""XID events, on their own thread: an NVML event set waits for nvmlEventTypeXidCriticalError and
counts each event once per GPU, XID code and MIG instance (with the MIG UUID the instance had when
the event came, from the mig family's listing, so that attribution finds the pod holding it).
Exported as counters plus a last-seen time, so alerts on increase() resolve, unlike a last-value gauge.

The thread reports its own health (gpuobs_exporter_xid_watcher_up, ..._errors_total{code}), is
restarted by the sampler (through Xid.node_samples) when it dies, and rate-limits its logs."""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from typing import Any, Callable

import pynvml as N

from .. import catalog as c
from ..nvml import Session, code_name
from .base import Family, GpuCtx, LogLimiter, Needs, Sample, register
from .mig import Mig, MigDevice

log = logging.getLogger("gpuobs.xid")

NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event that names no MIG instance
RESTARTED = "restarted"  # XID_WATCHER_ERRORS code of a restart by supervision


def _addr(handle: Any) -> int | None:
    """The address a pynvml device handle points at: two handles of one GPU compare equal by it."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def _instance_id(event: Any, name: str) -> str:
    """A MIG instance id of an event as a label value: '' when it names none (or the event is a v1
    event, which has no such field)."""
    value = getattr(event, name, None)
    return "" if value is None or int(value) == NO_ID else str(int(value))


def mig_uuid_of(devices: list[MigDevice], gi: str, ci: str) -> str:
    """The MIG UUID label of an XID naming GPU instance `gi` and compute instance `ci` (label
    values, '' when the event names none), among a GPU's listed MIG devices: the device with both
    ids; for an event naming only a GPU instance, the UUIDs of all its compute instances' devices,
    by compute instance id, joined with commas (one series per event, so sums count it once); ''
    when it names no GPU instance or no listed device matches (e.g. created since the last listing)."""
    if not gi:
        return ""
    if ci:
        return next((mig for _, ids, mig, _ in devices if ids == (gi, ci)), "")
    found = sorted((int(ids[1]), mig) for _, ids, mig, _ in devices if ids[0] == gi and ids[1].isdigit())
    return ",".join(mig for _, mig in found)


class _EventDataV1(ctypes.Structure):
    """nvmlEventData_t before NVML 11 (nvmlEventSetWait): no MIG instance ids."""
    _fields_ = [("device", N.c_nvmlDevice_t),
                ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong)]


def wait_v1(event_set: Any, timeout_ms: int) -> _EventDataV1:
    """nvmlEventSetWait, the pre-v2 call, made directly: recent pynvml maps its nvmlEventSetWait onto
    nvmlEventSetWait_v2, which is exactly what an older driver lacks. Raises NVMLError as pynvml does."""
    fn = N._nvmlGetFunctionPointer("nvmlEventSetWait")
    data = _EventDataV1()
    N._nvmlCheckReturn(fn(event_set, ctypes.byref(data), ctypes.c_uint(timeout_ms)))
    return data


class XidWatcher:
    """Waits on an event set in a daemon thread. `register(uuid, handle)` adds GPUs as the sampler
    sees them; counts survive NVML re-initialisation (the set is rebuilt).

    For the sampler (through the Xid family): register(), supervise() (restart a dead thread, with
    back-off), up (health), errors() (error counts by code), totals() (the XID counts).
    """

    def __init__(self, session: Session, wait_ms: int = 500, retry_s: float = 0.5, retry_max_s: float = 5.0,
                 restart_backoff_s: float = 1.0, restart_backoff_max_s: float = 60.0,
                 log_every_s: float = 60.0, xid_logs_per_window: int = 100,
                 clock: Callable[[], float] = time.monotonic):
        self.session = session
        self.wait_ms = wait_ms
        self.retry_s, self.retry_max_s = retry_s, retry_max_s  # after a failed create/wait, doubling
        self.restart_backoff_s, self.restart_backoff_max_s = restart_backoff_s, restart_backoff_max_s
        self._clock = clock
        # key: (GPU UUID, XID, GPU instance id, compute instance id, MIG UUID(s))
        self.counts: collections.Counter[tuple[str, int, str, str, str]] = collections.Counter()
        self.last_seen: dict[tuple[str, int, str, str, str], float] = {}
        # (GPU UUID, gi, ci) -> MIG UUID label (mig_uuid_of); set by the Xid family with the mig family on
        self.resolve_mig: Callable[[str, str, str], str] | None = None
        self._errors: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # counts, errors, handles
        self._handles: dict[str, object] = {}
        self._registered: set[str] = set()  # attempted in the current set (done, unsupported, or failed)
        self._watched: set[str] = set()  # registered in the current set
        self._retry_at: dict[str, float] = {}  # failed registrations: when to try again
        self._set = None
        self._sync_lock = threading.Lock()  # event set and registrations: watcher and sampler threads
        self._generation = -1
        self._use_v1 = False  # nvmlEventSetWait_v2 missing (older driver or binding): nvmlEventSetWait
        self._failing = False  # the last wait (or the thread) failed; cleared by a wait that returns
        self._failing_since: float | None = None  # clock() of the first failure of the current run of them
        self._last_code = ""  # code of the last failure
        self._delay = retry_s
        self._warn = LogLimiter(log_every_s, 1, clock)
        self._xid_log = LogLimiter(log_every_s, xid_logs_per_window, clock)
        self._stop = threading.Event()
        self._thread_lock = threading.Lock()  # start, stop, supervise
        self._thread: threading.Thread | None = None
        self._started = False
        self._thread_started_at = 0.0
        self._next_restart = 0.0
        self._backoff = restart_backoff_s

    # ---- public surface --------------------------------------------------------------------------

    def start(self) -> "XidWatcher":
        """Starts the event thread once (a second call does nothing) and returns self."""
        with self._thread_lock:
            if not self._started:
                self._started = True
                self._spawn()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread; waits at most `timeout` seconds (default: one wait plus 0.5 s), so a wait
        stuck in NVML does not hold up shutdown (the thread is a daemon)."""
        self._stop.set()
        with self._thread_lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=self.wait_ms / 1000 + 0.5 if timeout is None else timeout)

    @property
    def alive(self) -> bool:
        """The thread runs (started, not stopped, not dead)."""
        t = self._thread
        return t is not None and t.is_alive() and not self._stop.is_set()

    @property
    def up(self) -> bool:
        """Healthy: the thread is alive and waits on a valid event set with at least one GPU
        registered, and its last wait did not fail."""
        return (self.alive and self.session.up and self._set is not None and bool(self._watched)
                and not self._failing)

    def down_reason(self, grace: float) -> str:
        """Why the watcher cannot be relied on, for readiness: "dead" while its thread (started, not
        stopped) is not running, "failing (<code>) for <n>s" once its create/wait calls have failed
        without a good wait in between for more than `grace` seconds; "" otherwise (NVML down is
        not its failure: it then waits for NVML)."""
        with self._thread_lock:
            thread, started = self._thread, self._started
        if started and not self._stop.is_set() and (thread is None or not thread.is_alive()):
            return f"dead ({self._last_code or 'thread ended'})"
        since = self._failing_since
        if self._failing and since is not None and self._clock() - since > grace:
            return f"failing ({self._last_code}) for {self._clock() - since:.1f}s"
        return ""

    def supervise(self) -> bool:
        """Restart the thread if it died (a new Thread), at once the first time, then after a back-off
        doubling from restart_backoff_s to restart_backoff_max_s (reset once a thread has lived that
        long); counted as code 'restarted'. True if it restarted it. Cheap: call it every pass."""
        with self._thread_lock:
            if not self._started or self._stop.is_set() or self._thread is None:
                return False
            now = self._clock()
            if self._thread.is_alive():
                if now - self._thread_started_at >= self.restart_backoff_max_s:
                    self._backoff = self.restart_backoff_s
                return False
            if now < self._next_restart:
                return False
            self._next_restart = now + self._backoff
            self._backoff = min(self._backoff * 2, self.restart_backoff_max_s)
            self._count(RESTARTED)
            self._warning("xid watcher thread died: restarting it", RESTARTED)
            self._spawn()
            return True

    def errors(self) -> dict[str, int]:
        """{code: errors}: NVML code names, exception type names, and 'restarted'."""
        with self._lock:
            return dict(self._errors)

    def register(self, uuid: str, handle: object) -> None:
        """Watch this GPU (called by the sampler for every GPU it sees). A new GPU is registered at
        once, on the caller's thread, so that no XID is missed while the watcher waits."""
        with self._lock:
            new = self._handles.get(uuid) is not handle
            self._handles[uuid] = handle
        if new and self.session.up:
            try:
                self._sync()
            except N.NVMLError:
                pass  # counted and logged in _sync

    def totals(self) -> list[tuple[str, int, str, str, str, int, float]]:
        """[(uuid, xid, gpu instance id, compute instance id, MIG UUID(s), count, last seen unix
        time)]; the instance ids are '' when the events named none, the MIG UUIDs '' when no listed
        MIG device matched (see mig_uuid_of)."""
        with self._lock:
            return [key + (n, self.last_seen[key]) for key, n in self.counts.items()]

    # ---- event set -------------------------------------------------------------------------------

    def _sync(self) -> None:
        """Create the set if needed (after re-initialisation, anew) and register pending GPUs.
        Raises NVMLError (counted and logged) when the set cannot be created."""
        with self._sync_lock:
            if self.session.generation != self._generation:  # NVML re-initialised: set and handles are void
                self._free_set()
                self._generation = self.session.generation
                self._use_v1 = False  # probe the v2 call again
            if self._set is None:
                try:
                    self._set = self.session.call(N.nvmlEventSetCreate)
                except N.NVMLError as e:
                    self._failed("cannot create the XID event set", e)
                    raise
            self._register_pending()

    def _free_set(self) -> None:
        old, self._set = self._set, None
        self._registered, self._watched = set(), set()
        self._retry_at.clear()
        if old is not None:
            try:
                N.nvmlEventSetFree(old)
            except N.NVMLError:
                pass  # already void after re-initialisation

    def _register_pending(self) -> None:
        now = self._clock()
        with self._lock:
            pending = [(u, h) for u, h in self._handles.items()
                       if u not in self._registered or (u in self._retry_at and now >= self._retry_at[u])]
        for uuid, handle in pending:
            self._registered.add(uuid)
            self._retry_at.pop(uuid, None)
            try:
                self.session.call(N.nvmlDeviceRegisterEvents, handle, N.nvmlEventTypeXidCriticalError, self._set)
            except N.NVMLError as e:
                self._watched.discard(uuid)
                if e.value != N.NVML_ERROR_NOT_SUPPORTED:  # an answer: not retried in this set
                    self._retry_at[uuid] = now + self.retry_max_s
                self._count(code_name(e))  # health: `up` needs one GPU watched, not every one
                self._warning("cannot watch XID events", code_name(e), uuid=uuid)
            else:
                self._watched.add(uuid)

    # ---- thread ----------------------------------------------------------------------------------

    def _spawn(self) -> None:
        self._thread = threading.Thread(target=self._main, name="gpuobs-xid", daemon=True)
        self._thread_started_at = self._clock()
        self._thread.start()

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - a daemon thread: nothing above it; supervise() restarts it
            self._mark_failing(code_name(e))
            self._count(code_name(e))
            if self._warn.allow(("died", code_name(e))) is not None:
                log.error("xid watcher thread died", exc_info=True, extra={"error": code_name(e)})

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.session.up:
                    self._stop.wait(self.retry_s)
                    continue
                try:
                    self._step()
                except Exception as e:  # noqa: BLE001 - anything else: counted, logged, retried after a pause
                    self._failed("xid watcher failed", e, exc_info=True)
                    self._pause()
        finally:
            if self._stop.is_set():  # stopped: give the driver its event set back (a restarted thread reuses it)
                with self._sync_lock:
                    self._free_set()

    def _step(self) -> None:
        """Sync the set, wait once, and record what came."""
        try:
            self._sync()
        except N.NVMLError:  # counted and logged in _sync
            self._pause()
            return
        try:
            event = self._wait()
        except N.NVMLError_Timeout:
            self._ok()
            return
        except N.NVMLError as e:
            self._failed("xid event wait failed", e)
            with self._sync_lock:  # build the set anew: it may be what is broken
                self._free_set()
            self._pause()
            return
        self._ok()
        if event.eventType & N.nvmlEventTypeXidCriticalError:
            self._record(event)

    def _wait(self) -> Any:
        """One wait on the set with nvmlEventSetWait_v2, else (FUNCTION_NOT_FOUND: an older driver or
        binding) with nvmlEventSetWait from then on; its events carry no MIG instance ids."""
        if not self._use_v1:  # (a binding without the v2 call has gpuobs.nvml's stub answering the same)
            try:
                return N.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except N.NVMLError as e:
                if e.value != N.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
            self._use_v1 = True
            self.session.mark_unavailable("", "nvmlEventSetWait_v2", "nvmlEventSetWait_v2",
                                          N.NVML_ERROR_FUNCTION_NOT_FOUND)  # exported as an unavailable call
            log.info("nvmlEventSetWait_v2 not available: using nvmlEventSetWait (XIDs without MIG instance ids)")
        return wait_v1(self._set, self.wait_ms)

    def _ok(self) -> None:
        self._failing, self._failing_since = False, None
        self._delay = self.retry_s

    def _mark_failing(self, code: str) -> None:
        self._last_code = code
        if not self._failing or self._failing_since is None:
            self._failing_since = self._clock()
        self._failing = True

    def _pause(self) -> None:
        self._stop.wait(self._delay)
        self._delay = min(self._delay * 2, self.retry_max_s)

    def _failed(self, message: str, err: BaseException, exc_info: bool = False, **extra: Any) -> None:
        """Count an error by code, mark the watcher failing, and log it (rate-limited per code)."""
        self._mark_failing(code_name(err))
        self._count(code_name(err))
        self._warning(message, code_name(err), exc_info=exc_info, **extra)

    def _count(self, code: str) -> None:
        with self._lock:
            self._errors[code] += 1

    def _warning(self, message: str, code: str, exc_info: bool = False, **extra: Any) -> None:
        """At most one record per message and code a minute; the next says how many were left out."""
        suppressed = self._warn.allow((message, code))
        if suppressed is None:
            return
        extra["error"] = code
        if suppressed:
            extra["suppressed"] = suppressed
        log.warning(message + (f" ({suppressed} similar left out)" if suppressed else ""),
                    exc_info=exc_info, extra=extra)

    def _mig_uuid(self, uuid: str, gi: str, ci: str) -> str:
        """resolve_mig's answer; '' without one, or when it fails (counted: the event is still counted)."""
        resolve = self.resolve_mig
        if resolve is None or not gi:
            return ""
        try:
            return resolve(uuid, gi, ci)
        except Exception as e:  # noqa: BLE001 - never lose the XID over its label
            self._count(code_name(e))
            self._warning("cannot find the MIG device of an XID", code_name(e), uuid=uuid)
            return ""

    def _record(self, event: Any) -> None:
        try:
            uuid = self.session.call(N.nvmlDeviceGetUUID, event.device)
        except (N.NVMLError, UnicodeDecodeError):
            with self._lock:  # a lost GPU's handle may not answer: find it among ours
                uuid = next((u for u, h in self._handles.items() if _addr(h) == _addr(event.device)), "")
        gi, ci = _instance_id(event, "gpuInstanceId"), _instance_id(event, "computeInstanceId")
        key = (uuid, int(event.eventData), gi, ci, self._mig_uuid(uuid, gi, ci))
        with self._lock:
            self.counts[key] += 1
            self.last_seen[key] = time.time()
        suppressed = self._xid_log.allow("xid error")  # the event itself; bounded against a flood
        if suppressed is not None:
            extra = {"uuid": uuid, "xid": key[1], "gpu_instance_id": gi, "compute_instance_id": ci, "mig_uuid": key[4]}
            if suppressed:
                extra["suppressed"] = suppressed
            log.error("xid error" + (f" ({suppressed} more left out)" if suppressed else ""), extra=extra)


@register("xid", uses=("mig",), needs_watcher=True)
class Xid(Family):
    """Registers each GPU with the watcher, and exports its counters for every GPU ever seen: an
    XID 79 arrives as its GPU falls off the bus, and must stay visible while the GPU is lost. Also
    the watcher's health, and restarts its thread if it died. With the mig family on, the watcher
    labels an XID naming a MIG instance with its MIG UUID from that family's last listing."""

    def __init__(self, watcher: XidWatcher, mig: Mig | None = None):
        super().__init__()
        self.watcher = watcher
        self.mig = mig
        if mig is not None:
            watcher.resolve_mig = self.mig_uuid

    @classmethod
    def build(cls, needs: Needs) -> "Xid | None":
        """None without a watcher: the family is then left out."""
        mig = needs.built.get("mig")
        return cls(needs.watcher, mig=mig if isinstance(mig, Mig) else None) if needs.watcher is not None else None

    def mig_uuid(self, uuid: str, gi: str, ci: str) -> str:
        """The MIG UUID label of an XID of GPU `uuid` naming instances gi/ci (mig_uuid_of), from the
        mig family's last listing of that GPU; called on the watcher's thread."""
        return mig_uuid_of(self.mig.listed(uuid) if self.mig is not None else [], gi, ci)

    def collect(self, gpu: GpuCtx) -> None:
        """Registers the GPU's handle with the watcher (its event set waits on every registered GPU); no NVML call."""
        self.watcher.register(gpu.uuid, gpu.handle)

    def node_samples(self, known: dict[str, int]) -> list[Sample]:
        """c.XID_ERRORS and c.XID_LAST_SEEN (unix seconds) per GPU, XID and MIG instance ever seen, and the
        watcher's health (c.XID_WATCHER_UP, c.XID_WATCHER_ERRORS by code). Restarts the thread first if it died."""
        self.watcher.supervise()
        out = []
        for uuid, xid, gi, ci, mig, count, seen in self.watcher.totals():
            labels = (str(known.get(uuid, "")), uuid, str(xid), gi, ci, mig)
            out += [Sample(c.XID_ERRORS, labels, float(count)), Sample(c.XID_LAST_SEEN, labels, seen)]
        out.append(Sample(c.XID_WATCHER_UP, (), float(self.watcher.up)))
        out += [Sample(c.XID_WATCHER_ERRORS, (code,), float(n)) for code, n in sorted(self.watcher.errors().items())]
        return out
