"""bench/device_check.py runs to completion on a machine without a GPU, skipping the GPU parts and
saying so; the collective timer's device view (DeviceTail) is read without waiting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuobs.instrument.collectives import DdpCommTimer, DeviceTail, Tail

REPO = Path(__file__).resolve().parent.parent


def test_the_device_check_runs_to_completion_without_a_gpu(tmp_path):
    out = tmp_path / "device.md"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "device_check.py"), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = out.read_text()
    assert report.strip() == done.stdout.strip()
    sections = report.split("### ")[1:]
    assert len(sections) == 4
    import torch

    gpu = torch.cuda.is_available()
    for section in sections:
        title = section.splitlines()[0]
        if title.startswith("The traced loop"):  # runs anywhere
            assert "**passed**" in section and "µs" in section
        elif not gpu:
            assert "SKIPPED: " in section, title


class _Event:
    """A stand-in CUDA event: completed or not, at a time in ms."""

    def __init__(self, at_ms: float, done: bool = True):
        self.at_ms, self.done = at_ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other: "_Event") -> float:
        return other.at_ms - self.at_ms


def test_the_device_tail_is_read_only_once_its_end_completed():
    pending = DeviceTail(_Event(100.0), _Event(125.0, done=False))
    assert pending.seconds() is None  # never waits on the GPU
    pending.end.done = True
    assert pending.seconds() == 0.025


def test_take_hands_over_the_device_view_once():
    timer = DdpCommTimer()
    timer.launched, timer.done, timer.device = 10.0, 10.0001, DeviceTail(_Event(0.0), _Event(30.0))
    tail = timer.take()
    assert isinstance(tail, Tail) and tail.seconds < 0.001 and tail.device.seconds() == 0.03
    assert tail[0] == 10.0 and timer.take() is None  # (launched, seconds, ...) as before; taken once
