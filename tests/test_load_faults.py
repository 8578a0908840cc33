"""Issue 13 acceptance: the 50-scraper load test with faults injected live (lost GPU, 2 s calls,
NVML init failures, wedged calls): 0 errors, and 0 responses serving values older than the
documented bound (2 sampling intervals, plus bench.load.ALLOWANCE_S for the transfer) as fresh.

The checker itself is tested first, on crafted bodies and against a fake server that serves old
values as fresh, so that the load test would fail if the exporter did."""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import load  # noqa: E402
from bench.load import (  # noqa: E402
    ERR,
    FRESH_FLAG,
    INIT_ERROR,
    NO_TIMESTAMP,
    NVML_DOWN,
    STALE_AS_FRESH,
    STALE_FLAG,
    VALUES,
    check_body,
    scrape_checked,
    summarize_checked,
)

UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(3)]


def body(ts: float | None, *, values: bool = True, stale: bool = False, up=(1, 1, 1), reasons=(None, None, None),
         nvml_up: bool = True, init_error: str | None = None, timeouts: bool = True) -> bytes:
    """A /metrics body shaped like the exporter's (families in name order, HELP/TYPE lines)."""
    out = []
    if values:
        out += ["# HELP gpuobs_gpu_temperature_celsius GPU temperature.",
                "# TYPE gpuobs_gpu_temperature_celsius gauge"]
        out += [f'gpuobs_gpu_temperature_celsius{{gpu="{i}",uuid="{u}"}} 40.0' for i, u in enumerate(UUIDS) if up[i]]
    if any(reasons):
        out += ["# HELP gpuobs_gpu_unhealthy 1 with the reason.", "# TYPE gpuobs_gpu_unhealthy gauge"]
        out += [f'gpuobs_gpu_unhealthy{{gpu="{i}",reason="{r}",uuid="{UUIDS[i]}"}} 1.0'
                for i, r in enumerate(reasons) if r]
    if not stale:
        out += ["# HELP gpuobs_gpu_up 1 if the GPU answered.", "# TYPE gpuobs_gpu_up gauge"]
        out += [f'gpuobs_gpu_up{{gpu="{i}",uuid="{u}"}} {float(up[i])}' for i, u in enumerate(UUIDS)]
    if timeouts:
        out += ["# HELP gpuobs_exporter_gpu_timeouts_total Timeouts.",
                "# TYPE gpuobs_exporter_gpu_timeouts_total counter",
                f'gpuobs_exporter_gpu_timeouts_total{{gpu="1",uuid="{UUIDS[1]}"}} 3.0']
    if ts is not None:
        out += ["# HELP gpuobs_exporter_last_success_timestamp_seconds Start of the pass.",
                "# TYPE gpuobs_exporter_last_success_timestamp_seconds gauge",
                f"gpuobs_exporter_last_success_timestamp_seconds {ts!r}"]
    if not stale:
        out += ["# HELP gpuobs_nvml_up 1 if NVML is up.", "# TYPE gpuobs_nvml_up gauge", f"gpuobs_nvml_up {float(nvml_up)}"]
    if init_error:
        out += ["# HELP gpuobs_nvml_init_error The error.", "# TYPE gpuobs_nvml_init_error gauge",
                f'gpuobs_nvml_init_error{{reason="{init_error}"}} 1.0']
    out += ["# HELP gpuobs_exporter_snapshot_stale 1 if stale.", "# TYPE gpuobs_exporter_snapshot_stale gauge",
            f"gpuobs_exporter_snapshot_stale {float(stale)}"]
    return ("\n".join(out) + "\n").encode()


# ------------------------------------------------------------------------------------- the checker


def test_checker_passes_fresh_values_and_flags_old_ones():
    now = 1_800_000_000.0
    flags, age, up, timeout, lost = check_body(body(now - 0.9), now, 1.25)
    assert flags == VALUES | FRESH_FLAG and age == pytest.approx(0.9) and (up, timeout, lost) == (3, 0, 0)
    flags, age, *_ = check_body(body(now - 1.3), now, 1.25)  # just past the bound
    assert flags & STALE_AS_FRESH and flags & VALUES and age == pytest.approx(1.3)
    flags, *_ = check_body(body(now - 60, stale=False), now, 1.25)
    assert flags & STALE_AS_FRESH
    # values whose age nothing bounds count as stale served as fresh too
    flags, age, *_ = check_body(body(None), now, 1.25)
    assert flags & STALE_AS_FRESH and flags & NO_TIMESTAMP and age != age


def test_checker_accepts_old_timestamps_without_values():
    now = 1_800_000_000.0
    # the stale body: self-health only, an old last_success, the stale flag
    flags, age, up, *_ = check_body(body(now - 30, values=False, stale=True), now, 1.25)
    assert flags == STALE_FLAG and age == pytest.approx(30) and up == 0
    # NVML down: fresh flag, old last_success carried over, no GPU series at all
    flags, *_ = check_body(body(now - 30, values=False, up=(0, 0, 0), nvml_up=False, init_error="DRIVER_NOT_LOADED",
                                timeouts=False), now, 1.25)
    assert flags == FRESH_FLAG | NVML_DOWN | INIT_ERROR
    # gpu_up, gpu_unhealthy and the timeout counter carry uuid labels but are not values
    flags, _, up, timeout, lost = check_body(
        body(now - 30, values=False, up=(0, 0, 0), reasons=("timeout", "timeout", "lost")), now, 1.25)
    assert flags == FRESH_FLAG and (up, timeout, lost) == (0, 2, 1)


def test_checker_counts_gpu_states_and_truncation():
    now = 1_800_000_000.0
    flags, _, up, timeout, lost = check_body(body(now, up=(1, 0, 1), reasons=(None, "lost", None)), now, 1.25)
    assert flags == VALUES | FRESH_FLAG and (up, timeout, lost) == (2, 0, 1)
    flags, *_ = check_body(body(now)[:-40], now, 1.25)
    assert flags & ERR


def test_checker_against_a_server_that_serves_old_values_as_fresh():
    """Half the responses carry values from 3 s ago with the fresh flag: the scrapers must count
    every one of them (and nothing else) as stale served as fresh."""
    served = {"old": 0, "new": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            with lock:
                old = (served["old"] + served["new"]) % 2 == 1
                served["old" if old else "new"] += 1
            data = body(time.time() - (3.0 if old else 0.1))
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t0 = time.time()
        rec, errors, _ = scrape_checked(server.server_address[1], lambda: time.sleep(1.0), scrapers=4, procs=0,
                                        bound=1.25)
        t1 = time.time()
    finally:
        server.shutdown()
        server.server_close()
    res = summarize_checked(rec, errors, [("fake", t0, t1)], 1.25, {"fake": ("old values half the time", [])})
    assert res["errors"] == 0 and res["requests"] == served["old"] + served["new"] > 10
    assert res["stale_as_fresh"] == served["old"] > 0
    assert res["max_value_age_s"] >= 3.0 and res["phases"]["fake"]["stale_as_fresh"] == served["old"]


# ---------------------------------------------------------------------------------- the load test


def test_fault_load_50_scrapers_no_errors_no_stale_values_served_as_fresh():
    """50 scrapers, 0.5 s interval, a fault script of about 15 s nominal (some phases wait longer for
    the exporter to show the fault: ~30 s in all)."""
    r = load.fault_load(15.0, scrapers=50, interval=0.5)
    summary = "\n".join(f"{k}: {v['requests']} req, {v['errors']} err, {v['stale_as_fresh']} stale-as-fresh, "
                        f"fresh/stale {v['fresh_bodies']}/{v['stale_bodies']}, expect {v['expect']}"
                        for k, v in r["phases"].items())
    assert r["exporter_alive"], summary
    assert r["errors"] == 0, f"{r['error_kinds']}\n{summary}"
    assert r["stale_as_fresh"] == 0, (f"{r['stale_as_fresh']} responses served values older than "
                                      f"{r['bound_s']} s (max {r['max_value_age_s']:.3f} s)\n{summary}")
    assert r["max_value_age_s"] <= r["bound_s"]
    assert list(r["phases"]) == list(load.PHASES), r["notes"]
    for name, p in r["phases"].items():
        assert p["requests"] > 0, f"{name}: no responses"
        for e in p["expect"]:
            assert e["seen"] > 0, f"{name}: never saw '{e['what']}' (notes: {r['notes']})\n{summary}"
    # the states that matter most, spelled out
    assert r["phases"]["wedged_node"]["stale_bodies"] > 0
    assert r["phases"]["wedged_call_one_gpu"]["bodies_with_values"] > 0
    assert r["phases"]["lost_gpu"]["bodies_with_values"] > 0
    assert r["reinits"][1] > r["reinits"][0], "the driver errors never made the session re-initialise NVML"
