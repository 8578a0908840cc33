"""A training process's end reaches Prometheus: a real process serving its metrics raises an uncaught
exception (a gloo collective timeout, a CUDA OOM) or ends normally, and a scrape during its exit grace
reads the pattern's count and the crash, or the end mark; the grace ends at that scrape, never waits
for a process nobody scraped, and grace 0 exits at once (tests/workloads/ending_job.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "workloads" / "ending_job.py"
END = "gpuobs_training_run_end_timestamp_seconds"
CRASH = "gpuobs_training_run_crash_timestamp_seconds"
MATCHES = "gpuobs_log_pattern_matches_total"


class Job:
    """ending_job.py in a process of its own, serving on a free port with the grace given."""

    def __init__(self, how: str, grace_s: float):
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO), "GPUOBS_PROMETHEUS_PORT": str(self.port),
               "GPUOBS_EXIT_GRACE_S": str(grace_s), "GPUOBS_JOB_ID": "j1", "RANK": "3"}
        self.proc = subprocess.Popen([sys.executable, str(JOB), how], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready", self.output()

    def scrape(self) -> dict[tuple[str, str], float]:
        """{(sample name, pattern label or ''): value} of rank 3 of job j1, from one scrape."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {(s.name, s.labels.get("pattern", "")): s.value for fam in text_string_to_metric_families(text)
                for s in fam.samples if s.labels.get("rank") == "3" and s.labels.get("job_id") == "j1"}

    def go(self) -> float:
        """Let the job end; returns the monotonic time it was told to."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return time.monotonic()

    def scrape_until(self, predicate, timeout: float = 5.0) -> dict[tuple[str, str], float]:
        """Scrape until predicate(scrape) holds (the job marked its end); fail after timeout."""
        deadline, last = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            last = self.scrape()
            if predicate(last):
                return last
            time.sleep(0.05)
        pytest.fail(f"no scrape with the mark: {last}\n{self.output()}")

    def exited_within(self, seconds: float) -> float:
        """Wait for the exit; returns the exit code, failing after seconds."""
        try:
            return self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"still running {seconds} s later\n{self.output()}")

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return (self.proc.stdout.read() if self.proc.stdout else "") + (self.proc.stderr.read()
                                                                         if self.proc.stderr else "")


@pytest.mark.parametrize("how, pattern", [("crash", "collective_timeout"), ("oom", "cuda_oom")])
def test_a_crash_is_served_with_its_count_during_the_grace(how, pattern):
    job = Job(how, grace_s=15)
    before = job.scrape()  # scraped once while running: the grace is worth waiting for
    assert before[(CRASH, "")] == 0 and before[(END, "")] == 0 and before[(MATCHES, pattern)] == 0
    told, wall = job.go(), time.time()
    last = job.scrape_until(lambda s: s[(CRASH, "")] > 0)
    assert last[(MATCHES, pattern)] == 1, last  # the excepthook's count, served after the exception
    assert wall - 1 <= last[(CRASH, "")] <= time.time() and last[(END, "")] == 0, last  # a crash, not an end
    rc = job.exited_within(5)
    assert rc == 1  # the exception still ends the process as it would have
    assert time.monotonic() - told < 5, "the grace ends once a scrape carried the crash, not after 15 s"


def test_a_normal_end_is_marked_and_served():
    job = Job("end", grace_s=15)
    job.scrape()
    told = job.go()
    last = job.scrape_until(lambda s: s[(END, "")] > 0)
    assert last[(CRASH, "")] == 0 and last[(MATCHES, "collective_timeout")] == 0, last
    assert job.exited_within(5) == 0 and time.monotonic() - told < 5


@pytest.mark.parametrize("grace_s, scraped", [(0, True), (15, False)])
def test_no_wait_with_grace_0_or_when_never_scraped(grace_s, scraped):
    """Grace 0 disables the wait; a process nobody scraped has nobody to tell: both exit at once."""
    job = Job("end", grace_s=grace_s)
    if scraped:
        job.scrape()
    told = job.go()
    assert job.exited_within(5) == 0
    took = time.monotonic() - told
    # the rest of an exit: the scrape server's shutdown (its 0.5 s poll) and the providers' on a shared machine
    assert took < 2.0, f"a normal exit took {took:.2f} s"


def test_the_grace_is_bounded_when_no_scrape_comes():
    """Scraped while running, then never again (Prometheus down): the process exits when the grace is up."""
    job = Job("crash", grace_s=2)
    job.scrape()
    told = job.go()
    assert job.exited_within(6) == 1
    took = time.monotonic() - told
    assert 1.9 <= took < 4.5, f"exited {took:.2f} s after the crash with a 2 s grace"
