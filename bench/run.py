"""Benchmarks (issue 8): writes BENCHMARKS.md at the repository root from one run.

    .venv/bin/python bench/run.py            # full: exporter vs nvitop-exporter at 1, 8, 64 GPUs and 8 x 7 MIG,
                                             # load, tracing overhead, a 1,250-node fleet in Prometheus and VM
    .venv/bin/python bench/run.py --quick    # fewer sizes, shorter periods, 125 nodes
    .venv/bin/python bench/run.py --again exporter,load   # re-measure those sections alone into
                                                          # bench/last_run.json and rewrite the report from it

Sections: exporter and tracing here, load in bench/load.py, fleet in bench/fleet.py.

Every number in BENCHMARKS.md comes from the run that wrote it; ratios are taken within that run.
Results are written whole or not at all (bench.common.write_result), and a partial run (--only,
--quick) writes bench/last_run.json and BENCHMARKS.md only when named (--json, --output) or asked
to (--save): `--quick --only tracing --output /tmp/x.md` writes /tmp/x.md alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Running,
    cpu_model,
    cpu_seconds,
    free_port,
    is_tracked_result,
    pct,
    rss_mib,
    version,
    write_result,
)

PAGE_INTERVAL = 1.0  # both exporters sample every second
# What Prometheus 2.42 sends with every scrape: OpenMetrics first, and gzip
PROMETHEUS_HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                      "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                      "Accept-Encoding": "gzip"}
# Per-call driver latency for the second run of each size: 1 / 2743 s, the rate at which one public
# report measured nvmlDeviceGetPowerUsage answering back to back (gpustat issue #76, Tesla K40m).
# The simulator sleeps it in every call (SimState.set_call_latency): the time a real call spends in
# the kernel module and the GPU's firmware, which is waiting, not the caller's CPU.
DRIVER_LATENCY_US = 365
FULL = "gpuobs --profile full"   # the exporter row name of the full series profile (the default's is "gpuobs")

# ---------------------------------------------------------------------------------------------- helpers


def scrape(url: str, headers: dict | None = None) -> tuple[float, str, int]:
    """(seconds, body as text, bytes on the wire) of one GET; a gzip body is inflated."""
    import gzip

    t = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
        raw = r.read()
        packed = r.headers.get("Content-Encoding") == "gzip"
    took = time.perf_counter() - t
    return took, (gzip.decompress(raw) if packed else raw).decode(), len(raw)


# --------------------------------------------------------------------------------- exporter comparison


def exporter_cmd(name: str, port: int) -> list[str]:
    py = sys.executable
    if name.startswith("gpuobs"):   # "gpuobs" runs the default profile, FULL the full one
        return [py, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1", "--port", str(port),
                "--interval", "1", "--kubelet-socket", ""] + (["--profile", "full"] if name == FULL else [])
    exe = shutil.which("nvitop-exporter") or str(Path(py).parent / "nvitop-exporter")
    return [exe, "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]


def measure_exporter(name: str, spec: dict, gpus: int, period: float, warmup: float, burst: int,
                     latency_us: int = 0) -> dict:
    from gpuobs.sim import Simulator

    with tempfile.TemporaryDirectory(prefix="gpuobs-bench-") as tmp:
        sim = Simulator(spec, directory=tmp)
        sim.state.set_call_latency(latency_us)
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            with Running(exporter_cmd(name, port), sim.env(), Path(tmp) / "exporter.log") as exp:
                exp.wait_until(lambda: bool(scrape(url)[1].strip()), 60, f"{name} answering")
                return _measure(exp.proc.pid, sim, url, gpus, period, warmup, burst) | {"name": name,
                                                                                       "latency_us": latency_us}
        finally:
            sim.close()


def _series_lines(body: str) -> int:
    return sum(1 for line in body.splitlines() if line.strip() and not line.startswith("#"))


def _measure(pid: int, sim, url: str, gpus: int, period: float, warmup: float, burst: int) -> dict:
    """One exporter's numbers over the period (it is running and answering at `url`), scraped once a
    second as Prometheus scrapes (its Accept and Accept-Encoding headers)."""
    time.sleep(warmup)
    scrape(url, PROMETHEUS_HEADERS)
    # measured period: one scrape a second
    sim.state.reset_calls()
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    lat, n, wire = [], 0, []
    next_t = t0
    while True:
        now = time.monotonic()
        if now - t0 >= period:
            break
        if now < next_t:
            time.sleep(next_t - now)
            continue
        d, body, size = scrape(url, PROMETHEUS_HEADERS)
        lat.append(d)
        wire.append(size)
        n += 1
        next_t += 1.0
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    by_call = sim.state.calls()
    # XID event waits block in the driver between events: not sampling
    waits = sum(n for name, n in by_call.items() if name.startswith("nvmlEventSetWait"))
    calls = sum(by_call.values()) - waits
    elapsed = t1 - t0
    rss = rss_mib(pid)
    plain = scrape(url)[2]  # as curl asks: text, not compressed
    # latency burst: back-to-back scrapes, for a p99 with more than a handful of samples
    burst_lat = [scrape(url, PROMETHEUS_HEADERS)[0] for _ in range(burst)]
    samples = elapsed / PAGE_INTERVAL
    cpu = cpu1 - cpu0
    return {
        "gpus": gpus, "elapsed": elapsed, "scrapes": n, "cpu_s": cpu,
        "cpu_per_s": cpu / elapsed, "cpu_per_scrape": cpu / max(n, 1),
        "p50_ms": pct(lat + burst_lat, 0.5) * 1e3, "p99_ms": pct(lat + burst_lat, 0.99) * 1e3,
        "p99_period_ms": pct(lat, 0.99) * 1e3,
        "calls": calls, "calls_per_gpu_sample": calls / samples / gpus, "series": _series_lines(body),
        "rss_mib": rss, "event_waits_per_s": waits / elapsed,
        "bytes_wire": statistics.median(wire), "bytes_plain": plain,
    }


# One sampling pass of the gpuobs exporter, split into NVML sampling, text rendering (OpenMetrics, as
# Prometheus asks) and gzip, in process CPU (the pass's reader threads included), in a child on the
# simulated node: where the exporter's CPU goes.
_SPLIT = r"""
import gzip, json, statistics, sys, time
from gpuobs.exporter import Exporter, ExporterConfig, render as R, tune_process
tune_process()
exp = Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, interval=1.0, kubelet_socket=None,
                              profile=sys.argv[2]))
exp.sampler.on_snapshot = None
exp.renderer.render(exp.sampler.sample_once())
exp.renderer.body("openmetrics", gz=True)  # asked for: each render() below makes both, as for Prometheus
sample, render, pack = [], [], []
for _ in range(int(sys.argv[1])):
    time.sleep(0.25)  # let values move, as between real passes
    t0 = time.process_time()
    snap = exp.sampler.sample_once()
    t1 = time.process_time()
    exp.renderer.render(snap)  # OpenMetrics, then its gzip
    t2 = time.process_time()
    gzip.compress(exp.renderer.body("openmetrics"), compresslevel=R.GZIP_LEVEL, mtime=0)  # the gzip part alone
    packed = time.process_time() - t2
    sample.append(t1 - t0)
    render.append(t2 - t1 - packed)
    pack.append(packed)
print(json.dumps({"sample_ms": statistics.median(sample) * 1e3, "render_ms": statistics.median(render) * 1e3,
                  "gzip_ms": statistics.median(pack) * 1e3}))
"""


def gpuobs_split(spec: dict, passes: int, profile: str = "default") -> dict:
    """Median process-CPU ms of one gpuobs sampling pass, of rendering its snapshot and of gzip,
    with the exporter's series profile (default or full)."""
    import json

    from gpuobs.sim import Simulator

    with tempfile.TemporaryDirectory(prefix="gpuobs-bench-") as tmp:
        sim = Simulator(spec, directory=tmp)
        try:
            out = subprocess.run([sys.executable, "-c", _SPLIT, str(passes), profile], env=sim.env(), cwd=str(ROOT),
                                 capture_output=True, text=True, timeout=300, check=True)
        finally:
            sim.close()
    return json.loads(out.stdout.strip().splitlines()[-1])


def exporter_bench(quick: bool) -> list[dict]:
    """Both exporters at each size, with the simulator answering at once and with DRIVER_LATENCY_US
    per call; the gpuobs row of the first also gets the in-process split."""
    sizes = [("1 GPU", 1, None), ("8 GPUs", 8, None), ("64 GPUs", 64, None), ("8 GPUs x 7 MIG", 8, ["1g.10gb"] * 7)]
    if quick:
        sizes = [s for s in sizes if s[1] != 64]
    period, warmup, burst = (10.0, 3.0, 50) if quick else (30.0, 5.0, 100)
    rows = []
    for latency in (0, DRIVER_LATENCY_US):
        for label, n, mig in sizes:
            g = {"profile": "h100-sxm-80gb", "count": n, "behaviour": "steady"}
            if mig:
                g = {"profile": "h100-sxm-80gb", "count": n, "mig": mig}
            spec = {"gpus": [g]}
            # the full profile (every series, as before the budget) only at once: what the profile costs
            for name in ("gpuobs", FULL, "nvitop-exporter") if not latency else ("gpuobs", "nvitop-exporter"):
                print(f"[exporter] {label}, {latency} µs/call: {name} ...", flush=True)
                try:
                    r = measure_exporter(name, spec, n, period, warmup, burst, latency)
                except Exception as e:  # keep going: report the failure in BENCHMARKS.md
                    r = {"name": name, "gpus": n, "error": str(e)[:500], "latency_us": latency}
                r["label"] = label
                if name != "nvitop-exporter" and "error" not in r and not latency:
                    try:
                        r.update(gpuobs_split(spec, 10 if quick else 20, "full" if name == FULL else "default"))
                    except Exception as e:  # noqa: BLE001 - the split explains; its failure must not lose the row
                        r["split_error"] = str(e)[:300]
                rows.append(r)
                print(f"    {r}", flush=True)
    return rows


# ------------------------------------------------------------------------------------- tracing overhead


class _NullSpanExporter:
    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _time_loop(body, steps: int, batches: int) -> float:
    """Median over batches of seconds per step."""
    per = []
    for _ in range(batches):
        t = time.perf_counter()
        body(steps)
        per.append((time.perf_counter() - t) / steps)
    return statistics.median(per)


def tracing_bench(quick: bool) -> dict:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from gpuobs import instrument

    steps, batches = (2000, 7) if quick else (10000, 9)

    def bare(k):
        for _ in range(k):
            pass

    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(BatchSpanProcessor(_NullSpanExporter(), max_queue_size=65536))
    tracer = tp.get_tracer("bench")

    def bare_span(k):
        for _ in range(k):
            with tracer.start_as_current_span("train.step"):
                pass

    def run_steps(run):
        def body(k):
            for _ in range(k):
                with run.step(samples=32):
                    pass
        return body

    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider

    mp = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False,
                       exemplar_filter=AlwaysOffExemplarFilter())
    hist = mp.get_meter("bench").create_histogram("step_duration", unit="s")
    attrs = {"rank": "0", "job_id": ""}  # what gpuobs puts on a training point

    def bare_histogram(k):
        for _ in range(k):
            hist.record(0.1, attrs)

    res = {"steps_per_batch": steps, "batches": batches}
    bare(steps), bare_span(steps), bare_histogram(steps)
    res["bare_loop"] = _time_loop(bare, steps, batches)
    res["bare_span"] = _time_loop(bare_span, steps, batches)
    res["bare_histogram"] = _time_loop(bare_histogram, steps, batches)
    tp.shutdown()
    mp.shutdown()

    variants = {
        "spans_on": dict(span_exporters=[_NullSpanExporter()], metric_readers=[InMemoryMetricReader()]),
        "spans_off": dict(spans=False, metric_readers=[InMemoryMetricReader()]),
        "disabled": dict(enabled=False),
    }
    for key, kw in variants.items():
        tel = instrument.configure(**kw)
        run = instrument.TrainingRun(telemetry=tel)
        body = run_steps(run)
        body(min(steps, 1000))  # warm up
        res[key] = _time_loop(body, steps, batches)
        dropped = getattr(tel, "spans_dropped", 0)
        res[key + "_dropped"] = dropped() if callable(dropped) else dropped
        tel.shutdown(timeout_s=2.0)
    res["step"] = step_vs_sdk(quick)
    res["otlp"] = otlp_no_loss(5.0 if quick else 10.0)
    return res


# A realistic step: data wait, step, forward/backward/optimizer phases, a checkpoint every CKPT_EVERY steps.
CKPT_EVERY = 100
PHASES = ("forward", "backward", "optimizer")


def gpuobs_steps(run, loader=range):
    """A loop body of k realistic steps over loader(k), instrumented with gpuobs (the step and phase
    bodies are empty: pure overhead)."""
    def body(k):
        for i, _ in enumerate(run.data(loader(k)), 1):
            with run.step(samples=32):
                for name in PHASES:
                    with run.phase(name):
                        pass
            if i % CKPT_EVERY == 0:
                with run.checkpoint(path="/ckpt"):
                    pass
    return body


def sdk_steps(tracer, histogram, attrs: dict):
    """The same loop and span tree written with the plain OTel SDK, as its user would: a run span
    linked from each step, the data wait timed around next() and kept as a span of the step, nested
    start_as_current_span for step and phases, one histogram record of the step time, checkpoints
    under the run span."""
    from opentelemetry import trace

    run_span = tracer.start_span("train.run")
    run_ctx = trace.set_span_in_context(run_span)
    links = [trace.Link(run_span.get_span_context())]

    def body(k):
        it = iter(range(k))
        for i in range(1, k + 1):
            wait_ns, t = time.time_ns(), time.perf_counter()
            next(it)
            wait = time.perf_counter() - t
            with tracer.start_as_current_span("train.step", start_time=wait_ns, attributes={"train.step": i},
                                              links=links):
                tracer.start_span("train.data_wait", start_time=wait_ns).end(end_time=wait_ns + int(wait * 1e9))
                t0 = time.perf_counter()
                for name in PHASES:
                    with tracer.start_as_current_span(f"train.{name}", attributes={"train.phase": name}):
                        pass
                histogram.record(wait + time.perf_counter() - t0, attrs)
            if i % CKPT_EVERY == 0:
                with tracer.start_as_current_span("train.checkpoint", run_ctx, attributes={"path": "/ckpt"}):
                    pass
    return body


def step_vs_sdk(quick: bool) -> dict:
    """µs per realistic step, gpuobs (spans on) vs the plain OTel SDK, alternating batches in this
    process; both with a BatchSpanProcessor of gpuobs's settings to a null exporter, exemplars off."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from gpuobs import instrument
    from gpuobs.instrument.telemetry import SPAN_QUEUE
    from gpuobs.instrument.timing import WallTimer

    steps, batches = (1000, 6) if quick else (2000, 10)
    tel = instrument.configure(span_exporters=[_NullSpanExporter()], metric_readers=[InMemoryMetricReader()])
    ours = gpuobs_steps(instrument.TrainingRun(tel, timer=WallTimer()))
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(BatchSpanProcessor(_NullSpanExporter(), max_queue_size=SPAN_QUEUE,
                                             schedule_delay_millis=1000, max_export_batch_size=512,
                                             export_timeout_millis=5000))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False,
                       exemplar_filter=AlwaysOffExemplarFilter())
    hist = mp.get_meter("bench").create_histogram("train.step.duration", unit="s")
    sdk = sdk_steps(tp.get_tracer("bench"), hist, {"rank": "0", "job_id": ""})
    ours(1000), sdk(1000)  # warm up
    per = {"gpuobs": [], "sdk": []}
    for _ in range(batches):  # alternate, so drift in machine speed hits both alike
        for key, body, provider in (("gpuobs", ours, tel.tracer_provider), ("sdk", sdk, tp)):
            t = time.perf_counter()
            body(steps)
            per[key].append((time.perf_counter() - t) / steps)
            provider.force_flush()  # no export of one side's spans left running into the other's batch
    res = {"steps_per_batch": steps, "batches": batches, "gpuobs": statistics.median(per["gpuobs"]),
           "sdk": statistics.median(per["sdk"]), "pair_ratios": [g / s for g, s in zip(per["gpuobs"], per["sdk"])],
           "dropped": tel.spans_dropped}
    tel.shutdown(timeout_s=2.0)
    tp.shutdown()
    mp.shutdown()
    return res


# An OTLP/HTTP receiver in its own process (as a collector would be): counts the spans it decodes,
# answers every export with success, reports {"spans", "requests", "by_name"} on GET /count.
_OTLP_SINK = r"""
import collections, gzip, json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
by_name, requests = collections.Counter(), [0]

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            msg = ExportTraceServiceRequest.FromString(body)
            requests[0] += 1
            by_name.update(s.name for rs in msg.resource_spans for ss in rs.scope_spans for s in ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        reply = json.dumps({"spans": sum(by_name.values()), "requests": requests[0], "by_name": by_name}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()  # one export at a time
"""


def otlp_no_loss(seconds: float, rate: float = 500.0) -> dict:
    """Run realistic gpuobs steps paced at `rate` steps/s (the loader waits for the next tick) for
    `seconds` against an OTLP/HTTP receiver process on loopback; after shutdown, spans ended vs
    received, and gpuobs's spans_dropped."""
    import json

    from opentelemetry.sdk.trace import SpanProcessor

    from gpuobs import instrument
    from gpuobs.instrument.timing import WallTimer

    class Ended(SpanProcessor):
        count = 0

        def on_end(self, span):
            self.count += 1

    def paced(n):
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            yield i

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="gpuobs-otlp-") as tmp, \
            Running([sys.executable, "-c", _OTLP_SINK, str(port)], dict(os.environ), Path(tmp) / "sink.log") as sink:
        sink.wait_until(lambda: scrape(url + "/count")[1].startswith("{"), 30, "OTLP receiver answering")
        tel = instrument.configure(endpoint=url)
        ended = Ended()
        tel.tracer_provider.add_span_processor(ended)
        run = instrument.TrainingRun(tel, timer=WallTimer())
        steps = int(seconds * rate)
        t = time.perf_counter()
        gpuobs_steps(run, paced)(steps)
        elapsed = time.perf_counter() - t
        t = time.perf_counter()
        tel.shutdown(timeout_s=30.0)
        got = json.loads(scrape(url + "/count")[1])
    return {"rate": rate, "steps": steps, "elapsed_s": elapsed, "shutdown_s": time.perf_counter() - t,
            "sent": ended.count, "received": got["spans"], "requests": got["requests"], "by_name": got["by_name"],
            "dropped": tel.spans_dropped}


# ------------------------------------------------------------------------------------------ report


def fmt(x: float, d: int = 2) -> str:
    return f"{x:.{d}f}"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for p in ("gpuobs", "nvitop-exporter", "nvitop", "opentelemetry-sdk", "prometheus-client"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "not installed"
    return out


def machine_facts() -> dict:
    """What the report's Machine section says, gathered when the run starts."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()}", "versions": _versions(),
            "prometheus": version(["prometheus", "--version"], "prometheus"),
            "victoria-metrics": version(["victoria-metrics", "-version"], "victoria-metrics"),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def header_section(run: dict, cmd: str) -> list[str]:
    m, v = run["machine"], run["machine"]["versions"]
    tools = {**{k: m[k] for k in ("prometheus", "victoria-metrics")}, **run.get("fleet", {}).get("versions", {})}
    quick = " **Quick mode**: fewer sizes, shorter periods, a smaller fleet." if run["quick"] else ""
    every = "Every number below"
    alone = [k for k in ("exporter", "load", "tracing", "fleet")
             if ((run.get("exporter_run") if k == "exporter" else run.get(k)) or {}).get("cmd")] if run else []
    if alone:
        named = alone[0] if len(alone) == 1 else f"{', '.join(alone[:-1])} and {alone[-1]}"
        every = (f"Every number below, except the {named} section{'s' if len(alone) > 1 else ''}' "
                 "(re-measured on their own later; each says so),")
    return [
        "# Benchmarks", "",
        f"Generated by `{cmd}` on {m['date']} in {run['elapsed']:.0f} s. {every} comes from that one "
        f"run; every ratio compares numbers from the same run.{quick}", "",
        "## Machine", "",
        f"- CPU: {m['cpu']}, {m['cores']} logical cores",
        f"- Python {m['python']} on {m['os']}",
        f"- gpuobs {v['gpuobs']}, nvitop-exporter {v['nvitop-exporter']}, nvitop {v['nvitop']}, "
        f"opentelemetry-sdk {v['opentelemetry-sdk']}, prometheus-client {v['prometheus-client']}",
        f"- {tools['prometheus']}; {tools['victoria-metrics']} (Debian packages)",
        "- GPUs: none real; the exporters read the gpuobs NVML simulator (`gpuobs.sim`), which pynvml loads as "
        "libnvidia-ml.so.1.", "",
        "## How to reproduce", "",
        "```",
        "apt-get install -y prometheus prometheus-alertmanager victoria-metrics",
        ".venv/bin/pip install -q -e '.[test,bench]'   # in the README's venv: nvitop-exporter, numpy",
        ".venv/bin/python bench/run.py           # full",
        ".venv/bin/python bench/run.py --quick   # fewer sizes, shorter periods, a 125-node fleet",
        ".venv/bin/python bench/run.py --again exporter,load   # re-measure those sections, keep the others",
        ".venv/bin/python bench/run.py --render bench/last_run.json   # this report again from its numbers",
        "```", "",
    ]


MIG_INSTANCE_CALLS = 3  # the MIG call budget: 12 per physical GPU plus this many per MIG instance


def _call_budget(label: str) -> int:
    """NVML calls per physical GPU per sample allowed at a size: 12, plus 3 per MIG instance."""
    instances = 7 if "MIG" in label else 0
    return 12 + MIG_INSTANCE_CALLS * instances


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def exporter_section(rows: list[dict], run: dict | None = None) -> list[str]:
    out = []
    w = out.append
    ok = [r for r in rows if "error" not in r]
    period = ok[0]["elapsed"] if ok else float("nan")
    w("## Exporter vs nvitop-exporter")
    w("")
    again = (run or {}).get("exporter_run")
    if again:
        w(f"Measured on its own by `{again['cmd']}` on {again['date']} in {again['elapsed']:.0f} s ({again['cpu']}); "
          "every number and ratio in this section comes from that run.")
        w("")
    w("Method: for each size, one simulated node (profile h100-sxm-80gb, steady behaviour; MIG: 8 GPUs each split "
      "into 7 × 1g.10gb). Each exporter runs alone as a separate process on that node with a 1 s sampling interval "
      "(`python -m gpuobs.cli exporter --interval 1`, `nvitop-exporter --interval 1`), is warmed up, then scraped "
      f"once a second for {period:.0f} s with the headers Prometheus 2.42 sends (OpenMetrics preferred, gzip "
      "accepted): both exporters negotiate them (nvitop-exporter through prometheus_client). Every size runs twice: "
      "with the simulator answering at once, and with every NVML call answering after "
      f"{DRIVER_LATENCY_US} µs, slept in the call (see below). CPU = utime+stime(+children) from /proc/<pid>/stat "
      "over the period, per second of runtime (1 sample and 1 scrape per second, so it includes sampling, "
      "rendering, compression and serving). NVML calls are every call the simulator counted over the period "
      "except XID event waits (shown apart: they block in the driver until an event or a timeout, 2 per second "
      "per node), divided by samples (period / 1 s interval) and by physical GPUs. Latency = wall time of the "
      "HTTP GET, over the period's scrapes plus a burst of back-to-back scrapes after it. Series = sample lines "
      "of the last scrape. Bytes = the body on the wire as Prometheus gets it (median over the period) and as "
      "curl gets it (text, not compressed). RSS = VmRSS at the end of the period. Sample / render / gzip = median "
      "process CPU of one gpuobs sampling pass, of rendering its snapshot as OpenMetrics and of compressing that, "
      "measured in-process on the same simulated node (passes 0.25 s apart).")
    w("")
    w(f"Driver latency: {DRIVER_LATENCY_US} µs per call is 1 / 2,743 s, the rate at which one public report "
      "(gpustat issue #76, a Tesla K40m) saw `nvmlDeviceGetPowerUsage` answer back to back; calls that reach the "
      "GPU's PMU or GSP are of that order, cached ones faster, so it is on the slow side for most calls. The "
      "simulator sleeps it (`SimState.set_call_latency`): a real call waits in the kernel module and the GPU's "
      "firmware, time the caller does not spend on its own CPU. It lengthens a pass, not its CPU.")
    for latency in dict.fromkeys(r.get("latency_us", 0) for r in rows):
        part = [r for r in rows if r.get("latency_us", 0) == latency]
        w("")
        w(f"### {'Simulator answering at once' if not latency else f'Every NVML call taking {latency} µs'}")
        w("")
        w("| size | exporter | CPU ms/s | p50 ms | p99 ms | NVML calls/GPU/sample | event waits/s | series | "
          "KiB as Prometheus gets it | KiB as text | RSS MiB | sample ms | render ms | gzip ms |")
        w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in part:
            if "error" in r:
                w(f"| {r['label']} | {r['name']} | failed: {r['error'][:120].replace('|', '/')} |" + " |" * 11)
                continue
            split = " | ".join(fmt(r[k]) for k in ("sample_ms", "render_ms", "gzip_ms")) if "sample_ms" in r else \
                ("failed | | " if "split_error" in r else " | | ")
            w(f"| {r['label']} | {r['name']} | {fmt(r['cpu_per_s'] * 1e3, 1)} | {fmt(r['p50_ms'])} | "
              f"{fmt(r['p99_ms'])} | {fmt(r['calls_per_gpu_sample'], 1)} | "
              f"{fmt(r.get('event_waits_per_s', float('nan')), 1)} | {r['series']} | "
              f"{_kib(r.get('bytes_wire', float('nan')))} | {_kib(r.get('bytes_plain', float('nan')))} | "
              f"{fmt(r['rss_mib'], 1)} | {split} |")
    out += profile_section(rows)
    w("")
    w("### Targets")
    w("")
    w("| size | driver latency | CPU gpuobs ÷ nvitop (≤ 0.20) | NVML calls/GPU/sample (≤ 12, MIG: + 3 per instance) "
      "| p99 (≤ 10 ms) | RSS (≤ 60 MiB) |")
    w("|---|---|---|---|---|---|")
    missed = []
    for g, n in _pairs(rows):
        label, latency = g["label"], g.get("latency_us", 0)
        where = f"{label}{f', {latency} µs/call' if latency else ''}"
        cells = []
        ratio = g["cpu_per_s"] / n["cpu_per_s"] if n["cpu_per_s"] > 0 else float("nan")
        cells.append(f"{ratio:.3f} — {'met' if ratio <= 0.2 else f'missed by {ratio / 0.2:.2f}×'}")
        if not ratio <= 0.2:
            missed.append(f"{where}: CPU ratio {ratio:.2f}")
        c, budget = g["calls_per_gpu_sample"], _call_budget(label)
        cells.append(f"{c:.1f} of {budget} — {'met' if c <= budget else f'missed by {c - budget:.1f} calls'}")
        if c > budget:
            missed.append(f"{where}: {c:.1f} NVML calls/GPU/sample")
        p99 = g["p99_ms"]
        cells.append(f"{p99:.2f} ms — {'met' if p99 <= 10 else f'missed by {p99 - 10:.2f} ms'}")
        if p99 > 10:
            missed.append(f"{where}: p99 {p99:.2f} ms")
        rss = g["rss_mib"]
        cells.append(f"{rss:.1f} MiB — {'met' if rss <= 60 else f'missed by {rss - 60:.1f} MiB'}")
        if rss > 60:
            missed.append(f"{where}: RSS {rss:.1f} MiB")
        w(f"| {label} | {latency} µs | " + " | ".join(cells) + " |")
    w("")
    w("NVML calls are counted for the exporter's default families (all but processes), over all the MIG "
      "instances of a GPU when MIG is on; they are divided by physical GPUs only.")
    if missed:
        w("")
        w("Missed: " + "; ".join(missed) + ".")
        w("")
        w("Why, from this run:")
        w("")
        for g, n in _pairs(rows):
            if "sample_ms" not in g:
                continue
            cpu = g["cpu_per_s"] * 1e3
            parts = g["sample_ms"] + g["render_ms"] + g["gzip_ms"]
            w(f"- {g['label']}: gpuobs spends {fmt(cpu, 1)} ms/s: a pass is {fmt(g['sample_ms'])} ms of sampling, "
              f"{fmt(g['render_ms'])} ms of rendering and {fmt(g['gzip_ms'])} ms of gzip "
              f"({100 * g['sample_ms'] / parts:.0f} / {100 * g['render_ms'] / parts:.0f} / "
              f"{100 * g['gzip_ms'] / parts:.0f} %), the rest serving and the XID and kernel-log threads; "
              f"for {g['series']} series against nvitop-exporter's {n['series']} "
              f"({g['series'] / max(n['series'], 1):.1f}×). nvitop-exporter spends {fmt(n['cpu_per_s'] * 1e3, 1)} "
              f"ms/s, and 0.2× of that is {fmt(n['cpu_per_s'] * 200, 1)} ms/s: "
              f"{fmt(n['cpu_per_s'] * 200 / max(g['series'], 1) * 1e3, 2)} µs per gpuobs series and second.")
        for g, _ in _pairs(rows):
            if not g.get("latency_us") and g["p99_ms"] > 10:
                w(f"- {g['label']}: p99 {fmt(g['p99_ms'])} ms while p50 is {fmt(g['p50_ms'])} ms: its slowest scrapes "
                  "landed while a pass ran (a garbage collection or the pass's rendering holds the GIL); not "
                  "investigated further.")
        at_once = {g["label"]: (g, n) for g, n in _pairs(rows) if not g.get("latency_us")}
        for g, n in _pairs(rows):
            latency = g.get("latency_us", 0)
            if not latency or g["label"] not in at_once:
                continue
            g0, n0 = at_once[g["label"]]
            calls_per_s = g["calls_per_gpu_sample"] * g["gpus"] / PAGE_INTERVAL
            extra = (g["cpu_per_s"] - g0["cpu_per_s"]) * 1e3
            line = (f"- {g['label']} at {latency} µs per call: a gpuobs pass spends about "
                    f"{calls_per_s * latency / 1e3:.0f} ms of each second asleep in {calls_per_s:.0f} calls, and its "
                    f"CPU changes by {extra:+.1f} ms/s ({extra * 1e3 / max(calls_per_s, 1):+.0f} µs per call: a call "
                    "lets go of the GIL and the core, and takes them back).")
            if g["p99_ms"] > 10:
                line += (f" p99 {fmt(g['p99_ms'])} ms, against {fmt(g0['p99_ms'])} ms at once: a scrape that lands in "
                         "the longer pass waits for the GIL each time the reader thread takes it back after a call "
                         "(not investigated further: reading GPUs on more threads, or a server outside Python, "
                         "would be the ways out).")
            if n["calls_per_gpu_sample"] < 0.95 * n0["calls_per_gpu_sample"]:
                line += (f" nvitop-exporter made {n['calls_per_gpu_sample']:.1f} calls per GPU per sample here "
                         f"({n0['calls_per_gpu_sample']:.1f} at once): its pass no longer fits its interval, so it "
                         "samples less often and spends less; the ratio flatters it.")
            w(line)
        w("- What is left is Python per value: a sampling pass makes a Sample only for a value that changed and "
          "the renderer formats only those (a series' label text is written once), but each NVML call, each "
          "family's collect() and each value compared still runs bytecode, on the order of 0.5-1 µs a value. The "
          "floor the issue names (one batched call and the changed numbers) needs the per-value loop out of "
          "Python: a C extension, which this project does not ship. The detail (every NVLink link's counters, "
          "ECC by location, clock-event durations, ...) is opt-in (`--profile full`, `--detail`); its cost is "
          "in the per-profile table above.")
        w("- CPU is measured in whole clock ticks (10 ms at 100 Hz) over the period, so small values are coarse; "
          "and this shared 2-core VM's speed drifts between runs, which is why ratios are only taken within one "
          "run.")
    w("")
    return out


def profile_section(rows: list[dict]) -> list[str]:
    """The default profile next to the full one, per size (simulator answering at once): what the
    series budget saves on the node."""
    full = {r["label"]: r for r in rows if r["name"] == FULL and "error" not in r and not r.get("latency_us")}
    pairs = [(g, full[g["label"]]) for g in rows if g["name"] == "gpuobs" and "error" not in g
             and not g.get("latency_us") and g["label"] in full]
    if not pairs:
        return []
    out = ["", "### Per series profile: default against full", "",
           "The same gpuobs exporter with `--profile full` (every series, what it served by default before the "
           "series budget), measured like the rows above, at once.", "",
           "| size | series default / full | CPU ms/s default / full | NVML calls/GPU/sample default / full | "
           "KiB as Prometheus gets it default / full | sample ms default / full | render ms default / full |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for g, f in pairs:
        both = [(g[k], f[k]) if k in g and k in f else (float("nan"), float("nan"))
                for k in ("cpu_per_s", "calls_per_gpu_sample", "bytes_wire", "sample_ms", "render_ms")]
        (c0, c1), (n0, n1), (b0, b1), (s0, s1), (r0, r1) = both
        out.append(f"| {g['label']} | {g['series']} / {f['series']} | {fmt(c0 * 1e3, 1)} / {fmt(c1 * 1e3, 1)} | "
                   f"{fmt(n0, 1)} / {fmt(n1, 1)} | {_kib(b0)} / {_kib(b1)} | {fmt(s0)} / {fmt(s1)} | "
                   f"{fmt(r0)} / {fmt(r1)} |")
    return out


def tracing_section(tr: dict) -> list[str]:
    out = []
    w = out.append
    w("## Tracing overhead")
    w("")
    if tr.get("cmd"):
        w(f"Measured on its own by `{tr['cmd']}` on {tr['date']} in {tr['elapsed']:.0f} s ({tr['cpu']}); every "
          "number and ratio in this section comes from that run.")
        w("")
    w(f"Method: in one process, {tr['batches']} batches of {tr['steps_per_batch']} steps each; the figure is the "
      "median over batches of time per step. Bare loop = an empty `for`; bare span = one "
      "`tracer.start_as_current_span()` per step from an OTel SDK `TracerProvider` with a `BatchSpanProcessor` to a "
      "null exporter; bare histogram = one OTel SDK `Histogram.record()` with gpuobs's two point attributes (rank, "
      "job_id), exemplars off; gpuobs = `with TrainingRun.step(samples=32): pass` after `instrument.configure(...)` "
      "with spans on (null span exporter + InMemoryMetricReader), spans off (`spans=False`, InMemoryMetricReader) "
      "and disabled (`enabled=False`). The step body is empty, so these are the pure overheads.")
    w("")
    w("| case | µs/step | × bare span | target |")
    w("|---|---:|---:|---|")
    bs, on, off, dis = tr["bare_span"], tr["spans_on"], tr["spans_off"], tr["disabled"]
    hist = tr.get("bare_histogram")
    w(f"| bare loop | {tr['bare_loop'] * 1e6:.3f} | {tr['bare_loop'] / bs:.3f} | |")
    w(f"| bare OTel span | {bs * 1e6:.2f} | 1.00 | |")
    if hist is not None:
        w(f"| bare OTel histogram record | {hist * 1e6:.2f} | {hist / bs:.2f} | |")
    w(f"| gpuobs, spans on | {on * 1e6:.2f} | {on / bs:.2f} | ≤ 1.2× bare span: "
      f"{'met' if on / bs <= 1.2 else f'missed by {on / bs / 1.2:.2f}× ({(on - 1.2 * bs) * 1e6:.2f} µs over)'} |")
    w(f"| gpuobs, spans off (metrics only) | {off * 1e6:.2f} | {off / bs:.2f} | ≤ 10 µs: "
      f"{'met' if off <= 10e-6 else f'missed by {(off - 10e-6) * 1e6:.2f} µs'} |")
    w(f"| gpuobs, disabled | {dis * 1e6:.2f} | {dis / bs:.2f} | |")
    w("")
    w(f"Spans dropped by gpuobs's processor during the spans-on case: {tr.get('spans_on_dropped', 'n/a')}.")
    span_part = on - (off - dis)
    w("")
    w(f"Of a spans-on step, the span and its bookkeeping are {span_part * 1e6:.2f} µs "
      f"({span_part / bs:.2f}× a bare span: the span has a `gpuobs.step` attribute and is started with an explicit "
      f"start time, so that the data wait before it belongs to it) and the metrics {(off - dis) * 1e6:.2f} µs.")
    if on / bs > 1.2 or off > 10e-6:
        w("")
        why = ("Why a target is missed: a gpuobs step with spans on is a span plus the metrics-only work, so it "
               "cannot come within 1.2× of one bare span while the metrics cost "
               f"{(off - dis) / bs:.2f}× a bare span by themselves.")
        if hist is not None:
            why += (f" Of the metrics-only step, {hist * 1e6:.2f} µs is the one OTel SDK histogram record "
                    "(step duration), the floor while the step duration is an OTel histogram; the counters and "
                    "gauges are kept in plain Python and observed at collection.")
        w(why)
    w("")
    if "step" in tr:
        out += _step_section(tr["step"])
    if "otlp" in tr:
        out += _otlp_section(tr["otlp"])
    return out


def _step_section(st: dict) -> list[str]:
    g, s = st["gpuobs"], st["sdk"]
    ratio = g / s
    verdict = "met" if ratio <= 1.2 else f"missed by {ratio / 1.2:.2f}× ({(g - 1.2 * s) * 1e6:.2f} µs over)"
    pairs = st["pair_ratios"]
    return [
        "### A realistic training step: gpuobs vs the plain OTel SDK", "",
        f"Method: one step = a data wait (the loader's `next()`), the step, three phases (forward, backward, "
        f"optimizer) and a checkpoint every {CKPT_EVERY} steps, with empty bodies, so the figures are pure overhead. "
        "gpuobs: `for _ in run.data(loader): with run.step(samples=32): with run.phase(...)`, "
        "`with run.checkpoint(path=...)`, spans on, `WallTimer`. Plain SDK: the same span tree (a `train.run` span "
        "linked from every step, `train.step` started at the wait's start, a `train.data_wait` child with explicit "
        "start/end, nested `tracer.start_as_current_span()` phases, checkpoints under the run span) plus one "
        "`Histogram.record()` of the step time; gpuobs also records its data-wait and checkpoint histograms, "
        "quantile windows and counters. Both: an SDK `TracerProvider` with a `BatchSpanProcessor` of gpuobs's "
        "settings (queue 8192, batch 512, 1 s delay) to a null exporter, an `InMemoryMetricReader`, exemplars off. "
        f"{st['batches']} batches of {st['steps_per_batch']} steps each, gpuobs and SDK alternating in one process "
        "(the providers are flushed after each batch); figures are medians over batches.", "",
        "| case | µs/step | target |",
        "|---|---:|---|",
        f"| plain OTel SDK | {s * 1e6:.2f} | |",
        f"| gpuobs, spans on | {g * 1e6:.2f} | ≤ 1.2× plain SDK: {ratio:.2f}× — {verdict} |", "",
        f"Per alternating pair, gpuobs ÷ SDK ranged {min(pairs):.2f}–{max(pairs):.2f}. Spans dropped by gpuobs: "
        f"{st['dropped']}. Under cProfile both spend most of a step in the SDK's `Tracer.start_span` (5.01 spans a "
        "step in both); what gpuobs adds (its metrics, the loader wrapper) is of the order of what it saves by "
        "using `start_span` + `context.attach` instead of `start_as_current_span`'s generator context managers.", "",
    ]


def _otlp_section(ot: dict) -> list[str]:
    lost = ot["sent"] - ot["received"]
    ok = lost == 0 and ot["dropped"] == 0
    names = ", ".join(f"{k} {v}" for k, v in sorted(ot["by_name"].items(), key=lambda kv: -kv[1]))
    return [
        f"### No spans lost at {ot['rate']:.0f} steps/s over OTLP/HTTP", "",
        f"Method: the same gpuobs step loop, its loader paced to {ot['rate']:.0f} steps/s (the pacing shows as data "
        f"wait), for {ot['steps']} steps, with `instrument.configure(endpoint=...)` exporting OTLP/HTTP (protobuf) "
        "to a receiver in its own process on 127.0.0.1 that decodes every `ExportTraceServiceRequest` and answers "
        "success. Sent = spans ended in the process (an extra span processor counts them); received = spans the "
        "receiver decoded after `tel.shutdown()`.", "",
        "| steps/s achieved | spans sent | spans received | lost | `tel.spans_dropped` | export requests | "
        "shutdown s | target |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {ot['steps'] / ot['elapsed_s']:.1f} | {ot['sent']} | {ot['received']} | {lost} | {ot['dropped']} | "
        f"{ot['requests']} | {ot['shutdown_s']:.2f} | none lost: {'met' if ok else 'missed'} |", "",
        f"Received by name: {names}.", "",
    ]


# The device check (bench/device_check.py) runs on a GPU machine only: its section says how, and what it showed
# there; until one runs it, that nothing on hardware is verified.
DEVICE_CHECK = [
    "## Device check", "",
    "`python bench/device_check.py [--output FILE]`, a few minutes on one GPU: CUDA-event step time against "
    "synchronized truth; the DDP collective timer's device view (DeviceTail) against a device-side delay "
    "(`torch.cuda._sleep`) put before each all-reduce of a one-GPU NCCL process group, which the host's view "
    "of NCCL completion cannot see; the traced loop's overhead; the exporter against `nvidia-smi -q` on GPU 0. "
    "Without CUDA the GPU parts are skipped and say so (tests/test_device_check.py runs it that way).", "",
    "**Not yet run on a GPU**: no GPU machine was available to this project's sessions, so the device "
    "collective timing (gpuobs/instrument/collectives.py) and CUDA-event step timing are unverified on "
    "hardware; paste the script's report here when it runs on one.", "",
]


def write_report(run: dict, cmd: str) -> str:
    """BENCHMARKS.md from one run's results (what bench/last_run.json holds)."""
    from bench.fleet import fleet_report
    from bench.load import load_report

    out = header_section(run, cmd)
    if run.get("rows"):
        out += exporter_section(run["rows"], run)
    if run.get("load"):
        out += load_report(run["load"]).splitlines() + [""]
    if run.get("tracing"):
        out += tracing_section(run["tracing"])
    if run.get("fleet"):
        out += fleet_report(run["fleet"]).splitlines() + [""]
    out += DEVICE_CHECK
    out += ["## Cardinality budget", "",
            "Series per GPU by default and per opt-in family, per profile, with what multiplies them: "
            "[docs/cardinality.md](docs/cardinality.md), generated by `gpuobs generate` from a sampling "
            "pass on the simulator (a test fails when it drifts). The series counts above agree with it.", ""]
    return "\n".join(out)


def _pairs(rows: list[dict]):
    """(gpuobs row, nvitop-exporter row) of each size and driver latency both measured."""
    for g in rows:
        if g["name"] == "gpuobs" and "error" not in g:
            n = next((r for r in rows if r["label"] == g["label"] and r["name"] == "nvitop-exporter"
                      and r.get("latency_us", 0) == g.get("latency_us", 0) and "error" not in r), None)
            if n:
                yield g, n


SECTIONS = ("exporter", "load", "tracing", "fleet")


def again(sections: list[str], quick: bool, output: Path) -> None:
    """Re-measure some sections (exporter, load, tracing) and put them into bench/last_run.json in
    place of the saved ones, each marked with its own command, date and CPU; then rewrite the report
    from the whole file."""
    import json

    saved_path = ROOT / "bench" / "last_run.json"
    run = json.loads(saved_path.read_text()) if saved_path.exists() else \
        {"quick": quick, "machine": machine_facts(), "elapsed": 0.0, "cmd": "(none)"}
    cmd = ".venv/bin/python bench/run.py --again " + ",".join(sections) + (" --quick" if quick else "")
    started = time.monotonic()
    for section in sections:
        begun = time.monotonic()
        print(f"[{section}] ...", flush=True)
        if section == "exporter":
            result = run["rows"] = exporter_bench(quick)
            meta = run["exporter_run"] = {}
        elif section == "load":
            from bench.load import load_bench

            meta = result = run["load"] = load_bench(quick)
        else:
            meta = result = run["tracing"] = tracing_bench(quick)
        del result  # measured; what follows marks it
        meta.update(cmd=cmd, date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    elapsed=time.monotonic() - begun, cpu=f"{cpu_model()}, {os.cpu_count()} logical cores")
    report = write_report(run, run["cmd"])  # before either write: a report that fails to render writes nothing
    write_result(saved_path, json.dumps(run, indent=1))
    write_result(output, report)
    print(f"wrote {output} and {saved_path} in {time.monotonic() - started:.0f} s")


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter periods, a smaller fleet")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)} "
                    "(a partial run writes a partial report)")
    ap.add_argument("--output", help="the report (default BENCHMARKS.md; a partial or --quick run writes it "
                    "only when given, or with --save)")
    ap.add_argument("--json", help="the run's numbers (default bench/last_run.json; a partial or --quick run "
                    "writes them only when given, or with --save)")
    ap.add_argument("--save", action="store_true", help="let a partial or --quick run replace the committed "
                    "bench/last_run.json and BENCHMARKS.md")
    ap.add_argument("--render", metavar="JSON", help="rewrite the report from a saved run (bench/last_run.json)")
    ap.add_argument("--again", metavar="SECTIONS", help="re-measure only these sections (comma-separated: "
                    "exporter, load, tracing), replace them in bench/last_run.json (the others keep their numbers) "
                    "and rewrite the report from that")
    ap.add_argument("--tracing-only", action="store_true", help="the same as --again tracing")
    args = ap.parse_args()
    args.error = ap.error
    return args


def measure(only: list[str], quick: bool) -> dict:
    """Run the sections named in only; the run's results (what bench/last_run.json holds)."""
    started = time.monotonic()
    run: dict = {"quick": quick, "machine": machine_facts()}
    if "exporter" in only:
        run["rows"] = exporter_bench(quick)
    if "load" in only:
        from bench.load import load_bench

        print("[load] ...", flush=True)
        run["load"] = load_bench(quick)
    if "tracing" in only:
        print("[tracing] ...", flush=True)
        run["tracing"] = tracing_bench(quick)
    if "fleet" in only:
        from bench.fleet import fleet_bench

        print("[fleet] ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="gpuobs-fleet-") as tmp:
            run["fleet"] = fleet_bench(quick, Path(tmp))
    run["elapsed"] = time.monotonic() - started
    run["cmd"] = ".venv/bin/python bench/run.py" + (" --quick" if quick else "") + \
        ("" if only == list(SECTIONS) else f" --only {','.join(only)}")
    return run


def save(run: dict, complete: bool, args: argparse.Namespace) -> None:
    """Write the run's numbers and report, each whole (write_result) and only once both rendered. The
    committed files (bench/last_run.json, BENCHMARKS.md) are written by a complete run, or when named
    (--output, --json) or asked for (--save); a partial one prints where it would have written."""
    import json

    report = write_report(run, run["cmd"])
    for given, default, text in ((args.json, ROOT / "bench" / "last_run.json", json.dumps(run, indent=1)),
                                 (args.output, ROOT / "BENCHMARKS.md", report)):
        path = Path(given) if given else default
        if is_tracked_result(path) and not (complete or args.save or given):
            print(f"partial run: {path.relative_to(ROOT)} left as it is (name a file, or --save to replace it)")
            continue
        write_result(path, text)
        print(f"wrote {path}")


def main() -> None:
    import json

    args = _arguments()
    if args.tracing_only or args.again:
        sections = ["tracing"] if args.tracing_only else [x.strip() for x in args.again.split(",") if x.strip()]
        unknown = set(sections) - {"exporter", "load", "tracing"}
        if unknown:
            args.error(f"--again takes exporter, load and tracing; not {', '.join(sorted(unknown))}")
        again(sections, args.quick, Path(args.output or ROOT / "BENCHMARKS.md"))
        return
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        output = args.output or ROOT / "BENCHMARKS.md"
        write_result(output, write_report(saved, saved["cmd"]))
        print(f"wrote {output} from {args.render}")
        return
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        args.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    run = measure(only, args.quick)
    save(run, complete=set(only) == set(SECTIONS) and not args.quick, args=args)
    print(f"measured in {run['elapsed']:.0f} s")


if __name__ == "__main__":
    main()
