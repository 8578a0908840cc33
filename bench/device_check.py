"""The device check (issue 28): what only a GPU can prove, in one short script (a few minutes on one GPU).

    python bench/device_check.py [--output FILE]

Four parts, each reported as a Markdown section (stdout, or FILE written whole through
bench.common.write_result):

1. **Step time from CUDA events** against synchronized truth: the timer the instrumentation uses on a
   GPU (gpuobs.instrument.timing.CudaEventTimer, read back later without a sync) beside
   torch.cuda.synchronize() around each step, on matrix multiplications of known size.
2. **Collective timing on the device**: a one-GPU NCCL process group and a DDP model whose
   communication hook is gpuobs's DdpCommTimer, with a device-side delay (torch.cuda._sleep) put on
   the stream before each all-reduce. The host's view of NCCL completion sees about 0; the device's
   view (DeviceTail) must see the delay.
3. **The traced loop's overhead**: empty steps under `run.step()` against a bare loop (runs anywhere).
4. **The exporter against `nvidia-smi -q`**, field by field, on GPU 0.

On a machine without CUDA (or without torch) parts 1, 2 and 4 are skipped and say so; the script
still runs to completion and exits 0. It exits 1 when a part that ran failed its check.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result  # noqa: E402  (the repository on the path first)

STEP_TOLERANCE = 0.05  # CUDA-event step time within 5 % of the synchronized truth (median)
DELAY_S = 0.020  # the device-side delay before each all-reduce


class Skip(Exception):
    """A part that cannot run here, with the reason."""


def _torch_cuda():
    try:
        import torch
    except ImportError as e:
        raise Skip("torch is not installed") from e
    if not torch.cuda.is_available():
        raise Skip("no CUDA device (torch.cuda.is_available() is False)")
    return torch


def step_time() -> tuple[bool, list[str]]:
    """Part 1: per step, CUDA-event seconds against synchronize-and-wall-clock seconds."""
    from gpuobs.instrument.timing import CudaEventTimer

    torch = _torch_cuda()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    timer = CudaEventTimer(lambda: torch.cuda.Event(enable_timing=True))
    truth: dict[int, float] = {}
    for i in range(30):
        work = 4 + i % 5  # steps of different lengths
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        token = timer.start()
        for _ in range(work):
            a = (a @ a).clamp_(-1, 1)
        timer.stop(token, i)
        torch.cuda.synchronize()
        truth[i] = time.perf_counter() - t0
    measured = dict(timer.poll())
    errors = [abs(measured[i] - truth[i]) / truth[i] for i in truth if i >= 5 and i in measured]  # 5 warm-up
    ok = len(errors) >= 20 and statistics.median(errors) <= STEP_TOLERANCE
    return ok, [f"- steps compared: {len(errors)} (of {len(truth) - 5} after warm-up)",
                f"- relative error, median / max: {statistics.median(errors):.2%} / {max(errors):.2%} "
                f"(goal: median ≤ {STEP_TOLERANCE:.0%})"]


def _sleep_cycles(torch, seconds: float) -> int:
    """Cycles of torch.cuda._sleep that take about `seconds` on this GPU (measured with events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    per_cycle = start.elapsed_time(end) / 1000.0 / 1_000_000
    return int(seconds / per_cycle)


def collective() -> tuple[bool, list[str]]:
    """Part 2: a delay on the device before each all-reduce, seen by DeviceTail and not by the host."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from gpuobs.instrument.collectives import DdpCommTimer

    torch = _torch_cuda()
    allreduce = default_hooks.allreduce_hook
    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("nccl", init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        cycles = _sleep_cycles(torch, DELAY_S)
        timer = DdpCommTimer()

        def delayed(process_group, bucket):  # after the hook's start event, on the stream NCCL waits on
            torch.cuda._sleep(cycles)
            return allreduce(process_group, bucket)

        default_hooks.allreduce_hook = delayed  # what DdpCommTimer.hook calls (restored below)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[0])
        model.register_comm_hook(None, timer.hook)
        x = torch.randn(64, 1024, device="cuda")
        host, device = [], []
        for _ in range(12):
            model(x).sum().backward()
            tail = timer.take()
            torch.cuda.synchronize()  # the check reads the result now; the instrumentation reads it later
            if tail is not None and tail.device is not None:
                host.append(tail.seconds)
                device.append(tail.device.seconds() or 0.0)
    finally:
        default_hooks.allreduce_hook = allreduce
        dist.destroy_process_group()
        os.unlink(store.name)
    dev, hst = statistics.median(device[2:]), statistics.median(host[2:])
    ok = len(device) >= 10 and dev >= 0.8 * DELAY_S and hst < 0.5 * DELAY_S
    return ok, [f"- injected delay before each all-reduce: {DELAY_S * 1000:.0f} ms ({cycles:,} cycles)",
                f"- blocked tail, median: device {dev * 1000:.1f} ms, host {hst * 1000:.1f} ms "
                f"(goal: device ≥ {0.8 * DELAY_S * 1000:.0f} ms, host < {0.5 * DELAY_S * 1000:.0f} ms: "
                "the host's view of NCCL completion is blind)"]


def overhead() -> tuple[bool, list[str]]:
    """Part 3: seconds per empty step under run.step() (metrics, no span export) against a bare loop."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from gpuobs import instrument

    tel = instrument.configure(spans=False, metric_readers=[InMemoryMetricReader()])
    run = instrument.TrainingRun(telemetry=tel)
    steps = 5000

    def per_step(body) -> float:
        t = time.perf_counter()
        body()
        return (time.perf_counter() - t) / steps

    def traced():
        for _ in range(steps):
            with run.step(samples=32):
                pass

    def bare():
        for _ in range(steps):
            pass

    traced()  # warm-up
    cost = statistics.median(per_step(traced) for _ in range(5)) - statistics.median(per_step(bare) for _ in range(5))
    tel.shutdown(timeout_s=2.0)
    return True, [f"- overhead of `run.step()` per step: {cost * 1e6:.1f} µs (empty body; metrics on, spans off)"]


SMI_FIELDS = [  # (nvidia-smi -q line, regex of its value, exposed metric and labels, converter to base units)
    ("FB Memory Usage / Total", r"FB Memory Usage\n\s+Total\s+: (\d+) MiB", "gpuobs_gpu_memory_total_bytes", {},
     lambda v: float(v) * 2**20, 0.0),
    ("Current Power Limit", r"Current Power Limit\s+: ([\d.]+) W", "gpuobs_gpu_power_limit_watts", {}, float, 0.01),
    ("Max Clocks / SM", r"Max Clocks\n(?:.*\n)*?\s+SM\s+: (\d+) MHz", "gpuobs_gpu_max_clock_hertz", {"clock": "sm"},
     lambda v: float(v) * 1e6, 0.0),
    ("GPU Current Temp", r"GPU Current Temp\s+: (\d+) C", "gpuobs_gpu_temperature_celsius", {}, float, 0.1),
    ("PCIe Generation / Max", r"PCIe Generation\n\s+Max\s+: (\d+)", "gpuobs_gpu_pcie_link_generation_max", {},
     float, 0.0),
]


def _exporter_samples(port: int) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                             "--port", str(port), "--interval", "1", "--profile", "full"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(60):
            time.sleep(0.5)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
            if "gpuobs_gpu_temperature_celsius" in text:
                return {(s.name, frozenset(s.labels.items())): s.value
                        for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("gpu") == "0"}
        raise RuntimeError("the exporter served no GPU series within 30 s")
    finally:
        proc.terminate()
        proc.wait(10)


def exporter_vs_smi() -> tuple[bool, list[str]]:
    """Part 4: the exporter's value of each field against `nvidia-smi -q -i 0`, read side by side."""
    from gpuobs.ports import free_port

    if shutil.which("nvidia-smi") is None:
        raise Skip("nvidia-smi is not installed")
    text = subprocess.run(["nvidia-smi", "-q", "-i", "0"], capture_output=True, text=True, check=True).stdout
    samples = _exporter_samples(free_port())
    lines, ok = ["| field | nvidia-smi | exporter | verdict |", "|---|---:|---:|---|"], True
    for what, regex, name, labels, convert, tolerance in SMI_FIELDS:
        found = re.search(regex, text)
        got = next((v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls), None)
        if found is None:
            lines.append(f"| {what} | N/A | {got} | not in this GPU's -q |")
            continue
        want = convert(found[1])
        match = got is not None and abs(got - want) <= tolerance * max(abs(want), 1.0)
        ok &= match
        shown = "absent" if got is None else f"{got:g}"
        lines.append(f"| {what} | {want:g} | {shown} | {'match' if match else 'MISMATCH'} |")
    return ok, lines


PARTS = (("Step time from CUDA events", step_time), ("Collective timing on the device", collective),
         ("The traced loop's overhead", overhead), ("The exporter against nvidia-smi -q", exporter_vs_smi))


def main(argv: list[str] | None = None) -> int:
    """Run every part; print (or write to --output) the report; 1 if a part that ran failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", help="write the Markdown report to this file (whole, or not at all)")
    args = parser.parse_args(argv)
    report, failed = ["## Device check", ""], []
    for title, part in PARTS:
        report += [f"### {title}", ""]
        try:
            ok, lines = part()
        except Skip as why:
            report += [f"SKIPPED: {why}", ""]
            continue
        report += lines + ["", f"**{'passed' if ok else 'FAILED'}**", ""]
        if not ok:
            failed.append(title)
    text = "\n".join(report)
    if args.output:
        write_result(args.output, text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
