"""A logging handler that ships structured records to Fluentd over the forward protocol, with
fluent-logger's sender doing the wire work (msgpack packing, connection, reconnect buffer).

What a training loop needs from it, and how it is done:

* `emit()` never blocks and never raises: the record is packed on the caller's thread (a snapshot
  of its `extra` values) and offered to a bounded queue with `put_nowait`; when the queue is full
  the *newest* record is dropped and counted (the queued, older records keep the start of an
  incident). A sender thread drains the queue in batches into one socket write.
* Nothing is lost silently: `dropped` counts records refused by the full queue, records that could
  not be packed, and records given up by the sender (its reconnect buffer overflowed, or still
  unsent at close).
* Connect timeout and reconnect back-off (50 ms doubling to 2 s) so a down or black-holed Fluentd
  costs the sender thread little; a send timeout so a Fluentd that stops reading cannot wedge it.
* `close()` (and `flush()`) wait a bounded time, then abandon the daemon sender thread.
* Fork safety (DataLoader workers): an `os.register_at_fork` hook makes the child forget the
  parent's queue, thread and socket without touching their locks (the parent's sender thread may
  hold them at fork time); the child starts its own sender on its first record. In a
  multiprocessing child the queue is flushed at the child's exit; after a bare `os.fork()` call
  `flush()` before `os._exit()`.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable

import msgpack
from fluent import sender as fluent_sender

from ..instrument.env import RunEnv
from .fields import ContextFilter, RecordFormatter

DEFAULT_PORT = 24224
_STOP = object()
_BATCH_RECORDS = 512
_BATCH_BYTES = 256 * 1024
_HANDLERS: "weakref.WeakSet[FluentdHandler]" = weakref.WeakSet()


def parse_address(address: str) -> tuple[str, int]:
    """'host:port', 'host' (port 24224), '[::1]:24224' or 'unix:///path' -> (host, port)."""
    address = address.strip()
    if address.startswith("unix://"):
        return address, 0
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else DEFAULT_PORT
    if address.count(":") == 1:
        host, port = address.split(":")
        return host or "localhost", int(port)
    return address, DEFAULT_PORT


def address_from_env(env: dict[str, str] | None = None) -> str | None:
    """GPUOBS_FLUENTD ('host:port'), else FLUENTD_HOST with FLUENTD_PORT (default 24224)."""
    env = os.environ if env is None else env
    if env.get("GPUOBS_FLUENTD"):
        return env["GPUOBS_FLUENTD"]
    if env.get("FLUENTD_HOST"):
        host = env["FLUENTD_HOST"]
        return f"[{host}]:{env.get('FLUENTD_PORT') or DEFAULT_PORT}" if ":" in host else \
            f"{host}:{env.get('FLUENTD_PORT') or DEFAULT_PORT}"
    return None


def _coerce(obj: Any) -> Any:
    """msgpack fallback for values it cannot pack (sets, paths, objects): their str()."""
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    return str(obj)


class _Sender(fluent_sender.FluentSender):
    """fluent-logger's synchronous sender, used from one thread only, with a separate connect
    timeout, reconnect back-off, and a count of the records in its reconnect buffer so that the
    records it gives up are counted."""

    def __init__(self, host: str, port: int, timeout: float, connect_timeout: float, bufmax: int,
                 on_lost: Callable[[int], None]):
        super().__init__("", host=host, port=port, bufmax=bufmax, timeout=timeout,
                         buffer_overflow_handler=self._overflowed)
        self.connect_timeout = connect_timeout
        self.records_pending = 0  # records in self.pendings (the reconnect buffer)
        self._on_lost = on_lost
        self._retry_at = 0.0
        self._backoff = 0.0

    def deliver(self, data: bytes, n: int) -> bool:
        """Send n packed records (plus any earlier unsent ones); keep them for a retry on failure."""
        self.records_pending += n
        try:
            ok = self._send_internal(data)
        except Exception:  # not an OSError: give these records up rather than the thread
            self.discard()
            return False
        if ok:
            self.records_pending = 0
        return ok

    def retry_now(self) -> None:
        self._retry_at = 0.0

    def discard(self) -> None:
        """Give up the reconnect buffer (counted) and close the connection."""
        lost, self.records_pending, self.pendings = self.records_pending, 0, None
        if lost:
            self._on_lost(lost)
        self._close()

    def _overflowed(self, _pendings: bytes) -> None:
        lost, self.records_pending = self.records_pending, 0
        if lost:
            self._on_lost(lost)

    def _reconnect(self) -> None:
        if self.socket:
            return
        now = time.monotonic()
        if now < self._retry_at:
            raise OSError(errno.ECONNREFUSED, "fluentd unreachable; waiting before reconnecting")
        try:
            if self.host.startswith("unix://"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(self.connect_timeout)
                    sock.connect(self.host[len("unix://"):])
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self._backoff = min(max(self._backoff * 2, 0.05), 2.0)
            self._retry_at = now + self._backoff
            raise
        sock.settimeout(self.timeout)
        self._backoff = 0.0
        self.socket = sock


class _Pipe:
    """One process's bounded queue, sender thread and connection."""

    def __init__(self, host: str, port: int, maxsize: int, timeout: float, connect_timeout: float,
                 bufmax: int, on_lost: Callable[[int], None]):
        self.queue: queue.Queue = queue.Queue(maxsize)
        self.on_lost = on_lost
        self.sender = _Sender(host, port, timeout, connect_timeout, bufmax, on_lost)
        self.abort = False
        self.thread = threading.Thread(target=self._run, name="gpuobs-fluentd", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        q, s = self.queue, self.sender
        try:
            while not self.abort:
                try:
                    item = q.get(timeout=0.5 if s.pendings else None)
                except queue.Empty:  # idle with unsent records: retry them
                    s.deliver(b"", 0)
                    continue
                taken, batch, size, stop = 1, [], 0, item is _STOP
                if not stop:
                    batch.append(item)
                    size = len(item)
                while not stop and len(batch) < _BATCH_RECORDS and size < _BATCH_BYTES:
                    try:
                        item = q.get_nowait()
                    except queue.Empty:
                        break
                    taken += 1
                    if item is _STOP:
                        stop = True
                    else:
                        batch.append(item)
                        size += len(item)
                if batch and not self.abort:
                    s.deliver(b"".join(batch), len(batch))
                elif batch:
                    self.on_lost(len(batch))
                if stop and s.pendings and not self.abort:  # last try for the reconnect buffer
                    s.retry_now()
                    s.deliver(b"", 0)
                for _ in range(taken):
                    q.task_done()
                if stop:
                    break
        finally:
            s.discard()

    def flush(self, timeout: float) -> bool:
        """Wait until the queue is sent (or given up); False if that took longer than timeout."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks:
            if time.monotonic() >= deadline or not self.thread.is_alive():
                return False
            time.sleep(0.002)
        return True

    def close(self, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            if timeout > 0:
                self.queue.put(_STOP, timeout=timeout)
            else:
                self.queue.put_nowait(_STOP)
        except queue.Full:
            pass
        self.thread.join(max(deadline - time.monotonic(), 0.0))
        if self.thread.is_alive():  # Fluentd not reading: give up what is left, do not hang
            self.abort = True
            drained = 0
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    drained += 1
            if drained:
                self.on_lost(drained)
            try:
                self.queue.put_nowait(_STOP)  # wakes the thread if it waits on the queue
            except queue.Full:
                pass


class FluentdHandler(logging.Handler):
    """Ships records to Fluentd (forward protocol) with tag `<tag>.<logger name>`. Each record:
    time, level, logger, pid, message, exc_info/stack_info, every `extra` field, trace_id/span_id of
    the active span, and the run's rank, local_rank, job_id, node and pod (those detected)."""

    def __init__(self, host: str = "localhost", port: int = DEFAULT_PORT, *, tag: str = "gpuobs",
                 queue_maxsize: int = 10_000, timeout: float = 3.0, connect_timeout: float = 1.0,
                 close_timeout: float = 2.0, bufmax: int = 1024 * 1024, env: RunEnv | None = None,
                 level: int = logging.NOTSET):
        super().__init__(level)
        self.host, self.port, self.tag = host, port, tag.rstrip(".")
        self.queue_maxsize = queue_maxsize
        self.timeout, self.connect_timeout, self.close_timeout = timeout, connect_timeout, close_timeout
        self.bufmax = bufmax
        self.setFormatter(RecordFormatter())
        self.addFilter(ContextFilter(env))
        self._pipe: _Pipe | None = None
        self._pid = os.getpid()
        self._closed = False
        self._forked = False
        self._flush_timed_out = False
        self._count_lock = threading.Lock()
        self.dropped_queue_full = 0  # refused by the full queue (newest dropped)
        self.dropped_errors = 0      # could not be packed, or emitted after close
        self.dropped_send = 0        # given up by the sender: reconnect buffer overflow, unsent at close
        _HANDLERS.add(self)

    @classmethod
    def from_address(cls, address: str, **kwargs: Any) -> "FluentdHandler":
        host, port = parse_address(address)
        return cls(host, port, **kwargs)

    # -- counters ---------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Records lost: full queue, packing errors and sender give-ups (this process)."""
        return self.dropped_queue_full + self.dropped_errors + self.dropped_send

    def metrics(self) -> dict[str, int]:
        return {"gpuobs_log_records_dropped_total": self.dropped,
                "gpuobs_log_records_queued": self.queued}

    @property
    def queued(self) -> int:
        pipe = self._pipe
        return pipe.queue.qsize() if pipe is not None and self._pid == os.getpid() else 0

    @property
    def pending_bytes(self) -> int:
        """Bytes held in the sender's reconnect buffer (bounded by about bufmax + one batch)."""
        pipe = self._pipe
        return len(pipe.sender.pendings or b"") if pipe is not None else 0

    def _lost(self, n: int) -> None:
        with self._count_lock:
            self.dropped_send += n

    # -- logging.Handler --------------------------------------------------------------------
    def _ensure_pipe(self) -> _Pipe | None:
        if self._pid != os.getpid():  # forked without the at-fork hook running
            self._after_fork_in_child()
        if self._closed:
            return None
        if self._pipe is None:
            self._pipe = _Pipe(self.host, self.port, self.queue_maxsize, self.timeout,
                               self.connect_timeout, self.bufmax, self._lost)
            if self._forked:
                _flush_at_multiprocessing_exit(self)
        return self._pipe

    def emit(self, record: logging.LogRecord) -> None:
        try:
            pipe = self._pipe
            if pipe is None or self._pid != os.getpid():
                pipe = self._ensure_pipe()
                if pipe is None:  # closed
                    with self._count_lock:
                        self.dropped_errors += 1
                    return
            to_dict = getattr(self.formatter, "to_dict", None)
            if to_dict is not None:
                data = to_dict(record)
            else:  # a plain formatter was set: ship its text as the message
                data = {"time": record.created, "level": record.levelname, "logger": record.name,
                        "message": self.format(record)}
            event_time = fluent_sender.EventTime(record.created)
            tag = f"{self.tag}.{record.name}" if self.tag else record.name
            try:
                packet = msgpack.packb((tag, event_time, data), default=_coerce)
            except Exception:  # e.g. an int beyond 64 bits: strings for all extras
                data = {k: v if isinstance(v, (str, int, float, bool, type(None))) and
                        not (isinstance(v, int) and abs(v) >= 2**63) else repr(v) for k, v in data.items()}
                packet = msgpack.packb((tag, event_time, data))
            try:
                pipe.queue.put_nowait(packet)
            except queue.Full:
                with self._count_lock:
                    self.dropped_queue_full += 1
        except Exception:
            with self._count_lock:
                self.dropped_errors += 1

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (at most timeout, default close_timeout) until queued records are sent."""
        pipe = self._pipe
        if pipe is None or self._pid != os.getpid():
            return True
        ok = pipe.flush(self.close_timeout if timeout is None else timeout)
        self._flush_timed_out = not ok
        return ok

    def close(self) -> None:
        """Send what is queued, waiting at most close_timeout; what is left then is counted dropped."""
        self.acquire()
        try:
            if self._closed:
                return
            self._closed = True
            pipe, self._pipe = self._pipe, None
        finally:
            self.release()
        if pipe is not None and self._pid == os.getpid():
            pipe.close(0.2 if self._flush_timed_out else self.close_timeout)
        super().close()

    def _after_fork_in_child(self) -> None:
        """Forget the parent's queue, thread and socket; their locks are never touched here."""
        old, self._pipe = self._pipe, None
        self._pid = os.getpid()
        self._forked = True
        self._count_lock = threading.Lock()
        self.dropped_queue_full = self.dropped_errors = self.dropped_send = 0
        self._flush_timed_out = False
        sock = old.sender.socket if old is not None else None
        if sock is not None:  # the child's copy of the parent's connection: close it, no shutdown
            try:
                sock.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"<FluentdHandler {self.host}:{self.port} tag={self.tag} dropped={self.dropped}>"


def _at_fork_in_child() -> None:
    for handler in list(_HANDLERS):
        try:
            handler._after_fork_in_child()
        except Exception:
            pass


os.register_at_fork(after_in_child=_at_fork_in_child)


def _flush_at_multiprocessing_exit(handler: FluentdHandler) -> None:
    """multiprocessing children end with os._exit (no atexit, no logging.shutdown): flush there."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    try:
        util.Finalize(handler, handler.flush, exitpriority=0)
    except Exception:
        pass


def records_dropped_total() -> int:
    """Records dropped by all live FluentdHandlers of this process."""
    return sum(h.dropped for h in list(_HANDLERS))


class DroppedRecordsCollector:
    """prometheus_client collector: gpuobs_log_records_dropped_total (register it on a registry)."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("gpuobs_log_records_dropped",
                                  "Log records lost before reaching Fluentd (full queue, send failure)",
                                  value=records_dropped_total())

    def describe(self):
        return []
