"""A logging handler that ships structured records to Fluentd (or Fluent Bit) over the forward
protocol, with at-least-once delivery: a record counts as delivered only when Fluentd has
acknowledged it, and every record that is not acknowledged in time is counted as dropped.

What a training loop needs from it, and how it is done:

* `emit()` never blocks and never raises: the record is packed on the caller's thread (a snapshot
  of its `extra` values) and offered to a bounded queue with `put_nowait`; when the queue is full
  the *newest* record is dropped and counted (the queued, older records keep the start of an
  incident). A sender thread does all the network work.
* Acknowledgements (the forward protocol's `chunk` option): the sender takes up to 512 records
  (at most `bufmax` bytes) off the queue, groups them by tag into PackedForward messages
  `[tag, entries, {"chunk": id, "size": n}]`, and waits for Fluentd's `{"ack": id}` for each, as
  out_forward's `require_ack_response` and Fluent Bit's `Require_ack_response` do. in_forward of
  Fluentd (v0.14.5 and later, v1) and of Fluent Bit answer these. A connection that does not
  acknowledge within `timeout` is closed and the chunk is sent again on a new one (same chunk id),
  with a back-off of 50 ms doubling to 2 s between attempts.
* The bound: every record is acknowledged or counted in `dropped_send` no later than
  `delivery_timeout` (default 2 x `timeout`, so one full attempt and one retry) after its logging
  call, whatever Fluentd does: refuses connections, black-holes them, accepts and never reads (the
  kernel's socket buffers would otherwise take the bytes and hide it), reads and never answers.
  Each socket operation (connect, send, ack wait) is cut to the time left before the oldest
  record's deadline, and records still queued past their deadline are dropped without a send.
  A receiver that does not support acknowledgements therefore gets records that count as dropped:
  there is no unacknowledged mode, because it could not tell a stalled Fluentd from a working one.
* Nothing is lost silently: `dropped_queue_full` (refused by the full queue), `dropped_errors`
  (could not be packed, or logged after close) and `dropped_send` (not acknowledged in time, or
  given up at close) add up to `dropped`; `acknowledged` counts the records Fluentd confirmed.
  `records_dropped_total()` is the process-wide total over all handlers, a counter that never
  decreases (a closed or replaced handler's drops stay in it): the exporter reads it for its
  /metrics, and the training metrics endpoint of `gpuobs.instrument` observes it as
  `gpuobs_telemetry_log_records_dropped_total`, with no code on the user's side.
* `flush(timeout)` waits until the records logged before the call are acknowledged or given up;
  it returns True only if all were acknowledged and nothing was dropped since the previous flush.
* `close()` waits at most `close_timeout`: the sender makes one last attempt (no back-off), and
  if that fails the records still queued are dropped unsent; when close_timeout runs out the
  connection is shut down, which ends a blocked send or ack wait at once, and whatever is left is
  counted dropped.
* Fork safety (DataLoader workers): an `os.register_at_fork` hook makes the child forget the
  parent's queue, thread and socket without touching their locks (the parent's sender thread may
  hold them at fork time); the child starts its own sender on its first record. In a
  multiprocessing child the queue is flushed at the child's exit; after a bare `os.fork()` call
  `flush()` before `os._exit()`.

From fluent-logger this takes the forward protocol's EventTime. Its senders are not used: neither
reads acknowledgements or bounds a send by a deadline, and the async one's queue either blocks the
caller when full or drops the oldest record, with no hook for acknowledged delivery short of
replacing its private send loop. The connection, batching and acknowledgements are done here.
"""

from __future__ import annotations

import base64
import errno
import itertools
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, Mapping

import msgpack
from fluent.sender import EventTime

from .. import catalog as c
from ..runenv import RunEnv
from .fields import ContextFilter, RecordFormatter
from .patterns import PatternFilter

DEFAULT_PORT = 24224
_STOP = object()
_BATCH_RECORDS = 512
_MIN_WAIT = 0.01  # the shortest socket wait, when a deadline is that close
_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 2.0
_HANDLERS: "weakref.WeakSet[FluentdHandler]" = weakref.WeakSet()


class _Totals:
    """Process-wide counts of every FluentdHandler (reset in a forked child)."""
    dropped = 0


_COUNT_LOCK = threading.Lock()  # guards the handlers' counters and _Totals; replaced in a forked child


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


def address_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """GPUOBS_FLUENTD ('host:port'), else FLUENTD_HOST with FLUENTD_PORT (default 24224), from `env`
    (default: the process environment)."""
    values = os.environ if env is None else env
    if values.get("GPUOBS_FLUENTD"):
        return values["GPUOBS_FLUENTD"]
    if values.get("FLUENTD_HOST"):
        host = values["FLUENTD_HOST"]
        port = values.get("FLUENTD_PORT") or DEFAULT_PORT
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return None


def _coerce(obj: Any) -> Any:
    """msgpack fallback for values it cannot pack (sets, paths, objects): their str()."""
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    return str(obj)


class _Chunk:
    """The records of one tag from one batch: one PackedForward message with its own chunk id."""
    __slots__ = ("tag", "entries", "records", "nbytes", "deadline", "id", "done")

    def __init__(self, tag: str, deadline: float):
        self.tag, self.deadline = tag, deadline
        self.entries: list[bytes] = []
        self.records = self.nbytes = 0
        self.id = base64.b64encode(os.urandom(16)).decode("ascii")  # 128-bit unique id, as the spec says
        self.done = False  # acknowledged or counted dropped

    def add(self, entry: bytes) -> None:
        self.entries.append(entry)
        self.records += 1
        self.nbytes += len(entry)

    def message(self) -> bytes:
        return msgpack.packb([self.tag, b"".join(self.entries), {"chunk": self.id, "size": self.records}])


class _Sender:
    """One connection to Fluentd, used from the sender thread only (interrupt() excepted): chunks
    sent with the forward protocol's `chunk` option and their acknowledgements read back, with a
    separate connect timeout and a deadline on every socket operation.

    host: a name or address, or 'unix:///path'; timeout: the most one attempt may take (seconds);
    socket: the open connection, or None."""

    def __init__(self, host: str, port: int, timeout: float, connect_timeout: float):
        self.host, self.port, self.timeout, self.connect_timeout = host, port, timeout, connect_timeout
        self.socket: socket.socket | None = None
        self._unpacker: Any = None

    @staticmethod
    def _left(until: float) -> float:
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError(errno.ETIMEDOUT, "no acknowledgement from Fluentd in time")
        return max(left, _MIN_WAIT)

    def deliver(self, chunks: list[_Chunk], until: float, on_ack: Callable[[_Chunk], None]) -> None:
        """Send the chunks and read acknowledgements until all arrived; on_ack(chunk) for each.
        Raises OSError (TimeoutError at `until`) when some were not acknowledged."""
        sock = self._connection(until)
        waiting: dict[str, _Chunk] = {}
        for chunk in chunks:
            sock.settimeout(self._left(until))
            sock.sendall(chunk.message())  # the timeout bounds the whole call
            waiting[chunk.id] = chunk
        while waiting:
            sock.settimeout(self._left(until))
            data = sock.recv(65536)
            if not data:
                raise OSError(errno.EPIPE, "Fluentd closed the connection")
            self._unpacker.feed(data)
            for reply in self._unpacker:
                ack = reply.get("ack") if isinstance(reply, dict) else None
                acked = waiting.pop(ack, None) if isinstance(ack, str) else None
                if acked is not None:
                    on_ack(acked)

    def _connection(self, until: float) -> socket.socket:
        sock = self.socket
        if sock is not None and self._closed_by_peer(sock):
            self.disconnect()
            sock = None
        if sock is None:
            limit = min(self.connect_timeout, self._left(until))
            if self.host.startswith("unix://"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(limit)
                    sock.connect(self.host[len("unix://"):])
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((self.host, self.port), timeout=limit)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 20)
            self.socket = sock
        return sock

    @staticmethod
    def _closed_by_peer(sock: socket.socket) -> bool:
        """Whether Fluentd closed an idle kept connection (sending on it would cost a round)."""
        try:
            sock.settimeout(0.0)
            return sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def disconnect(self) -> None:
        """Shut the connection down and close it (a later deliver() connects again)."""
        sock, self.socket, self._unpacker = self.socket, None, None
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already reset by the peer
            pass
        try:
            sock.close()
        except OSError:
            pass

    def interrupt(self) -> None:
        """From another thread: end a blocked send or ack wait now (the sender thread then closes)."""
        sock = self.socket
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Pipe:
    """One process's bounded queue, sender thread and connection."""

    def __init__(self, sender: _Sender, maxsize: int, delivery_timeout: float, batch_bytes: int,
                 count: Callable[[str, int], None]):
        self.queue: queue.Queue = queue.Queue(maxsize)
        self.sender = sender
        self.delivery_timeout = delivery_timeout
        self.batch_bytes = max(batch_bytes, 1)
        self.count = count  # count("send", n): given up; count("acked", n): acknowledged
        self.stopping = False  # close() began: one last attempt per batch, no back-off
        self.abort = False     # close() gave up waiting: drop everything now
        self.gave_up = False   # a last attempt failed while stopping: drop the rest unsent
        self.wake = threading.Event()  # ends a back-off pause at close
        self.settled_seq = 0   # records up to this sequence number are acknowledged or dropped
        self.pending_bytes = self.pending_records = 0  # taken off the queue, not yet settled
        self.backoff = 0.0
        self.thread = threading.Thread(target=self._run, name="gpuobs-fluentd", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """The sender thread: take a batch off the queue, settle it, repeat until closed."""
        try:
            while True:
                taken, batch = self._take()
                if not taken:  # stopping and drained
                    return
                try:
                    if batch:
                        self._settle(batch)
                except Exception:  # never end the thread; _settle counted what it did not deliver
                    pass
                finally:
                    if batch:
                        self.settled_seq = max(self.settled_seq, batch[-1][0])
                    for _ in range(taken):
                        self.queue.task_done()
        finally:
            self.sender.disconnect()

    def _take(self) -> tuple[int, list[tuple]]:
        """(queue items taken, the records among them): the first item waited for (not once
        closing), then whatever is queued, up to _BATCH_RECORDS records or batch_bytes bytes.
        (0, []) when closing and the queue is empty."""
        q = self.queue
        try:
            item = q.get_nowait() if self.stopping or self.abort else q.get()
        except queue.Empty:
            return 0, []
        taken, batch, size = 1, [], 0
        while True:
            if item is not _STOP:
                batch.append(item)
                size += len(item[3])
            if len(batch) >= _BATCH_RECORDS or size >= self.batch_bytes:
                return taken, batch
            try:
                item = q.get_nowait()
            except queue.Empty:
                return taken, batch
            taken += 1

    def _settle(self, batch: list[tuple]) -> None:
        """Deliver one batch: returns when each of its records is acknowledged or counted dropped."""
        chunks: dict[str, _Chunk] = {}
        for _seq, born, tag, entry in batch:
            chunk = chunks.get(tag)
            if chunk is None:  # the oldest record of the tag sets the chunk's deadline
                chunk = chunks[tag] = _Chunk(tag, born + self.delivery_timeout)
            chunk.add(entry)
        pending = list(chunks.values())
        self.pending_records, self.pending_bytes = len(batch), sum(c.nbytes for c in pending)
        last_try = False
        try:
            while pending and not self._giving_up(last_try):
                live = self._expire(pending)
                if len(live) < len(pending):  # look at the closing flags again before sending
                    pending = live
                    continue
                last_try = self.stopping
                pending = self._attempt(pending)
        finally:  # what is left was given up
            self._lose([c for c in pending if not c.done])
            self.pending_records = self.pending_bytes = 0

    def _giving_up(self, last_try: bool) -> bool:
        """Whether to stop trying: close() gave up waiting, or, while closing, the last attempt
        (this batch's or an earlier one's) failed."""
        if self.abort or (self.stopping and (last_try or self.gave_up)):
            self.gave_up = self.gave_up or self.stopping
            return True
        return False

    def _expire(self, pending: list[_Chunk]) -> list[_Chunk]:
        """Count the chunks past their delivery deadline dropped; the others."""
        now = time.monotonic()
        self._lose([c for c in pending if c.deadline <= now])
        return [c for c in pending if not c.done]

    def _attempt(self, pending: list[_Chunk]) -> list[_Chunk]:
        """One attempt: send the chunks and wait for their acknowledgements until the send timeout
        or the oldest chunk's deadline. Returns the chunks still unacknowledged; after a failed
        attempt the connection is not used again and a back-off pause follows (none at close)."""
        until = min(time.monotonic() + self.sender.timeout, min(c.deadline for c in pending))
        try:
            self.sender.deliver(pending, until, self._acked)
        except Exception:  # OSError, a timeout, or a reply that is not msgpack
            self.sender.disconnect()
        pending = [c for c in pending if not c.done]
        if not pending:
            self.backoff = 0.0
            return pending
        self.sender.disconnect()  # no ack in time: this connection is not used again
        self.backoff = min(max(self.backoff * 2, _BACKOFF_MIN), _BACKOFF_MAX)
        if not self.stopping:
            pause = min(self.backoff, min(c.deadline for c in pending) - time.monotonic())
            if pause > 0:
                self.wake.wait(pause)
        return pending

    def _acked(self, chunk: _Chunk) -> None:
        chunk.done = True
        self.pending_records -= chunk.records
        self.pending_bytes -= chunk.nbytes
        self.count("acked", chunk.records)

    def _lose(self, chunks: list[_Chunk]) -> None:
        lost = 0
        for chunk in chunks:
            if not chunk.done:
                chunk.done = True
                lost += chunk.records
        if lost:
            self.count("send", lost)

    def wait_settled(self, seq: int, timeout: float) -> bool:
        """Wait until the records numbered below seq are acknowledged or dropped (or nothing is
        queued or in flight); False if that took longer than timeout."""
        deadline = time.monotonic() + timeout
        while self.settled_seq < seq - 1 and self.queue.unfinished_tasks:
            if time.monotonic() >= deadline or not self.thread.is_alive():
                return False
            time.sleep(0.002)
        return True

    def close(self, timeout: float) -> None:
        self.stopping = True
        self.wake.set()
        try:
            self.queue.put_nowait(_STOP)  # wakes the thread if it waits on the queue
        except queue.Full:  # then it is not waiting: it sees `stopping` when the queue runs dry
            pass
        self.thread.join(max(timeout, 0.0))
        if self.thread.is_alive():  # Fluentd too slow or not answering: give up what is left
            self.abort = True
            self.sender.interrupt()
            drained = 0
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    drained += 1
            if drained:
                self.count("send", drained)
            self.thread.join(0.5)  # it counts its batch as soon as its socket call returns


class FluentdHandler(logging.Handler):
    """Ships records to Fluentd (forward protocol, acknowledged) with tag `<tag>.<logger name>`.
    Each record: time, level, logger, pid, message, exc_info/stack_info, every `extra` field,
    trace_id/span_id of the active span, and the run's rank, local_rank, job_id, node and pod
    (those detected); `log_pattern` on records matching the log-pattern catalog (counted in
    gpuobs.logs.pattern_matches_total()).

    timeout: the most one attempt may take (connect, send, wait for the acknowledgement);
    delivery_timeout: the bound after a logging call by which its record is acknowledged or
    counted dropped (default 2 x timeout); connect_timeout: one connection attempt;
    close_timeout: the most close() (and a flush() without argument) waits; queue_maxsize: records
    waiting for the sender; bufmax: the most bytes of records sent and awaiting acknowledgement
    (one batch, at most 512 records)."""

    def __init__(self, host: str = "localhost", port: int = DEFAULT_PORT, *, tag: str = "gpuobs",
                 queue_maxsize: int = 10_000, timeout: float = 3.0, connect_timeout: float = 1.0,
                 close_timeout: float = 2.0, delivery_timeout: float | None = None,
                 bufmax: int = 256 * 1024, env: RunEnv | None = None, level: int = logging.NOTSET):
        super().__init__(level)
        self.host, self.port, self.tag = host, port, tag.rstrip(".")
        self.queue_maxsize = queue_maxsize
        self.timeout, self.connect_timeout, self.close_timeout = timeout, connect_timeout, close_timeout
        self.delivery_timeout = 2 * timeout if delivery_timeout is None else delivery_timeout
        self.bufmax = bufmax
        self.setFormatter(RecordFormatter())
        self.addFilter(ContextFilter(env))
        self.addFilter(PatternFilter())  # counts the records matching the log-pattern catalog
        self._pipe: _Pipe | None = None
        self._pid = os.getpid()
        self._closed = False
        self._forked = False
        self._flush_timed_out = False
        self._seq = itertools.count(1)  # numbers the records, for flush()
        self._flush_mark = 0  # `dropped` when the previous flush() returned
        self.acknowledged = 0        # records Fluentd acknowledged
        self.dropped_queue_full = 0  # refused by the full queue (newest dropped)
        self.dropped_errors = 0      # could not be packed, or emitted after close
        self.dropped_send = 0        # not acknowledged within delivery_timeout, or given up at close
        _HANDLERS.add(self)

    @classmethod
    def from_address(cls, address: str, **kwargs: Any) -> "FluentdHandler":
        """A handler for an address as parse_address() reads it ('host:port', 'host', '[v6]:port' or
        'unix:///path'), with the constructor's other arguments. Raises ValueError for a port that is
        not a number."""
        host, port = parse_address(address)
        return cls(host, port, **kwargs)

    # -- counters ---------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Records lost: full queue, packing errors, not acknowledged in time (this process)."""
        return self.dropped_queue_full + self.dropped_errors + self.dropped_send

    def metrics(self) -> dict[str, int]:
        """This handler's counts by exposed catalog name: the records it dropped
        (catalog.LOGS_DROPPED) and, under "queued", the records waiting in its queue now (a count
        for the caller, not an exported metric)."""
        return {c.LOGS_DROPPED.exposed_name: self.dropped, "queued": self.queued}

    @property
    def queued(self) -> int:
        """Records waiting in this process's queue to be sent (0 in a forked child before its first record)."""
        pipe = self._pipe
        return pipe.queue.qsize() if pipe is not None and self._pid == os.getpid() else 0

    @property
    def unacknowledged(self) -> int:
        """Records queued or sent and not yet acknowledged nor dropped."""
        pipe = self._pipe
        return self.queued + pipe.pending_records if pipe is not None and self._pid == os.getpid() else 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of the records the sender holds until acknowledged (one batch: about bufmax)."""
        pipe = self._pipe
        return pipe.pending_bytes if pipe is not None and self._pid == os.getpid() else 0

    def _count(self, kind: str, n: int) -> None:
        with _COUNT_LOCK:
            if kind == "acked":
                self.acknowledged += n
                return
            if kind == "queue_full":
                self.dropped_queue_full += n
            elif kind == "errors":
                self.dropped_errors += n
            else:
                self.dropped_send += n
            _Totals.dropped += n

    # -- logging.Handler --------------------------------------------------------------------
    def _ensure_pipe(self) -> _Pipe | None:
        if self._pid != os.getpid():  # forked without the at-fork hook running
            self._after_fork_in_child()
        if self._closed:
            return None
        if self._pipe is None:
            sender = _Sender(self.host, self.port, self.timeout, self.connect_timeout)
            self._pipe = _Pipe(sender, self.queue_maxsize, self.delivery_timeout, self.bufmax, self._count)
            if self._forked:
                _flush_at_multiprocessing_exit(self)
        return self._pipe

    def emit(self, record: logging.LogRecord) -> None:
        """Queues the record, packed on the caller's thread, for the sender thread; never blocks and never
        raises: a full queue or a packing error is counted as dropped."""
        try:
            seq = next(self._seq)
            pipe = self._pipe
            if pipe is None or self._pid != os.getpid():
                pipe = self._ensure_pipe()
                if pipe is None:  # closed
                    self._count("errors", 1)
                    return
            tag = f"{self.tag}.{record.name}" if self.tag else record.name
            try:
                pipe.queue.put_nowait((seq, time.monotonic(), tag, self._entry(record)))
            except queue.Full:
                self._count("queue_full", 1)
        except Exception:
            self._count("errors", 1)

    def _entry(self, record: logging.LogRecord) -> bytes:
        """The record as one forward-protocol entry, [EventTime, {fields}], packed on the caller's
        thread so that later changes to its `extra` objects do not show."""
        to_dict = getattr(self.formatter, "to_dict", None)
        if to_dict is not None:
            data = to_dict(record)
        else:  # a plain formatter was set: ship its text as the message
            data = {"time": record.created, "level": record.levelname, "logger": record.name,
                    "message": self.format(record)}
        event_time = EventTime(record.created)
        try:
            return msgpack.packb((event_time, data), default=_coerce)
        except Exception:  # e.g. an int beyond 64 bits: strings for all extras
            data = {k: v if isinstance(v, (str, int, float, bool, type(None))) and
                    not (isinstance(v, int) and abs(v) >= 2**63) else repr(v) for k, v in data.items()}
            return msgpack.packb((event_time, data))

    # logging.Handler.flush returns None; logging ignores the answer, callers that call flush() read it
    def flush(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        """Wait (at most timeout, default close_timeout) until the records logged before the call
        are acknowledged by Fluentd or given up. True only if they all were acknowledged and no
        record was dropped since the previous flush() (full queue included); False when records
        were lost or are still unacknowledged at the timeout."""
        pipe = self._pipe
        settled = True
        if pipe is not None and self._pid == os.getpid():
            settled = pipe.wait_settled(next(self._seq), self.close_timeout if timeout is None else timeout)
            self._flush_timed_out = not settled
        dropped = self.dropped
        ok = settled and dropped == self._flush_mark
        self._flush_mark = dropped
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
        self._seq = itertools.count(1)
        self.acknowledged = self.dropped_queue_full = self.dropped_errors = self.dropped_send = 0
        self._flush_mark = 0
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
    global _COUNT_LOCK
    _COUNT_LOCK = threading.Lock()  # the parent's may have been held by one of its threads
    _Totals.dropped = 0
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
    """Log records dropped by this process's FluentdHandlers since it started (a forked child
    starts from 0): full queue, packing errors, not acknowledged within delivery_timeout, given up
    at close. A counter: it never decreases, also when a handler is closed, replaced or collected.
    The exporter's /metrics and the training metrics endpoint
    (gpuobs_telemetry_log_records_dropped_total) read it; the signature stays `() -> int`."""
    return _Totals.dropped


class DroppedRecordsCollector:
    """prometheus_client collector of this process's dropped log records (records_dropped_total())
    under the catalog's name, catalog.LOGS_DROPPED (gpuobs_telemetry_log_records_dropped_total, the
    series the exporter and the training endpoint serve); register it on a registry of your own, not
    beside those two, which already serve it."""

    def collect(self):
        """One counter family, catalog.LOGS_DROPPED, valued records_dropped_total()."""
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily(c.LOGS_DROPPED.name, c.LOGS_DROPPED.help, value=records_dropped_total())

    def describe(self):
        """No families: registering the collector must not read anything."""
        return []
