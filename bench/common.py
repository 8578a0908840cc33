"""Helpers the benchmark sections share: ports, child processes, and process CPU and memory from /proc."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

from gpuobs.ports import free_port  # noqa: F401  (the bench sections import it from here)

ROOT = Path(__file__).resolve().parent.parent

TICK = os.sysconf("SC_CLK_TCK")


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


TRACKED_RESULTS = (ROOT / "bench" / "last_run.json", ROOT / "BENCHMARKS.md")  # committed: complete runs only


def write_result(path: Path | str, content: str | Callable[[IO[str]], None]) -> Path:
    """Write a results file (JSON numbers, a report, a section spliced into one) whole or not at
    all: content (the text, or a function writing it to a file object) goes to a temp file in the
    same directory, is flushed to disk, and only then replaces path (os.replace: atomic on POSIX).
    Every bench write goes through here, so a run that crashes half-way, or a writer that raises,
    leaves the old file as it was (the exception propagates; the temp file is removed). Returns path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():  # keep the file's mode (mkstemp makes 0600)
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def is_tracked_result(path: Path | str) -> bool:
    """Whether path is one of the committed results files (TRACKED_RESULTS), which only a complete
    run (every section, not --quick) or an explicit request may rewrite."""
    return Path(path).resolve() in {p.resolve() for p in TRACKED_RESULTS}


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
    """A child process (an exporter, a server) in its own process group, logging to a file; stop()
    (or leaving the `with` block) sends the group SIGTERM, then SIGKILL after `term_wait` seconds."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None, log_path: Path, term_wait: float = 10.0):
        """env None: this process's environment. Raises OSError when cmd cannot be started."""
        self.log_path = log_path
        self.term_wait = term_wait
        self._log = open(log_path, "w+")
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0, what: str = "ready") -> None:
        """Poll `ready()` (OSError counts as not yet) until true; RuntimeError with the log tail if the
        process exits first or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"not {what} within {timeout:.0f} s: {self.log_tail()}")

    def check(self) -> None:
        """RuntimeError with the log tail if the process has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.proc.args[0]} exited with {self.proc.returncode}: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        """The last `chars` characters of the process's output."""
        self._log.flush()
        return self.log_path.read_text()[-chars:]

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after term_wait seconds; closes the log. Idempotent."""
        for sig, wait in ((signal.SIGTERM, self.term_wait), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
