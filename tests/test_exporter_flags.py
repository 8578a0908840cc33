"""`gpuobs exporter`'s exporter-toolkit flags (--web.listen-address, --web.telemetry-path,
--web.config.file) on a child process, their environment variables, the usage errors when flags
disagree, and an environment variable for every flag, in --help and in docs/exporter.md."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import bcrypt
import pytest
import yaml
from conftest import REPO, free_port
from test_exporter_http import SCENARIO, clean_env, cli_exporter, fetch, parse

from gpuobs.cli import exporter as exporter_command
from gpuobs.exporter import ExporterConfig
from gpuobs.exporter.server import Exposition, HttpServer, Limits, check_telemetry_path, make_app

METRICS = b"gpuobs_test_value 1\n"


def metrics(accept=None, accept_encoding=None) -> Exposition:
    return Exposition(METRICS, "text/plain; version=0.0.4; charset=utf-8")


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def listening(err) -> dict:
    """The exporter's "exporter listening" log record (its stderr is JSON lines)."""
    return next(r for r in map(json.loads, err.read_text().splitlines()) if r["message"] == "exporter listening")


def gpus_up(body: str) -> int:
    return len([1 for name, _, value in parse(body) if name == "gpuobs_gpu_up" and value == 1])


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`gpuobs exporter ARGS` that should stop at a usage error (the timeout catches one that serves)."""
    return subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", *args], cwd=REPO, env=clean_env(**env),
                          capture_output=True, text=True, timeout=30)


# ------------------------------------------------------------------------- the flags, end to end

def test_web_listen_address_and_telemetry_path_move_the_metrics(tmp_path):
    port = free_port()
    args = ["--simulate", str(SCENARIO), "--interval", "0.5", f"--web.listen-address=127.0.0.1:{port}",
            "--web.telemetry-path=/custom"]
    with cli_exporter(tmp_path, args, port=port) as (_, url, err):
        status, headers, body = fetch(url + "/custom")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert gpus_up(body) == 8
        assert fetch(url + "/metrics")[0] == 404
        assert fetch(url + "/healthz")[:3:2] == (200, "ok\n") and fetch(url + "/readyz")[0] == 200
        assert "/custom" in fetch(url + "/")[2]
        record = listening(err)
        assert (record["address"], record["port"], record["path"]) == ("127.0.0.1", port, "/custom")


def test_web_flags_from_environment_variables(tmp_path):
    """GPUOBS_WEB_* set what the flags do; a GPUOBS_PORT that agrees is no conflict; the web-config
    file given as --web.config.file puts the moved metrics behind basic auth, probes stay open."""
    port = free_port()
    config = tmp_path / "web.yml"
    config.write_text(yaml.safe_dump({"basic_auth_users": {
        "prom": bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()}}))
    env = clean_env(GPUOBS_WEB_LISTEN_ADDRESS=f"127.0.0.1:{port}", GPUOBS_PORT=str(port),
                    GPUOBS_WEB_TELEMETRY_PATH="/gpu", GPUOBS_SIMULATE=str(SCENARIO), GPUOBS_INTERVAL="0.5")
    with cli_exporter(tmp_path, ["--web.config.file", str(config)], env=env, port=port) as (_, url, err):
        assert fetch(url + "/gpu")[0] == 401
        status, _, body = fetch(url + "/gpu", auth=("prom", "secret"))
        assert status == 200 and gpus_up(body) == 8
        assert fetch(url + "/metrics", auth=("prom", "secret"))[0] == 404
        assert fetch(url + "/readyz")[0] == 200
        assert listening(err)["path"] == "/gpu"


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_web_listen_address_ipv6(tmp_path):
    port = free_port()
    args = ["--simulate", str(SCENARIO), "--interval", "0.5", f"--web.listen-address=[::1]:{port}"]
    with cli_exporter(tmp_path, args, port=port, url=f"http://[::1]:{port}") as (_, url, err):
        status, _, body = fetch(url + "/metrics")
        assert status == 200 and gpus_up(body) == 8
        assert listening(err)["address"] == "::1"
        with pytest.raises(OSError):  # IPv6 loopback only
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


# ---------------------------------------------------------------------------------- usage errors

@pytest.mark.parametrize("args, env, message", [
    (["--web.listen-address=127.0.0.1:9500", "--port", "9445"], {},
     "--web.listen-address=127.0.0.1:9500 disagrees with --port=9445"),
    (["--web.listen-address=127.0.0.1:9500", "--listen-address", "0.0.0.0"], {},
     "--web.listen-address=127.0.0.1:9500 disagrees with --listen-address=0.0.0.0"),
    (["--web.listen-address=:9500"], {"GPUOBS_PORT": "9445"}, "--web.listen-address=:9500 disagrees with GPUOBS_PORT=9445"),
    ([], {"GPUOBS_WEB_LISTEN_ADDRESS": "[::1]:9445", "GPUOBS_LISTEN_ADDRESS": "127.0.0.1"},
     "GPUOBS_WEB_LISTEN_ADDRESS=[::1]:9445 disagrees with GPUOBS_LISTEN_ADDRESS=127.0.0.1"),
    (["--web.listen-address=::1:9445"], {}, "expected host:port, :port (every address) or [IPv6]:port"),
    (["--web.listen-address=[not-ipv6]:9445"], {}, "expected host:port"),
    (["--web.listen-address=localhost"], {}, "expected host:port"),
    (["--web.listen-address=localhost:65536"], {}, "with a port of 0 to 65535"),
    (["--web.telemetry-path=/healthz"], {}, "/healthz is a probe's path"),
    (["--web.telemetry-path=/readyz"], {}, "/readyz is a probe's path"),
    (["--web.telemetry-path=metrics"], {}, "must be an absolute URL path"),
    ([], {"GPUOBS_WEB_TELEMETRY_PATH": "/metrics?x=1"}, "must be an absolute URL path"),
    (["--web.max-connections=8", "--web.max-connections-per-client=9"], {},
     "per-client connection cap (9) is over the connection cap (8): --web.max-connections-per-client=9, "
     "--web.max-connections=8"),
    ([], {"GPUOBS_WEB_MAX_CONNECTIONS": "8", "GPUOBS_WEB_MAX_CONNECTIONS_PER_CLIENT": "9"},
     "GPUOBS_WEB_MAX_CONNECTIONS_PER_CLIENT=9, GPUOBS_WEB_MAX_CONNECTIONS=8"),
    (["--web.max-connections=0"], {}, "0 is not in the range x>=1"),
    (["--web.max-connections-per-client=-3"], {}, "-3 is not in the range x>=1"),
    ([], {"GPUOBS_WEB_MAX_CONNECTIONS": "many"}, "'many' is not a valid integer"),
])
def test_conflicting_or_malformed_flags_are_usage_errors(args, env, message):
    r = run_cli("--simulate", str(SCENARIO), *args, **env)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("total, per_client", [(0, 1), (4, 0), (4, 5), (4, 2.5), (True, 1)])
def test_connection_caps_refused_in_the_server_limits(total, per_client):
    with pytest.raises(ValueError, match="connection cap"):
        Limits(max_connections=total, max_per_client=per_client)


def test_configured_caps_kept_and_held_under_the_open_files_limit():
    assert ExporterConfig().max_connections_per_client == Limits().max_per_client <= ExporterConfig().max_connections
    assert Limits(max_connections=4, max_per_client=2).for_open_files(1024) == Limits(max_connections=4,
                                                                                      max_per_client=2)
    assert Limits(max_connections=900, max_per_client=900).for_open_files(1024) == Limits(max_connections=896,
                                                                                          max_per_client=896)


# ----------------------------------------------------------- an environment variable for each flag

def help_entries(text: str) -> dict[str, str]:
    """--help's Options section: {first flag: its whole entry, whitespace collapsed}."""
    entries: dict[str, str] = {}
    flag = None
    for line in text.split("Options:", 1)[1].splitlines():
        m = re.match(r"  (-[-\w.]+)", line)
        if m:
            flag = m.group(1)
            entries[flag] = line
        elif flag and line.strip():
            entries[flag] += " " + line
    return {f: " ".join(e.split()) for f, e in entries.items()}


def envvars(param) -> list[str]:
    return [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])


def test_help_shows_an_environment_variable_for_every_flag():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    entries = help_entries(r.stdout)
    params = [p for p in exporter_command.params if p.name != "help"]
    assert set(entries) - {"--help"} == {p.opts[0] for p in params}
    for param in params:
        shown = re.search(r"\[env var: ([^;\]]+)", entries[param.opts[0]].replace(", ", ","))
        assert shown, entries[param.opts[0]]
        assert shown.group(1).split(",") == envvars(param) and envvars(param), param.opts[0]
    assert next(p for p in params if p.name == "telemetry_path").default == ExporterConfig().telemetry_path
    names = [name for p in params for name in envvars(p)]
    assert len(names) == len(set(names))  # one flag per variable
    assert all(name.startswith("GPUOBS_") for name in (envvars(p)[0] for p in params))


def test_docs_flag_table_lists_every_flag_and_its_variables():
    rows = {}
    for line in (REPO / "docs" / "exporter.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `--") and len(cells) == 4:
            for flag in re.findall(r"`(--[^`]+)`", cells[0]):
                rows[flag] = re.findall(r"`([A-Z_]+)`", cells[1])
    for param in exporter_command.params:
        if param.name != "help":
            for flag in param.opts:
                assert rows.get(flag) == envvars(param), flag


# --------------------------------------------------------------------------- the server, in process

def call(app, path: str) -> tuple[int, bytes]:
    """(status, body) of a GET of `path` from `app` served by a real HttpServer."""
    server = HttpServer(app, "127.0.0.1", 0).start()
    try:
        status, _, body = fetch(f"http://127.0.0.1:{server.port}{path}")
        return status, body.encode()
    finally:
        server.stop()


def test_telemetry_path_in_the_app():
    app = make_app(metrics, lambda: (True, "ready"), {}, telemetry_path="/custom/metrics")
    assert call(app, "/custom/metrics") == (200, METRICS)
    assert call(app, "/metrics")[0] == call(app, "/custom")[0] == 404
    assert call(app, "/healthz") == (200, b"ok\n") and call(app, "/readyz") == (200, b"ready\n")
    assert call(app, "/") == (200, b"gpuobs exporter: /custom/metrics /healthz /readyz\n")
    root = make_app(metrics, lambda: (True, "ready"), {}, telemetry_path="/")
    assert call(root, "/") == (200, METRICS) and call(root, "/metrics")[0] == 404


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "", "metrics", "/a b", "/m?x", "/m#x"])
def test_telemetry_path_refused(path):
    with pytest.raises(ValueError):
        check_telemetry_path(path)
    with pytest.raises(ValueError):
        make_app(metrics, lambda: (True, "ready"), {}, telemetry_path=path)


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_every_address_serves_ipv4_and_ipv6():
    server = HttpServer(make_app(metrics, lambda: (True, "ready"), {}), "", 0).start()
    try:
        for url in (f"http://127.0.0.1:{server.port}/metrics", f"http://[::1]:{server.port}/metrics"):
            assert fetch(url)[::2] == (200, METRICS.decode()), url
    finally:
        server.stop()


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_listen_error_names_an_ipv6_address_in_brackets():
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=re.escape(f"cannot listen on [::1]:{port}: ")):
            HttpServer(make_app(metrics, lambda: (True, "ready"), {}), "::1", port)


def test_unresolvable_listen_address_is_an_oserror():
    with pytest.raises(OSError, match=r"cannot listen on no-such-host\.invalid:0: "):
        HttpServer(make_app(metrics, lambda: (True, "ready"), {}), "no-such-host.invalid", 0)
