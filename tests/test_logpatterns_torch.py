"""A real torch.distributed collective timeout, counted by pattern: two gloo processes, rank 1 calls
all_reduce while rank 0 sleeps past the process group's 3 s timeout. Rank 1's RuntimeError is never
caught; the hook that gpuobs.logs.configure chains in front of sys.excepthook logs it, the catalog
matches its text as collective_timeout, and rank 1's training metrics endpoint serves
gpuobs_log_pattern_matches_total{pattern="collective_timeout",rank="1"} 1 while rank 0's stays 0.
The original hook (PyTorch's "[rank1]:"-prefixing one) still prints the traceback, whose last line
the Fluent Bit pipeline of deploy/fluent-bit/ (tests/test_fluentbit.py) counts as collective_timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_fluentbit import pipeline_pattern

from gpuobs import logpatterns as lp
from gpuobs.ports import free_ports

pytest.importorskip("torch.distributed")
REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent('''
    import atexit, logging, os, sys, time, urllib.request
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from gpuobs import instrument, logs

    metrics_port, records = int(sys.argv[1]), sys.argv[2]
    instrument.configure(prometheus_port=metrics_port, prometheus_addr="127.0.0.1")
    logs.configure("info", stream=open(records, "w"))


    @atexit.register  # after the uncaught exception's hooks, before telemetry's own exit handler
    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            sys.stdout.write(r.read().decode())
        sys.stdout.flush()


    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    if dist.get_rank() == 1:
        dist.all_reduce(torch.ones(4))  # rank 0 never joins: gloo times out after 3 s and raises
    else:
        time.sleep(8)  # hosts the store: stays up until rank 1 has timed out
''')


def _env(rank: int, master_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SLURM", "TORCHELASTIC", "GPUOBS_"))
           and k not in ("LOCAL_RANK", "JOB_ID", "FLUENTD_HOST", "KUBERNETES_SERVICE_HOST", "POD_NAME")}
    env.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port),
               GPUOBS_JOB_ID="job-gloo", PYTHONPATH=str(REPO))
    return env


def _pattern_counts(metrics_text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.labels["rank"], s.labels["pattern"]): s.value
            for fam in text_string_to_metric_families(metrics_text) for s in fam.samples
            if s.name == "gpuobs_log_pattern_matches_total" and s.labels.get("job_id") == "job-gloo"}


def test_a_real_gloo_timeout_is_counted_as_collective_timeout_for_its_rank(tmp_path):
    master, *metrics_ports = free_ports(3)  # distinct: rank 0's metrics server must not take the store's port
    procs = {rank: subprocess.Popen(
        [sys.executable, "-c", WORKER, str(metrics_ports[rank]), str(tmp_path / f"rank{rank}.jsonl")], cwd=REPO,
        env=_env(rank, master), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)}
    out = {rank: p.communicate(timeout=120) for rank, p in procs.items()}
    assert procs[1].returncode == 1, out[1][1][-3000:]  # the uncaught RuntimeError ends rank 1
    assert procs[0].returncode == 0, out[0][1][-3000:]

    # the original hook still ran: PyTorch's prefixed traceback, gloo's text in it
    last = [line for line in out[1][1].splitlines() if line.startswith("[rank1]: RuntimeError")]
    assert last and "Timed out waiting 3000ms for" in last[-1], out[1][1][-3000:]
    found = lp.match(last[-1])
    assert found is not None and (found.name, found.fields) == ("collective_timeout", {"ms": "3000", "rank": "1"})
    # the Fluent Bit pipeline, tailing this container's stderr, counts that line and no other
    matched = [(line, pipeline_pattern(line)) for line in out[1][1].splitlines() if pipeline_pattern(line)]
    assert matched == [(last[-1], "collective_timeout")], matched

    records = [json.loads(line) for line in (tmp_path / "rank1.jsonl").read_text().splitlines()]
    uncaught = [r for r in records if r["logger"] == "gpuobs.uncaught"]
    assert len(uncaught) == 1 and uncaught[0]["log_pattern"] == "collective_timeout", records
    assert uncaught[0]["rank"] == 1 and uncaught[0]["job_id"] == "job-gloo"

    counts = {**_pattern_counts(out[0][0]), **_pattern_counts(out[1][0])}
    assert counts[("1", "collective_timeout")] == 1.0
    assert counts[("0", "collective_timeout")] == 0.0
    assert sum(counts.values()) == 1.0, counts


# Rank 1's collective meets a peer that goes: rank 0 exits mid-job ("crash": gloo's "Connection closed by
# peer" or "Read error ...: Connection reset by peer"), or rank 1 catches its own timeout and calls again
# ("closure": gloo closed its pairs on the timeout, the next call raises "Application timeout caused pair
# closure"). Rank 0 hosts the store, so in "closure" it stays until rank 1 is done (its file exists).
ENDINGS = textwrap.dedent('''
    import os, sys, time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from gpuobs import logs

    mode, done = sys.argv[1], sys.argv[2]
    logs.configure("info", stream=open(os.devnull, "w"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=2))
    if dist.get_rank() == 0:
        if mode == "crash":
            time.sleep(0.5)
            os._exit(3)  # no Python teardown, like a kill
        deadline = time.monotonic() + 60
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.1)
        sys.exit(0)
    try:
        if mode == "closure":
            try:
                dist.all_reduce(torch.ones(4))  # rank 0 never joins: times out after 2 s
            except RuntimeError as e:
                print("first:", e, file=sys.stderr)
        dist.all_reduce(torch.ones(4))
    finally:
        open(done, "w").close()
''')


@pytest.mark.parametrize("mode, pattern, text", [
    ("crash", "collective_peer_crash", ("Connection closed by peer [127.0.0.1]:", "Connection reset by peer")),
    ("closure", "collective_timeout", ("Application timeout caused pair closure",))])
def test_a_crashed_peer_and_the_pair_closure_after_a_timeout_are_matched(tmp_path, mode, pattern, text):
    (master,) = free_ports(1)
    done = str(tmp_path / "done")
    procs = {rank: subprocess.Popen([sys.executable, "-c", ENDINGS, mode, done], cwd=REPO, env=_env(rank, master),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)}
    out = {rank: p.communicate(timeout=90) for rank, p in procs.items()}
    assert procs[1].returncode == 1, out[1][1][-3000:]  # rank 1 ends on gloo's uncaught RuntimeError
    last = [line for line in out[1][1].splitlines() if line.startswith("[rank1]: RuntimeError")]
    assert last and any(t in last[-1] for t in text), out[1][1][-3000:]
    found = lp.match(last[-1])
    assert found is not None and found.name == pattern and found.fields.get("rank") == "1", (last[-1], found)
    assert pipeline_pattern(last[-1]) == pattern  # and Fluent Bit's converted regexes agree
    if mode == "crash":
        assert found.fields["peer"] == "127.0.0.1"
    else:  # the first error was the timeout itself, counted as such too
        first = next(line for line in out[1][1].splitlines() if line.startswith("first:"))
        assert lp.match(first).name == "collective_timeout", first
