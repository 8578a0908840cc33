"""Load benchmarks for issue 8 (deliverable 3): concurrent scrapers, and RSS under process churn.

    .venv/bin/python bench/load.py            # 50 scrapers for 60 s; 10,000 sampling passes; faults under load
    .venv/bin/python bench/load.py --quick    # 50 scrapers for 15 s; 2,000 sampling passes; shorter faults run
    .venv/bin/python bench/load.py --faults   # only the faults-under-load run (issue 13), 60 s nominal

`load_bench(quick)` returns the numbers (JSON-serialisable); `load_report(result)` renders the
"## Load" section of BENCHMARKS.md from them, so every number there comes from one run.
`fault_load(duration, scrapers, interval)` is the faults-under-load run alone: 50 scrapers while a
script injects faults into the simulated node live; every response is checked for errors and for
GPU values served older than the freshness bound (see check_body).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import itertools
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Running, cpu_seconds, free_port, pct, rss_mib, write_result  # noqa: E402

SCRAPERS = 50  # concurrent scrapers (deliverable 3)
CLIENT_PROCS = 10  # scrapers are spread over processes so one client GIL does not cap the load
SCRAPE_GPUS = 8  # simulated 8x H100 node for the scraper test
CHURN_GPUS = 64  # the largest node the exporter targets: RSS <= 60 MiB there, flat
CHURN_INTERVAL = 0.1  # s between sampling passes: a 64-GPU pass takes about half of it
CHURN_PERIOD = 0.25  # s between rewrites of every GPU's process table
RSS_BOUND_MIB = 60.0  # the bound on the exporter's RSS at 64 GPUs
PROCESS_CAP = 8  # below the simulator's 32 process slots per GPU, so the cap is exercised
FINAL_LINE = b"gpuobs_exporter_snapshot_stale 0.0\n"  # last line of a fresh /metrics body (render.Renderer)
FLAT_MIB, FLAT_PCT = 2.0, 5.0  # RSS is "flat" when growth from 10 % to 100 % is under either bound


# ---------------------------------------------------------------------------------------------- helpers


_source = threading.local()
_sources = itertools.count()


def source_address() -> tuple[str, int]:
    """This thread's own loopback address to connect from (all of 127.0.0.0/8 reaches 127.0.0.1 on
    Linux): the load is many scrapers, each from its own address as separate Prometheus servers are,
    so the exporter's per-client connection cap (server.Limits) applies as it does in a fleet."""
    if not hasattr(_source, "addr"):
        k = next(_sources)
        _source.addr = (f"127.{1 + os.getpid() % 250}.{k // 250 % 250}.{2 + k % 250}", 0)
    return _source.addr


def get(port: int, path: str = "/metrics", timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of one GET on a fresh connection, as each Prometheus scrape opens one, from
    this thread's own address (source_address)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=source_address())
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def metric_value(body: bytes, name: bytes) -> float | None:
    """Value of an unlabelled sample in a Prometheus text body."""
    for line in body.splitlines():
        if line.startswith(name + b" "):
            return float(line.split()[1])
    return None


def series(body: bytes, prefix: bytes = b"") -> int:
    """Number of sample lines (optionally only those whose name starts with prefix)."""
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#") and line.startswith(prefix))


def serving_fresh(port: int) -> bool:
    """True when /metrics serves a fresh gpuobs body with its GPUs."""
    status, body = get(port, timeout=2)
    return status == 200 and body.endswith(FINAL_LINE) and b"gpuobs_gpu_up{" in body


# ---------------------------------------------------------------------------------- concurrent scrapers


def _scraper(port: int, deadline: float, gpus: int, lat: array, errors: dict[str, int]) -> None:
    """Scrape back to back until deadline (time.time()); latencies in seconds, errors by kind."""
    expected_up = gpus
    while time.time() < deadline:
        t = time.perf_counter()
        try:
            status, body = get(port)
        except (OSError, http.client.HTTPException) as e:
            errors[f"connection: {type(e).__name__}"] = errors.get(f"connection: {type(e).__name__}", 0) + 1
            continue
        lat.append(time.perf_counter() - t)
        if status != 200:
            errors[f"status {status}"] = errors.get(f"status {status}", 0) + 1
        elif not body.endswith(FINAL_LINE):
            errors["body: not fresh or truncated"] = errors.get("body: not fresh or truncated", 0) + 1
        elif body.count(b"\ngpuobs_gpu_up{") != expected_up:
            errors["body: wrong GPU count"] = errors.get("body: wrong GPU count", 0) + 1


def _client_process(port: int, threads: int, start_at: float, seconds: float, gpus: int, out) -> None:
    """One client process: `threads` scrapers from start_at (time.time()) for `seconds`; result to out."""
    time.sleep(max(0.0, start_at - time.time()))
    out.put(_in_threads(threads, _scraper, port, start_at + seconds, gpus))


def _in_threads(threads: int, target, *args) -> tuple[bytes, dict[str, int]]:
    """Run target(*args, record, errors) on `threads` threads; (their records' bytes, errors merged)."""
    recs = [array("d") for _ in range(threads)]
    errs: list[dict[str, int]] = [{} for _ in range(threads)]
    workers = [threading.Thread(target=target, args=(*args, recs[i], errs[i]), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    merged: dict[str, int] = {}
    for e in errs:
        for k, n in e.items():
            merged[k] = merged.get(k, 0) + n
    return b"".join(a.tobytes() for a in recs), merged


def scrape_bench(seconds: float, scrapers: int = SCRAPERS, procs: int = CLIENT_PROCS) -> dict:
    """`scrapers` concurrent back-to-back scrapers of the CLI exporter on a simulated 8x H100 node."""
    from gpuobs.sim import Simulator

    spec = {"gpus": [{"profile": "h100-sxm-80gb", "count": SCRAPE_GPUS, "behaviour": "steady"}]}
    with tempfile.TemporaryDirectory(prefix="gpuobs-load-") as tmp:
        sim = Simulator(spec, directory=tmp)
        port = free_port()
        cmd = [sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1", "--port", str(port),
               "--interval", "1", "--kubelet-socket", ""]
        try:
            with Running(cmd, sim.env(), Path(tmp) / "exporter.log") as exp:
                exp.wait_until(lambda: serving_fresh(port), what="a fresh /metrics body")
                time.sleep(2)  # past start-up: GPM baselines taken, caches warm
                pid = exp.proc.pid
                res = _drive_scrapers(port, pid, seconds, scrapers, procs)
                res["exporter_alive"] = exp.proc.poll() is None
        finally:
            sim.close()
    return res


def _drive_scrapers(port: int, pid: int, seconds: float, scrapers: int, procs: int) -> dict:
    """Run the client processes against a ready exporter and collect the numbers."""
    ctx = mp.get_context("fork")  # no threads exist yet in this process; fork keeps start-up cheap
    out = ctx.Queue()
    per = [scrapers // procs + (1 if i < scrapers % procs else 0) for i in range(procs)]
    start_at = time.time() + 1.0
    clients = [ctx.Process(target=_client_process, args=(port, n, start_at, seconds, SCRAPE_GPUS, out))
               for n in per if n]
    for c in clients:
        c.start()
    time.sleep(max(0.0, start_at - time.time()))
    rss0, cpu0, t0 = rss_mib(pid), cpu_seconds(pid), time.monotonic()
    samples0 = metric_value(get(port)[1], b"gpuobs_exporter_samples_total")
    results = [out.get(timeout=seconds + 120) for _ in clients]
    cpu1, t1, rss1 = cpu_seconds(pid), time.monotonic(), rss_mib(pid)
    samples1 = metric_value(get(port)[1], b"gpuobs_exporter_samples_total")
    for c in clients:
        c.join(timeout=10)
    lat = array("d")
    errors: dict[str, int] = {}
    for raw, errs in results:
        lat.frombytes(raw)
        for k, n in errs.items():
            errors[k] = errors.get(k, 0) + n
    elapsed = t1 - t0
    n_err = sum(errors.values())
    failed_connections = sum(n for k, n in errors.items() if k.startswith("connection"))
    return {"scrapers": scrapers, "client_processes": len(clients), "seconds": seconds, "elapsed_s": elapsed,
            "gpus": SCRAPE_GPUS, "requests": len(lat) + failed_connections, "ok": len(lat) + failed_connections - n_err,
            "errors": n_err, "error_kinds": errors, "throughput_rps": len(lat) / elapsed,
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "max_ms": max(lat, default=0) * 1e3,
            "exporter_cpu_s": cpu1 - cpu0, "exporter_cpu_cores": (cpu1 - cpu0) / elapsed,
            "rss_before_mib": rss0, "rss_after_mib": rss1,
            "sampling_passes": (samples1 or 0) - (samples0 or 0)}


# ------------------------------------------------------------------------------- RSS under process churn


def serve_exporter(port: int, interval: float, process_cap: int) -> None:
    """Run the real Exporter (every family, processes included) until SIGTERM; for the churn test,
    whose interval is below the CLI's 0.1 s floor."""
    from gpuobs.collect import REGISTRY
    from gpuobs.exporter import Exporter, ExporterConfig, tune_process

    config = ExporterConfig(listen_address="127.0.0.1", port=port, interval=interval,
                            families=set(REGISTRY), process_cap=process_cap)
    tune_process()  # as the CLI runs it
    exp = Exporter(config).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    exp.stop()


class Churn(threading.Thread):
    """Rewrites every GPU's simulated process table every `period` seconds: 0 to 32 processes with
    fresh PIDs, names and memory, so processes appear and vanish between sampling passes."""

    def __init__(self, state, gpus: int, period: float):
        super().__init__(name="churn", daemon=True)
        self.state, self.gpus, self.period = state, gpus, period
        self.stop = threading.Event()
        self.rewrites = 0
        self.next_pid = 100_000
        self.rng = random.Random(8)  # fixed seed: the same churn every run

    def rewrite(self, slot: int) -> None:
        from gpuobs.sim import layout

        g = self.state.gpu(slot)
        n = self.rng.randint(0, layout.MAX_PROCS)
        g.proc_count = 0  # hide the table while it is rewritten (the C side reads proc_count first)
        for i in range(n):
            p = g.procs[i]
            p.pid, self.next_pid = self.next_pid, self.next_pid + 1
            p.kind = self.rng.choice((1, 1, 2, 3))  # mostly compute, some graphics, some both
            p.gi_id = p.ci_id = 0xFFFFFFFF
            p.used_mem = self.rng.randint(1, 40_000) * 1024 * 1024
            p.sm_util, p.mem_util = self.rng.randint(0, 100), self.rng.randint(0, 100)
            p.name.s = f"python job-{p.pid}.py --seed {self.rng.randint(0, 1 << 30)}".encode()
            p.name.ret = 0
        g.proc_count = n

    def run(self) -> None:
        while not self.stop.wait(self.period):
            for slot in range(self.gpus):
                self.rewrite(slot)
            self.rewrites += 1


def churn_bench(target: int, gpus: int = CHURN_GPUS, interval: float = CHURN_INTERVAL,
                process_cap: int = PROCESS_CAP, period: float = CHURN_PERIOD) -> dict:
    """Exporter with every family on a `gpus`-GPU node whose processes churn (every `period` s);
    VmRSS and series sampled against the exporter's own pass counter until `target` passes are done."""
    from gpuobs.sim import Simulator

    spec = {"gpus": [{"profile": "h100-sxm-80gb", "count": gpus, "behaviour": "steady"}]}
    with tempfile.TemporaryDirectory(prefix="gpuobs-churn-") as tmp:
        sim = Simulator(spec, directory=tmp)
        port = free_port()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-exporter", str(port),
               "--interval", str(interval), "--process-cap", str(process_cap)]
        churn = Churn(sim.state, gpus, period)
        try:
            with Running(cmd, sim.env(), Path(tmp) / "exporter.log") as exp:
                exp.wait_until(lambda: serving_fresh(port), what="a fresh /metrics body")
                churn.start()
                res = _watch(port, exp.proc.pid, target, interval, process_cap, gpus)
                churn.stop.set()
                churn.join()
                res["exporter_alive"] = exp.proc.poll() is None
                res["slow_pass_warnings"] = exp.log_path.read_text().count("longer than the interval")
        finally:
            churn.stop.set()
            sim.close()
    res.update(churn_rewrites=churn.rewrites, pids_used=churn.next_pid - 100_000, gpus=gpus,
               interval_s=interval, process_cap=process_cap, target=target, churn_period_s=period)
    return res


def _watch(port: int, pid: int, target: int, interval: float, cap: int, gpus: int) -> dict:
    """Poll /metrics and /proc until the exporter has made `target` passes; RSS by pass number."""
    points: list[tuple[float, float]] = []  # (passes, RSS MiB)
    proc_series, other_series, last = [], [], b""
    errors: dict[str, int] = {}
    t0 = time.monotonic()
    deadline = t0 + target * interval * 5 + 120
    while time.monotonic() < deadline:
        try:
            status, body = get(port)
        except (OSError, http.client.HTTPException) as e:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            time.sleep(0.5)
            continue
        passes = metric_value(body, b"gpuobs_exporter_samples_total")
        if status != 200 or passes is None or not body.endswith(FINAL_LINE):
            # a stale body (snapshot older than two intervals, 40 ms here) after a slow pass lands here too
            kind = f"status {status}" if status != 200 else "stale or incomplete body"
            errors[kind] = errors.get(kind, 0) + 1
        else:
            points.append((passes, rss_mib(pid)))
            if passes >= 0.1 * target:  # past warm-up: GPM has its baseline, churn is running
                proc_series.append(series(body, b"gpuobs_gpu_process_"))
                other_series.append(series(body) - proc_series[-1])
                last = body
            if passes >= target:
                break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0

    def rss_at(frac: float) -> float:
        want = frac * target
        return next((r for n, r in points if n >= want), points[-1][1] if points else float("nan"))

    r10, r50, r100 = rss_at(0.1), rss_at(0.5), rss_at(1.0)
    growth = r100 - r10
    return {"passes": points[-1][0] if points else 0, "elapsed_s": elapsed, "polls": len(points),
            "poll_errors": errors, "rss_start_mib": points[0][1] if points else float("nan"),
            "rss_10_mib": r10, "rss_50_mib": r50, "rss_100_mib": r100, "growth_mib": growth,
            "growth_pct": 100 * growth / r10 if r10 else float("nan"),
            "flat": growth < FLAT_MIB or 100 * growth / r10 < FLAT_PCT,
            "process_series_max": max(proc_series, default=0), "process_series_min": min(proc_series, default=0),
            "process_series_bound": 2 * cap * gpus,
            "other_series_min": min(other_series, default=0), "other_series_max": max(other_series, default=0),
            "nvml_errors": nvml_errors(last)}


def nvml_errors(body: bytes) -> dict[str, float]:
    """{"call code": count} from gpuobs_exporter_nvml_errors_total in a /metrics body."""
    out = {}
    for line in body.splitlines():
        if line.startswith(b"gpuobs_exporter_nvml_errors_total{"):
            labels = dict(kv.split("=", 1) for kv in line.decode().split("{", 1)[1].rsplit("}", 1)[0].split(","))
            out[f"{labels['call'].strip(chr(34))} {labels['code'].strip(chr(34))}"] = float(line.split()[-1])
    return out


# ------------------------------------------------------------------------------- faults under load
#
# Issue 13: 50 scrapers while faults are injected live into the simulated node. Every response is
# checked: a transport error or a status other than 200 is an error; a body that serves GPU values
# (any series with a `uuid` label except gpu_up, gpu_unhealthy and exporter_gpu_timeouts) whose
# gpuobs_exporter_last_success_timestamp_seconds (the start of the pass that read them) is older
# than the bound when the response has arrived is "stale served as fresh".

FRESH_INTERVALS = 2  # the exporter's documented bound: a snapshot is served at most 2 intervals old
ALLOWANCE_S = 0.25  # for the time from the exporter's freshness check to the client's last byte
FAULT_INTERVAL = 1.0  # the bench's sampling interval (the CLI's own flag)
LOST_SLOT, SLOW_SLOT, HUNG_SLOT = 2, 3, 5  # the GPUs the one-GPU faults hit
SLOW_CALL = "nvmlDeviceGetTemperature"  # read once per GPU per pass (power comes from field values)
SLOW_MS = 2000  # "2 s calls"
INIT_FAILURES = 2  # nvmlInit answers DRIVER_NOT_LOADED this many times after the re-initialisation
NVML_DRIVER_NOT_LOADED, NVML_UNKNOWN = 9, 999

# flags of one response record
ERR, VALUES, STALE_FLAG, FRESH_FLAG, NVML_DOWN, INIT_ERROR, STALE_AS_FRESH, NO_TIMESTAMP = (1 << i for i in range(8))
REC = 7  # doubles per response record: arrived (time.time()), latency s, age s, flags, up, timeout, lost
_EXCLUDED = (b"gpuobs_gpu_up", b"gpuobs_gpu_unhealthy", b"gpuobs_exporter_gpu_timeouts_total")


def _family_lines(body: bytes, name: bytes) -> list[bytes]:
    """The labelled sample lines of one metric (a family's lines are contiguous in the text format)."""
    i = body.find(b"\n" + name + b"{")
    if i < 0:
        if not body.startswith(name + b"{"):
            return []
        i = -1
    j = body.find(b"\n#", i + 1)
    return [ln for ln in body[i + 1:j if j >= 0 else len(body)].split(b"\n") if ln.startswith(name + b"{")]


def check_body(body: bytes, arrived: float, bound: float) -> tuple[int, float, int, int, int]:
    """(flags, age, GPUs up, GPUs timed out, GPUs lost) of one 200 /metrics body that arrived at
    `arrived` (time.time()). age = arrived - gpuobs_exporter_last_success_timestamp_seconds (NaN
    without one). STALE_AS_FRESH when the body serves GPU values and its age exceeds `bound`, or it
    serves values with no timestamp to bound their age; ERR when it does not end with the stale
    flag's line (truncated)."""
    flags = 0
    if body.endswith(b"gpuobs_exporter_snapshot_stale 1.0\n"):
        flags |= STALE_FLAG
    elif body.endswith(b"gpuobs_exporter_snapshot_stale 0.0\n"):
        flags |= FRESH_FLAG
    else:
        flags |= ERR
    up_lines = _family_lines(body, b"gpuobs_gpu_up")
    bad_lines = _family_lines(body, b"gpuobs_gpu_unhealthy")
    excluded = len(up_lines) + len(bad_lines) + len(_family_lines(body, b"gpuobs_exporter_gpu_timeouts_total"))
    if body.count(b'uuid="') > excluded:
        flags |= VALUES
    up = sum(1 for ln in up_lines if ln.endswith(b"} 1.0"))
    timeout = sum(1 for ln in bad_lines if b'reason="timeout"' in ln and ln.endswith(b"} 1.0"))
    lost = sum(1 for ln in bad_lines if b'reason="lost"' in ln and ln.endswith(b"} 1.0"))
    if b"\ngpuobs_nvml_up 0.0\n" in body:
        flags |= NVML_DOWN
    if b"\ngpuobs_nvml_init_error{" in body:
        flags |= INIT_ERROR
    age = float("nan")
    i = body.find(b"\ngpuobs_exporter_last_success_timestamp_seconds ")
    if i >= 0:
        j = body.find(b"\n", i + 1)
        age = arrived - float(body[i + 1:j].split()[1])
    if flags & VALUES:
        if age != age:  # NaN: values whose age nothing bounds
            flags |= NO_TIMESTAMP | STALE_AS_FRESH
        elif age > bound:
            flags |= STALE_AS_FRESH
    return flags, age, up, timeout, lost


def _checked_scraper(port: int, stop, bound: float, rec: array, errors: dict[str, int]) -> None:
    """Scrape back to back until `stop` is set; one record per response (see REC)."""
    nan = float("nan")
    while not stop.is_set():
        t = time.perf_counter()
        try:
            status, body = get(port)
        except (OSError, http.client.HTTPException) as e:
            kind = f"connection: {type(e).__name__}"
            errors[kind] = errors.get(kind, 0) + 1
            rec.extend((time.time(), nan, nan, ERR, 0, 0, 0))
            time.sleep(0.05)  # not a hot loop against a refused port
            continue
        arrived, lat = time.time(), time.perf_counter() - t
        if status != 200:
            errors[f"status {status}"] = errors.get(f"status {status}", 0) + 1
            rec.extend((arrived, lat, nan, ERR, 0, 0, 0))
            continue
        flags, age, up, timeout, lost = check_body(body, arrived, bound)
        if flags & ERR:
            errors["body: truncated (no stale-flag line at the end)"] = \
                errors.get("body: truncated (no stale-flag line at the end)", 0) + 1
        rec.extend((arrived, lat, age, flags, up, timeout, lost))


def _scraper_threads(port: int, threads: int, stop, bound: float) -> tuple[bytes, dict[str, int]]:
    return _in_threads(threads, _checked_scraper, port, stop, bound)


def _checked_client(port: int, threads: int, stop, bound: float, out) -> None:
    out.put(_scraper_threads(port, threads, stop, bound))


def scrape_checked(port: int, script: Callable[[], object], scrapers: int = SCRAPERS, procs: int = CLIENT_PROCS,
                   bound: float = FRESH_INTERVALS * FAULT_INTERVAL + ALLOWANCE_S) -> tuple[array, dict, object]:
    """`scrapers` checked back-to-back scrapers of `port` (over `procs` forked client processes;
    0: threads of this process) while `script()` runs in this thread; they stop when it returns.
    (records, error kinds, what script returned)."""
    if procs:
        ctx = mp.get_context("fork")  # before this process starts any thread of its own
        out, stop = ctx.Queue(), ctx.Event()
        per = [scrapers // procs + (1 if i < scrapers % procs else 0) for i in range(procs)]
        clients = [ctx.Process(target=_checked_client, args=(port, n, stop, bound, out), daemon=True)
                   for n in per if n]
        for cl in clients:
            cl.start()
    else:
        stop, box = threading.Event(), []
        runner = threading.Thread(target=lambda: box.append(_scraper_threads(port, scrapers, stop, bound)))
        runner.start()
    try:
        ret = script()
    finally:
        stop.set()
    if procs:
        results = [out.get(timeout=120) for _ in clients]
        for cl in clients:
            cl.join(timeout=10)
    else:
        runner.join()
        results = box
    rec, errors = array("d"), {}
    for raw, errs in results:
        rec.frombytes(raw)
        for k, n in errs.items():
            errors[k] = errors.get(k, 0) + n
    return rec, errors, ret


def _all_up(f: int, up: int, to: int, lost: int) -> bool:
    return bool(f & VALUES and f & FRESH_FLAG) and not f & NVML_DOWN and up == SCRAPE_GPUS and not to and not lost


def _seven_fresh(reason: str) -> Callable[[int, int, int, int], bool]:
    def pred(f: int, up: int, to: int, lost: int) -> bool:
        n = to if reason == "timeout" else lost
        return bool(f & VALUES and f & FRESH_FLAG) and up == SCRAPE_GPUS - 1 and n == 1
    return pred


ALL_UP = ("all 8 GPUs served fresh", _all_up)
# phase -> (the fault, [(what must be seen at least once, predicate(flags, up, timeout, lost))])
PHASES: dict[str, tuple[str, list[tuple[str, Callable[[int, int, int, int], bool]]]]] = {
    "baseline": ("no fault", [ALL_UP]),
    "lost_gpu": (f"GPU {LOST_SLOT} falls off the bus (`lose_gpu`)",
                 [("it reads gpu_up 0, reason lost; the other 7 served fresh", _seven_fresh("lost"))]),
    "lost_gpu_back": (f"GPU {LOST_SLOT} back on the bus", [ALL_UP]),
    "slow_call_one_gpu": (f"{SLOW_CALL} answers after {SLOW_MS / 1000:g} s on GPU {SLOW_SLOT}",
                          [("it is withheld (reason timeout); the other 7 served fresh", _seven_fresh("timeout"))]),
    "slow_calls_all_gpus": (f"{SLOW_CALL} answers after {SLOW_MS / 1000:g} s on every GPU",
                            [("every GPU withheld (reason timeout) in fresh bodies",
                              lambda f, up, to, lost: bool(f & FRESH_FLAG) and not f & VALUES and to == SCRAPE_GPUS)]),
    "slow_calls_back": ("delays cleared", [ALL_UP]),
    "nvml_init_failures": (f"every call answers UNKNOWN until NVML re-initialises; then nvmlInit fails "
                           f"{INIT_FAILURES}× (DRIVER_NOT_LOADED)",
                           [("NVML down with its init error, no GPU values",
                             lambda f, up, to, lost: bool(f & NVML_DOWN and f & INIT_ERROR) and not f & VALUES)]),
    "nvml_back": ("nvmlInit succeeds again", [ALL_UP]),
    "wedged_call_one_gpu": (f"every call on GPU {HUNG_SLOT} hangs",
                            [("it is withheld (reason timeout); the other 7 served fresh", _seven_fresh("timeout"))]),
    "wedged_node": ("every NVML call hangs, node-wide",
                    [("the stale flag, no GPU values",
                      lambda f, up, to, lost: bool(f & STALE_FLAG) and not f & VALUES)]),
    "recovered": ("every fault cleared", [ALL_UP]),
}


class _FaultScript:
    """Drives the fault phases on `state` and watches the exporter on `port`; `timeline` is
    [(phase, start, end)] in time.time()."""

    def __init__(self, state, port: int, interval: float, phase_s: float):
        self.state, self.port, self.interval, self.phase_s = state, port, interval, phase_s
        self.timeline: list[tuple[str, float, float]] = []
        self.notes: dict[str, str] = {}
        self.reinits: list[float] = []

    def _body(self) -> bytes:
        try:
            status, body = get(self.port, timeout=5)
            return body if status == 200 else b""
        except (OSError, http.client.HTTPException):
            return b""

    def wait(self, pred: Callable[[bytes], bool], timeout: float, what: str, phase: str) -> bool:
        """Poll /metrics until pred(body); a note in the result if it never came."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self._body()):
                return True
            time.sleep(0.05)
        self.notes[phase] = f"{what}: not seen within {timeout:.0f} s"
        return False

    @staticmethod
    def _all_up(body: bytes) -> bool:
        f, _, up, timeout, lost = check_body(body, time.time(), float("inf"))
        return _all_up(f, up, timeout, lost)

    def run(self) -> list[tuple[str, float, float]]:
        st, iv, hold = self.state, self.interval, self.phase_s
        recover_s = SLOW_MS / 1000 + 10 * iv + 10  # a delayed call returns late; a slow pass re-counts GPUs

        def phase(name: str, setup: Callable[[], object]) -> float:
            t0 = time.time()
            if self.timeline:
                self.timeline[-1] = self.timeline[-1][:2] + (t0,)
            self.timeline.append((name, t0, t0))
            setup()
            return t0

        def rest(t0: float, min_s: float = hold) -> None:
            time.sleep(max(0.0, t0 + min_s - time.time()))

        t = phase("baseline", lambda: None)
        rest(t)
        t = phase("lost_gpu", lambda: st.lose_gpu(LOST_SLOT))
        rest(t)
        t = phase("lost_gpu_back", lambda: st.lose_gpu(LOST_SLOT, lost=False))
        self.wait(self._all_up, recover_s, "all 8 GPUs back", "lost_gpu_back")
        rest(t)
        slow = []
        t = phase("slow_call_one_gpu", lambda: slow.append(st.fail(SLOW_CALL, 0, gpu=SLOW_SLOT, delay_ms=SLOW_MS)))
        rest(t, max(hold, SLOW_MS / 1000 + 2 * iv))
        t = phase("slow_calls_all_gpus", lambda: (st.clear_fault(slow.pop()),
                                                  slow.append(st.fail(SLOW_CALL, 0, delay_ms=SLOW_MS))))
        rest(t, max(hold, SLOW_MS / 1000 + 2 * iv))
        t = phase("slow_calls_back", lambda: st.clear_fault(slow.pop()))
        self.wait(self._all_up, recover_s, "all 8 GPUs back", "slow_calls_back")
        rest(t)
        unknown = []
        reinits0 = metric_value(self._body(), b"gpuobs_exporter_nvml_reinits_total") or 0.0

        def driver_gone() -> None:
            st.fail_init(NVML_DRIVER_NOT_LOADED, times=INIT_FAILURES)  # consulted only by nvmlInit
            unknown.append(st.fail(None, NVML_UNKNOWN))

        t = phase("nvml_init_failures", driver_gone)
        # down: NVML shut down by the session after the UNKNOWNs, and its first re-init failed
        self.wait(lambda b: b"\ngpuobs_nvml_init_error{" in b, 10 + 2 * iv, "NVML down", "nvml_init_failures")
        st.clear_fault(unknown.pop())  # the driver answers again; nvmlInit still fails INIT_FAILURES times
        self.wait(self._all_up, 30 + 2 * iv, "NVML back up with all 8 GPUs", "nvml_init_failures")
        t = phase("nvml_back", lambda: None)
        self.reinits = [reinits0, metric_value(self._body(), b"gpuobs_exporter_nvml_reinits_total") or 0.0]
        rest(t, max(hold / 2, 2 * iv))
        hung = []
        t = phase("wedged_call_one_gpu", lambda: hung.append(st.fail(None, 0, gpu=HUNG_SLOT, hang=True)))
        rest(t, max(hold, 3 * iv))

        def wedge_node() -> None:
            hung.append(st.fail(None, 0, hang=True))
            st.clear_fault(hung.pop(0))  # its hung calls move on to the node-wide hang

        t = phase("wedged_node", wedge_node)
        # the sampling thread itself calls NVML only on slow passes (every 10th: the device count),
        # so the snapshot goes stale within 10 + 2 intervals of the wedge
        seen = self.wait(lambda b: b.endswith(b"gpuobs_exporter_snapshot_stale 1.0\n"), 12 * iv + 10,
                         "the stale flag", "wedged_node")
        if seen:
            self.notes["wedged_node"] = f"stale flag after {time.time() - t:.1f} s"
        rest(time.time(), max(2 * iv, 1.0))  # stale bodies for a while
        rest(t)
        t = phase("recovered", lambda: (st.clear_faults(), st.clear_init_error()))
        self.wait(self._all_up, recover_s, "all 8 GPUs back", "recovered")
        rest(t)
        self.timeline[-1] = self.timeline[-1][:2] + (time.time(),)
        return self.timeline


def _phase_stats(rec: array, start: float, end: float, origin: float, bound: float, checks) -> dict:
    """Numbers of the records that arrived in [start, end); expectation onsets from `origin`."""
    lat, ages = [], []
    n = errors = saf = fresh = stale = values = down_values = 0
    seen = [0] * len(checks)
    first = [None] * len(checks)
    for k in range(0, len(rec), REC):
        arrived = rec[k]
        if not start <= arrived < end:
            continue
        f = int(rec[k + 3])
        n += 1
        if f & ERR:
            errors += 1
        if rec[k + 1] == rec[k + 1]:
            lat.append(rec[k + 1])
        saf += bool(f & STALE_AS_FRESH)
        fresh += bool(f & FRESH_FLAG)
        stale += bool(f & STALE_FLAG)
        if f & VALUES:
            values += 1
            down_values += bool(f & NVML_DOWN)
            if rec[k + 2] == rec[k + 2]:
                ages.append(rec[k + 2])
        up, to, lost = int(rec[k + 4]), int(rec[k + 5]), int(rec[k + 6])
        for i, (_, pred) in enumerate(checks):
            if pred(f, up, to, lost):
                seen[i] += 1
                if first[i] is None or arrived < first[i]:
                    first[i] = arrived
    return {"requests": n, "errors": errors, "stale_as_fresh": saf,
            "fresh_bodies": fresh, "stale_bodies": stale, "bodies_with_values": values,
            "values_with_nvml_down": down_values,
            "max_value_age_s": max(ages, default=float("nan")), "over_two_intervals": sum(a > bound - ALLOWANCE_S
                                                                                          for a in ages),
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "max_ms": max(lat, default=0) * 1e3,
            "expect": [{"what": what, "seen": seen[i],
                        "after_s": None if first[i] is None else max(0.0, first[i] - origin)}
                       for i, (what, _) in enumerate(checks)],
            "met": n > 0 and all(seen)}


def summarize_checked(rec: array, errors: dict[str, int], timeline: list[tuple[str, float, float]],
                      bound: float, phases: dict = PHASES) -> dict:
    """Totals and per-phase numbers of checked-scraper records (records after the last phase's end
    count in it; those before the first phase's start in the first)."""
    per = {}
    for i, (name, start, end) in enumerate(timeline):
        lo = float("-inf") if i == 0 else start
        hi = float("inf") if i == len(timeline) - 1 else end
        per[name] = _phase_stats(rec, lo, hi, start, bound, phases.get(name, ("", []))[1])
        per[name].update(seconds=end - start, fault=phases.get(name, ("",))[0])
    lat = [rec[k + 1] for k in range(0, len(rec), REC) if rec[k + 1] == rec[k + 1]]
    flags = [int(rec[k + 3]) for k in range(0, len(rec), REC)]
    ages = [rec[k + 2] for k in range(0, len(rec), REC) if int(rec[k + 3]) & VALUES and rec[k + 2] == rec[k + 2]]
    return {"requests": len(flags), "errors": sum(bool(f & ERR) for f in flags), "error_kinds": errors,
            "stale_as_fresh": sum(bool(f & STALE_AS_FRESH) for f in flags),
            "no_timestamp": sum(bool(f & NO_TIMESTAMP) for f in flags),
            "fresh_bodies": sum(bool(f & FRESH_FLAG) for f in flags),
            "stale_bodies": sum(bool(f & STALE_FLAG) for f in flags),
            "values_with_nvml_down": sum(1 for f in flags if f & VALUES and f & NVML_DOWN),
            "bodies_with_values": len(ages), "bound_s": bound,
            "max_value_age_s": max(ages, default=float("nan")),
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "max_ms": max(lat, default=0) * 1e3,
            "phases": per, "phases_met": bool(per) and all(p["met"] for p in per.values())}


def fault_load(duration: float = 60.0, scrapers: int = SCRAPERS, interval: float = FAULT_INTERVAL,
               procs: int = CLIENT_PROCS, allowance: float = ALLOWANCE_S) -> dict:
    """`scrapers` checked scrapers of the CLI exporter (`--interval interval`) on a simulated 8x H100
    node while the fault script runs through PHASES, each held about duration / len(PHASES) seconds
    (longer where a fault needs it: see _FaultScript). JSON-serialisable numbers; `errors` and
    `stale_as_fresh` should be 0 and `phases_met` true."""
    from gpuobs.sim import Simulator

    bound = FRESH_INTERVALS * interval + allowance
    started = time.monotonic()
    spec = {"gpus": [{"profile": "h100-sxm-80gb", "count": SCRAPE_GPUS, "behaviour": "steady"}]}
    with tempfile.TemporaryDirectory(prefix="gpuobs-faults-") as tmp:
        sim = Simulator(spec, directory=tmp)
        port = free_port()
        cmd = [sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1", "--port", str(port),
               "--interval", str(interval), "--kubelet-socket", ""]
        try:
            with Running(cmd, sim.env(), Path(tmp) / "exporter.log") as exp:
                exp.wait_until(lambda: serving_fresh(port), what="a fresh /metrics body")
                time.sleep(2 * interval)  # GPM baselines taken, caches warm
                pid = exp.proc.pid
                script = _FaultScript(sim.state, port, interval, duration / len(PHASES))
                cpu0, rss0 = cpu_seconds(pid), rss_mib(pid)
                rec, errors, timeline = scrape_checked(port, script.run, scrapers, procs, bound)
                cpu1, rss1 = cpu_seconds(pid), rss_mib(pid)
                sim.state.clear_faults()
                sim.state.clear_init_error()
                alive = exp.proc.poll() is None
                try:
                    final = get(port, timeout=5)[1]
                except (OSError, http.client.HTTPException):
                    final = b""
                log = exp.log_tail() if not alive else exp.log_path.read_text()
        finally:
            sim.state.clear_faults()
            sim.close()
    res = summarize_checked(rec, errors, timeline, bound)
    elapsed = timeline[-1][2] - timeline[0][1] if timeline else float("nan")
    res.update(scrapers=scrapers, client_processes=procs, gpus=SCRAPE_GPUS, interval_s=interval,
               allowance_s=allowance, nominal_s=duration, elapsed_s=elapsed,
               throughput_rps=res["requests"] / elapsed if elapsed else float("nan"),
               exporter_alive=alive, exporter_cpu_cores=(cpu1 - cpu0) / elapsed if elapsed else float("nan"),
               rss_before_mib=rss0, rss_after_mib=rss1, notes=script.notes, reinits=script.reinits,
               gpu_timeouts=sum(v for k, v in _labelled(final, b"gpuobs_exporter_gpu_timeouts_total").items()),
               slow_pass_warnings=log.count("longer than the interval"), log_errors=log.count('"level": "ERROR"'),
               nvml_errors=nvml_errors(final), run_s=time.monotonic() - started,
               cmd=f"python bench/load.py --faults --duration {duration:g} --fault-interval {interval:g}",
               date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), cpus=os.cpu_count())
    return res


def _labelled(body: bytes, name: bytes) -> dict[str, float]:
    """{label text: value} of one labelled metric."""
    return {ln.split(b"{", 1)[1].rsplit(b"}", 1)[0].decode(): float(ln.rsplit(b" ", 1)[1])
            for ln in _family_lines(body, name)}


# --------------------------------------------------------------------------------------------- entry


def load_bench(quick: bool) -> dict:
    """The three load tests; quick: 15 s of scraping, 2,000 passes and a 20 s fault script instead
    of 60 s, 10,000 and 60 s."""
    started = time.monotonic()
    print("[load] 50 concurrent scrapers ...", flush=True)
    scrape = scrape_bench(15.0 if quick else 60.0)
    print(f"    {scrape}", flush=True)
    print("[load] RSS under process churn ...", flush=True)
    churn = churn_bench(2_000 if quick else 10_000)
    print(f"    {churn}", flush=True)
    print("[load] 50 scrapers with faults injected live ...", flush=True)
    faults = fault_load(20.0 if quick else 60.0)
    print(f"    {_fault_line(faults)}", flush=True)
    return {"quick": quick, "scrape": scrape, "churn": churn, "faults": faults,
            "elapsed_s": time.monotonic() - started}


def _fault_line(r: dict) -> str:
    return (f"requests {r['requests']}, errors {r['errors']}, stale served as fresh {r['stale_as_fresh']}, "
            f"max value age {r['max_value_age_s']:.3f} s (bound {r['bound_s']:.2f} s), "
            f"phases met {r['phases_met']}")


def _f(x: float, d: int = 1) -> str:
    return f"{x:.{d}f}"


def _scrape_section(s: dict) -> list[str]:
    """Method, table and verdict of the concurrent-scraper test."""
    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(s["error_kinds"].items())) or "none"
    out = [f"### {s['scrapers']} concurrent scrapers", "",
           f"Method: the exporter runs as its own process (`python -m gpuobs.cli exporter --interval 1`) on a "
           f"simulated node of {s['gpus']} × h100-sxm-80gb (steady behaviour). {s['scrapers']} scrapers, spread over "
           f"{s['client_processes']} client processes (threads inside each, so no single client GIL caps the load), "
           f"each GET /metrics back to back on a new connection for {s['seconds']:.0f} s. An error is a failed "
           "connection, a status other than 200, or a body that does not end with the fresh snapshot's last line "
           f"(`gpuobs_exporter_snapshot_stale 0.0`) or lacks {s['gpus']} `gpuobs_gpu_up` series. Latency = wall time "
           "of one GET (connect to last byte) as the client sees it. Clients and exporter share the machine's cores, "
           "so latency includes waiting for a core. Exporter CPU from /proc/<pid>/stat over the period; RSS = VmRSS.",
           "", "| requests | errors | req/s | p50 ms | p99 ms | max ms | exporter CPU (cores) | RSS before → after MiB "
           "| sampling passes (1 s interval) |", "|---:|---:|---:|---:|---:|---:|---:|---|---:|",
           f"| {s['requests']} | {s['errors']} | {_f(s['throughput_rps'])} | {_f(s['p50_ms'], 2)} | "
           f"{_f(s['p99_ms'], 2)} | {_f(s['max_ms'], 2)} | {_f(s['exporter_cpu_cores'], 2)} | "
           f"{_f(s['rss_before_mib'])} → {_f(s['rss_after_mib'])} | {s['sampling_passes']:.0f} in "
           f"{s['elapsed_s']:.0f} s |", ""]
    little = s["scrapers"] / s["throughput_rps"] * 1e3 if s["throughput_rps"] else float("nan")
    out.append(f"Latency is queueing: with {s['scrapers']} scrapers always waiting, Little's law gives a mean of "
               f"{s['scrapers']} / {_f(s['throughput_rps'])} req/s = {_f(little)} ms per request, near the p50 "
               f"above. The exporter used {_f(s['exporter_cpu_cores'], 2)} cores of {os.cpu_count()}: its HTTP "
               "threads share one GIL, so it can use little more than one core, and the clients take the rest.")
    out.append("")
    if s["errors"] == 0 and s["exporter_alive"]:
        out.append(f"Target 0 errors: **met** ({s['requests']} requests; p99 {_f(s['p99_ms'], 2)} ms).")
    else:
        out.append(f"Target 0 errors: **missed** by {s['errors']} errors ({kinds}); "
                   f"exporter {'still running' if s['exporter_alive'] else 'exited'}.")
    return out


def _churn_section(c: dict) -> list[str]:
    """Method, table and verdict of the RSS-under-churn test."""
    out = [f"### RSS over {c['target']:,} sampling passes with process churn", "",
           f"Method: the `Exporter` class with every family, `processes` included (`--process-cap "
           f"{c['process_cap']}`), runs as its own process on {c['gpus']} simulated h100-sxm-80gb with a "
           f"{c['interval_s']} s interval (started by `bench/load.py --serve-exporter`, which runs it as the CLI does, "
           "so that the interval can go below the CLI's 0.1 s floor on a small node; at 64 GPUs a pass takes about "
           "half of 0.1 s, and a shorter interval would withhold GPUs past the pass deadline). A thread in the bench "
           "process rewrites each GPU's process "
           f"table in the simulator's shared state every {c.get('churn_period_s', c['interval_s'])} s: 0 to 32 "
           "processes, every one with a new PID, name "
           f"and memory size ({c['pids_used']:,} PIDs over {c['churn_rewrites']:,} rewrites). Twice a second the bench "
           "reads the exporter's `gpuobs_exporter_samples_total` from /metrics and its VmRSS from /proc, until "
           f"{c['target']:,} passes. Flat means growth from the 10 % point to the end under {FLAT_MIB:.0f} MiB or "
           f"under {FLAT_PCT:.0f} %; the first 10 % is warm-up (imports, caches, allocator arenas).", "",
           "| RSS at start | at 10 % | at 50 % | at 100 % | growth 10 → 100 % | process series (max / bound) "
           "| other series (min–max) | passes in s |", "|---:|---:|---:|---:|---:|---:|---:|---:|",
           f"| {_f(c['rss_start_mib'])} MiB | {_f(c['rss_10_mib'])} MiB | {_f(c['rss_50_mib'])} MiB | "
           f"{_f(c['rss_100_mib'])} MiB | {c['growth_mib']:+.2f} MiB ({c['growth_pct']:+.1f} %) | "
           f"{c['process_series_max']} / {c['process_series_bound']} | {c['other_series_min']}–{c['other_series_max']} "
           f"| {c['passes']:.0f} in {c['elapsed_s']:.0f} |", ""]
    bounded = c["process_series_max"] <= c["process_series_bound"]
    verdict = "**met**" if c["flat"] else (f"**missed**: {c['growth_mib']:.2f} MiB ({c['growth_pct']:.1f} %) "
                                           f"against {FLAT_MIB:.0f} MiB / {FLAT_PCT:.0f} %")
    errs = ", ".join(f"{k}: {n:.0f}" for k, n in sorted(c["nvml_errors"].items())) or "none"
    out.append(f"NVML errors the exporter counted by the end (`gpuobs_exporter_nvml_errors_total`): {errs}. Other "
               "series are counted after the 10 % point; their spread is error series appearing, and GPUs "
               "withheld from a pass that overran its deadline.")
    out.append("")
    peak = max(c["rss_10_mib"], c["rss_50_mib"], c["rss_100_mib"])
    bound = (f" RSS ≤ {RSS_BOUND_MIB:.0f} MiB at {c['gpus']} GPUs: **{'met' if peak <= RSS_BOUND_MIB else 'missed'}** "
             f"(largest of the points above {peak:.1f} MiB).")
    out.append(f"Target RSS flat: {verdict}.{bound} Process series stay within 2 metrics × cap × GPUs = "
               f"{c['process_series_bound']}: {'yes' if bounded else 'no'}. Polls that failed: "
               f"{', '.join(f'{k}: {n}' for k, n in c['poll_errors'].items()) or 'none'}; "
               f"passes that overran the interval: {c['slow_pass_warnings']}.")
    return out


PHASE_TITLES = {
    "baseline": "baseline", "lost_gpu": "lost GPU", "lost_gpu_back": "lost GPU back",
    "slow_call_one_gpu": "2 s calls, one GPU", "slow_calls_all_gpus": "2 s calls, every GPU",
    "slow_calls_back": "2 s calls cleared", "nvml_init_failures": "driver errors, re-init, init failures",
    "nvml_back": "NVML back", "wedged_call_one_gpu": "wedged call, one GPU", "wedged_node": "wedged calls, node-wide",
    "recovered": "recovered",
}


def faults_section(r: dict) -> list[str]:
    """Method, tables and verdict of the faults-under-load run (fault_load's result). A run made on
    its own (`bench/load.py --faults`, r["standalone"]) says so, with its command and date."""
    iv, b = r["interval_s"], r["bound_s"]
    out = ["### Faults injected live under 50 scrapers", ""]
    if r.get("standalone"):
        out += [f"Measured on its own by `.venv/bin/python {r['cmd'].removeprefix('python ')}` on {r['date']} in "
                f"{r['run_s']:.0f} s ({r['cpus']} logical cores); every number in this subsection comes from that run.",
                ""]
    out.append(
        f"Method: the exporter runs as its own process (`python -m gpuobs.cli exporter --interval {iv:g}`) on a "
        f"simulated node of {r['gpus']} × h100-sxm-80gb; {r['scrapers']} scrapers over {r['client_processes']} client "
        "processes GET /metrics back to back on new connections while a script in the bench process changes the "
        "simulator's shared state under the running exporter, phase by phase (table below): GPU "
        f"{LOST_SLOT} lost and back; `{SLOW_CALL}` answering after {SLOW_MS / 1000:g} s on GPU {SLOW_SLOT}, then on "
        f"every GPU; every call answering UNKNOWN until the session re-initialises NVML, then `nvmlInit` failing "
        f"{INIT_FAILURES}× with DRIVER_NOT_LOADED; every call on GPU {HUNG_SLOT} hanging; every call on the node "
        "hanging; all cleared. Each phase is held about "
        f"{r['nominal_s'] / len(PHASES):.1f} s, longer where the script waits for the exporter to show the fault "
        "or the recovery (a 2 s call returns late; the node-wide hang shows once the sampling thread itself calls "
        "NVML, on every 10th pass). Every response is checked as it arrives: an error is a failed connection, a "
        "status other than 200 or a body cut short; it is *stale served as fresh* when it serves GPU values (any "
        "series with a `uuid` label other than `gpuobs_gpu_up`, `gpuobs_gpu_unhealthy` and "
        "`gpuobs_exporter_gpu_timeouts_total`) and its `gpuobs_exporter_last_success_timestamp_seconds` (the start "
        f"of the pass that read them) is more than {FRESH_INTERVALS} intervals + {r['allowance_s']:g} s = {b:g} s "
        f"before the moment the client has the last byte (the {r['allowance_s']:g} s allows for the time from the "
        "exporter's freshness check to that byte), or serves values with no such timestamp. Value age = that "
        "difference; latency = connect to last byte.")
    out += ["", "| requests | errors | stale served as fresh | max value age (bound) | fresh / stale-flag bodies "
            "| bodies with values | req/s | p50 ms | p99 ms | max ms |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
            f"| {r['requests']} | {r['errors']} | {r['stale_as_fresh']} | {r['max_value_age_s']:.3f} s ({b:g} s) | "
            f"{r['fresh_bodies']} / {r['stale_bodies']} | {r['bodies_with_values']} | {_f(r['throughput_rps'])} | "
            f"{_f(r['p50_ms'], 2)} | {_f(r['p99_ms'], 2)} | {_f(r['max_ms'], 2)} |", "",
            "| phase | s | requests | errors | stale as fresh | fresh / stale-flag | with values | max value age s "
            "| p50 ms | p99 ms | expected state: responses showing it (first after s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, p in r["phases"].items():
        seen = "; ".join(f"{e['what']}: {e['seen']}"
                         + (f" ({e['after_s']:.1f})" if e["after_s"] is not None else " (**never**)")
                         for e in p["expect"])
        age = "–" if p["max_value_age_s"] != p["max_value_age_s"] else f"{p['max_value_age_s']:.3f}"
        out.append(f"| {PHASE_TITLES.get(name, name)} | {p['seconds']:.1f} | {p['requests']} | {p['errors']} | "
                   f"{p['stale_as_fresh']} | {p['fresh_bodies']} / {p['stale_bodies']} | {p['bodies_with_values']} | "
                   f"{age} | {_f(p['p50_ms'], 2)} | {_f(p['p99_ms'], 2)} | {seen} |")
    out.append("")
    ok = r["errors"] == 0 and r["stale_as_fresh"] == 0 and r["exporter_alive"]
    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(r["error_kinds"].items())) or "none"
    out.append("Target 0 errors and 0 responses serving values older than the bound as fresh: "
               + ("**met**" if ok else f"**missed** ({r['errors']} errors: {kinds}; {r['stale_as_fresh']} stale "
                                       f"served as fresh; exporter {'running' if r['exporter_alive'] else 'exited'})")
               + f" ({r['requests']} requests). Every phase showed its expected state: "
               + ("yes." if r["phases_met"] else "**no** (see the table)."))
    out.append("")
    over = sum(p["over_two_intervals"] for p in r["phases"].values())
    down = r.get("values_with_nvml_down", 0)
    reinits = r["reinits"][1] - r["reinits"][0] if len(r.get("reinits", [])) == 2 else float("nan")
    notes = [f"Responses whose values were more than {FRESH_INTERVALS} intervals ({FRESH_INTERVALS * iv:g} s) old "
             f"but within the allowance: {over}."]
    if down:
        notes.append(f"{down} responses served GPU values with `gpuobs_nvml_up 0`: the pass during which the session "
                     "shut NVML down reported every GPU up with the values it had cached, stamped with the previous "
                     "pass's `last_success`.")
    notes.append(f"Re-initialisations counted for the one driver failure: {reinits:.0f}; GPU timeouts counted "
                 f"(`gpuobs_exporter_gpu_timeouts_total`): {r['gpu_timeouts']:.0f}; passes that overran the "
                 f"interval: {r['slow_pass_warnings']}; exporter CPU {_f(r['exporter_cpu_cores'], 2)} cores; "
                 f"RSS {_f(r['rss_before_mib'])} → {_f(r['rss_after_mib'])} MiB.")
    notes += [f"{PHASE_TITLES.get(k, k)}: {v}." for k, v in r.get("notes", {}).items()]
    out.append(" ".join(notes))
    return out


def load_report(result: dict) -> str:
    """The "## Load" section of BENCHMARKS.md from a load_bench() result (older results without the
    faults run render without its subsection)."""
    out = ["## Load", "", f"`python bench/load.py{' --quick' if result['quick'] else ''}`, "
           f"{result['elapsed_s']:.0f} s.", ""]
    if result.get("cmd"):
        out[2:3] = [f"Measured on its own by `{result['cmd']}` on {result['date']} in {result['elapsed']:.0f} s "
                    f"({result['cpu']}); every number in this section comes from that run.", ""]
    out += _scrape_section(result["scrape"]) + [""] + _churn_section(result["churn"]) + [""]
    if result.get("faults"):
        out += faults_section(result["faults"]) + [""]
    return "\n".join(out)


def splice_faults(report: str, section: list[str]) -> str:
    """`report` (BENCHMARKS.md) with its faults subsection replaced by `section`, or `section`
    added at the end of the "## Load" section."""
    lines = report.splitlines()
    head = "### Faults injected live under 50 scrapers"
    try:
        load = lines.index("## Load")
    except ValueError:
        raise SystemExit("no '## Load' section to put the faults subsection in") from None
    end = next((i for i in range(load + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    start = next((i for i in range(load, end) if lines[i] == head), None)
    if start is not None:  # replace it: up to the next subsection or section
        stop = next((i for i in range(start + 1, end) if lines[i].startswith("### ")), end)
        lines[start:stop] = section + [""]
    else:
        lines[end:end] = section + [""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="15 s of scraping and 2,000 passes")
    ap.add_argument("--json", metavar="PATH", help="also write the raw numbers here")
    ap.add_argument("--serve-exporter", type=int, metavar="PORT", help="internal: run the churn test's exporter")
    ap.add_argument("--interval", type=float, default=CHURN_INTERVAL, help="with --serve-exporter: seconds")
    ap.add_argument("--process-cap", type=int, default=PROCESS_CAP, help="with --serve-exporter")
    ap.add_argument("--faults", action="store_true", help="only the faults-under-load run")
    ap.add_argument("--duration", type=float, default=60.0, help="with --faults: nominal seconds of the fault script")
    ap.add_argument("--fault-interval", type=float, default=FAULT_INTERVAL, help="with --faults: sampling interval")
    ap.add_argument("--scrapers", type=int, default=SCRAPERS, help="with --faults")
    ap.add_argument("--write-report", metavar="MD", help="with --faults: put its subsection into this report's "
                    "'## Load' section (BENCHMARKS.md), replacing an earlier one")
    args = ap.parse_args()
    if args.serve_exporter is not None:
        serve_exporter(args.serve_exporter, args.interval, args.process_cap)
        return
    if args.faults:
        import json

        res = fault_load(args.duration, args.scrapers, args.fault_interval)
        res["standalone"] = True
        if args.json:
            write_result(args.json, json.dumps(res, indent=1))
        section = faults_section(res)
        if args.write_report:
            path = Path(args.write_report)
            write_result(path, splice_faults(path.read_text(), section))
        print("\n".join(section))
        print(_fault_line(res))
        sys.exit(0 if res["errors"] == 0 and res["stale_as_fresh"] == 0 and res["phases_met"] else 1)
    result = load_bench(args.quick)
    if args.json:
        import json

        write_result(args.json, json.dumps(result, indent=1))
    print(load_report(result))


if __name__ == "__main__":
    main()
