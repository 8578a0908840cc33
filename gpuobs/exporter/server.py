"""HTTP for the exporter: the metrics (at /metrics or another telemetry path), /healthz, /readyz,
with TLS and basic auth from a Prometheus web-config file (as exporter-toolkit exporters read it).
Built on the standard library's WSGI server in prometheus_client's threading variant, on IPv4 or
IPv6; the handlers only hand out prepared bytes."""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import logging
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, make_server

import bcrypt
import yaml
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger("gpuobs.http")


class Exposition(NamedTuple):
    """A metrics response: body bytes, its Content-Type, and whether the body is gzip-compressed."""
    body: bytes
    content_type: str
    gzipped: bool = False


class WebConfigError(ValueError):
    """The web-config file is missing, unreadable or inconsistent."""


CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
               "RequireAnyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TOP_KEYS = {"tls_server_config", "basic_auth_users"}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    return value


def _known(doc: dict, allowed: set[str], where: str) -> None:
    # A misspelt key must not quietly turn TLS or auth off: refuse what is not understood.
    unknown = set(doc) - allowed
    if unknown:
        raise WebConfigError(f"{where}: unsupported keys {', '.join(sorted(map(str, unknown)))} "
                             f"(supported: {', '.join(sorted(allowed))})")


@dataclass
class WebConfig:
    """Parsed Prometheus web-config: TLS files and bcrypt-hashed basic-auth users."""
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str | None = None
    users: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> "WebConfig":
        """Read a web-config YAML; relative paths are relative to the file. Raises WebConfigError
        for anything unreadable, unknown or inconsistent, as exporter-toolkit does at start-up."""
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise WebConfigError(f"cannot read web config {path}: {e}") from None
        doc = _mapping(doc, f"web config {path}")
        _known(doc, TOP_KEYS, str(path))
        tls = _mapping(doc.get("tls_server_config"), "tls_server_config")
        _known(tls, TLS_KEYS, "tls_server_config")
        users = _mapping(doc.get("basic_auth_users"), "basic_auth_users")

        def rel(p) -> Path | None:
            return None if not p else Path(p) if Path(str(p)).is_absolute() else path.parent / p

        cfg = cls(cert_file=rel(tls.get("cert_file")), key_file=rel(tls.get("key_file")),
                  client_ca_file=rel(tls.get("client_ca_file")),
                  client_auth_type=str(tls.get("client_auth_type", "NoClientCert")),
                  min_version=str(tls.get("min_version", "TLS12")),
                  max_version=None if tls.get("max_version") is None else str(tls["max_version"]),
                  users={str(u): str(h).encode() for u, h in users.items()})
        cfg._check(has_tls=bool(tls))
        return cfg

    def _check(self, has_tls: bool) -> None:
        """Raise WebConfigError for settings that do not go together (has_tls: the file has a
        tls_server_config section)."""
        if bool(self.cert_file) != bool(self.key_file):
            raise WebConfigError("tls_server_config needs both cert_file and key_file")
        if has_tls and not self.cert_file:
            raise WebConfigError("tls_server_config needs cert_file and key_file")
        if self.client_auth_type not in CLIENT_AUTH:
            raise WebConfigError(f"client_auth_type must be one of {', '.join(CLIENT_AUTH)}")
        if self.client_auth_type != "NoClientCert" and not self.client_ca_file:  # Python verifies what it asks for
            raise WebConfigError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        for version in filter(None, (self.min_version, self.max_version)):
            if version not in TLS_VERSIONS:
                raise WebConfigError(f"TLS versions are one of {', '.join(TLS_VERSIONS)}, got {version}")
        for user, hashed in self.users.items():
            if not hashed.startswith((b"$2a$", b"$2b$", b"$2y$")):
                raise WebConfigError(f"basic_auth_users.{user} must be a bcrypt hash")

    def ssl_context(self) -> ssl.SSLContext | None:
        """Server TLS context, or None without TLS. Raises WebConfigError if files do not load."""
        if not self.cert_file:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                ctx.load_verify_locations(self.client_ca_file)
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"cannot load TLS files: {e}") from None
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return ctx


@functools.lru_cache(maxsize=256)
def _check(hashed: bytes, password: bytes) -> bool:
    # bcrypt is slow on purpose (tens of ms): cache results so scrapes stay cheap.
    return bcrypt.checkpw(password, hashed)


def authorized(users: dict[str, bytes], header: str | None) -> bool:
    """True if no users are configured or the Basic credentials match a user's bcrypt hash."""
    if not users:
        return True
    if not header or not header.startswith("Basic "):
        return False
    try:
        user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    hashed = users.get(user)
    return hashed is not None and _check(hashed, password.encode())


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # a stalled client holds only its own thread, and not for ever
    _tls_failed = False

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            # The TLS handshake runs here, on the request's thread: done in accept() it would
            # let one silent client stall every scrape and probe.
            try:
                self.connection.do_handshake()
            except OSError:  # plain HTTP, a bad client certificate, a timeout
                self._tls_failed = True

    def handle(self) -> None:
        if not self._tls_failed:
            super().handle()

    def log_message(self, *args) -> None:  # access logs would be one line per scrape
        pass


def _alive() -> tuple[bool, str]:
    return True, "ok"


PROBE_PATHS = ("/healthz", "/readyz")  # fixed: probes in deployments name them


def check_telemetry_path(path: str) -> str:
    """`path` if it can serve the metrics: an absolute URL path ("/metrics", "/custom", "/") that
    is neither probe's. Raises ValueError saying why not."""
    if not path.startswith("/") or any(c in "?#" or c.isspace() for c in path):
        raise ValueError(f"must be an absolute URL path such as /metrics (no query, fragment or spaces), "
                         f"got {path!r}")
    if path in PROBE_PATHS:
        raise ValueError(f"{path} is a probe's path ({' and '.join(PROBE_PATHS)} stay where they are)")
    return path


def make_app(metrics: Callable[[str | None, str | None], Exposition], ready: Callable[[], tuple[bool, str]],
             users: dict[str, bytes], alive: Callable[[], tuple[bool, str]] = _alive,
             telemetry_path: str = "/metrics"):
    """The WSGI application. `telemetry_path` serves `metrics(accept, accept_encoding)` (the
    request's Accept and Accept-Encoding headers, None when absent: the format and encoding are the
    callee's choice) behind basic auth when `users` is not empty; /healthz (liveness: `alive`) and
    /readyz (readiness: `ready`) answer 200 or 503 with the reason, and skip auth so that probes
    need no secret; every other path is 404 (but "/", an index). Raises ValueError for a telemetry
    path check_telemetry_path refuses."""
    check_telemetry_path(telemetry_path)
    index = f"gpuobs exporter: {telemetry_path} {' '.join(PROBE_PATHS)}\n".encode()

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path in PROBE_PATHS:
            ok, reason = (alive if path == "/healthz" else ready)()
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", reason.encode() + b"\n")
        if not authorized(users, environ.get("HTTP_AUTHORIZATION")):
            return _reply(start_response, "401 Unauthorized", b"unauthorized\n",
                          [("WWW-Authenticate", 'Basic realm="gpuobs"')])
        if path == telemetry_path:
            got = metrics(environ.get("HTTP_ACCEPT"), environ.get("HTTP_ACCEPT_ENCODING"))
            headers = [("Content-Type", got.content_type), ("Vary", "Accept, Accept-Encoding")]
            if got.gzipped:
                headers.append(("Content-Encoding", "gzip"))
            return _reply(start_response, "200 OK", got.body, headers)
        if path == "/":
            return _reply(start_response, "200 OK", index)
        return _reply(start_response, "404 Not Found", b"not found\n")

    return app


def _reply(start_response, status: str, body: bytes, headers: list[tuple[str, str]] | None = None):
    hdrs = headers or [("Content-Type", "text/plain; charset=utf-8")]
    start_response(status, hdrs + [("Content-Length", str(len(body)))])
    return [body]


class _Server(ThreadingWSGIServer):
    request_queue_size = 128  # the default 5 overflows under scrape storms (SYN retries of 1-3 s)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _DualStackServer(_Server6):
    """Every address, IPv6 and IPv4 (as mapped addresses), on one socket."""

    def server_bind(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # already dual-stack where it cannot be set
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def host_port(addr: str, port: int) -> str:
    """addr:port as a listen address is written, IPv6 in brackets ("[::1]:9445", ":9445" for every
    address)."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _bind(app, addr: str, port: int):
    """The WSGI server bound to addr:port: "" is every address (IPv6 and IPv4 where the host has
    IPv6, else IPv4), an IPv6 address or a name that resolves to one binds IPv6. Raises OSError."""
    if addr == "":
        try:
            return make_server("::", port, app, _DualStackServer, handler_class=_QuietHandler)
        except OSError as e:
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):  # IPv6 off on this host
                raise
        return make_server("0.0.0.0", port, app, _Server, handler_class=_QuietHandler)
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return make_server(addr, port, app, _Server6 if family == socket.AF_INET6 else _Server,
                       handler_class=_QuietHandler)


class HttpServer:
    """Serves the app on addr:port in a daemon thread ("" for every address; an IPv4 or IPv6
    address or a host name); `port` holds the bound port (0 picks one), `address` the bound
    address. Raises OSError (saying which address) when it cannot listen."""

    def __init__(self, app, addr: str, port: int, tls: ssl.SSLContext | None = None):
        try:
            self.httpd = _bind(app, addr, port)
        except OSError as e:  # gaierror too: a host name that does not resolve
            raise OSError(e.errno, f"cannot listen on {host_port(addr, port)}: {e.strerror}") from None
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.address, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="gpuobs-http", daemon=True)

    def start(self) -> "HttpServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
