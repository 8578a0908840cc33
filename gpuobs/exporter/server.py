"""HTTP for the exporter: /metrics, /healthz, /readyz, with TLS and basic auth from a Prometheus
web-config file (as exporter-toolkit exporters read it). Built on the standard library's WSGI
server in prometheus_client's threading variant; the handlers only hand out prepared bytes."""

from __future__ import annotations

import base64
import functools
import logging
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

import bcrypt
import yaml
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer

log = logging.getLogger("gpuobs.http")


class WebConfigError(ValueError):
    """The web-config file is missing, unreadable or inconsistent."""


@dataclass
class WebConfig:
    """Parsed Prometheus web-config: TLS files and bcrypt-hashed basic-auth users."""
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    users: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> "WebConfig":
        """Read a web-config YAML; paths are relative to the file. Raises WebConfigError."""
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise WebConfigError(f"cannot read web config {path}: {e}") from None
        if not isinstance(doc, dict):
            raise WebConfigError(f"web config {path} must be a mapping")
        tls = doc.get("tls_server_config") or {}
        rel = (lambda p: None if not p else (path.parent / p if not Path(p).is_absolute() else Path(p)))
        cfg = cls(rel(tls.get("cert_file")), rel(tls.get("key_file")), rel(tls.get("client_ca_file")),
                  tls.get("client_auth_type", "NoClientCert"),
                  {str(u): str(h).encode() for u, h in (doc.get("basic_auth_users") or {}).items()})
        if bool(cfg.cert_file) != bool(cfg.key_file):
            raise WebConfigError("tls_server_config needs both cert_file and key_file")
        for user, hashed in cfg.users.items():
            if not hashed.startswith((b"$2a$", b"$2b$", b"$2y$")):
                raise WebConfigError(f"basic_auth_users.{user} must be a bcrypt hash")
        return cfg

    def ssl_context(self) -> ssl.SSLContext | None:
        """Server TLS context, or None without TLS."""
        if not self.cert_file:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                ctx.load_verify_locations(self.client_ca_file)
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"cannot load TLS files: {e}") from None
        if self.client_auth_type in ("RequireAndVerifyClientCert", "RequireAnyClientCert"):
            ctx.verify_mode = ssl.CERT_REQUIRED
        elif self.client_auth_type == "VerifyClientCertIfGiven":
            ctx.verify_mode = ssl.CERT_OPTIONAL
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


def make_app(metrics: Callable[[], bytes], ready: Callable[[], tuple[bool, str]],
             users: dict[str, bytes]):
    """The WSGI application. /healthz and /readyz skip auth so that probes need no secret."""

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return _reply(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            ok, reason = ready()
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", reason.encode() + b"\n")
        if not authorized(users, environ.get("HTTP_AUTHORIZATION")):
            return _reply(start_response, "401 Unauthorized", b"unauthorized\n",
                          [("WWW-Authenticate", 'Basic realm="gpuobs"')])
        if path == "/metrics":
            # text format 0.0.4: what generate_latest writes (1.0.0 also needs an escaping= parameter)
            return _reply(start_response, "200 OK", metrics(), [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)])
        if path == "/":
            return _reply(start_response, "200 OK", b"gpuobs exporter: /metrics /healthz /readyz\n")
        return _reply(start_response, "404 Not Found", b"not found\n")

    return app


def _reply(start_response, status: str, body: bytes, headers: list[tuple[str, str]] | None = None):
    hdrs = headers or [("Content-Type", "text/plain; charset=utf-8")]
    start_response(status, hdrs + [("Content-Length", str(len(body)))])
    return [body]


class HttpServer:
    """Serves the app on addr:port in a daemon thread; `port` holds the bound port (0 picks one)."""

    def __init__(self, app, addr: str, port: int, tls: ssl.SSLContext | None = None):
        self.httpd = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="gpuobs-http", daemon=True)

    def start(self) -> "HttpServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
