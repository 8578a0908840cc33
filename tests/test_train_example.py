"""examples/train.py on two ranks beside the exporter, all scraped by a real Prometheus: step time,
data-wait share (from the badput counter), tokens/s and loss show per rank, and the slower rank stands out."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import REPO, free_port_run, stop

from gpuobs.sim import scenario


def test_training_metrics_by_rank_in_prometheus(exporter, prometheus, tmp_path):
    run = exporter(scenario.load(REPO / "examples" / "scenarios" / "8xh100.yaml"), interval=1.0)
    base = free_port_run(2)
    ports = [base, base + 1]  # like torchrun: one variable for the node, each rank serves on base + local rank
    procs = []
    try:
        for rank, compute_ms in enumerate((20, 45)):  # rank 1 is the straggler
            env = {"PATH": "/usr/bin:/bin", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "GPUOBS_JOB_ID": "example-job", "GPUOBS_PROMETHEUS_PORT": str(base)}
            procs.append(subprocess.Popen(
                [sys.executable, str(REPO / "examples" / "train.py"), "--steps", "100000",
                 "--compute-ms", str(compute_ms), "--data-ms", "10", "--checkpoint-every", "50",
                 "--eval-every", "20"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        query = prometheus([f"127.0.0.1:{run.exp.http.port}"] + [f"127.0.0.1:{p}" for p in ports])

        def by_rank(promql: str) -> dict[str, float]:
            return {r["metric"]["rank"]: float(r["value"][1]) for r in query(promql)}

        p50 = ("histogram_quantile(0.5, sum by (rank, le) "
               "(rate(gpuobs_training_step_duration_seconds_bucket{job='gpuobs'}[10s])))")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for proc in procs:
                if proc.poll() is not None:
                    pytest.fail(f"train.py exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
            if len(by_rank(p50)) == 2 and len(by_rank("rate(gpuobs_training_tokens_total[10s])")) == 2 \
                    and len(by_rank("sum by (rank) (gen_ai_server_request_duration_seconds_count)")) == 2:
                break  # every rank has stepped and run an evaluation (every 20 steps) that was scraped
            time.sleep(1)
        steps = by_rank(p50)
        assert set(steps) == {"0", "1"}
        assert 0.025 <= steps["0"] < steps["1"] <= 0.25, steps  # 10 ms data + 20 ms vs 45 ms compute
        # the data-wait share of the time the run accounted for (a ratio of rates: a series younger than
        # the window reads low in rate() alone)
        share = by_rank('sum by (rank) (rate(gpuobs_training_badput_seconds_total{cause="data_wait"}[10s])) / '
                        '(sum by (rank) (rate(gpuobs_training_goodput_seconds_total[10s])) + '
                        'sum by (rank) (rate(gpuobs_training_badput_seconds_total[10s])))')
        assert set(share) == {"0", "1"} and all(0.05 < v < 0.6 for v in share.values()), share
        tokens = by_rank("rate(gpuobs_training_tokens_total[10s])")
        assert tokens["0"] > tokens["1"] > 1000, tokens  # 32 samples x 512 tokens per step
        loss = by_rank("gpuobs_training_loss")
        assert set(loss) == {"0", "1"} and all(v >= 0 for v in loss.values())
        assert {r["metric"]["job_id"] for r in query("gpuobs_training_steps_total")} == {"example-job"}
        assert len(query("gpuobs_gpu_up == 1")) == 8  # the exporter beside them, in the same Prometheus
        requests = by_rank("sum by (rank) (gen_ai_server_request_duration_seconds_count)")
        assert set(requests) == {"0", "1"}  # the evaluation requests, with GenAI names
        assert by_rank("sum by (rank) (gpuobs_training_micro_steps_total)")["0"] >= 2 * by_rank(
            "sum by (rank) (gpuobs_training_steps_total)")["0"] - 2  # 2 micro-steps per step
    finally:
        for proc in procs:
            stop(proc)
