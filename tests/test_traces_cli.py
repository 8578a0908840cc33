"""`gpuobs traces`, the one-command local trace receiver: it prints the spans a configured
training run sends over OTLP/HTTP, and says where it listens."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading

from conftest import REPO

from gpuobs import instrument
from gpuobs.instrument import telemetry
from gpuobs.instrument.timing import WallTimer


def test_gpuobs_traces_prints_the_spans_of_a_training_run(monkeypatch):
    monkeypatch.setattr(telemetry, "_current", None)
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "traces", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    try:
        first = proc.stderr.readline()
        url = re.search(r"OTEL_EXPORTER_OTLP_ENDPOINT=(http://127\.0\.0\.1:\d+)", first)
        assert url, first
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
        tel = instrument.configure(service_name="traces-cli", endpoint=url[1], protocol="http/protobuf",
                                   set_global=False)
        run = instrument.TrainingRun(tel, timer=WallTimer())
        with run.step(samples=4):
            with run.phase("forward"):
                pass
        run.close()
        tel.shutdown(timeout_s=5)  # flushes the spans to the receiver
        seen = []
        while not any("train.step" in line for line in seen) or not any("train.forward" in line for line in seen):
            seen.append(lines.get(timeout=10))
    finally:
        proc.terminate()
        proc.wait(10)
    step = next(line for line in seen if "train.step" in line)
    assert step.startswith("traces-cli") and re.search(r" [0-9a-f]{32} ", step) and "gpuobs.step=1" in step
    forward = next(line for line in seen if "train.forward" in line)
    assert "  train.forward" in forward, "a child span is indented under its parent"
    assert forward.split()[1] == step.split()[1], "the phase is in the step's trace"
