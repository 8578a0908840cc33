"""Structured logs: records shipped to a Fluentd forward-protocol receiver (a msgpack TCP server in
this test that acknowledges chunks as in_forward does; neither Fluentd nor Fluent Bit is packaged
for Debian bookworm), JSON lines when no Fluentd is configured, and the faults a training job
meets: a refused port, a Fluentd that accepts and never reads, one that reads and never
acknowledges, and fork (DataLoader workers)."""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgpack
import pynvml as N
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from gpuobs import logs
from gpuobs.logs import FluentdHandler

REPO = Path(__file__).resolve().parents[1]
ENV_VARS = ("GPUOBS_FLUENTD", "FLUENTD_HOST", "FLUENTD_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "GPUOBS_JOB_ID", "SLURM_JOB_ID", "SLURM_PROCID", "TORCHELASTIC_RUN_ID", "JOB_ID", "NODE_NAME")


# -- a Fluentd forward-protocol receiver ---------------------------------------------------------

def _ext(code: int, data: bytes):
    if code == 0:  # EventTime: seconds and nanoseconds, big-endian
        sec, nsec = struct.unpack(">II", data)
        return sec + nsec / 1e9
    return msgpack.ExtType(code, data)


def _entries(message) -> tuple[str, str, list[tuple[float, dict]], dict]:
    """(mode, tag, [(time, record)], options) of one forward-protocol message."""
    tag, second = message[0], message[1]
    if isinstance(second, (int, float)):  # Message: [tag, time, record, option?]
        return "message", tag, [(second, message[2])], (message[3] if len(message) > 3 else None) or {}
    options = (message[2] if len(message) > 2 else None) or {}
    if isinstance(second, list):  # Forward: [tag, [[time, record], ...], option?]
        return "forward", tag, [(t, r) for t, r in second], options
    # PackedForward: [tag, bin (or str) of msgpack entries, option?]
    data = second.encode() if isinstance(second, str) else second
    return "packed", tag, [tuple(e) for e in msgpack.Unpacker(io.BytesIO(data), raw=False, ext_hook=_ext)], options


class Receiver:
    """A forward-protocol server written from the v1 spec: accepts Message, Forward and
    PackedForward entries and, like Fluentd's and Fluent Bit's in_forward, answers {"ack": chunk}
    to a message that carries the `chunk` option (after taking its records). `events` is a list
    of (tag, time, record); `chunks` the chunk ids received (a resent chunk appears again);
    `acks` how many acknowledgements were sent. ack=False: a server that reads and never answers.
    drop_first: close this many connections after reading one message, without answering
    (Fluentd restarting)."""

    def __init__(self, ack: bool = True, drop_first: int = 0):
        self.events: list[tuple[str, float, dict]] = []
        self.modes: set[str] = set()
        self.chunks: list[str] = []
        self.sizes_ok = True
        self.acks = 0
        self.ack = ack
        self.drop_first = drop_first
        self.cond = threading.Condition()
        receiver = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                unpacker = msgpack.Unpacker(raw=False, ext_hook=_ext, strict_map_key=False)
                with receiver.cond:
                    drop = receiver.drop_first > 0
                    receiver.drop_first -= drop
                while True:
                    try:
                        data = self.request.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    unpacker.feed(data)
                    for message in unpacker:
                        if drop:  # a restart: the message is lost, never acknowledged
                            return
                        chunk = receiver._accept(message)
                        if chunk is not None and receiver.ack:
                            with receiver.cond:  # counted first: the client may act on the ack at once
                                receiver.acks += 1
                            self.request.sendall(msgpack.packb({"ack": chunk}))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _accept(self, message) -> str | None:
        mode, tag, entries, options = _entries(message)
        with self.cond:
            self.modes.add(mode)
            self.events += [(tag, t, r) for t, r in entries]
            if "chunk" in options:
                self.chunks.append(options["chunk"])
            if "size" in options and options["size"] != len(entries):
                self.sizes_ok = False
            self.cond.notify_all()
        return options.get("chunk")

    def wait(self, predicate, timeout: float = 5.0) -> list[tuple[str, float, dict]]:
        """Events matching predicate(tag, record), once at least one arrived."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [e for e in self.events if predicate(e[0], e[2])]
                if found or time.monotonic() >= deadline:
                    return found
                self.cond.wait(max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Stalled:
    """A Fluentd that accepts connections and never reads from them: a small receive buffer on the
    listening socket (inherited by the accepted ones, which also get it set) fills at once, and
    the rest waits in the client's send buffer, so a plain sendall() succeeds for a while."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.sock.settimeout(0.02)
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn = self.sock.accept()[0]
            except socket.timeout:
                continue
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            self.conns.append(conn)

    def drain(self) -> list[tuple[str, dict]]:
        """Accept what waits in the backlog, then read every connection to its end: (tag, record)
        of each complete message that reached it."""
        self.stop.set()
        self.acceptor.join()
        self.sock.setblocking(False)
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                break
        self.sock.close()
        events = []
        for c in list(self.conns):
            c.settimeout(0.5)
            unpacker = msgpack.Unpacker(raw=False, ext_hook=_ext)
            while True:
                try:
                    data = c.recv(1 << 16)
                except OSError:
                    break
                if not data:
                    break
                unpacker.feed(data)
                for message in unpacker:
                    _, tag, entries, _ = _entries(message)
                    events += [(tag, r) for _, r in entries]
        return events

    def close(self):
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


def refused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # bound, never listened: connections are refused
    return port


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def run_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("GPUOBS_JOB_ID", "job-42")
    monkeypatch.setenv("NODE_NAME", "node-a")


@pytest.fixture
def root_logger():
    """Restores the root logger's handlers and level that configure() replaces, and the
    sys/threading excepthooks it chains."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    hooks = sys.excepthook, threading.excepthook
    yield root
    for h in root.handlers:
        if h not in saved[0]:
            h.close()
    root.handlers[:], root.level = saved[0], saved[1]
    sys.excepthook, threading.excepthook = hooks


@pytest.fixture
def tracer():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test_logs")
    provider.shutdown()


@pytest.fixture
def make_logger(request):
    """make_logger(handler) -> a logger of its own, not propagating, with only that handler."""
    made = []

    def factory(handler: logging.Handler, name: str | None = None) -> logging.Logger:
        log = logging.getLogger(name or f"gpuobs.test.{request.node.name}.{len(made)}")
        log.handlers[:] = [handler]
        log.propagate = False
        log.setLevel(logging.DEBUG)
        made.append((log, handler))
        return log

    yield factory
    for log, handler in made:
        log.handlers[:] = []
        log.propagate, log.level = True, logging.NOTSET
        log.filters[:] = []
        handler.close()


def ids(span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


# -- records ------------------------------------------------------------------------------------

def test_records_arrive_structured_with_trace_and_run_fields(receiver, run_env, tracer, make_logger):
    handler = FluentdHandler("127.0.0.1", receiver.port, tag="gpuobs")
    log = make_logger(handler, "gpuobs.train")
    before = time.time()
    with tracer.start_as_current_span("step") as span:
        log.info("step %d done", 7, extra={"loss": 0.25, "step": 7, "shape": (2, 3), "tags": {"a"}})
    log.warning("outside any span")
    try:
        raise ValueError("bad batch")
    except ValueError:
        log.exception("step failed")
    assert handler.flush(5)
    got = receiver.wait(lambda tag, r: r.get("message") == "step failed")
    assert got, receiver.events
    by_message = {r["message"]: (tag, t, r) for tag, t, r in receiver.events}
    tag, t, record = by_message["step 7 done"]
    assert tag == "gpuobs.gpuobs.train"
    assert isinstance(t, float) and before - 1 <= t <= time.time() + 1  # an EventTime
    trace_id, span_id = ids(span)
    assert (record["trace_id"], record["span_id"]) == (trace_id, span_id)
    assert len(trace_id) == 32 and len(span_id) == 16
    assert record["level"] == "INFO" and record["logger"] == "gpuobs.train" and record["pid"] == os.getpid()
    assert (record["loss"], record["step"], record["shape"], record["tags"]) == (0.25, 7, [2, 3], ["a"])
    assert (record["rank"], record["local_rank"], record["job_id"], record["node"]) == (3, 1, "job-42", "node-a")
    assert record["time"].endswith("Z") and record["time"].startswith(time.strftime("%Y-", time.gmtime()))
    assert "trace_id" not in by_message["outside any span"][2]
    failed = by_message["step failed"][2]
    assert failed["level"] == "ERROR" and "ValueError: bad batch" in failed["exc_info"]
    assert handler.dropped == 0 and handler.metrics()["gpuobs_telemetry_log_records_dropped_total"] == 0
    assert receiver.modes <= {"message", "forward", "packed"}


def test_exporter_xid_event_arrives_as_structured_record(receiver, run_env, monkeypatch, root_logger, make_sim):
    """The exporter's path: setup() with GPUOBS_FLUENTD set, and the XID watcher's own log call."""
    from gpuobs.collect.xid import XidWatcher
    from gpuobs.nvml import Session

    monkeypatch.setenv("GPUOBS_FLUENTD", receiver.address)
    logs.setup("info")
    assert isinstance(root_logger.handlers[-1], FluentdHandler)
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]}, init=False)
    session = Session()
    assert session.ensure()
    handle = N.nvmlDeviceGetHandleByIndex(0)
    uuid = N.nvmlDeviceGetUUID(handle)
    watcher = XidWatcher(session, wait_ms=50).start()
    try:
        watcher.register(uuid, handle)
        sim.state.xid(0, 79)
        got = receiver.wait(lambda tag, r: r.get("message") == "xid error")
    finally:
        watcher.stop()
    assert got, receiver.events
    tag, _, record = got[0]
    assert tag == "gpuobs.gpuobs.xid"
    assert (record["uuid"], record["xid"], record["level"], record["logger"]) == (uuid, 79, "ERROR", "gpuobs.xid")
    assert record["node"] == "node-a" and record["job_id"] == "job-42"


def test_json_lines_on_stdout_without_fluentd(run_env, root_logger, tracer, capsys):
    handler = logs.configure("debug")
    assert not isinstance(handler, FluentdHandler) and root_logger.level == logging.DEBUG
    with tracer.start_as_current_span("step") as span:
        logging.getLogger("gpuobs.train").info("hello %s", "world", extra={"step": 3})
    line = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads(line)
    assert (record["trace_id"], record["span_id"]) == ids(span)
    assert record["message"] == "hello world" and record["step"] == 3 and record["level"] == "INFO"
    assert (record["rank"], record["job_id"], record["node"], record["logger"]) == (3, "job-42", "node-a", "gpuobs.train")

    stream = io.StringIO()  # an explicit stream; and setup() (the exporter) writes to stderr
    logs.configure("info", stream=stream)
    logging.getLogger("x").debug("not shown")
    logging.getLogger("x").info("shown")
    assert [json.loads(l)["message"] for l in stream.getvalue().splitlines()] == ["shown"]
    logs.setup("info")
    logging.getLogger("gpuobs.exporter").warning("simulated", extra={"scenario": "s.yaml"})
    err = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert {k: err[k] for k in ("level", "logger", "message", "scenario", "node")} == \
        {"level": "WARNING", "logger": "gpuobs.exporter", "message": "simulated", "scenario": "s.yaml", "node": "node-a"}
    assert set(err) >= {"time", "pid"}


def test_configure_picks_fluentd_from_environment(receiver, run_env, monkeypatch, root_logger):
    monkeypatch.setenv("FLUENTD_HOST", "127.0.0.1")
    monkeypatch.setenv("FLUENTD_PORT", str(receiver.port))
    handler = logs.configure("info", tag="train")
    assert isinstance(handler, FluentdHandler) and (handler.host, handler.port) == ("127.0.0.1", receiver.port)
    logging.getLogger("loop").info("via env", extra={"step": 1})
    assert receiver.wait(lambda tag, r: tag == "train.loop" and r["message"] == "via env" and r["rank"] == 3)
    first = handler
    second = logs.configure("info", fluentd=receiver.address)  # replaces and closes the first
    assert first._closed and first not in root_logger.handlers and root_logger.handlers[-1] is second
    assert logs.parse_address("[::1]:24225") == ("::1", 24225) and logs.parse_address("fluentd") == ("fluentd", 24224)


def test_logging_does_not_import_the_instrumentation():
    """gpuobs.logs takes the run environment from gpuobs.runenv: importing it (the exporter's
    logging) loads none of gpuobs.instrument."""
    code = ("import sys, gpuobs.logs, gpuobs.logs.fluentd\n"
            "print(sorted(m for m in sys.modules if m.startswith('gpuobs.instrument')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- faults -------------------------------------------------------------------------------------

def test_refused_port_never_raises_and_counts_every_record(run_env, make_logger):
    handler = FluentdHandler("127.0.0.1", refused_port(), connect_timeout=0.5)
    log = make_logger(handler)
    start = time.perf_counter()
    for i in range(200):
        log.info("record %d", i, extra={"i": i})
    assert time.perf_counter() - start < 1.0
    start = time.monotonic()
    handler.close()
    assert time.monotonic() - start < 3.0
    assert handler.dropped == 200 and handler.dropped_send == 200
    log.info("after close")  # no error, counted
    assert handler.dropped == 201


def _loop(log: logging.Logger, n: int, run: str = "") -> float:
    start = time.perf_counter()
    for i in range(n):
        log.info("step %d", i, extra={"step": i, "loss": 0.5, "run": run})
    return time.perf_counter() - start


def test_fluentd_that_never_reads_costs_little_and_drops_counted(run_env, make_logger):
    stalled = Stalled()
    maxsize, n = 500, 10_000
    handler = FluentdHandler("127.0.0.1", stalled.port, queue_maxsize=maxsize, timeout=0.5,
                             close_timeout=1.0, bufmax=256 * 1024)
    log = make_logger(handler)
    null_log = make_logger(logging.NullHandler())
    null_log.addFilter(logs.ContextFilter())  # the same enrichment, without shipping
    try:
        _loop(log, 200, "warm-up"), _loop(null_log, 200)  # the connection fills at once
        baseline = min(_loop(null_log, n) for _ in range(2))
        queued = []
        sampler_stop = threading.Event()

        def sample():
            while not sampler_stop.is_set():
                queued.append(handler.queued)
                time.sleep(0.001)

        sampler = threading.Thread(target=sample)
        sampler.start()
        elapsed = _loop(log, n, "main")
        sampler_stop.set()
        sampler.join()
        per_record_us = (elapsed - baseline) / n * 1e6
        limit = max(50.0, 4 * baseline / n * 1e6)  # a loaded machine slows both loops
        assert per_record_us < limit, f"{per_record_us:.1f} µs per record over the NullHandler"
        assert max(queued) <= maxsize and handler.queued <= maxsize  # memory bounded by the queue ...
        assert handler.pending_bytes <= 256 * 1024 + 256 * 1024  # ... and the reconnect buffer
        assert handler.dropped_queue_full > 0
        pipe = handler._pipe
        start = time.monotonic()
        handler.close()
        closed_in = time.monotonic() - start
        assert closed_in < 5.0
        pipe.thread.join(2)  # an abandoned sender thread ends after its send timeout
        assert not pipe.thread.is_alive()
        # every record reached the socket or is counted dropped (a record resent after a
        # timed-out send may be both); none is lost silently
        # records reached the socket (some twice: a chunk is resent on a new connection), yet
        # none was acknowledged: every one is counted dropped, once
        sent = {(r["run"], r["step"]) for _, r in stalled.drain()}
        assert sent and handler.acknowledged == 0
        assert handler.dropped == n + 200 and handler.dropped_queue_full > 0
        assert logs.records_dropped_total() >= handler.dropped
        registry = CollectorRegistry()
        registry.register(logs.DroppedRecordsCollector())
        exposed = generate_latest(registry).decode()
        assert "# TYPE gpuobs_telemetry_log_records_dropped_total counter" in exposed or \
            "# TYPE gpuobs_telemetry_log_records_dropped counter" in exposed
        assert registry.get_sample_value("gpuobs_telemetry_log_records_dropped_total") >= handler.dropped
    finally:
        stalled.close()


def test_close_gives_up_on_a_wedged_send_within_its_timeout(run_env, make_logger):
    """A send timeout longer than the close timeout: close() abandons the sender thread, counts
    what was queued, and the thread counts its in-flight batch when its send times out."""
    stalled = Stalled()
    handler = FluentdHandler("127.0.0.1", stalled.port, queue_maxsize=2000, timeout=1.5, close_timeout=0.3)
    log = make_logger(handler)
    try:
        for k in range(5):
            _loop(log, 2000, f"run-{k}")
            time.sleep(0.05)
        pipe = handler._pipe
        start = time.monotonic()
        handler.close()
        assert time.monotonic() - start < 1.0
        assert pipe.abort and handler.dropped > 0  # given up, not waited for
        pipe.thread.join(3)
        assert not pipe.thread.is_alive()
        assert handler.dropped == 10_000 and handler.acknowledged == 0  # every record counted, once
        assert stalled.drain()  # though bytes did reach the socket
    finally:
        stalled.close()


N_RECORDS = 2000


def _log_timed(log: logging.Logger, n: int, run: str) -> tuple[float, float]:
    """Log n records; (total seconds, slowest single call)."""
    worst, start = 0.0, time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        log.info("step %d", i, extra={"step": i, "loss": 0.5, "run": run})
        worst = max(worst, time.perf_counter() - t)
    return time.perf_counter() - start, worst


def _wait_dropped(handler: FluentdHandler, n: int, limit: float) -> None:
    deadline = time.monotonic() + limit
    while handler.dropped < n and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("fault", ["never-reads", "reads-never-acks"])
def test_unacknowledged_records_are_counted_dropped_within_the_bound(fault, run_env, make_logger):
    """Issue 13: a Fluentd that accepts and never reads (its kernel buffers take the bytes, so a
    plain send succeeds) or one that reads and never acknowledges: sends time out, every record
    is counted dropped within delivery_timeout of its logging call, flush() reports failure, and
    no logging call waited on the network."""
    server = Stalled() if fault == "never-reads" else Receiver(ack=False)
    timeout, delivery = 0.5, 1.0
    handler = FluentdHandler("127.0.0.1", server.port, timeout=timeout, delivery_timeout=delivery,
                             close_timeout=1.0)
    log = make_logger(handler)
    before = logs.records_dropped_total()
    try:
        start = time.monotonic()
        total, worst = _log_timed(log, N_RECORDS, fault)
        assert worst < 0.1 and total < 2.0, (worst, total)  # a blocked call would take the 0.5 s timeout
        assert handler.flush(0.1) is False  # records unacknowledged when the time is up
        _wait_dropped(handler, N_RECORDS, delivery + 2.0)
        settled_in = time.monotonic() - start
        assert handler.dropped == handler.dropped_send == N_RECORDS, (handler.dropped, handler.unacknowledged)
        assert handler.acknowledged == 0 and handler.unacknowledged == 0
        assert delivery - 0.05 <= settled_in <= delivery + 2.0  # not given up before the bound, nor long after
        assert handler.flush(1.0) is False  # nothing pending, but records were lost since the last flush
        assert handler.flush(1.0) is True   # ... and reported once
        assert logs.records_dropped_total() - before == N_RECORDS
        if fault == "reads-never-acks":  # the first chunk arrived, and was sent again with its id
            assert len(server.events) >= 512 and server.acks == 0
            assert len(server.chunks) > len(set(server.chunks))
    finally:
        server.close()


def test_acknowledging_fluentd_gets_everything(receiver, run_env, make_logger):
    handler = FluentdHandler("127.0.0.1", receiver.port, timeout=2.0)
    log = make_logger(handler)
    total, worst = _log_timed(log, N_RECORDS, "acked")
    assert handler.flush(10) is True
    assert handler.dropped == 0 and handler.acknowledged == N_RECORDS and handler.unacknowledged == 0
    steps = [r["step"] for _, _, r in receiver.events if r.get("run") == "acked"]
    assert sorted(steps) == list(range(N_RECORDS))
    # PackedForward chunks with the chunk and size options, each acknowledged once
    assert receiver.modes == {"packed"} and receiver.sizes_ok
    assert len(receiver.chunks) == len(set(receiver.chunks)) == receiver.acks >= N_RECORDS // 512
    assert logs.records_dropped_total() >= 0 and handler.flush(1) is True


def test_a_restarting_fluentd_loses_nothing(run_env, make_logger):
    """The first two connections end without an acknowledgement (Fluentd restarting): the chunk
    is sent again on a new connection and every record arrives, none counted dropped."""
    receiver = Receiver(drop_first=2)
    try:
        handler = FluentdHandler("127.0.0.1", receiver.port, timeout=1.0, delivery_timeout=5.0)
        log = make_logger(handler)
        _log_timed(log, 300, "restart")
        assert handler.flush(5) is True
        assert handler.dropped == 0 and handler.acknowledged == 300
        assert {r["step"] for _, _, r in receiver.events} == set(range(300))
    finally:
        receiver.close()


def test_dropped_total_is_a_counter_that_outlives_its_handlers(run_env):
    """records_dropped_total() (what the exporter and the training endpoint read) never goes
    down: a closed, replaced and collected handler's drops stay in it."""
    import gc

    before = logs.records_dropped_total()
    handler = FluentdHandler("127.0.0.1", refused_port(), connect_timeout=0.2, close_timeout=0.5)
    for i in range(10):
        handler.handle(logging.makeLogRecord({"msg": "r", "name": "x", "levelno": logging.INFO,
                                              "levelname": "INFO", "i": i}))
    handler.close()
    assert handler.dropped == 10
    del handler
    gc.collect()
    assert logs.records_dropped_total() - before == 10
    registry = CollectorRegistry()
    registry.register(logs.DroppedRecordsCollector())
    assert registry.get_sample_value("gpuobs_telemetry_log_records_dropped_total") == logs.records_dropped_total()


TRAINING_ENDPOINT_SCRIPT = textwrap.dedent('''
    import json, logging, sys, time, urllib.request
    from gpuobs import instrument, logs

    port, fluentd, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    tel = instrument.configure(prometheus_port=port, prometheus_addr="127.0.0.1")
    handler = logs.configure("info", fluentd=fluentd, timeout=0.3, delivery_timeout=0.6, close_timeout=0.5)
    log = logging.getLogger("train")
    for i in range(n):
        log.info("step", extra={"step": i})
    deadline = time.monotonic() + 5
    while logs.records_dropped_total() < n and time.monotonic() < deadline:
        time.sleep(0.02)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        scrape = r.read().decode()
    out = {"scrape": scrape, "dropped": handler.dropped, "total": logs.records_dropped_total()}
    logging.getLogger().handlers.remove(handler)
    handler.close()
    tel.shutdown(timeout_s=2)
    print(json.dumps(out))
''')


def test_training_metrics_endpoint_shows_log_drops_without_user_code(run_env):
    """A process that calls instrument.configure(prometheus_port=...) and logs.configure(fluentd=...)
    and nothing else: the never-reading Fluentd's drops appear on its /metrics as
    gpuobs_telemetry_log_records_dropped_total (prometheus_client's global registry and HTTP
    server: in a subprocess)."""
    from prometheus_client.parser import text_string_to_metric_families

    stalled = Stalled()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    try:
        proc = subprocess.run([sys.executable, "-c", TRAINING_ENDPOINT_SCRIPT, str(port), stalled.address,
                               str(N_RECORDS)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    finally:
        stalled.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dropped"] == out["total"] == N_RECORDS
    samples = [s for fam in text_string_to_metric_families(out["scrape"]) for s in fam.samples
               if s.name == "gpuobs_telemetry_log_records_dropped_total"]
    assert samples and sum(s.value for s in samples) == N_RECORDS, samples


def test_connect_timeout_bounds_a_fluentd_that_does_not_answer(run_env, make_logger):
    """A full accept backlog drops SYNs, as a black-holed address would: connects time out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    probe = socket.socket()
    probe.settimeout(0.2)
    try:
        try:
            probe.connect(("127.0.0.1", port))
            pytest.skip("this kernel accepts beyond the backlog")
        except socket.timeout:
            pass
        handler = FluentdHandler("127.0.0.1", port, connect_timeout=0.2, timeout=5.0, close_timeout=3.0)
        log = make_logger(handler)
        start = time.perf_counter()
        for i in range(100):
            log.info("r", extra={"i": i})
        assert time.perf_counter() - start < 0.5  # the caller never waits for the connect
        start = time.monotonic()
        handler.close()
        assert time.monotonic() - start < 1.5  # connect attempts of 0.2 s, not the 5 s send timeout
        assert handler.dropped == 100
    finally:
        probe.close()
        filler.close()
        listener.close()


def _child_logs(address: str, marker: str) -> None:
    logging.getLogger("gpuobs.worker").info("from child", extra={"marker": marker, "child_pid": os.getpid()})


def test_fork_child_gets_its_own_sender(receiver, run_env, make_logger):
    handler = FluentdHandler("127.0.0.1", receiver.port)
    log = make_logger(handler, "gpuobs.worker")
    stop = threading.Event()

    def busy():  # keeps the parent's sender thread and queue locks busy while forking
        i = 0
        while not stop.is_set():
            log.debug("parent busy", extra={"i": i})
            i += 1
            time.sleep(0.0002)

    spammer = threading.Thread(target=busy)
    spammer.start()
    children = []
    try:
        for k in range(5):
            pid = os.fork()
            if pid == 0:  # child: log, flush, leave without running the parent's cleanup
                code = 1
                try:
                    log.info("from child", extra={"marker": f"fork-{k}", "child_pid": os.getpid()})
                    code = 0 if handler.flush(5) and handler.dropped == 0 else 2
                finally:
                    os._exit(code)
            children.append(pid)
            time.sleep(0.02)
    finally:
        stop.set()
        spammer.join()
    deadline = time.monotonic() + 10
    codes = {}
    while len(codes) < len(children) and time.monotonic() < deadline:
        for pid in children:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in children:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert codes == {pid: 0 for pid in children}, "a forked child hung or failed"
    got = receiver.wait(lambda tag, r: r.get("marker") == "fork-4")
    markers = {r["marker"]: r for _, _, r in receiver.events if "marker" in r}
    assert got and set(markers) == {f"fork-{k}" for k in range(5)}
    assert {r["child_pid"] for r in markers.values()} == set(children)
    assert all(r["pid"] == r["child_pid"] and r["rank"] == 3 for r in markers.values())
    log.info("parent after forks")  # the parent's sender still works
    assert handler.flush(5) and receiver.wait(lambda tag, r: r["message"] == "parent after forks")


def test_multiprocessing_fork_worker_logs_are_flushed_at_its_exit(receiver, run_env, make_logger):
    handler = FluentdHandler("127.0.0.1", receiver.port)
    make_logger(handler, "gpuobs.worker").info("parent first")  # the parent's sender is running
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_child_logs, args=(receiver.address, f"mp-{k}")) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(10)
    hung = [w for w in workers if w.is_alive()]
    for w in hung:
        w.kill()
    assert not hung and [w.exitcode for w in workers] == [0, 0]
    assert receiver.wait(lambda tag, r: r.get("marker") == "mp-1") and receiver.wait(lambda tag, r: r.get("marker") == "mp-0")


def test_configure_keeps_the_applications_own_handlers(tmp_path, root_logger):
    file_handler = logging.FileHandler(tmp_path / "app.log")
    console = logging.StreamHandler()
    root_logger.addHandler(file_handler)
    root_logger.addHandler(console)
    ours = logs.configure(stream=io.StringIO())
    assert file_handler in root_logger.handlers and ours in root_logger.handlers
    assert console not in root_logger.handlers  # a plain console handler would print every record twice
    file_handler.close()


# ------------------------------------------------------------------------------------ uncaught exceptions

def test_uncaught_exceptions_are_logged_counted_and_still_reach_the_original_hooks(root_logger, run_env):
    """configure() chains a hook in front of sys.excepthook and threading.excepthook: the exception
    becomes one CRITICAL record (traceback included, matched against the pattern catalog), and the
    hook it replaced still runs, once; a second configure() does not log it twice."""
    seen = []
    sys.excepthook = lambda *exc: seen.append(("sys", exc[1]))
    threading.excepthook = lambda args: seen.append(("thread", args.exc_value))
    stream = io.StringIO()
    logs.configure("info", stream=stream)
    outer = sys.excepthook
    sys.excepthook = lambda *exc: outer(*exc)  # as torch.distributed wraps it after configure()
    logs.configure("info", stream=stream)  # chains again in front of the wrapper
    before = logs.pattern_matches_total()
    try:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                           "waiting 1800000ms for recv operation to complete")
    except RuntimeError as exc:
        timeout = exc
        sys.excepthook(type(exc), exc, exc.__traceback__)
    worker = threading.Thread(target=lambda: 1 / 0, name="loader")
    worker.start()
    worker.join()
    sys.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)  # passed on, not logged

    assert [(where, type(e)) for where, e in seen] == [
        ("sys", RuntimeError), ("thread", ZeroDivisionError), ("sys", KeyboardInterrupt)]
    assert seen[0][1] is timeout
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["logger"], r["level"], r["message"]) for r in records] == [
        ("gpuobs.uncaught", "CRITICAL", "Uncaught RuntimeError in the main thread"),
        ("gpuobs.uncaught", "CRITICAL", "Uncaught ZeroDivisionError in thread loader")]
    assert records[0]["log_pattern"] == "collective_timeout" and "Timed out waiting" in json.dumps(records[0])
    after = logs.pattern_matches_total()
    assert after["collective_timeout"] - before["collective_timeout"] == 1


def test_a_failing_handler_never_hides_the_original_traceback(root_logger, run_env):
    class Broken(logging.Handler):
        def emit(self, record):
            raise OSError("disk full")

        def handleError(self, record):  # logging's own fallback would print; make the failure loud
            raise OSError("disk full")

    seen = []
    sys.excepthook = lambda *exc: seen.append(exc[1])
    logs.configure("info", stream=io.StringIO())
    logging.getLogger().addHandler(Broken())
    exc = ValueError("boom")
    sys.excepthook(ValueError, exc, None)
    assert seen == [exc]


def test_configure_without_uncaught_leaves_the_hooks_alone(root_logger, run_env):
    hooks = sys.excepthook, threading.excepthook
    logs.configure("info", stream=io.StringIO(), uncaught=False)
    assert (sys.excepthook, threading.excepthook) == hooks
