"""gpuobs.instrument: training and inference spans and metrics through the OTel SDK (in-memory
exporters), CUDA-event timing with a stand-in event, the disabled path, configure() from the
environment, a real OTLP/HTTP receiver, and the Prometheus path against the catalog's names."""

from __future__ import annotations

import bisect
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import timeit
import types
from pathlib import Path

import pytest
from conftest import OTLPReceiver, free_port
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gpuobs import catalog as c
from gpuobs import instrument
from gpuobs.instrument import inference, telemetry, train
from gpuobs.instrument.env import RunEnv
from gpuobs.instrument.telemetry import BATCH_BUCKETS, DURATION_BUCKETS
from gpuobs.instrument.timing import CudaEventTimer, WallTimer, default_timer

REPO = Path(__file__).resolve().parents[1]
RUN_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GPUOBS_JOB_ID", "JOB_ID",
                "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURMD_NODENAME",
                "KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE", "NODE_NAME",
                "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_SDK_DISABLED",
                "GPUOBS_PROMETHEUS_PORT", "OTEL_METRICS_EXEMPLAR_FILTER", "GPUOBS_EXEMPLARS", "GPUOBS_EXEMPLAR_MIN_S")
TRAIN_LABELS = dict(zip(c.RUN_LABELS, ("3", "job-7")))  # what RunEnv(rank=3, job_id="job-7") puts on points


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    """No launcher or OTEL_* variables from the outside; a fresh module state before and after."""
    for name in RUN_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(telemetry, "_current", None)
    monkeypatch.setattr(train, "_default", None)
    yield
    if telemetry._current is not None:
        telemetry._current.shutdown(timeout_s=2)


class Mem:
    """A Telemetry over in-memory exporters, with helpers to read what it recorded."""

    def __init__(self, **kw):
        self.span_exporter, self.reader = InMemorySpanExporter(), InMemoryMetricReader()
        kw.setdefault("env", RunEnv(rank=3, job_id="job-7"))
        self.tel = instrument.configure(span_exporters=[self.span_exporter], metric_readers=[self.reader], **kw)

    def spans(self, name: str | None = None) -> list:
        self.tel.tracer_provider.force_flush()
        return [s for s in self.span_exporter.get_finished_spans() if name is None or s.name == name]

    def metrics(self) -> dict[str, object]:
        """otel name -> SDK Metric of one collection."""
        data = self.reader.get_metrics_data()
        return {m.name: m for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
                for m in sm.metrics}

    def points(self, metric: c.Metric) -> list:
        m = self.metrics().get(metric.otel_name)
        return list(m.data.data_points) if m else []

    def point(self, metric: c.Metric, **attrs):
        """The one point of metric whose attributes include attrs (TRAIN_LABELS by default)."""
        want = {**(TRAIN_LABELS if metric.family == "training" else {}), **attrs}
        found = [p for p in self.points(metric) if all(p.attributes.get(k) == v for k, v in want.items())]
        assert len(found) == 1, (metric.otel_name, want, [dict(p.attributes) for p in self.points(metric)])
        return found[0]

    def value(self, metric: c.Metric, **attrs) -> float:
        p = self.point(metric, **attrs)
        return p.sum if metric.kind == "histogram" else p.value


@pytest.fixture
def mem():
    return Mem(service_name="test-train")


def sleepy_loader(n: int, seconds: float):
    for i in range(n):
        time.sleep(seconds)
        yield i


# ------------------------------------------------------------------------------------------ spans


@pytest.mark.parametrize("setting, stored", [(None, False), ("trace_based", True), ("bogus", False)])
def test_step_exemplars_follow_the_standard_variable_and_are_off_by_default(monkeypatch, setting, stored):
    """Exemplars on the step-duration histogram cost more than the point itself: off unless
    OTEL_METRICS_EXEMPLAR_FILTER asks for them; with trace_based they carry the step span's ids."""
    if setting:
        monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", setting)
    m = Mem(service_name="test-train")
    run = instrument.TrainingRun(m.tel, timer=WallTimer())
    with run.step(samples=1):
        pass
    exemplars = m.point(c.STEP_DURATION).exemplars
    assert bool(exemplars) == stored
    if stored:
        assert exemplars[0].span_id == m.spans("train.step")[0].context.span_id


def test_step_spans_link_parent_and_children(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    for i in run.data(sleepy_loader(2, 0.02)):
        with run.step(samples=4):
            with run.phase("forward"):
                time.sleep(0.005)
            for _ in range(2):
                with run.micro_step():
                    pass
            if i == 1:
                with run.checkpoint(tag="mid"):
                    time.sleep(0.002)
    with run.checkpoint(path="/ckpt/final"):  # outside any step: a child of the run span
        pass
    run.close()

    steps = sorted(mem.spans("train.step"), key=lambda s: s.start_time)
    assert [s.attributes["gpuobs.step"] for s in steps] == [1, 2]
    [run_span] = mem.spans("train.run")
    assert run_span.parent is None and run_span.attributes["gpuobs.steps"] == 2
    assert run_span.start_time <= steps[0].start_time and run_span.end_time >= steps[1].end_time
    for s in steps:
        assert s.parent is None  # each step its own trace, grouped by a link to the run span
        assert [link.context.span_id for link in s.links] == [run_span.context.span_id]
        # the run's rank and job are on the resource, once, not on every span
        assert s.resource.attributes["gpuobs.rank"] == 3 and s.resource.attributes["gpuobs.job.id"] == "job-7"
        assert "rank" not in s.attributes
    by_parent = {}
    for s in mem.spans():
        if s.parent is not None:
            by_parent.setdefault(s.parent.span_id, []).append(s)
    for n, step in enumerate(steps):
        children = by_parent[step.context.span_id]
        names = sorted(ch.name for ch in children)
        assert names == sorted(["train.data_wait", "train.forward", "train.micro_step", "train.micro_step"]
                               + (["train.checkpoint"] if n == 1 else []))
        for ch in children:
            assert ch.context.trace_id == step.context.trace_id
            assert step.start_time <= ch.start_time and ch.end_time <= step.end_time
        wait = next(ch for ch in children if ch.name == "train.data_wait")
        assert wait.start_time == step.start_time  # the step starts when it began waiting for its batch
        assert 0.02 <= (wait.end_time - wait.start_time) / 1e9 < 0.3
        forward = next(ch for ch in children if ch.name == "train.forward")
        assert forward.start_time >= wait.end_time and forward.attributes["gpuobs.phase"] == "forward"
    assert steps[0].context.trace_id != steps[1].context.trace_id
    ckpts = mem.spans("train.checkpoint")
    inner = next(s for s in ckpts if s.parent is not None)
    assert inner.parent.span_id == steps[1].context.span_id
    assert inner.attributes["gpuobs.checkpoint.tag"] == "mid"
    outer = next(s for s in ckpts if s.parent.span_id == run_span.context.span_id)
    assert outer.context.trace_id == run_span.context.trace_id
    assert outer.attributes["gpuobs.checkpoint.path"] == "/ckpt/final" and outer.attributes[
        "gpuobs.checkpoint.step"] == "2"
    assert mem.value(c.MICRO_STEPS) == 4


def test_epoch_end_is_not_the_next_steps_wait(mem):
    """The StopIteration at the end of an epoch, then an evaluation pause, must not stretch the
    first step of the next epoch back to the end of the previous one."""
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    for _ in range(2):
        for _ in run.data(sleepy_loader(1, 0.005)):
            with run.step():
                pass
        time.sleep(0.1)  # evaluation between epochs
    second = max(mem.spans("train.step"), key=lambda s: s.start_time)
    assert (second.end_time - second.start_time) / 1e9 < 0.09
    assert mem.value(c.BADPUT, cause="idle") >= 0.1  # the pause is idle time, not data wait
    assert mem.value(c.BADPUT, cause="data_wait") < 0.09


def test_exception_inside_a_step_marks_the_span_and_counts_a_failed_step(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    with pytest.raises(ValueError, match="boom"):
        with run.step(samples=2):
            with run.phase("backward"):
                raise ValueError("boom")
    step = mem.spans("train.step")[0]
    assert step.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" and e.attributes["exception.type"] == "ValueError" for e in step.events)
    assert mem.spans("train.backward")[0].status.status_code is StatusCode.ERROR
    assert mem.value(c.STEPS_FAILED, exception="ValueError") == 1
    assert mem.points(c.STEPS) == [] and mem.points(c.SAMPLES_TRAINED) == [] and mem.points(c.LAST_STEP) == []
    assert mem.points(c.STEP_DURATION) == []
    with run.step():  # the failed step left no span current: the next is a root again
        pass
    assert all(s.parent is None for s in mem.spans("train.step"))
    assert mem.value(c.STEPS) == 1 and mem.value(c.STEPS_FAILED, exception="ValueError") == 1


class Flaky(Exception):
    """The failure the loop below injects and catches."""


def test_a_loop_whose_steps_raise_counts_failures_not_progress(mem):
    """A real loop over a loader where some steps' bodies raise and the loop catches the exception:
    steps, samples, tokens, FLOPs and the step histogram count only the steps that completed, the
    failed-steps counter counts the others by exception type, the last-step time is that of the
    last completed step, and the data waits of failed steps are still data wait."""
    run = instrument.TrainingRun(mem.tel, timer=WallTimer(), flops_per_step=10.0)
    done = {"steps": 0, "samples": 0, "tokens": 0}
    failed: dict[str, int] = {}
    last_ok = (0.0, 0.0)  # (before, after) the last step that completed
    for i in run.data(sleepy_loader(30, 0.002)):
        kind = (Flaky, KeyError, None, None, None)[i % 5] if i < 20 else Flaky  # the last 10 all fail
        before = time.time()
        try:
            with run.step(samples=4, tokens=64):
                time.sleep(0.001)
                if kind is not None:
                    raise kind(i)
        except (Flaky, KeyError) as exc:
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
            continue
        last_ok = (before, time.time())
        done["steps"] += 1
        done["samples"] += 4
        done["tokens"] += 64
    assert done["steps"] == 12 and failed == {"Flaky": 14, "KeyError": 4}  # what the loop itself saw
    assert mem.value(c.STEPS) == done["steps"] and mem.point(c.STEP_DURATION).count == done["steps"]
    assert (mem.value(c.SAMPLES_TRAINED), mem.value(c.TOKENS_TRAINED)) == (done["samples"], done["tokens"])
    assert mem.value(c.FLOPS) == 10.0 * done["steps"]
    # plus the rank's "other" series, at 0 from the start (the rules count a new type's first failures)
    assert {p.attributes["exception"]: p.value for p in mem.points(c.STEPS_FAILED)} == {**failed, "other": 0}
    assert last_ok[0] <= mem.value(c.LAST_STEP) <= last_ok[1]  # the last completed step's, not a failed one's
    assert mem.point(c.DATA_WAIT).count == 30  # every batch was waited for, failed step or not
    bad = {p.attributes["cause"]: p.value for p in mem.points(c.BADPUT)}
    assert bad["failed_step"] >= 18 * 0.001 and bad["data_wait"] == pytest.approx(mem.value(c.DATA_WAIT))


def test_failed_steps_are_bounded_by_exception_type_and_interruptions_are_neither(mem):
    """Past EXCEPTION_TYPES exception types, failed steps count as "other"; the end of the data
    (StopIteration) or a KeyboardInterrupt inside a step is neither progress nor a failure."""
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    types_ = [type(f"E{n}", (Exception,), {}) for n in range(train.EXCEPTION_TYPES + 3)]
    for kind in types_ + [StopIteration, KeyboardInterrupt]:
        with pytest.raises(kind):
            with run.step(samples=1):
                raise kind()
    counts = {p.attributes["exception"]: p.value for p in mem.points(c.STEPS_FAILED)}
    assert counts == {**{t.__name__: 1 for t in types_[:train.EXCEPTION_TYPES]}, "other": 3}
    assert mem.points(c.STEPS) == [] and mem.points(c.SAMPLES_TRAINED) == []


def test_gpu_timed_failed_steps_resolve_as_failures(mem):
    """With CUDA events a step is recorded when its events complete: a failed one still as a failure."""
    gpu = FakeGPU()
    run = instrument.TrainingRun(mem.tel, timer=CudaEventTimer(gpu.event))
    for n in range(4):
        try:
            with run.step(samples=1):
                gpu.now_ms += 10
                if n % 2:
                    raise RuntimeError("CUDA error: an illegal memory access")
        except RuntimeError:
            pass
    gpu.release()
    run.flush()
    assert mem.value(c.STEPS) == 2 and mem.value(c.STEPS_FAILED, exception="RuntimeError") == 2
    assert mem.value(c.SAMPLES_TRAINED) == 2 and mem.point(c.STEP_DURATION).count == 2


def test_trace_step_decorators_and_module_shortcuts(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())

    @run.trace_step
    def one(x):
        """docstring kept"""
        return x * 2

    assert [one(i) for i in range(3)] == [0, 2, 4] and one.__doc__ == "docstring kept"

    @instrument.trace_step
    def two():
        with instrument.phase("forward"):
            pass

    for _ in instrument.data(range(2)):
        two()
    with instrument.step(samples=5, tokens=50):
        with instrument.checkpoint():
            pass
    instrument.report(loss=0.5)
    instrument.default_run().flush()
    assert mem.value(c.STEPS) == 6
    assert mem.value(c.SAMPLES_TRAINED) == 5 and mem.value(c.TOKENS_TRAINED) == 50
    assert mem.value(c.LOSS) == 0.5
    assert len(mem.spans("train.step")) == 6 and len(mem.spans("train.forward")) == 2
    assert instrument.default_run() is instrument.default_run()


# ---------------------------------------------------------------------------------------- metrics


def test_metric_values_units_and_buckets_from_controlled_sleeps(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    before = time.time()
    for _ in run.data(sleepy_loader(1, 0.02)):
        with run.step(samples=8, tokens=1024):
            time.sleep(0.01)
    wait, total = mem.value(c.DATA_WAIT), mem.value(c.STEP_DURATION)
    assert 0.02 <= wait < 0.3
    assert 0.01 <= total - wait < 0.3
    assert mem.value(c.GOODPUT) == pytest.approx(total - wait, rel=1e-9)
    assert mem.value(c.COMPUTE) == pytest.approx(total - wait, rel=1e-9)  # no collective in this step
    assert mem.value(c.COLLECTIVE_WAIT) == 0
    assert mem.value(c.BADPUT, cause="data_wait") == pytest.approx(wait, rel=1e-9)
    assert before <= mem.value(c.LAST_STEP) <= time.time()
    assert (mem.value(c.STEPS), mem.value(c.SAMPLES_TRAINED), mem.value(c.TOKENS_TRAINED)) == (1, 8, 1024)
    for metric, seconds in ((c.DATA_WAIT, wait), (c.STEP_DURATION, total)):
        p = mem.point(metric)
        assert tuple(p.explicit_bounds) == DURATION_BUCKETS
        assert p.count == 1 and p.bucket_counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] == 1

    for _ in run.data(sleepy_loader(2, 0.02)):
        with run.step(samples=8):
            pass
    assert mem.point(c.DATA_WAIT).count == 3 and mem.value(c.DATA_WAIT) >= 0.06
    assert mem.value(c.STEPS) == 3 and mem.value(c.SAMPLES_TRAINED) == 24
    # names and units as the catalog has them, for everything recorded
    recorded = mem.metrics()
    for metric in c.OTEL:
        if metric.otel_name in recorded:
            assert recorded[metric.otel_name].unit == metric.otel_unit, metric.otel_name


def test_goodput_and_badput_by_cause_add_up_to_wall_time(mem):
    t0 = time.perf_counter()
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    time.sleep(0.03)  # startup: model building before the first batch
    for i in run.data(sleepy_loader(3, 0.02)):
        with run.step():
            time.sleep(0.01)
            if i == 1:
                with run.checkpoint():  # inside a step: checkpoint badput, not goodput
                    time.sleep(0.015)
        t_end = time.perf_counter()
        if i == 0:
            with run.checkpoint():  # between steps: checkpoint badput, not idle as well
                time.sleep(0.015)
            time.sleep(0.02)  # idle (e.g. evaluation)
    elapsed = t_end - t0
    good = mem.value(c.GOODPUT)
    bad = {p.attributes["cause"]: p.value for p in mem.points(c.BADPUT)}
    assert set(bad) == {"startup", "data_wait", "checkpoint", "idle"}
    assert 0.03 <= bad["startup"] < 0.3
    assert 0.02 <= bad["idle"] < 0.3
    assert bad["data_wait"] == pytest.approx(mem.value(c.DATA_WAIT), rel=1e-9) and bad["data_wait"] >= 0.06
    ckpt = mem.point(c.CHECKPOINT_DURATION)
    assert ckpt.count == 2 and tuple(ckpt.explicit_bounds) == DURATION_BUCKETS
    assert bad["checkpoint"] == pytest.approx(ckpt.sum, rel=1e-9) and bad["checkpoint"] >= 0.03
    assert 0.03 <= good <= mem.value(c.STEP_DURATION) - mem.value(c.DATA_WAIT) - 0.015 + 1e-9
    accounted = good + sum(bad.values())
    assert accounted <= elapsed + 1e-3, (accounted, elapsed, bad)  # no second counted twice
    assert accounted >= 0.8 * elapsed


def test_flops_counter_and_peak_gauge_give_mfu_over_a_window(mem):
    """MFU is rate(FLOPs) / peak FLOP/s over the rules' window: a FLOPs counter and a peak gauge,
    not the last step's ratio (which swung 6x between scrapes of a steady run)."""
    run = instrument.TrainingRun(mem.tel, flops_per_step=2e9, peak_flops=1e12, timer=WallTimer())
    with run.step():
        time.sleep(0.02)
    assert mem.value(c.FLOPS) == 2e9 and mem.value(c.PEAK_FLOPS) == 1e12
    with run.step(flops=4e9):  # a per-step count overrides flops_per_step
        time.sleep(0.02)
    assert mem.value(c.FLOPS) == 6e9

    other = Mem()
    no_flops = instrument.TrainingRun(other.tel, timer=WallTimer())
    with no_flops.step():
        pass
    assert other.points(c.FLOPS) == [] and other.points(c.PEAK_FLOPS) == [] and other.value(c.STEPS) == 1


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12), ("NVIDIA H100 PCIe", "torch.bfloat16", 756e12),
    ("NVIDIA H200", "fp8", 1979e12), ("NVIDIA A100-SXM4-80GB", "float16", 312e12), ("NVIDIA L40S", "tf32", 183e12),
    ("NVIDIA A100-SXM4-80GB", "fp8", None), ("Tesla T4", "fp16", None)])
def test_peak_flops_lookup_by_gpu_and_dtype(name, dtype, peak):
    from gpuobs.instrument.flops import peak_flops

    assert peak_flops(name, dtype) == peak


class CountingTensor:
    """A 0-d tensor stand-in counting .item() calls (each is a CUDA sync on a real GPU tensor)."""

    def __init__(self, value: float):
        self.value, self.calls = value, 0

    def item(self) -> float:
        self.calls += 1
        return self.value


def test_loss_grad_norm_and_lr_are_read_lazily(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer(), report_interval_s=3600)
    loss, norm = CountingTensor(2.5), CountingTensor(0.75)
    optimizer = types.SimpleNamespace(param_groups=[{"lr": 3e-4}, {"lr": 1.0}])
    for _ in range(50):
        with run.step():
            pass
        run.report(loss=loss, grad_norm=norm, lr=optimizer)
    assert loss.calls == 0 and norm.calls == 0  # no .item() in the hot path
    assert mem.points(c.LOSS) == [] and mem.points(c.LEARNING_RATE) == []
    run.flush()
    assert (loss.calls, norm.calls) == (1, 1)
    assert mem.value(c.LOSS) == 2.5 and mem.value(c.GRAD_NORM) == 0.75
    assert mem.value(c.LEARNING_RATE) == 3e-4  # the first param group's
    optimizer.param_groups[0]["lr"] = 1e-4  # read at the next flush, not when reported
    run.report(loss=lambda: 1.25)  # callables are read lazily too
    run.flush()
    assert mem.value(c.LEARNING_RATE) == 1e-4 and mem.value(c.LOSS) == 1.25

    broken = types.SimpleNamespace(item=lambda: 1 / 0)
    run.report(grad_norm=broken)
    run.flush()  # a value that cannot be read does not break training
    assert mem.value(c.GRAD_NORM) == 0.75


def test_reported_values_are_read_once_per_interval(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer(), report_interval_s=0.3)
    loss = CountingTensor(1.0)
    t0 = time.monotonic()
    for _ in range(20):
        with run.step():
            pass
        run.report(loss=loss)
    if time.monotonic() - t0 < 0.25:  # (a very slow machine could have passed the interval)
        assert loss.calls == 0
    time.sleep(0.35)
    with run.step():
        pass
    with run.step():
        pass
    assert loss.calls == 1 and mem.value(c.LOSS) == 1.0


# ----------------------------------------------------------------------------------- GPU timing


class FakeGPU:
    """Stand-in for a CUDA stream: events record the stream's clock (ms, advanced by the test)
    and complete only when the test releases them."""

    def __init__(self):
        self.now_ms, self.seq, self.done_upto, self.syncs = 0.0, 0, -1, 0

    def event(self) -> "FakeEvent":
        return FakeEvent(self)

    def release(self, events: int | None = None) -> None:
        self.done_upto = self.seq - 1 if events is None else events - 1


class FakeEvent:
    def __init__(self, gpu: FakeGPU):
        self.gpu, self.seq, self.t = gpu, None, None

    def record(self) -> None:
        self.seq, self.t = self.gpu.seq, self.gpu.now_ms
        self.gpu.seq += 1

    def query(self) -> bool:
        return self.seq <= self.gpu.done_upto

    def synchronize(self) -> None:
        self.gpu.syncs += 1
        self.gpu.done_upto = max(self.gpu.done_upto, self.seq)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.query() and end.query(), "elapsed_time on an event that has not completed"
        return end.t - self.t


def test_cuda_events_are_resolved_later_without_synchronizing(mem):
    gpu = FakeGPU()
    run = instrument.TrainingRun(mem.tel, flops_per_step=1e9, peak_flops=1e11, timer=CudaEventTimer(gpu.event))
    for ms in (40, 50, 60):
        with run.step(samples=1):
            gpu.now_ms += ms  # the GPU work this step enqueued
    run.flush()
    assert mem.points(c.STEPS) == [] and mem.points(c.STEP_DURATION) == []  # nothing completed yet
    assert mem.spans("train.step") and gpu.syncs == 0  # spans end at once; timing waits

    gpu.release(events=4)  # the first two steps' start and end events
    run.flush()
    assert mem.value(c.STEPS) == 2
    assert mem.value(c.STEP_DURATION) == pytest.approx(0.09)
    assert mem.value(c.FLOPS) == 2e9  # counted as the steps resolve

    gpu.release()
    with run.step(samples=1):  # a later step's end resolves the earlier ones that completed
        gpu.now_ms += 10
    assert mem.value(c.STEPS) == 3 and mem.value(c.SAMPLES_TRAINED) == 3
    assert mem.value(c.STEP_DURATION) == pytest.approx(0.15)
    assert mem.value(c.GOODPUT) == pytest.approx(0.15)
    assert gpu.syncs == 0
    gpu.release()
    run.flush()
    assert mem.value(c.STEPS) == 4 and gpu.syncs == 0


def test_cuda_events_sync_option_records_each_step_at_once(mem):
    gpu = FakeGPU()
    run = instrument.TrainingRun(mem.tel, timer=CudaEventTimer(gpu.event, sync=True))
    for n, ms in enumerate((30, 20), start=1):
        with run.step():
            gpu.now_ms += ms
        assert mem.value(c.STEPS) == n and gpu.syncs == n
    assert mem.value(c.STEP_DURATION) == pytest.approx(0.05)


def test_cpu_timing_is_the_wall_clock(mem):
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        assert isinstance(default_timer(), WallTimer) and isinstance(default_timer(sync=True), WallTimer)
        assert isinstance(instrument.TrainingRun(mem.tel).timer, WallTimer)
    timer = WallTimer()
    token = timer.start()
    time.sleep(0.02)
    assert 0.02 <= timer.stop(token) < 0.3 and list(timer.poll()) == []


# -------------------------------------------------------------------------------- disabled path


def _whole_loop(tel) -> None:
    run = instrument.TrainingRun(tel, flops_per_step=1.0, peak_flops=1.0, timer=WallTimer(), report_interval_s=0)
    for _ in run.data(range(3)):
        with run.step(samples=1, tokens=2):
            with run.phase("forward"), run.micro_step():
                pass
        run.report(loss=CountingTensor(1.0), lr=0.1)
        with run.checkpoint():
            pass
    run.flush()
    with instrument.request("m", batch_size=2, telemetry=tel) as r:
        r.first_token()
        r.tokens(input=1, output=1)


def test_disabled_by_otel_sdk_disabled_records_nothing(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tel = instrument.configure(span_exporters=[spans], metric_readers=[reader])
    assert not tel.enabled and instrument.current() is tel
    _whole_loop(tel)
    assert spans.get_finished_spans() == ()
    assert reader.get_metrics_data() is None  # never attached to a provider
    tel.shutdown(timeout_s=1)


def test_nothing_configured_is_disabled():
    assert not instrument.current().enabled  # before any configure()
    tel = instrument.configure()
    assert not tel.enabled and tel.tracer_provider is None and tel.meter_provider is None
    _whole_loop(tel)
    assert tel.spans_dropped == 0


def test_configure_logs_one_line_naming_where_telemetry_goes(caplog, monkeypatch):
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    def lines(**kw) -> list[str]:
        caplog.clear()
        with caplog.at_level("INFO", logger="gpuobs"):
            instrument.configure(**kw).shutdown(timeout_s=0.5)
        return [r.getMessage() for r in caplog.records if r.name.startswith("gpuobs") and r.levelname == "INFO"]

    [line] = lines()
    assert "off" in line and "nothing to export to" in line
    [line] = lines(enabled=False, span_exporters=[InMemorySpanExporter()])
    assert "off (enabled=False)" in line
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    [line] = lines(endpoint="http://127.0.0.1:9")
    assert "OTEL_SDK_DISABLED" in line
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    [line] = lines(endpoint="http://127.0.0.1:9", protocol="http/protobuf", span_exporters=[ConsoleSpanExporter()])
    assert "OTLP http/protobuf to http://127.0.0.1:9" in line and "ConsoleSpanExporter" in line
    with socket.socket() as taken:  # a port someone else holds: said, not claimed as served
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        [line] = lines(prometheus_port=port, prometheus_addr="127.0.0.1")
    assert f"port {port} not served" in line and "Prometheus scrape" not in line
    caplog.clear()
    with caplog.at_level("INFO", logger="gpuobs"):
        monkeypatch.setattr(telemetry, "_current", None)
        instrument.current()  # the lazy default is not a configuration: no line
    assert not [r for r in caplog.records if r.levelname == "INFO"]


def test_disabled_steps_cost_little():
    tel = instrument.configure(enabled=False)
    run = instrument.TrainingRun(tel, timer=WallTimer())
    n = 20000

    def bare():
        for _i in range(n):
            pass

    def instrumented():
        for i in run.data(range(n)):
            with run.step(samples=1):
                pass
            run.report(loss=i)

    bare_s = min(timeit.repeat(bare, number=1, repeat=5))
    inst_s = min(timeit.repeat(instrumented, number=1, repeat=5))
    per_step_us = (inst_s - bare_s) / n * 1e6
    assert per_step_us < 20, f"{per_step_us:.1f} µs per disabled step"


# ------------------------------------------------------------------------------------- configure


def _resource(mem: Mem) -> dict:
    with instrument.TrainingRun(mem.tel, timer=WallTimer()).step():
        pass
    return dict(mem.spans("train.step")[0].resource.attributes)


def test_configure_reads_otel_and_torchrun_variables(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "svc-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,team=ml")
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "te-42"}.items():
        monkeypatch.setenv(k, v)
    mem = Mem(env=None)
    attrs = _resource(mem)
    assert attrs["service.name"] == "svc-env"
    assert attrs["deployment.environment"] == "prod" and attrs["team"] == "ml"
    assert (attrs["gpuobs.rank"], attrs["gpuobs.world_size"], attrs["gpuobs.local_rank"]) == (5, 8, 1)
    assert attrs["gpuobs.job.id"] == "te-42" and attrs["host.name"] == socket.gethostname()
    assert mem.tel.env.launcher == "torchrun"
    assert mem.value(c.STEPS, **dict(zip(c.RUN_LABELS, ("5", "te-42")))) == 1


def test_configure_service_name_precedence(monkeypatch):
    assert _resource(Mem(env=None))["service.name"] == "training"  # the default
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs")
    assert _resource(Mem(env=None))["service.name"] == "from-attrs"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-var")
    assert _resource(Mem(env=None))["service.name"] == "from-var"
    assert _resource(Mem(env=None, service_name="explicit"))["service.name"] == "explicit"


def test_configure_reads_slurm_variables(monkeypatch):
    for k, v in {"SLURM_JOB_ID": "777", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16",
                 "SLURMD_NODENAME": "gpu-node-9"}.items():
        monkeypatch.setenv(k, v)
    mem = Mem(env=None)
    attrs = _resource(mem)
    assert (attrs["gpuobs.rank"], attrs["gpuobs.local_rank"], attrs["gpuobs.world_size"]) == (3, 1, 16)
    assert attrs["gpuobs.job.id"] == "777" and attrs["host.name"] == "gpu-node-9"
    assert mem.tel.env.launcher == "slurm"
    assert mem.value(c.STEPS, **dict(zip(c.RUN_LABELS, ("3", "777")))) == 1


def test_configure_reads_kubernetes_variables(monkeypatch):
    for k, v in {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "trainer-0", "POD_NAMESPACE": "ml",
                 "NODE_NAME": "node-a", "RANK": "2", "WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(k, v)
    attrs = _resource(Mem(env=None))
    assert attrs["k8s.pod.name"] == "trainer-0" and attrs["k8s.namespace.name"] == "ml"
    assert attrs["k8s.node.name"] == "node-a" and attrs["host.name"] == "node-a"
    assert attrs["gpuobs.rank"] == 2


def test_configure_spans_false_records_metrics_only():
    mem = Mem(spans=False)
    assert mem.tel.tracer_provider is None
    with instrument.TrainingRun(mem.tel, timer=WallTimer()).step():
        pass
    assert mem.span_exporter.get_finished_spans() == () and mem.value(c.STEPS) == 1


# ------------------------------------------------------------------------------------- inference


def test_inference_request_metrics_and_span(mem):
    with instrument.request(model="llama-3-8b", batch_size=4) as r:
        time.sleep(0.01)
        r.first_token()
        r.first_token()  # only the first counts
        time.sleep(0.01)
        r.tokens(input=12, output=34)
    genai = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-3-8b", "rank": "3"}
    duration = mem.point(c.REQUEST_DURATION, **genai)
    ttft = mem.point(c.TIME_TO_FIRST_TOKEN, **genai)
    assert tuple(duration.explicit_bounds) == DURATION_BUCKETS == tuple(ttft.explicit_bounds)
    assert duration.count == 1 and 0.02 <= duration.sum < 0.5
    assert ttft.count == 1 and 0.01 <= ttft.sum < duration.sum - 0.01 + 1e-3
    assert "error.type" not in duration.attributes
    assert mem.value(c.INFERENCE_TOKENS, **genai, **{"gen_ai.token.type": "input"}) == 12
    assert mem.value(c.INFERENCE_TOKENS, **genai, **{"gen_ai.token.type": "output"}) == 34
    batch = mem.point(c.BATCH_SIZE, **genai)
    assert tuple(batch.explicit_bounds) == BATCH_BUCKETS and batch.sum == 4 and batch.count == 1
    # no error: only the model's _OTHER series, at 0 since its first request (the rules' birth reference)
    assert [(p.attributes["error.type"], p.value) for p in mem.points(c.INFERENCE_ERRORS)] == [("_OTHER", 0)]
    span = mem.spans("chat llama-3-8b")[0]
    assert span.kind is SpanKind.SERVER and span.status.status_code is not StatusCode.ERROR
    assert span.attributes["gen_ai.request.model"] == "llama-3-8b"
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.usage.input_tokens"] == 12 and span.attributes["gen_ai.usage.output_tokens"] == 34


def test_inference_error_counts_and_marks_the_span(mem):
    with pytest.raises(RuntimeError):
        with instrument.request(model="m", operation="text_completion"):
            raise RuntimeError("out of memory")
    genai = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": "m", "error.type": "RuntimeError"}
    assert mem.value(c.INFERENCE_ERRORS, **genai) == 1
    assert mem.point(c.REQUEST_DURATION, **genai).count == 1
    assert mem.points(c.TIME_TO_FIRST_TOKEN) == [] and mem.points(c.BATCH_SIZE) == []
    span = mem.spans("text_completion m")[0]
    assert span.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in span.events)


def test_error_counters_exist_at_0_before_the_first_failure(mem):
    """A rank's failed-step counter and a model's error counter are exported at 0 (exception "other",
    error.type "_OTHER") from the run's start and the model's first request, before any failure: the
    rules count the failures a new type's series is born with against them (records.born_watched).
    One such series per rank and per model; the first real failure adds its own series at 1."""
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    assert {p.attributes["exception"]: p.value for p in mem.points(c.STEPS_FAILED)} == {"other": 0}
    with run.step(samples=1):
        pass
    assert {p.attributes["exception"]: p.value for p in mem.points(c.STEPS_FAILED)} == {"other": 0}
    with pytest.raises(ValueError):
        with run.step(samples=1):
            raise ValueError("bad batch")
    assert {p.attributes["exception"]: p.value for p in mem.points(c.STEPS_FAILED)} == {"other": 0, "ValueError": 1}
    r = instrument.start_request(model="m3")
    assert {p.attributes["error.type"]: p.value for p in mem.points(c.INFERENCE_ERRORS)} == {"_OTHER": 0}
    r.finish()
    instrument.start_request(model="m3").finish("timeout")
    errors = {p.attributes["error.type"]: p.value for p in mem.points(c.INFERENCE_ERRORS)}
    assert errors == {"_OTHER": 0, "timeout": 1}  # one zero series per model, not one per request


def test_trace_request_decorator(mem):
    @instrument.trace_request(model="m1")
    def generate(prompt, request=None):
        request.first_token()
        request.tokens(input=len(prompt), output=3)
        return prompt.upper()

    @instrument.trace_request(model="m2")
    def plain(prompt):
        request = {"prompt": prompt}  # a local that happens to be called request: not a parameter
        return request["prompt"]

    assert generate("abcd") == "ABCD" and plain("x") == "x"
    assert mem.value(c.INFERENCE_TOKENS, **{"gen_ai.request.model": "m1", "gen_ai.token.type": "input"}) == 4
    assert mem.point(c.TIME_TO_FIRST_TOKEN, **{"gen_ai.request.model": "m1"}).count == 1
    assert mem.point(c.REQUEST_DURATION, **{"gen_ai.request.model": "m2"}).count == 1
    assert {s.name for s in mem.spans()} == {"chat m1", "chat m2"}
    assert inference.Request is instrument.Request


# ------------------------------------------------------------------------------- over the wire


def _any_value(v):
    return getattr(v, v.WhichOneof("value"))


def test_otlp_http_export_to_a_real_receiver(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    receiver = OTLPReceiver()
    try:
        tel = instrument.configure(service_name="wire-test", endpoint=receiver.url, export_interval_s=0.2)
        assert tel.enabled
        run = instrument.TrainingRun(tel, timer=WallTimer())
        for i in run.data(sleepy_loader(3, 0.005)):
            with run.step(samples=2):
                if i == 2:
                    with run.checkpoint():
                        pass
        deadline = time.monotonic() + 5  # periodic metric export, before any shutdown
        while not receiver.metrics and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver.metrics, "no periodic metrics export within 5 s at a 0.2 s interval"
        t = time.monotonic()
        tel.shutdown(timeout_s=5)
        assert time.monotonic() - t < 5
    finally:
        receiver.close()

    spans = []
    for req in receiver.traces:
        for rs in req.resource_spans:
            resource = {kv.key: _any_value(kv.value) for kv in rs.resource.attributes}
            spans += [(resource, s) for ss in rs.scope_spans for s in ss.spans]
    assert spans, receiver.paths
    for resource, _ in spans:
        assert resource["service.name"] == "wire-test"
        assert resource["gpuobs.rank"] == 2 and resource["gpuobs.world_size"] == 4
    spans = [s for _, s in spans]
    steps = [s for s in spans if s.name == "train.step"]
    assert len(steps) == 3 and all(s.parent_span_id == b"" for s in steps)
    assert sorted({kv.key: _any_value(kv.value) for kv in s.attributes}["gpuobs.step"] for s in steps) == [1, 2, 3]
    by_id = {s.span_id: s for s in steps}
    waits = [s for s in spans if s.name == "train.data_wait"]
    assert len(waits) == 3
    for w in waits:
        step = by_id[w.parent_span_id]
        assert w.trace_id == step.trace_id and w.start_time_unix_nano == step.start_time_unix_nano
        assert w.end_time_unix_nano <= step.end_time_unix_nano
        assert w.end_time_unix_nano - w.start_time_unix_nano >= 5_000_000
    (ckpt,) = [s for s in spans if s.name == "train.checkpoint"]
    assert ckpt.parent_span_id in by_id and ckpt.trace_id == by_id[ckpt.parent_span_id].trace_id

    histograms = [(rm, m) for req in receiver.metrics for rm in req.resource_metrics for sm in rm.scope_metrics
                  for m in sm.metrics if m.name == c.STEP_DURATION.otel_name]
    assert histograms
    rm, last = histograms[-1]
    assert last.unit == "s"
    (point,) = last.histogram.data_points
    assert tuple(point.explicit_bounds) == DURATION_BUCKETS and point.count == 3
    assert {kv.key: _any_value(kv.value) for kv in point.attributes}["rank"] == "2"
    assert {kv.key: _any_value(kv.value) for kv in rm.resource.attributes}["service.name"] == "wire-test"


# ------------------------------------------------------------------------------------ Prometheus

PROMETHEUS_SCRIPT = textwrap.dedent('''
    import json, sys, time, urllib.request
    from gpuobs import instrument
    from gpuobs.instrument.timing import WallTimer

    port = int(sys.argv[1])

    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    def work(tel):
        run = instrument.TrainingRun(tel, flops_per_step=1e9, peak_flops=1e12, timer=WallTimer())
        for i in run.data(range(3)):
            with run.step(samples=2, tokens=16):
                with run.micro_step():
                    pass
            run.report(loss=1.5, grad_norm=0.25, lr=1e-3)
        try:
            with run.step(samples=2):  # a failed step: counted as such, not as progress
                raise ValueError("bad batch")
        except ValueError:
            pass
        with run.checkpoint():
            pass
        run.flush()
        run.report(loss=float("nan"))  # a diverged run: counted, since gauges ignore NaN
        run.flush()
        with instrument.request("m1", batch_size=2) as r:
            r.first_token()
            r.tokens(input=3, output=4)
        try:
            with instrument.request("m1"):
                raise RuntimeError("x")
        except RuntimeError:
            pass

    tel = instrument.configure(prometheus_port=port, prometheus_addr="127.0.0.1")
    addr = tel.http_server.server_address[0]
    work(tel)
    first = scrape()
    tel.shutdown(timeout_s=2)
    tel = instrument.configure(prometheus_port=port)  # again, on the same port
    work(tel)
    second = scrape()
    tel.shutdown(timeout_s=2)
    print(json.dumps({"first": first, "second": second, "addr": addr}))
''')


def test_prometheus_names_match_the_catalog():
    """configure(prometheus_port=...) in a subprocess (prometheus_client's global registry and
    HTTP server): every training and inference metric of the catalog appears under its
    Prometheus sample names and labels, and a second configure() can serve on the same port."""
    from prometheus_client.parser import text_string_to_metric_families

    env = {k: v for k, v in os.environ.items() if k not in RUN_ENV_VARS}
    env.update(RANK="1", WORLD_SIZE="2", GPUOBS_JOB_ID="job-prom", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", PROMETHEUS_SCRIPT, str(free_port())], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scrapes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert scrapes["addr"] == "127.0.0.1"  # the bind address is configurable (default 0.0.0.0)
    for key in ("first", "second"):
        samples = [s for fam in text_string_to_metric_families(scrapes[key]) for s in fam.samples]
        names = {s.name for s in samples}
        for metric in c.OTEL:
            assert metric.family in c.APP_FAMILIES
            for sample_name in metric.prometheus_samples:
                assert sample_name in names, f"{key}: {sample_name} ({metric.otel_name}) not in the scrape"
                for s in (s for s in samples if s.name == sample_name):
                    labels = {k for k in s.labels if not k.startswith("otel_scope_") and k != "le"}
                    assert labels <= set(metric.labels), (sample_name, labels, metric.labels)
                    if "rank" in metric.labels:
                        assert s.labels["rank"] == "1" and s.labels["job_id"] == "job-prom", s.labels
                    if metric.kind == "histogram" and sample_name.endswith("_bucket"):
                        buckets = BATCH_BUCKETS if metric.otel_unit != "s" else DURATION_BUCKETS
                        assert {float(s.labels["le"]) for s in samples if s.name == sample_name} == \
                            {float(b) for b in buckets} | {float("inf")}
        ours = {n for n in names if n.startswith(("gpuobs_", "gen_ai_"))}
        expected = {n for m in c.OTEL for n in m.prometheus_samples}
        assert ours == expected, ours ^ expected
        value = {(s.name, s.labels.get("cause")): s.value for s in samples}
        assert value[(c.STEPS.exposed_name, None)] == 3 and value[(c.SAMPLES_TRAINED.exposed_name, None)] == 6
        assert value[(c.STEPS_FAILED.exposed_name, None)] == 1
        assert value[(c.LOSS.name, None)] == 1.5 and value[(c.LEARNING_RATE.name, None)] == 1e-3


# ------------------------------------------------------------------- misuse found in review


def test_data_wrapper_is_reiterable_like_a_loader(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    data = run.data([10, 20, 30])
    assert [list(data) for _ in range(2)] == [[10, 20, 30], [10, 20, 30]] and len(data) == 3
    assert next(run.data(iter([7, 8]))) == 7


def test_batches_fetched_inside_a_step_are_that_steps_wait_not_goodput(mem):
    t0 = time.perf_counter()
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    it = iter(run.data(sleepy_loader(6, 0.02)))
    for _ in range(3):
        with run.step():
            next(it)  # gradient accumulation: two micro-batches fetched inside the step
            next(it)
            time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    good = mem.value(c.GOODPUT)
    waited = mem.value(c.DATA_WAIT)
    assert waited >= 0.12 and 0.03 <= good < 0.06
    bad = sum(p.value for p in mem.points(c.BADPUT))
    assert good + bad <= elapsed + 1e-3  # nothing counted twice
    assert mem.point(c.DATA_WAIT).count == 3  # one wait per step


def test_a_step_inside_a_step_is_one_step(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    for _ in range(3):
        with run.step():
            with run.step():  # e.g. a decorated function called inside a step
                time.sleep(0.005)
    assert mem.value(c.STEPS) == 3 and len(mem.spans("train.step")) == 3


def test_non_finite_loss_is_counted_not_hidden(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    run.report(loss=2.0)
    run.flush()
    run.report(loss=float("nan"), grad_norm=float("inf"))
    run.flush()
    assert mem.value(c.LOSS) == 2.0  # gauges ignore NaN ...
    assert mem.value(c.NONFINITE, value="loss") == 1 and mem.value(c.NONFINITE, value="grad_norm") == 1


def test_a_failing_timer_never_breaks_the_step(mem):
    class Broken:
        def start(self):
            raise RuntimeError("cuda event record failed")

        def stop(self, token, payload=None):
            raise AssertionError("not reached: start failed")

        def poll(self):
            return iter(())

    run = instrument.TrainingRun(mem.tel, timer=Broken())
    with pytest.raises(ValueError, match="user"):
        with run.step():
            raise ValueError("user error")  # the user's exception, not the timer's
    with run.step():
        pass
    assert mem.value(c.STEPS) == 1 and mem.value(c.STEPS_FAILED, exception="ValueError") == 1  # both recorded
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN  # no span left current


def test_trace_request_rejects_async_and_generator_functions():
    with pytest.raises(TypeError, match="async or a generator"):
        @instrument.trace_request(model="m")
        async def handler():
            pass
    with pytest.raises(TypeError, match="async or a generator"):
        @instrument.trace_request(model="m")
        def stream():
            yield 1


def test_prometheus_port_is_offset_by_local_rank_and_a_busy_port_is_not_fatal(monkeypatch):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        base = busy.getsockname()[1]
        monkeypatch.setenv("GPUOBS_PROMETHEUS_PORT", str(base - 1))
        tel = instrument.configure(env=RunEnv(rank=1, local_rank=1))  # base - 1 + 1: the busy port
        try:
            assert tel.enabled and tel.http_server is None  # carried on without the endpoint
        finally:
            tel.shutdown(timeout_s=2)


# ------------------------------------------------------------- issue 12: signals that hold up


class ScriptedTimer(WallTimer):
    """A step timer returning given durations (seconds): steps of 1 ms to 100 s without waiting."""

    def __init__(self, durations):
        self.durations = iter(durations)

    def stop(self, token, payload=None) -> float:
        return next(self.durations)


def _bucket_quantile(point, q: float) -> float:
    """What Prometheus's histogram_quantile() makes of an explicit-bucket histogram point: linear
    interpolation inside the bucket holding the rank (the estimate the rules used before)."""
    bounds, counts = list(point.explicit_bounds), list(point.bucket_counts)
    rank, seen = q * point.count, 0
    for i, n in enumerate(counts):
        if seen + n >= rank and n:
            lo = bounds[i - 1] if i > 0 else 0.0
            hi = bounds[i] if i < len(bounds) else bounds[-1]
            return lo + (hi - lo) * (rank - seen) / n
        seen += n
    return bounds[-1]


def test_step_quantiles_are_within_5_percent_of_ground_truth_from_1ms_to_100s():
    """p50 and p99 exported for step times spread around 1 ms ... 100 s against the test's own
    quantiles of the same durations: within 5 % everywhere. The bucket estimate the rules used
    before (histogram_quantile over the explicit buckets) misses by far more on the same data."""
    import random
    import statistics

    rng = random.Random(12)
    worst_ours, worst_buckets = 0.0, 0.0
    for median in (0.001, 0.0037, 0.02, 0.075, 0.3, 1.7, 8.0, 42.0, 100.0):
        m = Mem(quantile_window_s=1e9)
        durations = [median * rng.lognormvariate(0, 0.15) for _ in range(500)]
        run = instrument.TrainingRun(m.tel, timer=ScriptedTimer(durations))
        for _ in durations:
            with run.step():
                pass
        truth = statistics.quantiles(durations, n=100, method="inclusive")
        for q, true in ((0.5, truth[49]), (0.99, truth[98])):
            ours = m.value(c.STEP_QUANTILE, quantile=f"{q:g}")
            worst_ours = max(worst_ours, abs(ours / true - 1))
            worst_buckets = max(worst_buckets, abs(_bucket_quantile(m.point(c.STEP_DURATION), q) / true - 1))
        m.tel.shutdown(timeout_s=1)
    assert worst_ours <= 0.05, worst_ours
    assert worst_buckets > 0.2, worst_buckets  # why the rules no longer read the buckets


def test_quantile_window_drops_old_observations():
    """A quantile is over the last window only: once every observation is older, no point is
    exported (no stale p99 reported as current)."""
    m = Mem(quantile_window_s=0.2)
    run = instrument.TrainingRun(m.tel, timer=ScriptedTimer([0.5, 0.7]))
    with run.step():
        pass
    assert m.value(c.STEP_QUANTILE, quantile="0.5") == 0.5
    time.sleep(0.3)
    with run.step():
        pass
    assert m.value(c.STEP_QUANTILE, quantile="0.5") == 0.7  # the older step left the window
    time.sleep(0.3)
    assert m.points(c.STEP_QUANTILE) == []


def test_request_latency_quantiles_match_the_requests_the_test_timed():
    m = Mem()
    timed = []
    for i in range(40):
        with instrument.request("m1", telemetry=m.tel, provider="vllm") as r:
            t0 = time.perf_counter()
            time.sleep(0.005 + 0.0005 * i)
            r.first_token()
            r.tokens(input=10, output=5)
            timed.append(time.perf_counter() - t0)
    import statistics

    truth = statistics.quantiles(timed, n=100, method="inclusive")
    for q, true in ((0.5, truth[49]), (0.99, truth[98])):
        got = m.value(c.REQUEST_QUANTILE, quantile=f"{q:g}")
        assert abs(got / true - 1) <= 0.05, (q, got, true)
    tpot = m.point(c.TIME_PER_OUTPUT_TOKEN)
    assert tpot.count == 40 and tpot.sum < 0.01  # the first token came last: ~0 per further token
    assert m.value(c.ACTIVE_REQUESTS) == 0
    span = m.spans()[0]
    assert span.attributes["gen_ai.provider.name"] == "vllm"
    assert "gen_ai.provider.name" not in m.point(c.REQUEST_DURATION).attributes  # series stay one per model


def test_error_spans_carry_error_type_and_in_flight_requests_count():
    m = Mem()
    with instrument.request("m1", telemetry=m.tel):
        assert m.value(c.ACTIVE_REQUESTS) == 1
        with pytest.raises(TimeoutError):
            with instrument.request("m1", telemetry=m.tel):
                assert m.value(c.ACTIVE_REQUESTS) == 2
                raise TimeoutError("decode")
    failed = [s for s in m.spans() if s.status.status_code == StatusCode.ERROR]
    assert len(failed) == 1 and failed[0].attributes["error.type"] == "TimeoutError"
    assert m.value(c.ACTIVE_REQUESTS) == 0


def test_collective_blocks_are_collective_wait_not_compute(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    with run.step():
        time.sleep(0.02)
        with run.collective("all_reduce"):
            time.sleep(0.03)
    compute, waited = mem.value(c.COMPUTE), mem.value(c.COLLECTIVE_WAIT)
    assert 0.02 <= compute < 0.03 + 0.01 and 0.03 <= waited < 0.05
    assert compute + waited == pytest.approx(mem.value(c.GOODPUT), rel=1e-9)
    [span] = mem.spans("train.collective")
    assert span.attributes["gpuobs.collective"] == "all_reduce"
    assert span.parent.span_id == mem.spans("train.step")[0].context.span_id


def test_trace_step_passes_samples_tokens_and_the_step(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())

    @run.trace_step(samples=32, tokens=4096)
    def fixed():
        pass

    @run.trace_step(step_arg="gstep")
    def from_batch(batch, gstep):
        gstep.samples, gstep.tokens = len(batch), 10 * len(batch)

    fixed()
    from_batch([1, 2, 3])
    assert (mem.value(c.STEPS), mem.value(c.SAMPLES_TRAINED), mem.value(c.TOKENS_TRAINED)) == (2, 35, 4126)


def test_trace_step_leaves_the_users_own_step_parameter_alone(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    seen = []

    with pytest.warns(DeprecationWarning):  # a `step` without default: the legacy injection, when left out
        @run.trace_step
        def train(batch, step):  # the user's own step counter, passed positionally
            seen.append(step)

    @instrument.trace_step
    def by_keyword(batch, step=0):  # with a default: the user's own, even when left out
        seen.append(step)

    @run.trace_step(step_arg="gstep")
    def both(batch, step, gstep):
        seen.append((step, type(gstep).__name__))
        gstep.samples = len(batch)

    train([1], 7)
    train([1], step=8)
    by_keyword([1])
    by_keyword([1], step=9)
    both([1, 2], 10)
    assert seen == [7, 8, 0, 9, (10, "_Step")]
    instrument.default_run().flush()
    assert mem.value(c.STEPS) == 5 and mem.value(c.SAMPLES_TRAINED) == 2


def test_trace_step_legacy_step_parameter_and_bad_step_arg(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    with pytest.warns(DeprecationWarning, match="step_arg"):
        @run.trace_step
        def legacy(batch, step):  # no default, left out by callers: it received the open step before
            step.samples = len(batch)
    legacy([1, 2, 3])
    assert mem.value(c.SAMPLES_TRAINED) == 3
    with pytest.raises(TypeError, match="nope"):
        run.trace_step(lambda batch: None, step_arg="nope")


def test_data_waits_inside_a_step_get_spans(mem):
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    data = iter(run.data(sleepy_loader(3, 0.01)))
    next(data)
    with run.step():
        next(data)  # a micro-batch fetched inside the step
        next(data)
    [step] = mem.spans("train.step")
    waits = [s for s in mem.spans("train.data_wait")]
    assert len(waits) == 3 and all(s.parent.span_id == step.context.span_id for s in waits)


GLOBAL_SCRIPT = textwrap.dedent('''
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from gpuobs import instrument
    from gpuobs.instrument.timing import WallTimer

    spans = InMemorySpanExporter()
    tel = instrument.configure(span_exporters=[spans], set_global=sys.argv[1] == "1")
    run = instrument.TrainingRun(tel, timer=WallTimer())
    with run.step():
        with trace.get_tracer("user.code").start_as_current_span("user.work"):
            pass
    tel.tracer_provider.force_flush()
    got = {s.name: s for s in spans.get_finished_spans()}
    user = got.get("user.work")
    print(json.dumps({"exported": user is not None,
                      "child_of_step": bool(user and user.parent.span_id == got["train.step"].context.span_id)}))
''')


@pytest.mark.parametrize("set_global, exported", [(True, True), (False, False)])
def test_configure_installs_global_providers_so_user_spans_nest_under_the_step(set_global, exported):
    """A user's span (or another instrumentation's) from OTel's global tracer, inside a step: with
    configure()'s default it is exported with gpuobs's spans as a child of train.step; with
    set_global=False the global tracer stays the no-op one."""
    env = {k: v for k, v in os.environ.items() if k not in RUN_ENV_VARS}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", GLOBAL_SCRIPT, "1" if set_global else "0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"exported": exported, "child_of_step": exported}


# ------------------------------------------------ issue 14: providers apart from recording


def test_run_environment_is_shared_and_still_importable_from_instrument():
    from gpuobs.runenv import RunEnv as Shared

    assert RunEnv is Shared and instrument.RunEnv is Shared


def test_every_catalog_metric_has_one_recorder_chosen_per_metric(mem):
    """instrument() gives a Recorder for each recorded metric: held values for the per-step
    counters and gauges (telemetry.HELD), the SDK instrument for the rest; the quantile and drop
    gauges and how the run ended (instrument/ending.py) are observed by gpuobs itself and take no recordings."""
    from gpuobs.instrument.recorders import LocalValues, Recorder, SyncRecorder

    observed = {q.name for q in c.QUANTILES.values()} | {c.SPANS_DROPPED.name, c.LOGS_DROPPED.name,
                                                          c.LOG_LINES_TRUNCATED.name, c.LOG_PATTERN_MATCHES.name,
                                                          c.RUN_END.name, c.RUN_CRASH.name, c.RANK_INFO.name}
    for m in c.OTEL:
        if m.name in observed:
            with pytest.raises(TypeError):
                mem.tel.instrument(m)
            continue
        rec = mem.tel.instrument(m)
        assert isinstance(rec, Recorder)
        assert isinstance(rec, LocalValues if m.name in telemetry.HELD else SyncRecorder), m.name
        if m.kind == "histogram":
            assert m.name not in telemetry.HELD  # the SDK aggregates buckets
    assert telemetry.HELD.isdisjoint(observed)
    sync = mem.tel.instrument(c.INFERENCE_TOKENS)  # a cell works for every recorder
    sync.cell({**TRAIN_LABELS, "gen_ai.request.model": "m", "gen_ai.token.type": "input"}).add(5)
    assert mem.value(c.INFERENCE_TOKENS, **{"gen_ai.request.model": "m"}) == 5
    with pytest.raises(TypeError):
        mem.tel.instrument(c.STEPS).record(1.0, TRAIN_LABELS)


def test_telemetry_records_into_the_providers_it_is_given():
    """Like a contrib instrumentor: tracer and meter come from the providers passed in, under the
    scope gpuobs.instrument and gpuobs's version; shutdown flushes providers it does not own."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import gpuobs
    from gpuobs.instrument.providers import Providers

    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader])
    tel = telemetry.Telemetry(RunEnv(rank=1), Providers(tracer_provider, meter_provider, owned=False))
    assert tel.enabled and tel.tracer_provider is tracer_provider and tel.meter_provider is meter_provider
    with instrument.TrainingRun(tel, timer=WallTimer()).step(samples=2):
        pass
    tel.shutdown(timeout_s=2)
    (step,) = [s for s in spans.get_finished_spans() if s.name == "train.step"]
    assert (step.instrumentation_scope.name, step.instrumentation_scope.version) == \
        ("gpuobs.instrument", gpuobs.__version__)
    scopes = {sm.scope.name: sm for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics}
    steps = [m for m in scopes["gpuobs.instrument"].metrics if m.name == c.STEPS.otel_name]
    assert steps[0].data.data_points[0].value == 1
    tracer_provider.get_tracer("after").start_span("still-running").end()  # not shut down
    assert spans.get_finished_spans()[-1].name == "still-running"
    assert not telemetry.Telemetry(RunEnv()).enabled  # no providers: disabled


def test_span_processor_counts_what_its_full_queue_drops():
    """The bounded span queue, counted from the outside: with the exporter stuck on a first batch
    of 4, a queue of 8 holds 8 more and each further span pushes one out, counted once."""
    import threading

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult

    from gpuobs.instrument.providers import CountingBatchSpanProcessor

    entered, release, exported = threading.Event(), threading.Event(), []

    class Stuck(InMemorySpanExporter):
        def export(self, batch):
            entered.set()
            release.wait(10)
            exported.extend(s.name for s in batch)
            return SpanExportResult.SUCCESS

    processor = CountingBatchSpanProcessor(Stuck(), max_queue_size=8, schedule_delay_millis=60_000,
                                           max_export_batch_size=4)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(4):
        tracer.start_span(f"s{i}").end()
    assert entered.wait(5)  # the worker took the first batch and is stuck exporting it
    for i in range(4, 30):
        tracer.start_span(f"s{i}").end()
    assert (processor.queued, processor.dropped) == (8, 30 - 4 - 8)
    release.set()
    processor.force_flush()
    assert len(exported) == 12 and processor.queued == 0
    assert exported[-8:] == [f"s{i}" for i in range(22, 30)]  # the oldest were dropped
    provider.shutdown()


def test_nccl_collective_wait_comes_from_the_device_not_from_the_host(mem):
    """On NCCL the host sees an all-reduce complete at enqueue: the DDP timer's device pair (events
    at launch and where the result is ready) is what the step's collective wait and compute read,
    once the step's events have completed (a stand-in stream, as for the CUDA step timer)."""
    from gpuobs.instrument.collectives import DeviceTail

    gpu = FakeGPU()
    run = instrument.TrainingRun(mem.tel, timer=CudaEventTimer(gpu.event))
    with run.step(samples=1):
        gpu.now_ms += 70  # forward and backward
        start = gpu.event()
        start.record()  # the last bucket launched
        gpu.now_ms += 30  # the fast rank waits on the device for the slow one
        end = gpu.event()
        end.record()
        now = time.perf_counter()
        run._comm.launched, run._comm.done, run._comm.device = now, now + 1e-5, DeviceTail(start, end)
    gpu.release()
    run.flush()
    assert mem.value(c.COLLECTIVE_WAIT) == pytest.approx(0.030)  # not the host's 10 µs
    assert mem.value(c.COMPUTE) == pytest.approx(0.070)


@pytest.mark.parametrize("world_size,timed,warned", [(2, False, True), (2, True, False), (1, False, False)])
def test_a_multi_rank_run_without_a_timed_collective_warns_once(caplog, world_size, timed, warned):
    mem = Mem(env=RunEnv(rank=0, world_size=world_size, job_id="j"))
    run = instrument.TrainingRun(mem.tel, timer=WallTimer())
    with caplog.at_level("WARNING", logger="gpuobs.instrument"):
        for _ in range(train.WARN_UNTIMED_AFTER + 10):
            with run.step(samples=1):
                if timed:
                    with run.collective("all_reduce"):
                        time.sleep(0.0005)
    said = [r for r in caplog.records if "no timed collective" in r.getMessage()]
    assert len(said) == (1 if warned else 0)
    mem.tel.shutdown(timeout_s=2)


# ------------------------------------------------ issue 30: where a rank runs, for the slowdown records


def test_rank_info_is_one_series_per_rank_naming_host_pod_and_gpu():
    """gpuobs_training_rank_info: 1, with the rank's job and rank, its host, pod and GPU UUID (what the
    slowdown records join to the exporter's GPU series); empty labels where the environment says nothing."""
    env = RunEnv(rank=3, job_id="job-7", node="n4", pod="trainer-3", namespace="ml", gpu_uuid="GPU-abc")
    mem = Mem(env=env)
    (point,) = mem.points(c.RANK_INFO)
    assert point.value == 1
    assert dict(point.attributes) == {**TRAIN_LABELS, "host": "n4", "k8s_namespace": "ml", "k8s_pod": "trainer-3",
                                      "uuid": "GPU-abc"}
    mem.tel.shutdown(timeout_s=2)
    bare = Mem(env=RunEnv(rank=0, job_id="j", node="box"))
    (point,) = bare.points(c.RANK_INFO)
    assert dict(point.attributes) == {"rank": "0", "job_id": "j", "host": "box", "k8s_namespace": "",
                                      "k8s_pod": "", "uuid": ""}
    bare.tel.shutdown(timeout_s=2)


class _FakeCuda:
    """torch.cuda as _torch_uuid reads it: n devices whose properties carry a uuid."""

    def __init__(self, uuids: list[str], available: bool = True):
        self.uuids, self.available = uuids, available

    def is_available(self):
        return self.available

    def device_count(self):
        return len(self.uuids)

    def current_device(self):
        return 0

    def get_device_properties(self, i):
        return type("Props", (), {"uuid": self.uuids[i]})()


@pytest.mark.parametrize("env, cuda, want", [
    ({"CUDA_VISIBLE_DEVICES": "GPU-1111"}, None, "GPU-1111"),  # the only visible device
    ({"CUDA_VISIBLE_DEVICES": "GPU-1111,GPU-2222", "LOCAL_RANK": "1"}, None, "GPU-2222"),  # the local rank's
    ({"CUDA_VISIBLE_DEVICES": "MIG-3333"}, None, "MIG-3333"),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "1"}, ["aaaa-0", "bbbb-1"], "GPU-bbbb-1"),  # indexes: torch's
    ({"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "0"}, ["GPU-cccc"], "GPU-cccc"),  # already NVML-formatted
    ({"GPUOBS_GPU_UUID": "GPU-sim-1", "CUDA_VISIBLE_DEVICES": "GPU-1111"}, ["dddd"], "GPU-sim-1"),  # explicit wins
    ({"CUDA_VISIBLE_DEVICES": "0"}, None, None),  # an index and no CUDA: unknown
    ({}, [], None),
])
def test_the_rank_s_gpu_uuid_comes_from_each_source_in_order(monkeypatch, env, cuda, want):
    """RunEnv.gpu_uuid: GPUOBS_GPU_UUID, else a UUID entry of CUDA_VISIBLE_DEVICES (the local rank's of
    several), else torch.cuda's device properties (only where torch is imported; GPU-<uuid> as NVML
    writes it), else None."""
    from gpuobs import runenv

    if cuda is None:
        monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=_FakeCuda([], available=False)))
    else:
        monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=_FakeCuda(cuda)))
    assert runenv.RunEnv.detect(env).gpu_uuid == want
    monkeypatch.delitem(sys.modules, "torch")  # never imported by detection: no torch, no UUID from it
    assert runenv.gpu_uuid({"LOCAL_RANK": "0"}, 0) is None
