"""What the live training-alert tests share (tests/test_training_alerts_live.py,
tests/test_training_acceptance_live.py): real multi-rank PyTorch jobs (tests/workloads/ddp_job.py
by default, one process per rank, DDP over gloo) serving their metrics on free ports, a file_sd
target file naming them, and a real Prometheus that scrapes them every second and evaluates the
fast rule profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from conftest import REPO, free_port, prometheus_query, require_tool, stop

from gpuobs.alerts.build import write_fast_rules
from gpuobs.ports import free_ports

WORKLOAD = REPO / "tests" / "workloads" / "ddp_job.py"
SECONDS = 100  # a job process lives this long unless its Job says otherwise


@dataclass
class Job:
    """One training job: job_id, its number of ranks, the workload's arguments (its faults), how long
    its processes live (seconds, passed as --seconds), extra environment (e.g. GPUOBS_EXIT_GRACE_S;
    `{rank}` in a value is replaced by the rank, e.g. POD_NAME "train-{rank}") and the workload
    script. start() fills ports (one metrics port per rank) and procs."""
    job_id: str
    ranks: int
    args: list[str] = field(default_factory=list)
    seconds: float = SECONDS
    env: dict[str, str] = field(default_factory=dict)
    workload: Path = WORKLOAD
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, logs: IO[str]) -> None:
        """Start one process per rank, their output appended to logs. GPUOBS_* and OTEL_* of the
        test's environment are dropped: each rank serves Prometheus on its own port only."""
        master, *ports = free_ports(1 + self.ranks)  # distinct: no rank's metrics server on the store's port
        for rank, port in enumerate(ports):
            self.ports.append(port)
            env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPUOBS_"))},
                   "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(self.ranks), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(master), "GPUOBS_JOB_ID": self.job_id, "GPUOBS_PROMETHEUS_PORT": str(port),
                   "GPUOBS_PROMETHEUS_ADDR": "127.0.0.1", "GPUOBS_QUANTILE_WINDOW_S": "10",
                   "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
                   **{k: v.replace("{rank}", str(rank)) for k, v in self.env.items()}}
            self.procs.append(subprocess.Popen(
                [sys.executable, str(self.workload), "--seconds", str(self.seconds), *self.args],
                env=env, stdout=logs, stderr=subprocess.STDOUT))

    def targets(self, skip_rank: int | None = None) -> list[str]:
        """host:port of each rank's metrics endpoint, but skip_rank's."""
        return [f"127.0.0.1:{p}" for r, p in enumerate(self.ports) if r != skip_rank]


def write_targets(path: Path, jobs: list[Job], removed: dict[str, int], node: str = "test-node") -> None:
    """The file_sd file: every job's targets, less the rank removed[job_id] (a deleted pod's), with
    target label node."""
    groups = [{"targets": job.targets(removed.get(job.job_id)), "labels": {"node": node}} for job in jobs]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)  # atomic: Prometheus never reads half a file


def start_prometheus(tmp_path: Path, sd: Path, exporters: dict[str, str] | None = None,
                     ) -> tuple[subprocess.Popen, Callable[[str], list[dict]]]:
    """A real Prometheus scraping the targets in sd (job training) and the exporters (job gpuobs,
    {host:port: its node label}) every second and evaluating the fast rule profile, built here (it is
    not committed). Returns (its process, query(promql) -> result vector, with query.url its base URL;
    OSError while it is not up yet)."""
    rules = write_fast_rules(tmp_path)
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{rules}']\n"
        "scrape_configs:\n"
        f"  - job_name: training\n    file_sd_configs: [{{files: ['{sd}'], refresh_interval: 1s}}]\n"
        + (f"  - job_name: gpuobs\n    static_configs: {_static(exporters)}\n" if exporters else ""))
    prom = subprocess.Popen([require_tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    query = prometheus_query(port)
    query.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]  (as conftest's prometheus fixture)
    return prom, query


def _static(targets: dict[str, str]) -> str:
    """A static_configs list (flow YAML) of one group per target, labelled its node."""
    return "[" + ", ".join(f"{{targets: ['{t}'], labels: {{node: '{n}'}}}}" for t, n in targets.items()) + "]"


def stop_all(jobs: list[Job], prom: subprocess.Popen | None) -> None:
    """Stop every rank of every job (5 s each before a kill), then Prometheus if it started."""
    for job in jobs:
        for proc in job.procs:
            stop(proc, timeout=5)
    if prom is not None:
        stop(prom)
