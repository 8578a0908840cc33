"""The exporter's HTTP layer under a hostile client (issue 26), on `gpuobs exporter --simulate` as a
child process: ~1,100 trickling connections from one address with the open-files limit at 1,024
(another client's scrapes still answered within 1 s, the exporter under 20 % of a core, the
refusals counted), a header deadline that no byte restarts, basic-auth timing that does not tell
users apart, an over-long password answered 401, a rotated certificate served on the next
handshake, HEAD, refused methods, q-values, and accept() out of file descriptors backed off and
counted."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import bcrypt
import pytest
from conftest import REPO, free_port
from test_exporter_http import SCENARIO, clean_env, cli_exporter, fetch, parse, tls_files, write_web_config  # noqa: F401

from gpuobs.exporter.server import Limits

ATTACKERS = 1100
NOFILE = 1024  # systemd's default soft limit, the one the slowloris exhausted
LIMITS = Limits()
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and 127.0.0.0/8")


def simulate(port: int, *extra: str) -> list[str]:
    return ["--simulate", str(SCENARIO), "--interval", "1", "--listen-address", "127.0.0.1", "--port", str(port),
            *extra]


def refused(url: str, context=None, auth=None) -> dict[str, float]:
    """gpuobs_exporter_http_connections_refused_total by reason, from a scrape."""
    status, _, body = fetch(url + "/metrics", context, auth)
    assert status == 200
    return {l["reason"]: v for n, l, v in parse(body) if n == "gpuobs_exporter_http_connections_refused_total"}


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def limit_open_files() -> None:  # preexec_fn: soft and hard at 1,024, so raising the soft one gains nothing
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
def many_files():
    """This process's soft open-files limit raised for ~1,100 sockets (skips where it cannot be)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ATTACKERS + 400
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"hard open-files limit {hard} < {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Trickler:
    """Connections from one address (127.0.0.2) that send one request byte per tick and are
    reopened when the server closes them, as a slowloris client does."""

    REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 4000

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.socks: list[tuple[socket.socket, int]] = []
        self.reopened = 0

    def _open(self) -> tuple[socket.socket, int]:
        s = socket.socket()
        s.setblocking(False)
        s.bind(("127.0.0.2", 0))
        s.connect_ex(("127.0.0.1", self.port))
        return s, 0

    def tick(self) -> None:
        """Send each connection its next byte; replace the ones the server closed."""
        if not self.socks:
            self.socks = [self._open() for _ in range(self.count)]
            return
        for i, (s, sent) in enumerate(self.socks):
            try:
                s.send(self.REQUEST[sent % len(self.REQUEST):][:1])
                self.socks[i] = (s, sent + 1)
            except BlockingIOError:
                pass  # still connecting
            except OSError:  # refused or closed at the deadline: come back
                s.close()
                self.socks[i] = self._open()
                self.reopened += 1

    def close(self) -> None:
        for s, _ in self.socks:
            s.close()


def scrape_times(url: str, stop: threading.Event, out: list) -> None:
    """(status, seconds) of scrapes on new connections from 127.0.0.1, every 0.25 s until `stop`."""
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            status = fetch(url + "/metrics")[0]
        except OSError as e:
            status = repr(e)
        out.append((status, time.monotonic() - t0))
        stop.wait(0.25)


@linux_only
def test_trickling_connections_from_one_client_leave_scrapes_answered(tmp_path, many_files):
    port = free_port()
    with cli_exporter(tmp_path, simulate(port), port=port, preexec_fn=limit_open_files) as (proc, url, err):
        records = [json.loads(line) for line in err.read_text().splitlines()]
        nofile = next(r for r in records if r["message"].startswith("open-files limit"))
        assert nofile["soft"] == NOFILE == nofile["hard"]  # logged; here there is nothing to raise it to
        attack, stop, scrapes = Trickler(port, ATTACKERS), threading.Event(), []
        attack.tick()
        time.sleep(1)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        scraper = threading.Thread(target=scrape_times, args=(url, stop, scrapes))
        scraper.start()
        try:
            while time.monotonic() - t0 < LIMITS.header_timeout + 5:  # past one header deadline
                attack.tick()
                time.sleep(1)
        finally:
            stop.set()
            scraper.join()
        cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        attack.close()
        bad = [s for s in scrapes if s[0] != 200 or s[1] >= 1.0]
        assert len(scrapes) >= 20 and not bad, f"{len(bad)} of {len(scrapes)} scrapes late or failed: {bad[:5]}"
        assert cpu < 0.20, f"exporter used {cpu:.0%} of a core under attack"
        counts = refused(url)
        print(f"scrapes {len(scrapes)}, slowest {max(t for _, t in scrapes):.3f}s; exporter CPU {cpu:.1%}; {counts}")
        # all but the client's share refused at once, then its share closed at the header deadline
        assert counts["client_limit"] >= ATTACKERS - LIMITS.max_per_client, counts
        assert counts["deadline"] >= LIMITS.max_per_client, counts
        assert counts["open_files"] == 0, counts  # the cap stays under the limit: accept() never failed
        assert attack.reopened >= ATTACKERS - LIMITS.max_per_client


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """One plain-HTTP exporter child for the smaller checks: its base url."""
    port = free_port()
    with cli_exporter(tmp_path_factory.mktemp("child"), simulate(port), port=port) as (_, url, _err):
        yield url


def test_header_deadline_is_not_restarted_by_each_byte(child):
    host, port = child.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        t0, closed = time.monotonic(), None
        s.settimeout(0.5)
        for byte in Trickler.REQUEST:  # a byte every 0.5 s: a per-byte timeout would never fire
            try:
                s.send(bytes([byte]))
                if s.recv(1) == b"":
                    closed = time.monotonic() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = time.monotonic() - t0
                break
            if time.monotonic() - t0 > LIMITS.header_timeout + 5:
                break
    assert closed is not None and LIMITS.header_timeout - 1 <= closed <= LIMITS.header_timeout + 3, closed


def raw(url: str, request: bytes) -> tuple[bytes, bytes]:
    """(head, body) of one raw HTTP/1.1 exchange that closes the connection."""
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def test_head_has_no_body_and_other_methods_get_405(child):
    head, body = raw(child, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
    assert head.startswith(b"HTTP/1.1 200") and length > 1000 and body == b""
    for method in ("POST", "DELETE", "PUT", "PATCH", "OPTIONS"):
        head, body = raw(child, f"{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".encode())
        assert head.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in head, method
        assert b"gpuobs_gpu_up" not in body


@pytest.mark.parametrize("accept, encoding, content_type, gzipped", [
    ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "gzip",
     "application/openmetrics-text", True),  # Prometheus
    ("text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5", "gzip;q=0", "text/plain", False),
    ("application/openmetrics-text;q=0,text/plain;q=0.2", "identity;q=0.1, gzip;q=0.9", "text/plain", True),
])
def test_q_values_choose_format_and_encoding(child, accept, encoding, content_type, gzipped):
    req = urllib.request.Request(child + "/metrics", headers={"Accept": accept, "Accept-Encoding": encoding})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.headers["Content-Type"].startswith(content_type)
        assert (r.headers.get("Content-Encoding") == "gzip") == gzipped
        assert r.read()[:2] == b"\x1f\x8b" if gzipped else True


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def timed_status(url: str, headers: dict[str, str]) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            status = r.status
            r.read()
    except urllib.error.HTTPError as e:
        status = e.code
    return status, time.monotonic() - t0


def test_basic_auth_does_not_tell_users_apart(tmp_path):
    hashed = bcrypt.hashpw(b"right-password", bcrypt.gensalt(rounds=10)).decode()  # a realistic cost
    path = write_web_config(tmp_path, {"basic_auth_users": {"prometheus": hashed}})
    port = free_port()
    with cli_exporter(tmp_path, simulate(port, f"--web.config.file={path}"), port=port) as (_, url, _err):
        metrics = url + "/metrics"
        unknown, wrong = [], []
        for _ in range(50):  # interleaved, so that machine load falls on both alike
            status, t = timed_status(metrics, basic("nobody", "wrong-password"))
            assert status == 401
            unknown.append(t)
            status, t = timed_status(metrics, basic("prometheus", "wrong-password"))
            assert status == 401
            wrong.append(t)
        a, b = statistics.median(unknown), statistics.median(wrong)
        print(f"median 401: unknown user {a * 1000:.1f} ms, wrong password {b * 1000:.1f} ms")
        assert max(a, b) / min(a, b) < 1.5, (a, b)
        assert timed_status(metrics, basic("prometheus", "x" * 80))[0] == 401  # over bcrypt's 72 bytes
        assert timed_status(metrics, basic("prometheus", "é" * 40))[0] == 401  # 80 bytes of UTF-8
        assert timed_status(metrics, basic("prometheus", "right-password"))[0] == 200
        status, again = timed_status(metrics, basic("prometheus", "right-password"))
        assert status == 200 and again < b / 2, (again, b)  # a recent success costs no bcrypt


def make_cert(cert, key, name: str) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=30)


def served_cert(port: int) -> bytes:
    """The DER certificate the server presents on a new handshake."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, ctx.wrap_socket(s) as tls:
        return tls.getpeercert(binary_form=True)


def der(cert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def test_rotated_certificate_is_served_on_the_next_handshake(tmp_path, tls_files):
    cert, key = tls_files
    path = write_web_config(tmp_path, {"tls_server_config": {"cert_file": "cert.pem", "key_file": "key.pem"}})
    port = free_port()
    first = ssl.create_default_context(cafile=str(cert))
    with cli_exporter(tmp_path, simulate(port, f"--web.config.file={path}"), port=port,
                      url=f"https://127.0.0.1:{port}", context=first) as (_, url, err):
        assert served_cert(port) == der(cert)
        new_cert, new_key = tmp_path / "new-cert.pem", tmp_path / "new-key.pem"
        make_cert(new_cert, new_key, "rotated")
        os.replace(new_key, key)  # as cert-manager or a deploy tool replaces them: rename over
        os.replace(new_cert, cert)
        assert served_cert(port) == der(cert)  # the next handshake, no restart
        assert fetch(url + "/metrics", ssl.create_default_context(cafile=str(cert)))[0] == 200
        rotated = der(cert)
        cert.write_text("not a certificate")  # a broken rotation keeps the last good pair
        assert served_cert(port) == rotated
        assert "do not load" in err.read_text()


EMFILE_CHILD = textwrap.dedent("""
    import json, resource, sys
    from gpuobs.exporter.server import Exposition, HttpServer, Limits, make_app
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    holder = {}
    def metrics(accept=None, encoding=None):
        return Exposition(json.dumps(holder["server"].refused_counts()).encode(), "text/plain")
    server = HttpServer(make_app(metrics, lambda: (True, "ready"), {}), "127.0.0.1", 0,
                        limits=Limits(max_connections=1000, max_per_client=1000)).start()
    holder["server"] = server
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()
""")


def test_accept_out_of_file_descriptors_backs_off_and_counts():
    # No cap here, so that accept() itself runs out: the exporter keeps its cap under the limit instead
    proc = subprocess.Popen([sys.executable, "-c", EMFILE_CHILD], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        cpu0 = cpu_seconds(proc.pid)
        with contextlib.ExitStack() as stack:
            for _ in range(100):
                stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(3)
            cpu = (cpu_seconds(proc.pid) - cpu0) / 3
        assert cpu < 0.2, f"{cpu:.0%} of a core while out of descriptors: a spin, not a back-off"
        deadline = time.monotonic() + 10
        while True:  # the sockets are closed: served again once the back-off ends
            with contextlib.suppress(OSError):
                status, _, body = fetch(f"http://127.0.0.1:{port}/metrics")
                if status == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        counts = json.loads(body)
        assert 1 <= counts["open_files"] <= 10, counts  # about one a second, not one per retry
    finally:
        proc.stdin.close()
        proc.wait(10)


def held(port: int, source: str) -> socket.socket:
    """A keep-alive connection from `source` that has had one answer (so it holds a slot)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200"), "a connection under the cap was not answered"
    return s


def answered(port: int, source: str) -> bool:
    """Whether a new connection from `source` gets an answer (False: closed or reset unanswered)."""
    try:
        with held(port, source):
            return True
    except (OSError, AssertionError):
        return False


@linux_only
def test_connection_caps_from_flag_and_variable_take_effect(tmp_path):
    """--web.max-connections-per-client 2 on a running exporter: a client's third concurrent
    connection is refused and counted as client_limit, another client's is answered; the total cap
    from GPUOBS_WEB_MAX_CONNECTIONS (4) refuses a fifth connection, counted as limit."""
    port = free_port()
    env = clean_env(GPUOBS_WEB_MAX_CONNECTIONS="4")
    with cli_exporter(tmp_path, simulate(port, "--web.max-connections-per-client", "2"), env=env,
                      port=port) as (_, url, _err):
        before = refused(url)
        with contextlib.ExitStack() as stack:
            for _ in range(2):
                stack.enter_context(held(port, "127.0.0.2"))
            assert not answered(port, "127.0.0.2")  # the client's third
            stack.enter_context(held(port, "127.0.0.3"))  # another client: 3 open
            stack.enter_context(held(port, "127.0.0.4"))  # 4 open: the total cap
            assert not answered(port, "127.0.0.5")
        deadline = time.monotonic() + 10  # counts are served with the next sampling pass
        counts = before
        while time.monotonic() < deadline and not all(counts[r] > before[r] for r in ("client_limit", "limit")):
            time.sleep(0.5)
            with contextlib.suppress(OSError):  # a closed connection's slot may not be free yet
                counts = refused(url)
        assert counts["client_limit"] - before["client_limit"] == 1, counts
        assert counts["limit"] - before["limit"] == 1, counts
