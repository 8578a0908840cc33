"""FSDP2's all-gathers and reduce-scatters timed per rank (gpuobs.instrument.fsdp): the wrapper comm's
host and device timing, what TrainingRun makes of it, and a real 2-rank FSDP2 job over gloo whose
slow rank shows in its compute time only when the run watches the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_instrument import FakeGPU, Mem, isolated  # noqa: F401 - isolated: the autouse fixture, used here too

from gpuobs import catalog as c
from gpuobs import instrument
from gpuobs.instrument import fsdp, train
from gpuobs.instrument.timing import CudaEventTimer, WallTimer
from gpuobs.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "tests" / "workloads" / "fsdp_job.py"


class SleepyComm:
    """A stand-in inner comm: allocate() and each call are recorded; a call sleeps `seconds` and
    returns `work` (None: synchronous, as FSDP2 calls its comms by default)."""

    def __init__(self, seconds: float = 0.0, work: object = None):
        self.seconds, self.work, self.calls, self.allocated = seconds, work, [], []

    def allocate(self, size, *, dtype, device):
        self.allocated.append((tuple(size), dtype, device))
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        time.sleep(self.seconds)
        return self.work


def test_the_wrapper_delegates_and_counts_the_blocked_host_seconds():
    timer = fsdp.FsdpCommTimer()
    gather_cls, scatter_cls = fsdp._wrappers()
    inner_g, inner_s = SleepyComm(0.03), SleepyComm(0.02)
    gather, scatter = gather_cls(inner_g, timer), scatter_cls(inner_s, timer)
    buf = gather.allocate((8,), dtype=torch.float32, device=torch.device("cpu"))
    assert buf.shape == (8,) and inner_g.allocated == [((8,), torch.float32, torch.device("cpu"))]
    out, inp = torch.zeros(8), torch.ones(4)
    assert gather(out, inp, "group") is None
    assert scatter(output_tensor=out, input_tensor=inp, group="group", op="sum") is None
    assert inner_g.calls == [dict(output_tensor=out, input_tensor=inp, group="group", async_op=False)]
    assert inner_s.calls[0]["op"] == "sum" and inner_s.calls[0]["async_op"] is False
    got = timer.take()
    assert 0.05 <= got.seconds < 0.05 + 0.1 and got.calls == 2 and got.device == ()
    assert got.first is not None and got.last is not None and got.last - got.first >= got.seconds - 1e-6
    assert timer.take().calls == 0 and timer.take().seconds == 0  # reset by take


def test_an_async_call_counts_from_launch_to_the_works_completion():
    future: torch.futures.Future = torch.futures.Future()
    timer = fsdp.FsdpCommTimer()
    gather_cls, _ = fsdp._wrappers()
    work = SimpleNamespace(get_future=lambda: future)
    assert gather_cls(SleepyComm(0.0, work), timer)(torch.zeros(8), torch.ones(4), None, async_op=True) is work
    assert timer.take().calls == 0  # launched, not complete: nothing counted yet
    threading.Timer(0.04, future.set_result, args=([torch.zeros(1)],)).start()
    future.wait()
    time.sleep(0.01)  # the callback runs right after the result is set
    got = timer.take()
    assert got.calls == 1 and 0.035 <= got.seconds < 0.2


class CudaLike:
    """What the wrapper reads of a CUDA tensor (is_cuda) without a GPU."""
    is_cuda = True


def test_cuda_calls_are_device_pairs_read_after_the_step_without_synchronizing():
    """On NCCL the call returns at enqueue: the collective wait comes from the event pairs around
    each call (a stand-in stream), summed over those complete when the step is recorded."""
    m = Mem()
    gpu = FakeGPU()
    run = instrument.TrainingRun(m.tel, timer=CudaEventTimer(gpu.event))
    run._fsdp = fsdp.FsdpCommTimer(event_factory=lambda: gpu.event)
    gather_cls, scatter_cls = fsdp._wrappers()

    class OnDevice(SleepyComm):
        def __init__(self, ms: float):
            super().__init__()
            self.ms = ms

        def __call__(self, **kwargs):
            gpu.now_ms += self.ms  # the collective on the stream, waiting for the slow peer
            return super().__call__(**kwargs)

    gather, scatter = gather_cls(OnDevice(10), run._fsdp), scatter_cls(OnDevice(15), run._fsdp)
    with run.step(samples=1):
        gather(CudaLike(), CudaLike(), None)
        gpu.now_ms += 50  # forward and backward
        scatter(CudaLike(), CudaLike(), None, "sum")
        gpu.now_ms += 5
    run.flush()
    assert m.points(c.COMPUTE) == []  # nothing recorded before the events completed, nothing synchronized
    assert gpu.syncs == 0
    gpu.release()
    run.flush()
    assert m.value(c.COLLECTIVE_WAIT) == pytest.approx(0.025)
    assert m.value(c.COMPUTE) == pytest.approx(0.055)
    assert m.spans("train.collective") == []  # the host saw no wait: no span


def test_a_steps_fsdp_calls_are_collective_wait_and_one_span(mem_fsdp):
    m, run = mem_fsdp
    gather_cls, scatter_cls = fsdp._wrappers()
    gather, scatter = gather_cls(SleepyComm(0.02), run._fsdp), scatter_cls(SleepyComm(0.02), run._fsdp)
    gather(torch.zeros(8), torch.ones(4), None)  # before the step (e.g. an evaluation): not its wait
    with run.step():
        gather(torch.zeros(8), torch.ones(4), None)
        time.sleep(0.03)
        scatter(torch.zeros(4), torch.ones(8), None, "sum")
    waited, compute = m.value(c.COLLECTIVE_WAIT), m.value(c.COMPUTE)
    assert 0.04 <= waited < 0.04 + 0.02 and 0.03 <= compute < 0.03 + 0.02
    [span] = m.spans("train.collective")
    assert span.attributes["gpuobs.collective"] == "fsdp" and span.attributes["gpuobs.collective.calls"] == 2
    assert span.attributes["gpuobs.collective.blocked_s"] == pytest.approx(waited)
    assert span.parent.span_id == m.spans("train.step")[0].context.span_id
    assert (span.end_time - span.start_time) / 1e9 >= 0.07  # first launch to last completion


@pytest.fixture
def mem_fsdp():
    m = Mem()
    return m, instrument.TrainingRun(m.tel, timer=WallTimer())


class FakeFsdpModule:
    """The parts of an FSDPModule that fsdp.hook uses: the state's param groups and FSDP's setters
    (which, like FSDP's, refuse several groups)."""

    def __init__(self, groups: int = 1, comms: tuple = ()):
        gather, scatter = comms or (SleepyComm(), SleepyComm())
        self.groups = [SimpleNamespace(_all_gather_comm=gather, _reduce_scatter_comm=scatter) for _ in range(groups)]

    def _get_fsdp_state(self):
        return SimpleNamespace(_fsdp_param_groups=self.groups)

    def set_custom_all_gather(self, comm):
        assert len(self.groups) == 1
        self.groups[0]._all_gather_comm = comm

    def set_custom_reduce_scatter(self, comm):
        assert len(self.groups) == 1
        self.groups[0]._reduce_scatter_comm = comm


def test_a_users_own_comm_is_wrapped_and_still_called():
    users = SleepyComm(0.01), SleepyComm(0.01)
    module, timer = FakeFsdpModule(comms=users), fsdp.FsdpCommTimer()
    assert fsdp.hook(module, timer) and fsdp.hook(module, timer)  # twice: wrapped once
    group = module.groups[0]
    assert group._all_gather_comm.inner is users[0] and group._reduce_scatter_comm.inner is users[1]
    group._all_gather_comm(torch.zeros(8), torch.ones(4), None)
    group._reduce_scatter_comm(torch.zeros(4), torch.ones(8), None, "sum")
    assert len(users[0].calls) == len(users[1].calls) == 1
    assert timer.take().calls == 2


def test_modules_that_cannot_take_a_timed_comm_are_left_alone(caplog):
    timer = fsdp.FsdpCommTimer()
    with caplog.at_level("WARNING", logger="gpuobs.instrument"):
        assert not fsdp.watch(torch.nn.Linear(4, 4), timer)  # no FSDP at all
        assert not fsdp.hook(FakeFsdpModule(groups=0), timer)  # a root without parameters of its own
        assert not caplog.records
        several = FakeFsdpModule(groups=2)
        assert not fsdp.hook(several, timer)
        assert all(isinstance(g._all_gather_comm, SleepyComm) for g in several.groups)
        assert "several param groups" in caplog.records[-1].getMessage()


def test_a_torch_without_the_private_comms_is_not_hooked_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(fsdp, "_warned", set())
    odd = SimpleNamespace(_get_fsdp_state=lambda: SimpleNamespace())  # no _fsdp_param_groups
    with caplog.at_level("WARNING", logger="gpuobs.instrument"):
        assert not fsdp.hook(odd, fsdp.FsdpCommTimer()) and not fsdp.hook(odd, fsdp.FsdpCommTimer())
    assert len(caplog.records) == 1 and "not timed" in caplog.records[0].getMessage()


# ------------------------------------------------------------------------------- a real FSDP2 job


def _job(tmp_path: Path, name: str, *args: str) -> list[dict]:
    """Run fsdp_job.py as 2 ranks over gloo with rank 1 1.3x slower; each rank's report."""
    [master] = free_ports(1)
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master), "GPUOBS_JOB_ID": name,
               "PYTHONPATH": str(REPO)}
        env.pop("GPUOBS_PROMETHEUS_PORT", None)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        procs.append(subprocess.Popen([sys.executable, str(WORKLOAD), "--seconds", "3.5", "--slow-rank", "1",
                                       "--slow-factor", "1.3", "--report", str(tmp_path / f"{name}{rank}.json"),
                                       *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out[-3000:]
    return [json.loads((tmp_path / f"{name}{rank}.json").read_text()) for rank in (0, 1)]


def _per_step(report: dict) -> float:
    return report["compute"] / report["steps"]


def test_a_real_fsdp2_straggler_shows_in_compute_only_when_watched(tmp_path):
    """Rank 1's forward and backward (inside the sharded model) take 1.3x rank 0's. Steps take the
    same on both (each waits for the other in FSDP's collectives), so unwatched per-rank compute
    is the step time, equal; watched, the fast rank's waits are collective time and its compute
    its own. A user's own comm on one module keeps being called."""
    fast, slow = _job(tmp_path, "watched", "--user-comm")
    assert fast["watched"] and slow["watched"] and fast["steps"] >= train.WARN_UNTIMED_AFTER
    assert fast["user_comm_wrapped"] and fast["user_comm_calls"] >= fast["steps"]  # wrapped, still called
    assert fast["timed_calls"] >= fast["user_comm_calls"] + 2 * fast["steps"]  # both layers' gathers and scatters
    assert 1.15 <= _per_step(slow) / _per_step(fast) <= 1.45, (fast, slow)
    assert fast["collective"] > slow["collective"] > 0
    assert not any("no timed collective" in w for r in (fast, slow) for w in r["warnings"])
    fast, slow = _job(tmp_path, "blind", "--no-watch")
    assert fast["steps"] >= train.WARN_UNTIMED_AFTER and fast["collective"] == slow["collective"] == 0
    assert abs(_per_step(slow) / _per_step(fast) - 1) < 0.05, (fast, slow)  # the blindness watch fixes
    assert all(any("no timed collective" in w for w in r["warnings"]) for r in (fast, slow))


def test_an_async_work_without_a_future_counts_the_calls_host_duration():
    timer = fsdp.FsdpCommTimer()
    gather_cls, _ = fsdp._wrappers()

    def no_future():
        raise RuntimeError("this backend's Work has no future")
    work = SimpleNamespace(get_future=no_future)
    assert gather_cls(SleepyComm(0.02, work), timer)(torch.zeros(8), torch.ones(4), None, async_op=True) is work
    got = timer.take()
    assert got.calls == 1 and 0.02 <= got.seconds < 0.1
