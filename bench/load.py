"""Load benchmarks for issue 8 (deliverable 3): concurrent scrapers, and RSS under process churn.

    .venv/bin/python bench/load.py            # 50 scrapers for 60 s; 10,000 sampling passes
    .venv/bin/python bench/load.py --quick    # 50 scrapers for 15 s; 2,000 sampling passes

`load_bench(quick)` returns the numbers (JSON-serialisable); `load_report(result)` renders the
"## Load" section of BENCHMARKS.md from them, so every number there comes from one run.
"""

from __future__ import annotations

import argparse
import http.client
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Running, cpu_seconds, free_port, pct, rss_mib  # noqa: E402

SCRAPERS = 50  # concurrent scrapers (deliverable 3)
CLIENT_PROCS = 10  # scrapers are spread over processes so one client GIL does not cap the load
SCRAPE_GPUS = 8  # simulated 8x H100 node for the scraper test
CHURN_GPUS = 2  # small node for the RSS test: the sampling pass, not the GPU count, is under test
CHURN_INTERVAL = 0.02  # s between sampling passes; the CLI's floor is 0.1 s, so the bench starts Exporter itself
PROCESS_CAP = 8  # below the simulator's 32 process slots per GPU, so the cap is exercised
FINAL_LINE = b"gpuobs_exporter_snapshot_stale 0.0\n"  # last line of a fresh /metrics body (render.Renderer)
FLAT_MIB, FLAT_PCT = 2.0, 5.0  # RSS is "flat" when growth from 10 % to 100 % is under either bound


# ---------------------------------------------------------------------------------------------- helpers


def get(port: int, path: str = "/metrics", timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of one GET on a fresh connection, as each Prometheus scrape opens one."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
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
    deadline = start_at + seconds
    lats = [array("d") for _ in range(threads)]
    errs: list[dict[str, int]] = [{} for _ in range(threads)]
    workers = [threading.Thread(target=_scraper, args=(port, deadline, gpus, lats[i], errs[i]))
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    merged: dict[str, int] = {}
    for e in errs:
        for k, n in e.items():
            merged[k] = merged.get(k, 0) + n
    out.put((b"".join(a.tobytes() for a in lats), merged))


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
    from gpuobs import catalog
    from gpuobs.exporter import Exporter, ExporterConfig

    config = ExporterConfig(listen_address="127.0.0.1", port=port, interval=interval,
                            families=set(catalog.FAMILIES), process_cap=process_cap)
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


def churn_bench(target: int, interval: float = CHURN_INTERVAL, process_cap: int = PROCESS_CAP) -> dict:
    """Exporter with every family on a 2-GPU node whose processes churn; VmRSS and series sampled
    against the exporter's own pass counter until `target` passes are done."""
    from gpuobs.sim import Simulator

    spec = {"gpus": [{"profile": "h100-sxm-80gb", "count": CHURN_GPUS, "behaviour": "steady"}]}
    with tempfile.TemporaryDirectory(prefix="gpuobs-churn-") as tmp:
        sim = Simulator(spec, directory=tmp)
        port = free_port()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-exporter", str(port),
               "--interval", str(interval), "--process-cap", str(process_cap)]
        churn = Churn(sim.state, CHURN_GPUS, interval)
        try:
            with Running(cmd, sim.env(), Path(tmp) / "exporter.log") as exp:
                exp.wait_until(lambda: serving_fresh(port), what="a fresh /metrics body")
                churn.start()
                res = _watch(port, exp.proc.pid, target, interval, process_cap)
                churn.stop.set()
                churn.join()
                res["exporter_alive"] = exp.proc.poll() is None
                res["slow_pass_warnings"] = exp.log_path.read_text().count("longer than the interval")
        finally:
            churn.stop.set()
            sim.close()
    res.update(churn_rewrites=churn.rewrites, pids_used=churn.next_pid - 100_000, gpus=CHURN_GPUS,
               interval_s=interval, process_cap=process_cap, target=target)
    return res


def _watch(port: int, pid: int, target: int, interval: float, cap: int) -> dict:
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
            "process_series_bound": 2 * cap * CHURN_GPUS,
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


# --------------------------------------------------------------------------------------------- entry


def load_bench(quick: bool) -> dict:
    """Both load tests; quick: 15 s of scraping and 2,000 passes instead of 60 s and 10,000."""
    started = time.monotonic()
    print("[load] 50 concurrent scrapers ...", flush=True)
    scrape = scrape_bench(15.0 if quick else 60.0)
    print(f"    {scrape}", flush=True)
    print("[load] RSS under process churn ...", flush=True)
    churn = churn_bench(2_000 if quick else 10_000)
    print(f"    {churn}", flush=True)
    return {"quick": quick, "scrape": scrape, "churn": churn, "elapsed_s": time.monotonic() - started}


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
           f"{c['interval_s']} s interval (started by `bench/load.py --serve-exporter`, because the CLI's floor is "
           f"0.1 s and 10,000 passes would take 17 minutes). A thread in the bench process rewrites each GPU's process "
           "table in the simulator's shared state every interval: 0 to 32 processes, every one with a new PID, name "
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
               "series are counted after the 10 % point; their spread is error series appearing.")
    out.append("")
    out.append(f"Target RSS flat: {verdict}. Process series stay within 2 metrics × cap × GPUs = "
               f"{c['process_series_bound']}: {'yes' if bounded else 'no'}. Polls that failed: "
               f"{', '.join(f'{k}: {n}' for k, n in c['poll_errors'].items()) or 'none'}; "
               f"passes that overran the interval: {c['slow_pass_warnings']}.")
    return out


def load_report(result: dict) -> str:
    """The "## Load" section of BENCHMARKS.md from a load_bench() result."""
    out = ["## Load", "", f"`python bench/load.py{' --quick' if result['quick'] else ''}`, "
           f"{result['elapsed_s']:.0f} s.", ""]
    out += _scrape_section(result["scrape"]) + [""] + _churn_section(result["churn"]) + [""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="15 s of scraping and 2,000 passes")
    ap.add_argument("--json", metavar="PATH", help="also write the raw numbers here")
    ap.add_argument("--serve-exporter", type=int, metavar="PORT", help="internal: run the churn test's exporter")
    ap.add_argument("--interval", type=float, default=CHURN_INTERVAL, help="with --serve-exporter: seconds")
    ap.add_argument("--process-cap", type=int, default=PROCESS_CAP, help="with --serve-exporter")
    args = ap.parse_args()
    if args.serve_exporter is not None:
        serve_exporter(args.serve_exporter, args.interval, args.process_cap)
        return
    result = load_bench(args.quick)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(result, indent=1))
    print(load_report(result))


if __name__ == "__main__":
    main()
