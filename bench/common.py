"""Helpers the benchmark sections share: ports, and process CPU and memory from /proc."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

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
