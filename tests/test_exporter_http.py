"""The exporter over HTTP: TLS and basic auth from a web-config file, probes, dcgm-exporter naming,
OTLP push (decoded by a real collector endpoint), the `gpuobs exporter` command, and promtool."""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent import futures

import bcrypt
import pytest
import yaml
from conftest import REPO, OTLPReceiver, free_port
from prometheus_client.parser import text_string_to_metric_families

from gpuobs import catalog as c
from gpuobs.collect import REGISTRY
from gpuobs.exporter import Exporter, ExporterConfig
from gpuobs.exporter.render import SELF_FAMILIES
from gpuobs.exporter.server import WebConfig, WebConfigError
from gpuobs.sim import scenario
from gpuobs.sim.state import set_val

SCENARIO = REPO / "examples" / "scenarios" / "8xh100.yaml"
EIGHT = scenario.load(SCENARIO)
TWO = {"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}
MIB = 1024 * 1024
SELF_HEALTH = {m.exposed_name for m in c.ALL if m.family in SELF_FAMILIES}
BY_EXPOSED = {m.exposed_name: m for m in c.ALL}


def parse(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def fetch(url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None):
    """(status, headers, body) of one GET; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


# ------------------------------------------------------------------------------- TLS + basic auth

@pytest.fixture
def tls_files(tmp_path):
    """A self-signed certificate for 127.0.0.1 and its key, made with the openssl CLI."""
    if not shutil.which("openssl"):
        pytest.skip("openssl CLI not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=30)
    return cert, key


def write_web_config(tmp_path, doc: dict):
    path = tmp_path / "web-config.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_tls_and_basic_auth_from_web_config(exporter, tls_files, tmp_path):
    cert, _ = tls_files
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    # relative paths: resolved against the web-config file's folder
    path = write_web_config(tmp_path, {"tls_server_config": {"cert_file": "cert.pem", "key_file": "key.pem"},
                                       "basic_auth_users": {"prometheus": hashed}})
    run = exporter(TWO, web_config=str(path))
    base = f"https://127.0.0.1:{run.exp.http.port}"
    trust = ssl.create_default_context(cafile=str(cert))

    status, headers, _ = fetch(base + "/metrics", trust)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
    assert fetch(base + "/metrics", trust, ("prometheus", "wrong"))[0] == 401
    assert fetch(base + "/metrics", trust, ("nobody", "s3cret"))[0] == 401
    status, _, body = fetch(base + "/metrics", trust, ("prometheus", "s3cret"))
    assert status == 200
    up = {l["uuid"]: v for n, l, v in parse(body) if n == "gpuobs_gpu_up"}
    assert len(up) == 2 and set(up.values()) == {1.0}
    # probes need no secret
    assert fetch(base + "/healthz", trust)[:1] == (200,)
    status, _, body = fetch(base + "/readyz", trust)
    assert (status, body.strip()) == (200, "ready")
    # the certificate is really checked: a client that does not trust it fails
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(base + "/healthz", ssl.create_default_context())
    # plain HTTP to the TLS port gets no answer, and the server keeps serving TLS
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{run.exp.http.port}/healthz", timeout=5).read()
    assert fetch(base + "/healthz", trust)[0] == 200


def test_tls_client_that_never_handshakes_does_not_block_scrapes(exporter, tls_files, tmp_path):
    path = write_web_config(tmp_path, {"tls_server_config": {"cert_file": "cert.pem", "key_file": "key.pem"}})
    run = exporter(TWO, web_config=str(path))
    trust = ssl.create_default_context(cafile=str(tls_files[0]))
    with socket.create_connection(("127.0.0.1", run.exp.http.port)):  # connects, then says nothing
        t0 = time.monotonic()
        status, _, body = fetch(f"https://127.0.0.1:{run.exp.http.port}/metrics", trust)
        assert status == 200 and "gpuobs_gpu_up" in body
        assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("doc, message", [
    ({"tls_server_config": {"cert_file": "cert.pem"}}, "key_file"),
    ({"basic_auth_users": {"alice": "hunter2"}}, "bcrypt"),
    (["not", "a", "mapping"], "mapping"),
    ({"tls_config": {"cert_file": "c", "key_file": "k"}}, "unsupported keys tls_config"),  # misspelt: not plain HTTP
    ({"tls_server_config": {"cert_file": "c", "key_file": "k", "cipher_suites": ["x"]}}, "unsupported keys cipher"),
    ({"tls_server_config": {"cert_file": "c", "key_file": "k", "client_auth_type": "Bogus"}}, "client_auth_type must"),
    ({"tls_server_config": {"cert_file": "c", "key_file": "k", "client_auth_type": "RequireAndVerifyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "c", "key_file": "k", "min_version": "SSL3"}}, "TLS versions"),
    ({"tls_server_config": [1, 2]}, "tls_server_config must be a mapping"),
    ({"basic_auth_users": ["a", "b"]}, "basic_auth_users must be a mapping"),
])
def test_bad_web_config_is_a_clear_error(tmp_path, doc, message):
    path = write_web_config(tmp_path, doc)
    with pytest.raises(WebConfigError, match=message):
        WebConfig.load(path)
    with pytest.raises(WebConfigError, match=message):  # before anything starts
        Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, web_config=str(path)))


def test_web_config_with_missing_tls_files_is_a_clear_error(tmp_path):
    path = write_web_config(tmp_path, {"tls_server_config": {"cert_file": "nope.pem", "key_file": "nope.key"}})
    with pytest.raises(WebConfigError, match="cannot load TLS files"):
        WebConfig.load(path).ssl_context()


def test_cli_exits_non_zero_on_a_bad_web_config(tmp_path):
    path = write_web_config(tmp_path, {"tls_server_config": {"cert_file": "cert.pem"},
                                       "basic_auth_users": {"alice": "plain"}})
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--simulate", str(SCENARIO), "--port", "0",
                        "--listen-address", "127.0.0.1", "--web-config", str(path)],
                       cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "Error: tls_server_config needs both cert_file and key_file" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ probes and paths

def test_probes_paths_and_content_type(exporter):
    run = exporter(TWO)
    assert run.get("/readyz") == (200, "ready\n")
    assert run.get("/healthz") == (200, "ok\n")
    assert run.get("/nope")[0] == 404
    assert run.get("/metrics/extra")[0] == 404
    assert "/metrics" in run.get("/")[1]
    with urllib.request.urlopen(run.url + "/metrics", timeout=5) as r:
        ctype = r.headers["Content-Type"]
    media, *params = [p.strip() for p in ctype.split(";")]
    assert media == "text/plain" and "version=0.0.4" in params and "charset=utf-8" in params


def test_stale_snapshot_fails_readyz_and_withholds_gpu_series(exporter):
    run = exporter(TWO, interval=0.2)
    run.exp.sampler.stop()
    time.sleep(0.6)  # older than two intervals
    status, body = run.get("/readyz")
    assert status == 503 and "stale" in body
    scrape = run.scrape()
    assert ("gpuobs_exporter_snapshot_stale", {}, 1.0) in scrape
    assert not [n for n, _, _ in scrape if n.startswith("gpuobs_gpu_")]


# ------------------------------------------------------------------------------------ dcgm naming

@contextlib.contextmanager
def native_exporter(families=None):
    """A second, gpuobs-named exporter on the simulated node already active in this process."""
    exp = Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, interval=0.2,
                                  families=families or set(REGISTRY) - {"xid"})).start()
    try:
        deadline = time.monotonic() + 10
        while exp.sampler.samples < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert exp.sampler.samples >= 2
        yield exp
    finally:
        exp.stop()


def scrape_of(exp: Exporter) -> list[tuple[str, dict, float]]:
    status, _, body = fetch(f"http://127.0.0.1:{exp.http.port}/metrics")
    assert status == 200
    return parse(body)


DCGM = {  # dcgm field -> (native name, native extra labels, scale native -> dcgm)
    "DCGM_FI_DEV_GPU_UTIL": ("gpuobs_gpu_utilization_ratio", {}, 100),
    "DCGM_FI_DEV_FB_USED": ("gpuobs_gpu_memory_used_bytes", {}, 1 / MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("gpuobs_gpu_power_usage_watts", {}, 1),
    "DCGM_FI_DEV_GPU_TEMP": ("gpuobs_gpu_temperature_celsius", {}, 1),
    "DCGM_FI_DEV_SM_CLOCK": ("gpuobs_gpu_clock_hertz", {"clock": "sm"}, 1e-6),
}


def test_dcgm_naming_matches_native_values_and_labels(exporter):
    run = exporter(TWO, naming="dcgm", hostname="node-a")
    want = {}
    for i in range(2):
        g = run.sim.state.gpu(i)
        set_val(g.util_gpu, 40 + 13 * i)
        set_val(g.power_mw, 300000 + 12345 * i)
        set_val(g.temp_gpu, 50 + 3 * i)
        set_val(g.mem_used, float((2048 + 512 * i) * MIB))
        set_val(g.clock[1], 1500 + 45 * i)
        want[g.uuid.s.decode()] = {"DCGM_FI_DEV_GPU_UTIL": 40 + 13 * i, "DCGM_FI_DEV_FB_USED": 2048 + 512 * i,
                                   "DCGM_FI_DEV_POWER_USAGE": 300 + 12.345 * i, "DCGM_FI_DEV_GPU_TEMP": 50 + 3 * i,
                                   "DCGM_FI_DEV_SM_CLOCK": 1500 + 45 * i}
    run.next_snapshot(2)
    dcgm = run.scrape()
    with native_exporter() as native_exp:
        native = scrape_of(native_exp)
    info = {l["uuid"]: l for n, l, _ in native if n == "gpuobs_gpu_info"}
    assert set(info) == set(want)

    for field, (name, extra, scale) in DCGM.items():
        series = {l["UUID"]: (l, v) for n, l, v in dcgm if n == field}
        assert set(series) == set(want), field
        for uuid, (labels, value) in series.items():
            gi = info[uuid]
            assert labels == {"gpu": gi["gpu"], "UUID": uuid, "device": f"nvidia{gi['gpu']}",
                              "modelName": gi["name"], "Hostname": "node-a", "hostname": "node-a",
                              "pci_bus_id": gi["pci_bus_id"], "DCGM_FI_DRIVER_VERSION": gi["driver_version"]}
            assert labels["modelName"] and labels["pci_bus_id"]
            assert value == pytest.approx(want[uuid][field]), (field, uuid)
            [nv] = [v for n, l, v in native if n == name and l["uuid"] == uuid
                    and all(l.get(k) == x for k, x in extra.items())]
            assert value == pytest.approx(nv * scale), (field, uuid)
    assert all(0 <= v <= 100 for n, _, v in dcgm if n == "DCGM_FI_DEV_GPU_UTIL")

    names = {n for n, _, _ in dcgm}
    assert not [n for n in names if n.startswith(("gpuobs_gpu_", "gpuobs_mig_"))]
    assert names - SELF_HEALTH == {n for n in names if n.startswith("DCGM_FI_")}
    assert {"gpuobs_nvml_up", "gpuobs_exporter_samples_total", "gpuobs_exporter_snapshot_stale"} <= names
    keys = [(n, tuple(sorted(l.items()))) for n, l, _ in dcgm]
    assert len(keys) == len(set(keys)), "duplicate series"


def test_dcgm_naming_labels_mig_series(exporter):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]}]},
                   naming="dcgm", hostname="node-a")
    run.next_snapshot(2)
    dcgm = run.scrape()
    with native_exporter() as native_exp:
        native = scrape_of(native_exp)
    migs = {l["gpu_instance_id"]: l for n, l, _ in native if n == "gpuobs_mig_info"}
    used = {l["gpu_instance_id"]: v for n, l, v in native if n == "gpuobs_mig_memory_used_bytes"}
    assert len(migs) == 3
    fb = {l["GPU_I_ID"]: (l, v) for n, l, v in dcgm if n == "DCGM_FI_DEV_FB_USED" and "GPU_I_ID" in l}
    assert set(fb) == set(migs)
    for gi, (labels, value) in fb.items():
        assert labels["GPU_I_PROFILE"] == migs[gi]["profile"] and labels["GPU_I_PROFILE"]
        assert labels["UUID"] == migs[gi]["uuid"] and labels["Hostname"] == "node-a"
        assert value == pytest.approx(used[gi] / MIB)
    assert {p for l, _ in fb.values() for p in [l["GPU_I_PROFILE"]]} >= {migs[g]["profile"] for g in migs}
    # no whole-GPU FB_USED on a MIG GPU: dcgm-exporter (default -d f) watches its GPU instances only, so
    # summing FB_USED by UUID gives the GPU's used memory once (tests/test_dcgm.py cites its source)
    assert not [l for n, l, _ in dcgm if n == "DCGM_FI_DEV_FB_USED" and "GPU_I_ID" not in l]
    keys = [(n, tuple(sorted(l.items()))) for n, l, _ in dcgm]
    assert len(keys) == len(set(keys)), "duplicate series"


# ---------------------------------------------------------------------------------------- OTLP

class _Collector:
    """Records decoded ExportMetricsServiceRequests from a gRPC or HTTP OTLP endpoint."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()

    def add(self, req) -> None:
        with self.lock:
            self.requests.append(req)

    def metric(self, name: str):
        """The newest exported metric of that name that has data points, or None."""
        with self.lock:
            reqs = list(self.requests)
        for req in reversed(reqs):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        if m.name == name and kind and getattr(m, kind).data_points:
                            return rm, m
        return None


@contextlib.contextmanager
def grpc_collector():
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as pb
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as pbg

    rec = _Collector()

    class Service(pbg.MetricsServiceServicer):
        def Export(self, request, context):
            rec.add(request)
            return pb.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_MetricsServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield rec, f"http://127.0.0.1:{port}"
    finally:
        server.stop(0).wait(5)


@contextlib.contextmanager
def http_collector():
    rec = _Collector()
    receiver = OTLPReceiver(on_metrics=rec.add)
    try:
        yield rec, f"{receiver.url}/v1/metrics"
    finally:
        receiver.close()


@pytest.mark.parametrize("collector", [grpc_collector, http_collector], ids=["grpc", "http"])
def test_otlp_push_is_decodable_and_complete(make_sim, collector):
    from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

    make_sim(TWO, init=False)
    before = set(threading.enumerate())
    with collector() as (rec, endpoint):
        exp = Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, interval=0.2,
                                      families=set(REGISTRY) - {"xid"}, otlp_endpoint=endpoint)).start()
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (
                    rec.metric("gpuobs_gpu_power_usage_watts") and rec.metric("gpuobs_gpu_energy_consumption_joules")):
                time.sleep(0.05)
            uuids = {l["uuid"] for n, l, _ in scrape_of(exp) if n == "gpuobs_gpu_up"}
        finally:
            t0 = time.monotonic()
            exp.stop()
            stop_s = time.monotonic() - t0
    assert len(uuids) == 2
    found = rec.metric("gpuobs_gpu_power_usage_watts")
    assert found, f"no power data in {len(rec.requests)} OTLP requests"
    rm, power = found
    resource = {a.key: a.value.string_value for a in rm.resource.attributes}
    assert resource["service.name"] == "gpuobs-exporter"
    assert power.unit == "W" and power.WhichOneof("data") == "gauge"
    points = {tuple(sorted((a.key, a.value.string_value) for a in p.attributes)): p.as_double
              for p in power.gauge.data_points}
    assert {dict(k)["uuid"] for k in points} == uuids
    assert all(50 < v < 1000 for v in points.values())

    _, energy = rec.metric("gpuobs_gpu_energy_consumption_joules")
    assert energy.unit == "J" and energy.WhichOneof("data") == "sum"
    assert energy.sum.is_monotonic
    assert energy.sum.aggregation_temporality == AGGREGATION_TEMPORALITY_CUMULATIVE
    assert {a.value.string_value for p in energy.sum.data_points for a in p.attributes if a.key == "uuid"} == uuids
    assert all(p.as_double > 0 for p in energy.sum.data_points)

    assert stop_s < 5, f"stop took {stop_s:.1f}s"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [t for t in set(threading.enumerate()) - before if t.is_alive()
                                           and not t.daemon]:
        time.sleep(0.05)
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon]
    assert not left, f"threads left running: {left}"
    assert not [t.name for t in threading.enumerate() if "PeriodicExportingMetricReader" in t.name]


@pytest.mark.parametrize("path", ["", "/v1/metrics"], ids=["grpc", "http"])
def test_otlp_stop_is_bounded_when_the_collector_is_down(make_sim, path):
    make_sim(TWO, init=False)
    exp = Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, interval=0.2, families={"power"},
                                  otlp_endpoint=f"http://127.0.0.1:{free_port()}{path}")).start()
    time.sleep(0.8)  # exports are failing and being retried
    t0 = time.monotonic()
    exp.stop()
    assert time.monotonic() - t0 < 4  # not the SDK's 10 s OTLP timeout, twice


# ----------------------------------------------------------------------------------------- CLI

def clean_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUOBS_", "OTEL_", "NODE_NAME"))}
    env.update(extra)
    return env


@contextlib.contextmanager
def cli_exporter(tmp_path, args=(), env=None, port=None, url=None, preexec_fn=None, context=None):
    """`python -m gpuobs.cli exporter ARGS` until ready: yields (process, base url, stderr path);
    the base url is `url`, else http://127.0.0.1:<port>. `preexec_fn` runs in the child before the
    exporter (e.g. to lower its limits); `context`: the SSLContext that checks readiness over TLS."""
    port = port or free_port()
    err = tmp_path / f"stderr-{port}.log"
    with open(err, "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", *args], cwd=REPO,
                                env=env or clean_env(), stdout=subprocess.DEVNULL, stderr=err_f,
                                preexec_fn=preexec_fn)
    url = url or f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"exporter exited {proc.returncode}: {err.read_text()}"
            try:
                if fetch(url + "/readyz", context)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"exporter not ready: {err.read_text()}"
            time.sleep(0.1)
        yield proc, url, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def cli_scrape(url: str):
    status, _, body = fetch(url + "/metrics")
    assert status == 200
    return parse(body)


def test_cli_help_lists_the_flags():
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--help"], cwd=REPO, env=clean_env(),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for flag in ("--listen-address", "--port", "--interval", "--families", "--processes", "--process-cap",
                 "--naming", "--expected-gpus", "--web-config", "--hostname", "--otlp-endpoint", "--simulate",
                 "--log-level", "--web.listen-address", "--web.telemetry-path", "--web.config.file"):
        assert flag in r.stdout, flag


def test_cli_simulate_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    args = ["--simulate", str(SCENARIO), "--port", str(port), "--interval", "0.5", "--listen-address", "127.0.0.1"]
    with cli_exporter(tmp_path, args, port=port) as (proc, url, err):
        first = json.loads(err.read_text().splitlines()[0])
        assert "simulated" in first["message"].lower() and first["level"] == "WARNING"
        assert first["scenario"] == str(SCENARIO) and first["logger"].startswith("gpuobs")
        scrape = cli_scrape(url)
        up = {l["uuid"]: v for n, l, v in scrape if n == "gpuobs_gpu_up"}
        assert len(up) == 8 and set(up.values()) == {1.0}
        assert "gpuobs_gpu_process_memory_used_bytes" not in {n for n, _, _ in scrape}  # opt-in
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        lines = [json.loads(line) for line in err.read_text().splitlines()]  # every line is JSON
        assert lines[-1]["message"] == "stopping"


def test_cli_simulate_auto_without_a_driver_uses_the_example_scenario(tmp_path):
    # no NVIDIA driver here (or in CI): auto must say it runs on simulated GPUs
    from gpuobs.smi import DEFAULT_SCENARIO, driver_present

    if driver_present():
        pytest.skip("a real driver answers on this machine")
    port = free_port()
    args = ["--simulate", "auto", "--port", str(port), "--interval", "0.5", "--listen-address", "127.0.0.1"]
    with cli_exporter(tmp_path, args, port=port) as (proc, url, err):
        first = json.loads(err.read_text().splitlines()[0])
        assert "SIMULATED" in first["message"] and first["scenario"] == str(DEFAULT_SCENARIO)
        assert len([1 for n, _, _ in cli_scrape(url) if n == "gpuobs_gpu_up"]) == 8
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--simulate", str(tmp_path / "nope.yaml")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no such scenario file" in r.stderr


def test_cli_settings_from_environment_variables(tmp_path):
    port = free_port()
    env = clean_env(GPUOBS_PORT=str(port), GPUOBS_INTERVAL="0.5", GPUOBS_SIMULATE=str(SCENARIO),
                    GPUOBS_LISTEN_ADDRESS="127.0.0.1", GPUOBS_NAMING="dcgm")
    with cli_exporter(tmp_path, env=env, port=port) as (proc, url, err):
        scrape = cli_scrape(url)
        util = {l["UUID"] for n, l, _ in scrape if n == "DCGM_FI_DEV_GPU_UTIL"}
        assert len(util) == 8
        assert not [n for n, _, _ in scrape if n.startswith("gpuobs_gpu_")]
        listening = [r for r in map(json.loads, err.read_text().splitlines()) if r["message"] == "exporter listening"]
        assert listening and listening[0]["port"] == port and listening[0]["naming"] == "dcgm"
        assert listening[0]["address"] == "127.0.0.1"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0


def test_cli_unknown_family_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--families", "nonsense", "--simulate",
                        str(SCENARIO), "--port", "0"], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2
    assert "--families" in r.stderr and "nonsense" in r.stderr and "utilization" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_processes_flag_adds_process_series(tmp_path):
    port = free_port()
    args = ["--simulate", str(SCENARIO), "--port", str(port), "--interval", "0.5", "--listen-address",
            "127.0.0.1", "--processes"]
    with cli_exporter(tmp_path, args, port=port) as (_, url, _):
        procs = {l["pid"]: (l, v) for n, l, v in cli_scrape(url) if n == "gpuobs_gpu_process_memory_used_bytes"}
    assert set(procs) == {str(21001 + i) for i in range(8)}
    labels, value = procs["21003"]
    assert labels["gpu"] == "2" and labels["process_name"] == "python train.py --rank 2"
    assert value == 61440 * MIB


def test_cli_families_limits_what_is_served(tmp_path):
    port = free_port()
    args = ["--simulate", str(SCENARIO), "--port", str(port), "--interval", "0.5", "--listen-address",
            "127.0.0.1", "--families", "utilization,memory"]
    with cli_exporter(tmp_path, args, port=port) as (_, url, _):
        scrape = cli_scrape(url)
    names = {n for n, _, _ in scrape}
    families = {BY_EXPOSED[n].family for n in names - {"gpuobs_gpu_up"}}
    assert families == {"utilization", "memory", *SELF_FAMILIES}
    assert len({l["uuid"] for n, l, _ in scrape if n == "gpuobs_gpu_up"}) == 8
    assert {"gpuobs_gpu_utilization_ratio", "gpuobs_gpu_memory_used_bytes", "gpuobs_nvml_up"} <= names


# ------------------------------------------------------------------------------------- promtool

@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
def test_promtool_check_metrics_passes(exporter):
    run = exporter(EIGHT, families=set(REGISTRY))
    run.next_snapshot(2)  # GPM needs two samples
    status, text = run.get("/metrics")
    assert status == 200 and "gpuobs_gpu_process_memory_used_bytes" in text and "gpuobs_gpu_sm_active_ratio" in text
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")


@pytest.mark.parametrize("args, message", [
    (["--interval", "nan"], "must be a finite number"),
    (["--interval", "inf"], "not in the range"),
    (["--interval", "0"], "not in the range"),
    (["--port", "70000"], "not in the range"),
    (["--families", " , "], "name at least one family"),
    (["--simulate", "auto", "--naming", "prometheus"], "Invalid value for '--naming'"),
])
def test_cli_rejects_bad_values_before_starting(args, message):
    r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", *args], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_cli_port_in_use_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "gpuobs.cli", "exporter", "--simulate", str(SCENARIO),
                            "--listen-address", "127.0.0.1", "--port", str(port)], capture_output=True, text=True,
                           timeout=30)
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
