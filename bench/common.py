"""Helpers the benchmark sections share: ports, child processes, and process CPU and memory from /proc."""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """An unused TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int, children: bool = True) -> float:
    """utime + stime of a process (and of its waited-for children), in seconds, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the ")": state is field 3, so utime (14) is index 11, stime 12, cutime 13, cstime 14
    return sum(int(x) for x in fields[11:15 if children else 13]) / TICK


def rss_mib(pid: int) -> float:
    """VmRSS of a process in MiB, from /proc/<pid>/status; NaN once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def pct(values, q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN for no values."""
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def version(cmd: list[str], package: str) -> str:
    """The binary's own version line, else the Debian package's (Debian's VictoriaMetrics prints none)."""
    for c in (cmd, ["dpkg-query", "-W", "-f", "${Version}", package]):
        try:
            out = subprocess.run(c, capture_output=True, text=True, timeout=20)
            text = (out.stdout + out.stderr).strip().splitlines()
            if out.returncode == 0 and text:
                return text[0] if c is cmd else f"{package} {text[0]}"
        except (OSError, subprocess.TimeoutExpired):
            continue
    return f"{package} ?"


class Running:
    """A child process (an exporter) in its own process group, logging to a file; on exit the
    group gets SIGTERM, then SIGKILL after 10 s."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "w+")
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0, what: str = "ready") -> None:
        """Poll `ready()` (OSError counts as not yet) until true; RuntimeError with the log tail if the
        process exits first or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args[0]} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"not {what} within {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-2000:]

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()
