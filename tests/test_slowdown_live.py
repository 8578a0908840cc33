"""Issue 30's acceptance on real jobs: why a rank is slow, joined from the exporter's GPU series to
the training ranks through the pod attribution path, evaluated by a real Prometheus (fast profile,
every second) that scrapes

- a simulated node of 7 GPUs served by a real `gpuobs exporter` process, whose kubelet (a real
  PodResources gRPC server, tests/kubelet_server.py) gives each rank's pod one GPU and GPU 6 to a pod
  with no training rank; the exporter's target label `node` is the ranks' NODE_NAME;
- three real 2-rank gloo jobs (tests/workloads/ddp_job.py), each rank with POD_NAME, POD_NAMESPACE,
  KUBERNETES_SERVICE_HOST and NODE_NAME, and no GPU UUID: the join can only go through the pod.

The faults, and what must fire:

- thermal: rank 1 computes 1.3x as long and its GPU is in HW thermal slowdown (the simulator's
  clock-event reasons) -> TrainingStragglerRank for rank 1, cause=thermal, cause_gpu its GPU's UUID;
- loader: rank 1's data loader waits 25 ms a batch (the other's 2 ms), no GPU fault ->
  TrainingDataLoaderStraggler for rank 1, cause=data_loader, no GPU named;
- plain: rank 1 computes 1.3x as long on a healthy GPU -> TrainingStragglerRank, cause=none, no GPU.

GPU 6 (the other pod's) is in HW thermal slowdown too: no job's alert may name it, nor any GPU
but its own rank's. Nothing fires for any rank 0. Each rank's GPU, as the join record maps it, is
the one its pod holds. `gpuobs explain` (diagnose() and the command) ranks the same cause first.

Energy per training job: the thermal job's two GPUs draw known watts (the simulator's energy counters
grow at rates the test sets, one changed mid-run); its energy from the records (the job's power record,
charged through the job -> GPU join, summed over its run times the evaluation interval) is within 2 %
of those watts integrated over its run, from its first scrape to its ranks' stop.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO, free_port, require_tool, stop
from kubelet_server import serve_kubelet
from live_jobs import Job, start_prometheus, stop_all, write_targets

from gpuobs import catalog as c
from gpuobs import explain, records
from gpuobs.alerts.rules import FAST
from gpuobs.sim import Simulator
from gpuobs.sim.state import set_counter, set_val

pytest.importorskip("torch")  # CI installs the CPU build; without torch these real jobs cannot run

NODE = "gpu-node-7"  # NODE_NAME of every rank, and the exporter target's node label
NAMESPACE = "ml"
HW_THERMAL = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
WATCH_S = 100  # the watch ends this long after the start at the latest (or once settled())
SETTLE_S = 12  # ... watched this long after every expected alert fired: rank 0's alerts would have too
SECONDS = WATCH_S + 10  # the jobs' processes outlive the watch
ENERGY_JOB = "thermal"  # its GPUs draw WATTS (slot -> W), slot 0 then LATER_WATTS from CHANGE_AT_S
WATTS = {0: 310.0, 1: 455.0}
# slot 0 draws LATER_WATTS from CHANGE_AT_S to BACK_AT_S: the records lag a change by about 2 s (the
# exporter's sample and irate's scrape), which shifts the watts charged in time; back to where it started,
# the shift charges nothing more or less over the run
LATER_WATTS, CHANGE_AT_S, BACK_AT_S = 520.0, 25.0, 45.0
EDGE_EVALS = 2  # evaluations a run's start may lose: after a slow first scrape, and one more (a limit)
ENERGY_TOLERANCE = 0.02  # the acceptance's 2 %
# The job runs at least this long from its first scrape: the records start charging a rank at the first
# evaluation that sees its rank info (up to a 1 s evaluation after a slow first scrape), so each end of a
# run is known to within one evaluation, 1/MIN_RUN_S of the run per GPU
MIN_RUN_S = 60.0

# job_id -> (workload arguments, the GPU slots its ranks' pods hold)
JOBS = {
    "thermal": (["--slow-rank", "1"], (0, 1)),
    "loader": (["--data-slow-rank", "1", "--data-slow-ms", "25"], (2, 3)),
    "plain": (["--slow-rank", "1"], (4, 5)),
}
OTHER_POD_GPU = 6  # held by a pod without training ranks
THROTTLED = (JOBS["thermal"][1][1], OTHER_POD_GPU)
ALERTS = ("TrainingStragglerRank", "TrainingDataLoaderStraggler", "TrainingStepTimeRegression",
          "TrainingCollectivesSlowing")


def expected(uuids: list[str]) -> set[tuple[str, str, str, str, str]]:
    """Exactly the (alert, job_id, rank, cause, cause_gpu) that must fire, given the GPUs' UUIDs by slot."""
    return {("TrainingStragglerRank", "thermal", "1", "thermal", uuids[JOBS["thermal"][1][1]]),
            ("TrainingDataLoaderStraggler", "loader", "1", "data_loader", ""),
            ("TrainingStragglerRank", "plain", "1", "none", "")}


@dataclass
class Seen:
    """fired: (alert, job_id, rank, cause, cause_gpu) -> seconds since the start when first seen firing;
    causes: (job_id, rank) -> the causes the rank cause record named, in order, without repeats."""
    fired: dict[tuple[str, str, str, str, str], float] = field(default_factory=dict)
    causes: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)


def start_node(tmp_path: Path, logs, segments: Segments, changes: list[threading.Timer],
               ) -> tuple[Simulator, list[str], subprocess.Popen, int, object]:
    """The simulated node (every GPU busy, GPUs THROTTLED in HW thermal slowdown, the energy job's GPUs
    drawing WATTS, its GPU 0 LATER_WATTS from CHANGE_AT_S to BACK_AT_S: timers added to changes, the
    watts recorded in segments), its kubelet giving
    each rank's pod its GPU, and a real exporter process reading both. Returns (simulator, UUIDs by
    slot, exporter process, its port, the kubelet's stop())."""
    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb", "count": 7}]}, base=REPO, directory=tmp_path / "node")
    uuids = [sim.state.gpu(i).uuid.s.decode() for i in range(7)]
    for i in range(7):
        set_val(sim.state.gpu(i).util_gpu, 90)  # busy, as GPUs under training are
    for i in THROTTLED:
        set_val(sim.state.gpu(i).clock_events, HW_THERMAL)
    for slot, watts in WATTS.items():
        draw(sim, slot, watts, segments)
    changes += [threading.Timer(at, draw, (sim, 0, watts, segments))
                for at, watts in ((CHANGE_AT_S, LATER_WATTS), (BACK_AT_S, WATTS[0]))]
    for change in changes:
        change.start()
    kubelet, socket, stop_kubelet = serve_kubelet()
    kubelet.pods = [(f"{job}-{rank}", NAMESPACE, "trainer", "nvidia.com/gpu", [uuids[slot]])
                    for job, (_, slots) in JOBS.items() for rank, slot in enumerate(slots)]
    kubelet.pods.append(("infer-0", "serve", "vllm", "nvidia.com/gpu", [uuids[OTHER_POD_GPU]]))
    port = free_port()
    env = sim.env({"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    exporter = subprocess.Popen([sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1",
                                 "--port", str(port), "--interval", "1", "--kernel-log", "off",
                                 "--kubelet-socket", socket], env=env, stdout=logs, stderr=subprocess.STDOUT)
    return sim, uuids, exporter, port, stop_kubelet


Segments = dict[int, list[tuple[float, float]]]  # slot -> [(since, watts)], in order


def draw(sim: Simulator, slot: int, watts: float, segments: Segments) -> None:
    """Make GPU slot draw `watts` from now: its energy counter (and power gauge) at that rate, the
    counter kept continuous; the time the simulator rebased it is recorded in segments."""
    g = sim.state.gpu(slot)
    set_counter(g.energy_mj, rate=watts * 1000)  # mJ per second
    set_val(g.power_mw, watts * 1000)
    segments.setdefault(slot, []).append((g.energy_mj.t0, g.energy_mj.amp / 1000))


def integral(segments: Segments, spans: dict[int, tuple[float, float]]) -> float:
    """Joules the slots drew, each over its span (slot -> (start, end), Unix s), from the watts set and when."""
    total = 0.0
    for slot, steps in segments.items():
        start, end = spans[slot]
        for (since, watts), (until, _) in zip(steps, [*steps[1:], (float("inf"), 0.0)]):
            total += watts * max(0.0, min(until, end) - max(since, start))
    return total


def run_spans(query, job_id: str) -> dict[int, tuple[float, float]]:
    """rank -> (first, end) of each rank of the job as Prometheus scraped it (not the exporter): its
    first rank-info sample, and its last one plus the scrape interval (the failed scrape that marks it
    stale). A rank's pod holds its GPU for that span."""
    found = query(f'{c.RANK_INFO.exposed_name}{{job_id="{job_id}"}}[10m]')
    spans = {}
    for series in found:
        times = [float(t) for t, _ in series["values"]]
        spans[int(series["metric"]["rank"])] = (min(times), max(times) + 1.0)
    return spans


def job_energy(query, job_id: str) -> float:
    """Joules charged to the job by the records: its power record summed over its run, times the
    evaluation interval of the fast rules (1 s)."""
    power = f'{records.TRAINING_JOB_POWER.name}{{job_id="{job_id}"}}'
    found = query(f"sum_over_time({power}[10m])")
    return float(found[0]["value"][1]) * records.duration_seconds(FAST.eval_interval) if found else 0.0


def stop_and_measure(job: Job, query, segments: Segments) -> dict[str, float]:
    """Once the job has run MIN_RUN_S, stop its ranks, let Prometheus see them gone and evaluate, then
    its energy by the records and the truth over its span, with the span and the time the test stopped
    it (Unix s)."""
    first = min(a for a, _ in run_spans(query, job.job_id).values())
    time.sleep(max(0.0, first + MIN_RUN_S - time.time()))
    for proc in job.procs:
        stop(proc, timeout=5)
    stopped = time.time()
    time.sleep(4)  # a failed scrape (stale markers), then evaluations without the job
    spans = run_spans(query, job.job_id)  # rank r's pod holds GPU slot r (JOBS)
    slots = {JOBS[job.job_id][1][rank]: span for rank, span in spans.items()}
    power = f'{records.TRAINING_JOB_POWER.name}{{job_id="{job.job_id}"}}'
    samples = [float(t) for series in query(f"{power}[10m]") for t, _ in series["values"]]
    gpus = [float(t) for series in query(f'{records.JOB_GPUS.name}{{job_id="{job.job_id}"}}[10m]')
            for t, _ in series["values"]]
    # what the records charged: each sample stands for the evaluation interval before it
    charged = {slot: (max(a, min(samples) - 1.0), min(b, max(samples))) for slot, (a, b) in slots.items()}
    return {"records_j": job_energy(query, job.job_id), "truth_j": integral(segments, slots),
            "charged_truth_j": integral(segments, charged), "first": min(a for a, _ in spans.values()),
            "end": max(b for _, b in spans.values()), "stopped": stopped, "spans": spans,
            "first_power": min(samples), "last_power": max(samples), "first_join": min(gpus)}


def stop_node(exporter, stop_kubelet, sim, changes: list[threading.Timer]) -> None:
    """Stop what start_node started (each part that did start)."""
    for change in changes:
        change.cancel()
    if exporter is not None:
        stop(exporter)
    if stop_kubelet is not None:
        stop_kubelet()
    if sim is not None:
        sim.close()


def jobs() -> list[Job]:
    """The three jobs, each rank in its own pod on NODE (no GPU UUID: the join goes through the pod)."""
    env = {"POD_NAME": "", "POD_NAMESPACE": NAMESPACE, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "NODE_NAME": NODE}
    return [Job(job_id, 2, args, seconds=SECONDS, env={**env, "POD_NAME": f"{job_id}-{{rank}}"})
            for job_id, (args, _) in JOBS.items()]


def pods_served(port: int) -> int:
    """How many GPUs the exporter serves with a pod label (0 while it is not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return sum(line.startswith("gpuobs_gpu_info{") and 'k8s_pod="' in line for line in text.splitlines())


def poll(query, seen: Seen, now: float) -> None:
    """One look: the slowdown alerts firing for our jobs (with their cause labels), and the rank causes."""
    names = "|".join(ALERTS)
    for a in query(f'ALERTS{{alertstate="firing", alertname=~"{names}"}}'):
        m = a["metric"]
        if m.get("job_id") in JOBS:
            key = (m["alertname"], m["job_id"], m.get("rank", ""), m.get("cause", ""), m.get("cause_gpu", ""))
            seen.fired.setdefault(key, now)
    for r in query(records.RANK_CAUSE.name):
        m = r["metric"]
        history = seen.causes.setdefault((m["job_id"], m["rank"]), [])
        if not history or history[-1] != (m["cause"], m.get("cause_gpu", "")):
            history.append((m["cause"], m.get("cause_gpu", "")))


def watch(query, want: set, start: float) -> Seen:
    """Poll every 2 s until every wanted alert has fired and SETTLE_S more passed, or WATCH_S."""
    seen = Seen()
    while (now := time.monotonic() - start) < WATCH_S:
        time.sleep(2)
        try:
            poll(query, seen, now)
        except OSError:
            continue  # Prometheus still starting
        if want <= set(seen.fired) and now - max(seen.fired[k] for k in want) >= SETTLE_S:
            break
    return seen


def explained(url: str) -> dict[str, tuple[str, str, str, str]]:
    """job_id -> (cause, rank, GPU) of `gpuobs explain`'s top finding, from diagnose() and, as the last
    item, the first ranked line the command (`gpuobs explain JOB --prometheus URL`) prints."""
    out = {}
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    for job in JOBS:
        top = explain.diagnose(url, job, thresholds=FAST).findings[0]
        printed = subprocess.run([sys.executable, "-m", "gpuobs.cli", "explain", job, "--prometheus", url,
                                  "--profile", "fast"], env=env, capture_output=True, text=True, timeout=60)
        first = next((line for line in printed.stdout.splitlines() if line.startswith("  1. ")),
                     f"no ranked line: {printed.stdout[-2000:]}{printed.stderr[-2000:]}")
        out[job] = (top.cause, top.rank, top.gpu, first)
    return out


def descriptions(url: str) -> dict[tuple[str, str], str]:
    """(alert, job_id) -> the description of our jobs' slowdown alerts now firing (what on-call reads)."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as r:
        found = json.load(r)["data"]["alerts"]
    return {(a["labels"]["alertname"], a["labels"]["job_id"]): a["annotations"].get("description", "")
            for a in found if a["state"] == "firing" and a["labels"].get("job_id") in JOBS
            and a["labels"]["alertname"] in ALERTS}


def rank_gpus(query) -> dict[tuple[str, str], set[str]]:
    """(job_id, rank) -> the UUIDs the join record maps it to, for our jobs."""
    mapped: dict[tuple[str, str], set[str]] = {}
    for r in query(records.RANK_GPUS.name):
        m = r["metric"]
        if m["job_id"] in JOBS:
            mapped.setdefault((m["job_id"], m["rank"]), set()).add(m["uuid"])
    return mapped


def check_energy(energy: dict[str, float], job_gpus: set[str], own: set[str], segments: Segments,
                 report: str) -> None:
    """The energy job's acceptance: its GPUs (own: its pods') joined, its energy from the records
    against the watts set, integrated over its run (stop_and_measure's figures)."""
    # energy per training job: its two pods' GPUs joined, its energy within 2 % of the watts set,
    # integrated over its run (a run long enough that a 1 s evaluation is under 2 % of it)
    assert job_gpus == own, report
    assert energy["end"] - energy["first"] >= MIN_RUN_S and len(segments[0]) == 3, report  # the changes within it
    assert abs(energy["end"] - energy["stopped"]) < 2, report  # the span measured is the ranks' own
    error = energy["records_j"] / energy["truth_j"] - 1
    charged_error = energy["records_j"] / energy["charged_truth_j"] - 1
    print(f"energy of job {ENERGY_JOB}: records {energy['records_j']:.0f} J; truth over its run "
          f"{energy['truth_j']:.0f} J ({100 * error:+.2f} %, {energy['end'] - energy['first']:.1f} s); truth over "
          f"the span charged {energy['charged_truth_j']:.0f} J ({100 * charged_error:+.2f} %); first scrape "
          f"{energy['first']:.3f}, first join {energy['first_join']:.3f}, first power {energy['first_power']:.3f}")
    # the watts charged: within 2 % of the simulated watts over the span the records charged ...
    assert abs(charged_error) < ENERGY_TOLERANCE, report
    # ... and over the whole run, short of it by no more than EDGE_EVALS evaluations of the job's watts
    lost = EDGE_EVALS * records.duration_seconds(FAST.eval_interval) * sum(WATTS.values())
    assert -ENERGY_TOLERANCE < (energy["records_j"] + lost) / energy["truth_j"] - 1 and error < ENERGY_TOLERANCE, \
        report


@pytest.mark.timeout(WATCH_S + 80)
def test_each_slow_rank_pages_with_its_cause_joined_through_its_pod(tmp_path):
    require_tool("prometheus")
    sd = tmp_path / "targets.json"
    logs = open(tmp_path / "processes.log", "w")
    running = jobs()
    prom = exporter = stop_kubelet = sim = None
    changes: list[threading.Timer] = []
    segments: Segments = {}
    try:
        start = time.monotonic()
        sim, uuids, exporter, port, stop_kubelet = start_node(tmp_path, logs, segments, changes)
        for job in running:
            job.start(logs)
        write_targets(sd, running, {}, node=NODE)
        prom, query = start_prometheus(tmp_path, sd, exporters={f"127.0.0.1:{port}": NODE})
        while pods_served(port) < 7:  # well before any rank's first step: torch takes longer to import
            assert time.monotonic() - start < 40, "the exporter never served the pods' labels"
            time.sleep(0.5)
        want = expected(uuids)
        seen = watch(query, want, start)
        mapped = rank_gpus(query)
        texts = descriptions(query.url)
        diagnosed = explained(query.url)
        throttled = {r["metric"]["uuid"] for r in query(f'{records.GPU_CAUSES.name}{{cause="thermal"}}')}
        job_gpus = {r["metric"]["uuid"] for r in query(f'{records.JOB_GPUS.name}{{job_id="{ENERGY_JOB}"}}')}
        energy = stop_and_measure(next(j for j in running if j.job_id == ENERGY_JOB), query, segments)
    finally:
        stop_all(running, prom)
        stop_node(exporter, stop_kubelet, sim, changes)
        logs.close()
    report = (f"fired (s since start): {seen.fired}\nrank causes over time: {seen.causes}\nrank GPUs: {mapped}\n"
              f"GPUs with the thermal cause: {throttled}\ndescriptions: {texts}\nexplain: {diagnosed}\n"
              f"UUIDs by slot: {uuids}\nenergy job's GPUs: {job_gpus}, energy: {energy}, watts set: {segments}\n"
              f"log tail: {(tmp_path / 'processes.log').read_text()[-3000:]}")
    print(report.split("\nlog tail")[0])

    assert set(seen.fired) == want, report  # the causes right, and nothing for any rank 0 or other alert
    # the join went through the pods: each rank to exactly its pod's GPU
    assert mapped == {(job, str(rank)): {uuids[slot]} for job, (_, slots) in JOBS.items()
                      for rank, slot in enumerate(slots)}, report
    # the page says it: the cause and GPU in the description on-call reads
    assert f"Likely cause: thermal on GPU {uuids[THROTTLED[0]]}." in texts[("TrainingStragglerRank", "thermal")], report
    assert "Likely cause: data_loader." in texts[("TrainingDataLoaderStraggler", "loader")], report
    assert "No cause found on its GPUs" in texts[("TrainingStragglerRank", "plain")], report
    # both throttled GPUs read as thermal (so GPU 6 was there to be wrongly named), no other GPU does
    assert throttled == {uuids[slot] for slot in THROTTLED}, report
    # gpuobs explain ranks the same cause first, from diagnose() and on the command's first ranked line
    assert {job: d[:3] for job, d in diagnosed.items()} == {
        "thermal": ("thermal", "1", uuids[THROTTLED[0]]), "loader": ("data_loader", "1", ""),
        "plain": ("none", "1", "")}, report
    assert all(d[3].startswith(f"  1. {d[0]} on rank {d[1]}") for d in diagnosed.values()), report
    check_energy(energy, job_gpus, {uuids[slot] for slot in WATTS}, segments, report)
    # no rank's cause ever named a GPU but its own (GPU 6, throttled, belongs to no rank)
    for (job, rank), history in seen.causes.items():
        own = uuids[JOBS[job][1][int(rank)]] if job in JOBS else None
        assert all(gpu in ("", own) for _, gpu in history), report
