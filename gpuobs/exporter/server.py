"""HTTP for the exporter: the metrics (at /metrics or another telemetry path), /healthz, /readyz and
an index at /, with TLS and basic auth from a Prometheus web-config file (gpuobs.exporter.webconfig),
on IPv4, IPv6 or both.

Built on aiohttp's low-level server (aiohttp.web.Server) on an asyncio event loop of its own, in one
thread, so that the sampler threads are untouched. Why aiohttp: a widely used, actively maintained
asyncio HTTP/1.1 server whose parser bounds request lines and header fields; an idle or trickling
connection costs a small object on the loop instead of a thread (the threaded stdlib server this
replaces spent a thread per connection and a 30 s timeout that restarted with every byte). What
aiohttp does not do, this module does around it, on the raw connection (_Conn), before aiohttp sees
a byte:
- a cap on open connections overall and per client address: an excess connection is closed at once
  (its file descriptor back within the accept), so one client cannot take the slots another needs;
- one deadline per request that no byte restarts: from accept (the TLS handshake included) to
  complete request headers, then for the response, then for the next request on a kept-alive
  connection; a connection that misses it is closed;
- TLS done per connection with the web config's current context (TlsReloader: a certificate
  rotated on disk is served on the next handshake);
- accept() failing for want of file descriptors (EMFILE, ENFILE): asyncio takes the listening
  socket off the loop for a second and retries (a back-off, not a spin); each time is counted.
Refusals and closures count in `HttpServer.refused` by reason (REFUSE_REASONS), served as
gpuobs_exporter_http_connections_refused_total. Handlers only hand out prepared bytes: the metrics
callback runs on a small thread pool and bcrypt on a single thread (BasicAuth), never on the loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import resource
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .webconfig import BasicAuth, WebConfig, WebConfigError

__all__ = ["Exposition", "HttpServer", "Limits", "WebConfig", "WebConfigError", "check_connection_caps",
           "check_telemetry_path", "host_port", "make_app", "raise_open_files_limit", "REFUSE_REASONS"]

log = logging.getLogger("gpuobs.http")

# Listen queue (the kernel caps it at net.core.somaxconn): when a burst of connections overflows it,
# the kernel drops SYNs, other clients' included, and they retry only after 1-3 s; the loop drains
# the queue fast, refusing what is over the caps, so a deep queue costs little
BACKLOG = 4096
ACCEPT_BATCH = 32
# Why a connection was refused or closed without an answer: `limit` (all connection slots taken),
# `client_limit` (the client's address holds its share), `deadline` (request headers, TLS handshake
# or response not done in time), `open_files` (accept() failed with EMFILE/ENFILE; the connection
# waits in the kernel's queue while the server backs off)
REFUSE_REASONS = ("limit", "client_limit", "deadline", "open_files")
FD_RESERVE = 128  # file descriptors kept for everything but connections (NVML, logs, state files)


class Exposition(NamedTuple):
    """A metrics response: body bytes, its Content-Type, and whether the body is gzip-compressed."""
    body: bytes
    content_type: str
    gzipped: bool = False


@dataclass(frozen=True)
class Limits:
    """Connection limits and deadlines (seconds) of the HTTP server. The two caps are the
    exporter's --web.max-connections and --web.max-connections-per-client. Raises ValueError for a
    cap below 1 or a per-client cap over the total."""
    max_connections: int = 512     # open connections, all clients together
    max_per_client: int = 32       # open connections from one client address
    header_timeout: float = 10.0   # accept (TLS handshake included) to complete request headers
    response_timeout: float = 60.0  # complete headers to the response's last byte written
    keepalive_timeout: float = 120.0  # a response to the next request's complete headers
    body_timeout: float = 5.0      # reading a request body nobody asked for, after the response

    def __post_init__(self) -> None:
        check_connection_caps(self.max_connections, self.max_per_client)

    def for_open_files(self, soft_limit: int) -> "Limits":
        """These limits with the connection cap kept FD_RESERVE file descriptors below
        `soft_limit` (RLIMIT_NOFILE), so that a full house never makes accept() fail."""
        cap = min(self.max_connections, max(16, soft_limit - FD_RESERVE))  # a lower configured cap stays
        return replace(self, max_connections=cap, max_per_client=min(self.max_per_client, cap))


def check_connection_caps(total: int, per_client: int) -> None:
    """Raises ValueError unless both caps are integers of at least 1 and the per-client cap is at
    most the total (a larger one could never be reached)."""
    for name, cap in (("connection cap", total), ("per-client connection cap", per_client)):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, not {cap!r}")
    if per_client > total:
        raise ValueError(f"per-client connection cap ({per_client}) is over the connection cap ({total})")


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (as Go programs do at start; systemd's default
    soft limit is 1,024), logging both; returns the soft limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("open-files limit", extra={"soft": soft, "hard": hard})
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        log.warning("open-files limit not raised", extra={"soft": soft, "hard": hard, "error": str(e)})
        return soft
    log.info("open-files limit raised to the hard limit", extra={"from": soft, "to": target, "hard": hard})
    return target


PROBE_PATHS = ("/healthz", "/readyz")  # fixed: probes in deployments name them
METHODS = ("GET", "HEAD")


def check_telemetry_path(path: str) -> str:
    """`path` if it can serve the metrics: an absolute URL path ("/metrics", "/custom", "/") that
    is neither probe's. Raises ValueError saying why not."""
    if not path.startswith("/") or any(c in "?#" or c.isspace() for c in path):
        raise ValueError(f"must be an absolute URL path such as /metrics (no query, fragment or spaces), "
                         f"got {path!r}")
    if path in PROBE_PATHS:
        raise ValueError(f"{path} is a probe's path ({' and '.join(PROBE_PATHS)} stay where they are)")
    return path


def _alive() -> tuple[bool, str]:
    return True, "ok"


def _reply(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    hdrs = {"Content-Type": "text/plain; charset=utf-8", "Server": "gpuobs"}
    hdrs.update(headers or {})
    return web.Response(status=status, body=body, headers=hdrs)


class App:
    """The exporter's HTTP handler (make_app builds it); `handle` is an aiohttp handler."""

    def __init__(self, metrics: Callable[[str | None, str | None], Exposition],
                 ready: Callable[[], tuple[bool, str]], users: dict[str, bytes],
                 alive: Callable[[], tuple[bool, str]], telemetry_path: str):
        self.metrics, self.ready, self.alive = metrics, ready, alive
        self.telemetry_path = check_telemetry_path(telemetry_path)
        self.auth = BasicAuth(users)
        self.index = f"gpuobs exporter: {telemetry_path} {' '.join(PROBE_PATHS)}\n".encode()
        self._work = ThreadPoolExecutor(4, thread_name_prefix="gpuobs-http")
        self._bcrypt = ThreadPoolExecutor(1, thread_name_prefix="gpuobs-bcrypt")  # one bcrypt at a time

    async def _authorized(self, header: str | None) -> bool:
        verdict = self.auth.quick(header)
        if verdict is None:
            verdict = await asyncio.get_running_loop().run_in_executor(self._bcrypt, self.auth.check, header)
        return verdict

    async def _metrics(self, request: web.BaseRequest) -> web.Response:
        args = (request.headers.get("Accept"), request.headers.get("Accept-Encoding"))
        try:
            got = await asyncio.get_running_loop().run_in_executor(self._work, self.metrics, *args)
        except Exception:  # noqa: BLE001 - logged here; the client gets a 500 and no traceback
            log.exception("metrics callback failed")
            return _reply(500, b"internal error\n")
        headers = {"Content-Type": got.content_type, "Vary": "Accept, Accept-Encoding"}
        if got.gzipped:
            headers["Content-Encoding"] = "gzip"
        return _reply(200, got.body, headers)

    async def handle(self, request: web.BaseRequest) -> web.Response:
        """GET or HEAD (HEAD: the headers of GET, no body) on the telemetry path serves
        `metrics(accept, accept_encoding)` behind basic auth; /healthz and /readyz answer 200 or
        503 with the reason and skip auth, so that probes need no secret; "/" is an index (unless it
        is the telemetry path); anything else is 404, and any other method 405."""
        if request.method not in METHODS:
            resp = _reply(405, b"method not allowed\n", {"Allow": ", ".join(METHODS)})
            resp.force_close()  # the body is never read: the connection closes after the answer
            return resp
        path = request.path
        if path in PROBE_PATHS:
            ok, reason = (self.alive if path == "/healthz" else self.ready)()
            return _reply(200 if ok else 503, reason.encode() + b"\n")
        if not await self._authorized(request.headers.get("Authorization")):
            return _reply(401, b"unauthorized\n", {"WWW-Authenticate": 'Basic realm="gpuobs"'})
        if path == self.telemetry_path:
            return await self._metrics(request)
        if path == "/":
            return _reply(200, self.index)
        return _reply(404, b"not found\n")

    def close(self) -> None:
        """Let the worker threads go (a metrics call in progress finishes on its own)."""
        self._work.shutdown(wait=False, cancel_futures=True)
        self._bcrypt.shutdown(wait=False, cancel_futures=True)


def make_app(metrics: Callable[[str | None, str | None], Exposition], ready: Callable[[], tuple[bool, str]],
             users: dict[str, bytes], alive: Callable[[], tuple[bool, str]] = _alive,
             telemetry_path: str = "/metrics") -> App:
    """The App for HttpServer. `telemetry_path` serves `metrics(accept, accept_encoding)` (the
    request's Accept and Accept-Encoding headers, None when absent: the format and encoding are the
    callee's choice) behind basic auth when `users` (name -> bcrypt hash) is not empty; see
    App.handle. Raises ValueError for a telemetry path check_telemetry_path refuses."""
    return App(metrics, ready, users, alive, telemetry_path)


class _Conn(asyncio.Protocol):
    """One accepted connection: admitted or refused by the server's caps, its deadline, TLS, and
    then aiohttp's request handler (`inner`), to which the transport's events are passed on."""

    def __init__(self, server: "HttpServer"):
        self.server = server
        self.inner: RequestHandler | None = None
        self.client: str | None = None  # the address counted against the per-client cap, once admitted
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._early: list[bytes] = []  # data that arrived after the TLS handshake, before `inner`

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # a stream server's connections are Transports; asyncio.Protocol declares the base class
        self.transport = transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        reason = self.server._admit(client)
        if reason:
            self.server._count(reason)
            transport.abort()  # RST: the descriptor is free at once, no TIME_WAIT here
            return
        self.client = client
        self.arm(self.server.limits.header_timeout)
        tls = self.server.tls
        if tls is None:
            self._start(transport)
        else:
            self.server._tasks.add(asyncio.get_running_loop().create_task(self._handshake(transport, tls)))

    async def _handshake(self, transport: asyncio.Transport, tls: Callable[[], ssl.SSLContext]) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls_transport = await loop.start_tls(transport, self, tls(), server_side=True,
                                                 ssl_handshake_timeout=self.server.limits.header_timeout)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError, RuntimeError):
            transport.abort()  # plain HTTP, a bad client certificate, a silent client
            return
        finally:
            self.server._tasks.discard(asyncio.current_task())
        if tls_transport is not None and not tls_transport.is_closing():
            self._start(tls_transport)

    def _start(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.inner = inner = self.server._aio()
        self.server._conns[inner] = self
        inner.connection_made(transport)
        for data in self._early:
            inner.data_received(data)
        self._early.clear()

    def arm(self, seconds: float) -> None:
        """(Re)start the connection's one deadline: `seconds` from now, whatever arrives meanwhile."""
        if self._timer:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.server._count("deadline")
        if self.transport:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.inner:
            self.inner.data_received(data)
        elif self.client is not None:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self.inner:
            self.inner.eof_received()
        return None  # the transport closes itself, as aiohttp's handler answers

    def pause_writing(self) -> None:
        if self.inner:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer:
            self._timer.cancel()
        if self.client is not None:
            self.server._release(self.client)
            self.client = None
        if self.inner:
            self.server._conns.pop(self.inner, None)
            self.inner.connection_lost(exc)


def _resolve(future: asyncio.Future[None]) -> None:
    """Sets the future's result unless it is done already (the stop was asked twice)."""
    if not future.done():
        future.set_result(None)


def host_port(addr: str, port: int) -> str:
    """addr:port as a listen address is written, IPv6 in brackets ("[::1]:9445", ":9445" for every
    address)."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _listen(family: int, addr: str, port: int, dual: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual:
            with contextlib.suppress(OSError, AttributeError):  # already dual-stack where it cannot be set
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((addr, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _bind(addr: str, port: int) -> socket.socket:
    """A listening socket on addr:port: "" is every address (IPv6 and IPv4 where the host has IPv6,
    else IPv4), an IPv6 address or a name that resolves to one binds IPv6. Raises OSError."""
    if addr == "":
        try:
            return _listen(socket.AF_INET6, "::", port, dual=True)
        except OSError as e:
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):  # IPv6 off on this host
                raise
        return _listen(socket.AF_INET, "0.0.0.0", port)
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return _listen(family, addr, port)


class HttpServer:
    """Serves an App on addr:port from an event loop in a daemon thread ("" for every address; an
    IPv4 or IPv6 address or a host name); `port` holds the bound port (0 picks one), `address` the
    bound address. `tls`: None (plain HTTP), an SSLContext, or a callable giving the context for
    each new handshake (webconfig.TlsReloader). `refused` counts connections refused or closed
    unanswered, by REFUSE_REASONS. Raises OSError (saying which address) when it cannot listen."""

    def __init__(self, app: App, addr: str, port: int,
                 tls: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None, limits: Limits = Limits()):
        try:
            self.sock = _bind(addr, port)
        except OSError as e:  # gaierror too: a host name that does not resolve
            raise OSError(e.errno, f"cannot listen on {host_port(addr, port)}: {e.strerror}") from None
        self.app, self.limits = app, limits
        self.tls = (lambda: tls) if isinstance(tls, ssl.SSLContext) else tls
        self.address, self.port = self.sock.getsockname()[:2]
        self.refused = collections.Counter({reason: 0 for reason in REFUSE_REASONS})
        self._open = 0
        self._per_client: collections.Counter[str] = collections.Counter()
        self._conns: dict[RequestHandler, _Conn] = {}   # aiohttp request handler -> _Conn
        self._tasks: set[asyncio.Task[None]] = set()  # TLS handshakes in progress
        self._backing_off = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuobs-http", daemon=True)

    # ------------------------------------------------------------------ admission (loop thread)
    def _admit(self, client: str) -> str | None:
        if self._open >= self.limits.max_connections:
            return "limit"
        if self._per_client[client] >= self.limits.max_per_client:
            return "client_limit"
        self._open += 1
        self._per_client[client] += 1
        return None

    def _release(self, client: str) -> None:
        self._open -= 1
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    def _count(self, reason: str) -> None:
        self.refused[reason] += 1

    def refused_counts(self) -> dict[str, int]:
        """Connections refused or closed unanswered so far, by reason (every REFUSE_REASONS key)."""
        return dict(self.refused)

    # ------------------------------------------------------------------------------ the loop
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = self._conns.get(request.protocol)
        if conn:
            conn.arm(self.limits.response_timeout)
        resp = await self.app.handle(request)
        await resp.prepare(request)  # written here, so that the next deadline starts after it
        await resp.write_eof()
        if conn:
            conn.arm(self.limits.keepalive_timeout)
        return resp

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            # asyncio has taken the socket off the loop for a second: a back-off, not a spin. Its
            # accept loop goes on trying (and reporting) for the rest of its batch in the same
            # callback: one back-off is counted and logged once.
            if not self._backing_off:
                self._backing_off = True
                loop.call_soon(setattr, self, "_backing_off", False)
                self._count("open_files")
                log.warning("accept() out of file descriptors: backing off 1 s", extra={"error": str(exc)})
            return
        loop.default_exception_handler(context)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._on_loop_error)
        self._aio = web.Server(self._handle, access_log=None, keepalive_timeout=self.limits.keepalive_timeout,
                               lingering_time=self.limits.body_timeout, max_line_size=8190,
                               max_field_size=8190)
        # asyncio takes `backlog` as the listen queue and as how many connections one wake-up
        # accepts before any is refused: a small batch (a burst never takes hundreds of
        # descriptors at once), then the deep queue set again
        server = await loop.create_server(lambda: _Conn(self), sock=self.sock, backlog=ACCEPT_BATCH)
        self.sock.listen(BACKLOG)
        self._stopping = loop.create_future()
        self._ready.set()
        try:
            await self._stopping
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await self._aio.shutdown(timeout=1.0)
            for conn in list(self._conns.values()):
                if conn.transport:
                    conn.transport.abort()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except Exception:  # noqa: BLE001 - the server thread must say why it ended
            log.exception("HTTP server stopped on an error")
        finally:
            self._ready.set()
            loop.close()

    def start(self) -> "HttpServer":
        """Start serving; returns once the loop accepts connections (within 5 s)."""
        self._thread.start()
        self._ready.wait(5)
        return self

    def stop(self, timeout: float = 3.0) -> None:
        """Stop accepting, close every connection and end the thread, within about `timeout` s."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, stopping)
            self._thread.join(timeout)
        self.sock.close()
        self.app.close()
