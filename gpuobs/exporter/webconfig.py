"""The Prometheus web-config file (as exporter-toolkit exporters read it) and what it sets up for the
HTTP server: basic auth checked as exporter-toolkit checks it, and a TLS context that follows the
certificate and key on disk.

Basic auth defends against guessing and enumeration without letting a guesser burn the node's CPU:
an unknown user is compared against a dummy hash of the users' own bcrypt cost (so it costs what a
wrong password costs), a password over bcrypt's 72 bytes is refused without hashing (401, never a
500), bcrypt runs one check at a time (BasicAuth.check is called from one thread), and recent
successes are cached by a digest of user, password and hash, so that a scrape with the right
credentials costs no bcrypt."""

from __future__ import annotations

import base64
import collections
import hashlib
import logging
import os
import secrets
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

log = logging.getLogger("gpuobs.http")

BCRYPT_MAX_PASSWORD = 72  # bytes: bcrypt ignores (bcrypt 5 refuses) anything longer
SUCCESS_CACHE = 256       # recent successful (user, password) digests kept


class WebConfigError(ValueError):
    """The web-config file is missing, unreadable or inconsistent."""


CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
               "RequireAnyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TOP_KEYS = {"tls_server_config", "basic_auth_users"}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    return value


def _known(doc: dict[str, Any], allowed: set[str], where: str) -> None:
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

        def rel(p: object) -> Path | None:
            return None if not p else Path(str(p)) if Path(str(p)).is_absolute() else path.parent / str(p)

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


def _cost(hashed: bytes) -> int:
    """The cost (log2 rounds) of a bcrypt hash "$2b$NN$..."; 10 where it cannot be read."""
    try:
        return int(hashed.split(b"$")[2])
    except (IndexError, ValueError):
        return 10


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) of a Basic Authorization header, None when it is absent or malformed."""
    if not header or not header.startswith("Basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password.encode()) if sep else None


class BasicAuth:
    """Basic-auth checks against `users` (name -> bcrypt hash, from WebConfig.users); an empty
    mapping lets every request through."""

    def __init__(self, users: dict[str, bytes]):
        self.users = dict(users)
        # a wrong user must cost what a wrong password costs: the dummy has the users' highest cost
        cost = max((_cost(h) for h in self.users.values()), default=10)
        self._dummy = bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(rounds=cost))
        self._ok: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _key(self, user: str, password: bytes) -> bytes:
        hashed = self.users.get(user, self._dummy)
        return hashlib.sha256(b"\0".join((user.encode(), password, hashed))).digest()

    def quick(self, header: str | None) -> bool | None:
        """True or False when the answer needs no bcrypt (no users, a cached success, a missing,
        malformed or over-long credential), None when check() must decide."""
        if not self.users:
            return True
        creds = _credentials(header)
        if creds is None or len(creds[1]) > BCRYPT_MAX_PASSWORD:
            return False
        with self._lock:
            if self._key(*creds) in self._ok:
                self._ok.move_to_end(self._key(*creds))
                return True
        return None

    def check(self, header: str | None) -> bool:
        """True if the header's credentials match a user's hash; runs bcrypt (tens of ms at cost
        10), against the dummy hash for an unknown user. Never raises."""
        verdict = self.quick(header)
        if verdict is not None:
            return verdict
        creds = _credentials(header)
        if creds is None:  # quick() answered False for it: not reached
            return False
        user, password = creds
        hashed = self.users.get(user)
        try:
            ok = bcrypt.checkpw(password, hashed or self._dummy) and hashed is not None
        except ValueError:  # a hash bcrypt cannot read: configured, so checked at load; never a 500
            ok = False
        if ok:
            with self._lock:
                self._ok[self._key(user, password)] = None
                while len(self._ok) > SUCCESS_CACHE:
                    self._ok.popitem(last=False)
        return ok


def _signature(paths: list[Path]) -> tuple[tuple[int, int, int] | None, ...]:
    """What changes when a file is replaced or rewritten: inode, size and mtime of each path (None for
    one that cannot be read)."""
    out: list[tuple[int, int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


class TlsReloader:
    """Callable giving the server's TLS context for a new handshake, rebuilt from the web config's
    files when any of them changed on disk (as exporter-toolkit reloads per handshake). A change
    that does not load (a half-written key) keeps the previous context and logs a warning once per
    change."""

    def __init__(self, config: "WebConfig"):
        self.config = config
        self._files = [p for p in (config.cert_file, config.key_file, config.client_ca_file) if p]
        self._seen = _signature(self._files)
        ctx = config.ssl_context()  # raises WebConfigError at start: a bad file is fatal then
        if ctx is None:
            raise WebConfigError("no cert_file: no TLS context to reload")
        self._ctx = ctx

    def __call__(self) -> ssl.SSLContext:
        now = _signature(self._files)
        if now != self._seen:
            self._seen = now
            try:
                self._ctx = self.config.ssl_context() or self._ctx
                log.info("TLS certificate reloaded", extra={"cert_file": str(self.config.cert_file)})
            except WebConfigError as e:
                log.warning("TLS files changed but do not load; serving the previous ones",
                            extra={"error": str(e)})
        return self._ctx
