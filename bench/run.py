"""Benchmarks (issue 8): writes BENCHMARKS.md at the repository root from one run.

    .venv/bin/python bench/run.py            # full: exporter vs nvitop-exporter at 1, 8, 64 GPUs and 8 x 7 MIG,
                                             # load, tracing overhead, a 1,250-node fleet in Prometheus and VM
    .venv/bin/python bench/run.py --quick    # fewer sizes, shorter periods, 125 nodes
    .venv/bin/python bench/run.py --tracing-only   # re-measure the tracing section alone (about 30 s)
                                                   # into bench/last_run.json and rewrite the report from it

Sections: exporter and tracing here, load in bench/load.py, fleet in bench/fleet.py.

Every number in BENCHMARKS.md comes from the run that wrote it; ratios are taken within that run.
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

from bench.common import Running, cpu_model, cpu_seconds, free_port, pct, rss_mib, version  # noqa: E402

PAGE_INTERVAL = 1.0  # both exporters sample every second

# ---------------------------------------------------------------------------------------------- helpers


def scrape(url: str) -> tuple[float, str]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    return time.perf_counter() - t, body


# --------------------------------------------------------------------------------- exporter comparison


def exporter_cmd(name: str, port: int) -> list[str]:
    py = sys.executable
    if name == "gpuobs":
        return [py, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1", "--port", str(port),
                "--interval", "1", "--kubelet-socket", ""]
    exe = shutil.which("nvitop-exporter") or str(Path(py).parent / "nvitop-exporter")
    return [exe, "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]


def measure_exporter(name: str, spec: dict, gpus: int, period: float, warmup: float, burst: int) -> dict:
    from gpuobs.sim import Simulator

    with tempfile.TemporaryDirectory(prefix="gpuobs-bench-") as tmp:
        sim = Simulator(spec, directory=tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            with Running(exporter_cmd(name, port), sim.env(), Path(tmp) / "exporter.log") as exp:
                exp.wait_until(lambda: bool(scrape(url)[1].strip()), 60, f"{name} answering")
                return _measure(exp.proc.pid, sim, url, gpus, period, warmup, burst) | {"name": name}
        finally:
            sim.close()


def _measure(pid: int, sim, url: str, gpus: int, period: float, warmup: float, burst: int) -> dict:
    """One exporter's numbers over the period (it is running and answering at `url`)."""
    time.sleep(warmup)
    scrape(url)
    # measured period: one scrape a second
    sim.state.reset_calls()
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    lat, n = [], 0
    next_t = t0
    while True:
        now = time.monotonic()
        if now - t0 >= period:
            break
        if now < next_t:
            time.sleep(next_t - now)
            continue
        d, body = scrape(url)
        lat.append(d)
        n += 1
        next_t += 1.0
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    by_call = sim.state.calls()
    # XID event waits block in the driver between events (the simulator polls at 20 Hz): not sampling
    waits = sum(n for name, n in by_call.items() if name.startswith("nvmlEventSetWait"))
    calls = sum(by_call.values()) - waits
    elapsed = t1 - t0
    series = sum(1 for line in body.splitlines() if line.strip() and not line.startswith("#"))
    rss = rss_mib(pid)
    # latency burst: back-to-back scrapes, for a p99 with more than a handful of samples
    burst_lat = [scrape(url)[0] for _ in range(burst)]
    samples = elapsed / PAGE_INTERVAL
    cpu = cpu1 - cpu0
    return {
        "gpus": gpus, "elapsed": elapsed, "scrapes": n, "cpu_s": cpu,
        "cpu_per_s": cpu / elapsed, "cpu_per_scrape": cpu / max(n, 1),
        "p50_ms": pct(lat + burst_lat, 0.5) * 1e3, "p99_ms": pct(lat + burst_lat, 0.99) * 1e3,
        "p99_period_ms": pct(lat, 0.99) * 1e3,
        "calls": calls, "calls_per_gpu_sample": calls / samples / gpus, "series": series, "rss_mib": rss,
        "event_waits_per_s": waits / elapsed,
    }


# One sampling pass of the gpuobs exporter, split into NVML sampling and text rendering (thread CPU
# time), in a child on the simulated node: where the exporter's CPU goes.
_SPLIT = r"""
import json, statistics, sys, time
from gpuobs.exporter import Exporter, ExporterConfig
exp = Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, interval=1.0))
exp.sampler.on_snapshot = None
exp.renderer.render(exp.sampler.sample_once())
sample, render = [], []
for _ in range(int(sys.argv[1])):
    time.sleep(0.25)  # let values move, as between real passes
    t0 = time.thread_time()
    snap = exp.sampler.sample_once()
    t1 = time.thread_time()
    exp.renderer.render(snap)
    sample.append(t1 - t0)
    render.append(time.thread_time() - t1)
print(json.dumps({"sample_ms": statistics.median(sample) * 1e3, "render_ms": statistics.median(render) * 1e3}))
"""


def gpuobs_split(spec: dict, passes: int) -> dict:
    """Median thread-CPU ms of one gpuobs sampling pass and of rendering its snapshot."""
    import json

    from gpuobs.sim import Simulator

    with tempfile.TemporaryDirectory(prefix="gpuobs-bench-") as tmp:
        sim = Simulator(spec, directory=tmp)
        try:
            out = subprocess.run([sys.executable, "-c", _SPLIT, str(passes)], env=sim.env(), cwd=str(ROOT),
                                 capture_output=True, text=True, timeout=120, check=True)
        finally:
            sim.close()
    return json.loads(out.stdout.strip().splitlines()[-1])


def exporter_bench(quick: bool) -> list[dict]:
    sizes = [("1 GPU", 1, None), ("8 GPUs", 8, None), ("64 GPUs", 64, None), ("8 GPUs x 7 MIG", 8, ["1g.10gb"] * 7)]
    if quick:
        sizes = [s for s in sizes if s[1] != 64]
    period, warmup, burst = (10.0, 3.0, 50) if quick else (30.0, 5.0, 100)
    rows = []
    for label, n, mig in sizes:
        g = {"profile": "h100-sxm-80gb", "count": n, "behaviour": "steady"}
        if mig:
            g = {"profile": "h100-sxm-80gb", "count": n, "mig": mig}
        spec = {"gpus": [g]}
        pair = {}
        for name in ("gpuobs", "nvitop-exporter"):
            print(f"[exporter] {label}: {name} ...", flush=True)
            try:
                r = measure_exporter(name, spec, n, period, warmup, burst)
            except Exception as e:  # keep going: report the failure in BENCHMARKS.md
                r = {"name": name, "gpus": n, "error": str(e)[:500]}
            r["label"] = label
            if name == "gpuobs" and "error" not in r:
                try:
                    r.update(gpuobs_split(spec, 10 if quick else 20))
                except Exception as e:  # noqa: BLE001 - the split explains; its failure must not lose the row
                    r["split_error"] = str(e)[:300]
            pair[name] = r
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
    alone = [k for k in ("tracing", "fleet") if run.get(k, {}).get("cmd")]
    if alone:
        every = (f"Every number below, except the {' and '.join(alone)} section{'s' if len(alone) > 1 else ''}' "
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
        ".venv/bin/python bench/run.py --render bench/last_run.json   # this report again from its numbers",
        "```", "",
    ]


def exporter_section(rows: list[dict]) -> list[str]:
    out = []
    w = out.append
    ok = [r for r in rows if "error" not in r]
    period = ok[0]["elapsed"] if ok else float("nan")
    w("## Exporter vs nvitop-exporter")
    w("")
    w("Method: for each size, one simulated node (profile h100-sxm-80gb, steady behaviour; MIG: 8 GPUs each split "
      "into 7 × 1g.10gb). Each exporter runs alone as a separate process on that node with a 1 s sampling interval "
      "(`python -m gpuobs.cli exporter --interval 1`, `nvitop-exporter --interval 1`), is warmed up, then scraped "
      f"once a second for {period:.0f} s. CPU = utime+stime(+children) from /proc/<pid>/stat over the period; since "
      "both exporters sample on their own 1 s timer, CPU is reported per second of runtime and per scrape "
      "(1 scrape/s, so the two are about equal and include the sampling cost). NVML calls are every call the "
      "simulator counted over the period except XID event waits (shown apart: they block in the driver until an "
      "event or a timeout, 2 per second per node), divided by samples (period / 1 s interval) and by physical GPUs. "
      "Latency = wall time of the HTTP GET of /metrics, over the period's scrapes plus a burst of back-to-back "
      "scrapes after it. Series = non-comment lines of the last scrape. RSS = VmRSS at the end of the period. "
      "Sample / render = median thread CPU of one gpuobs sampling pass and of rendering its snapshot, measured "
      "in-process on the same simulated node (passes 0.25 s apart).")
    w("")
    w("| size | exporter | CPU ms/s | CPU ms/scrape | p50 ms | p99 ms | NVML calls/GPU/sample | event waits/s | "
      "series | RSS MiB | sample ms | render ms |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            w(f"| {r['label']} | {r['name']} | failed: {r['error'][:120].replace('|', '/')} | | | | | | | | | |")
            continue
        split = (f"{fmt(r['sample_ms'])} | {fmt(r['render_ms'])}" if "sample_ms" in r else
                 ("failed | " if "split_error" in r else " | "))
        w(f"| {r['label']} | {r['name']} | {fmt(r['cpu_per_s'] * 1e3, 1)} | {fmt(r['cpu_per_scrape'] * 1e3, 1)} | "
          f"{fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {fmt(r['calls_per_gpu_sample'], 1)} | "
          f"{fmt(r.get('event_waits_per_s', float('nan')), 1)} | {r['series']} | {fmt(r['rss_mib'], 1)} | {split} |")
    w("")
    w("### Targets")
    w("")
    w("| size | CPU/scrape gpuobs ÷ nvitop (≤ 0.20) | NVML calls/GPU/sample (≤ 12) | p99 (≤ 10 ms) |")
    w("|---|---|---|---|")
    missed = []
    for label in dict.fromkeys(r["label"] for r in rows):
        g = next((r for r in rows if r["label"] == label and r["name"] == "gpuobs"), None)
        n = next((r for r in rows if r["label"] == label and r["name"] == "nvitop-exporter"), None)
        cells = []
        if g and n and "error" not in g and "error" not in n and n["cpu_per_scrape"] > 0:
            ratio = g["cpu_per_scrape"] / n["cpu_per_scrape"]
            cells.append(f"{ratio:.2f} — {'met' if ratio <= 0.2 else f'missed by {ratio / 0.2:.1f}×'}")
            if ratio > 0.2:
                missed.append(f"{label}: CPU ratio {ratio:.2f}")
        else:
            cells.append("not measured")
        if g and "error" not in g:
            c = g["calls_per_gpu_sample"]
            cells.append(f"{c:.1f} — {'met' if c <= 12 else f'missed by {c - 12:.1f} calls ({c / 12:.1f}×)'}")
            if c > 12:
                missed.append(f"{label}: {c:.1f} NVML calls/GPU/sample")
            p = g["p99_ms"]
            cells.append(f"{p:.2f} ms — {'met' if p <= 10 else f'missed by {p - 10:.2f} ms'}")
            if p > 10:
                missed.append(f"{label}: p99 {p:.2f} ms")
        else:
            cells += ["not measured", "not measured"]
        w(f"| {label} | " + " | ".join(cells) + " |")
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
            w(f"- {g['label']}: a gpuobs pass is {fmt(g['sample_ms'])} ms of sampling and {fmt(g['render_ms'])} ms "
              f"of rendering, for {g['series']} series against nvitop-exporter's {n['series']} "
              f"({g['series'] / max(n['series'], 1):.1f}×); nvitop-exporter spends {fmt(n['cpu_per_s'] * 1e3, 1)} ms/s "
              f"in all, and 0.2× of that is {fmt(n['cpu_per_s'] * 200, 1)} ms/s.")
        w("- What is left per series is prometheus_client's formatting of the values that changed (the renderer "
          "keeps the text of unchanged metrics) and the sampling pass's Python per value (about 1 µs each); "
          "gpuobs exposes every NVLink link's counters and errors (108 series per H100), each clock-event "
          "reason, and profiling ratios. Cutting further means exposing less by default or formatting outside "
          "prometheus_client; this project keeps the library and the coverage, and says so here.")
        w("- With MIG, each MIG instance costs its own memory and GPM reads (7 instances: about 3.5 calls each), "
          "which NVML offers only per MIG device; nvitop-exporter makes more calls there.")
        if any(g["p99_ms"] > 10 for g, _ in _pairs(rows)):
            w("- p99 over 10 ms comes where a pass takes tens of ms of pure Python (64 GPUs): a scrape that arrives "
              "during it waits for the GIL, even at the exporter's 0.5 ms switch interval, on a 2-core machine.")
        w("- CPU per scrape is measured in whole clock ticks (10 ms at 100 Hz) over the period, so small values "
          "are coarse; and this shared 2-core VM's speed drifts between runs, which is why ratios are only taken "
          "within one run.")
    w("")
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


def write_report(run: dict, cmd: str) -> str:
    """BENCHMARKS.md from one run's results (what bench/last_run.json holds)."""
    from bench.fleet import fleet_report
    from bench.load import load_report

    out = header_section(run, cmd)
    if run.get("rows"):
        out += exporter_section(run["rows"])
    if run.get("load"):
        out += load_report(run["load"]).splitlines() + [""]
    if run.get("tracing"):
        out += tracing_section(run["tracing"])
    if run.get("fleet"):
        out += fleet_report(run["fleet"]).splitlines() + [""]
    out += ["## Cardinality budget", "",
            "Series per GPU by default and per opt-in family, per profile, with what multiplies them: "
            "[docs/cardinality.md](docs/cardinality.md), generated by `gpuobs generate` from a sampling "
            "pass on the simulator (a test fails when it drifts). The series counts above agree with it.", ""]
    return "\n".join(out)


def _pairs(rows: list[dict]):
    for g in rows:
        if g["name"] == "gpuobs" and "error" not in g:
            n = next((r for r in rows if r["label"] == g["label"] and r["name"] == "nvitop-exporter"
                      and "error" not in r), None)
            if n:
                yield g, n


SECTIONS = ("exporter", "load", "tracing", "fleet")


def tracing_only(quick: bool, output: Path) -> None:
    """Run the tracing section alone and put it into bench/last_run.json in place of the saved one,
    marked with its own command, date and CPU; then rewrite the report from the whole file."""
    import json

    saved_path = ROOT / "bench" / "last_run.json"
    started = time.monotonic()
    print("[tracing] ...", flush=True)
    tr = tracing_bench(quick)
    tr.update(cmd=".venv/bin/python bench/run.py --tracing-only" + (" --quick" if quick else ""),
              date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), elapsed=time.monotonic() - started,
              cpu=f"{cpu_model()}, {os.cpu_count()} logical cores")
    if saved_path.exists():
        run = json.loads(saved_path.read_text())
    else:  # nothing saved yet: a report of this section alone
        run = {"quick": quick, "machine": machine_facts(), "elapsed": tr["elapsed"], "cmd": tr["cmd"]}
    run["tracing"] = tr
    saved_path.write_text(json.dumps(run, indent=1))
    output.write_text(write_report(run, run["cmd"]))
    print(f"wrote {output} and {saved_path}")


def main() -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter periods, a smaller fleet")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)} "
                    "(a partial run writes a partial report)")
    ap.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--render", metavar="JSON", help="rewrite the report from a saved run (bench/last_run.json)")
    ap.add_argument("--tracing-only", action="store_true", help="re-measure only the tracing section, replace it in "
                    "bench/last_run.json (the other sections keep their numbers) and rewrite the report from that")
    args = ap.parse_args()
    if args.tracing_only:
        tracing_only(args.quick, Path(args.output))
        return
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        Path(args.output).write_text(write_report(saved, saved["cmd"]))
        print(f"wrote {args.output} from {args.render}")
        return
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    started = time.monotonic()
    run: dict = {"quick": args.quick, "machine": machine_facts()}
    if "exporter" in only:
        run["rows"] = exporter_bench(args.quick)
    if "load" in only:
        from bench.load import load_bench

        print("[load] ...", flush=True)
        run["load"] = load_bench(args.quick)
    if "tracing" in only:
        print("[tracing] ...", flush=True)
        run["tracing"] = tracing_bench(args.quick)
    if "fleet" in only:
        from bench.fleet import fleet_bench

        print("[fleet] ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="gpuobs-fleet-") as tmp:
            run["fleet"] = fleet_bench(args.quick, Path(tmp))
    run["elapsed"] = time.monotonic() - started
    run["cmd"] = ".venv/bin/python bench/run.py" + (" --quick" if args.quick else "") + \
        ("" if only == list(SECTIONS) else f" --only {','.join(only)}")
    (ROOT / "bench" / "last_run.json").write_text(json.dumps(run, indent=1))
    Path(args.output).write_text(write_report(run, run["cmd"]))
    print(f"wrote {args.output} in {run['elapsed']:.0f} s")


if __name__ == "__main__":
    main()
