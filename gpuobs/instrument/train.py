"""Training instrumentation: steps, data waits, checkpoints, phases and micro-steps as spans and
metrics, with goodput/badput accounting and MFU. Works with any loop::

    run = TrainingRun(flops_per_step=6 * params * tokens_per_step, peak_flops=989e12)
    for batch in run.data(loader):          # time inside __next__ is the step's data wait
        with run.step(samples=len(batch), tokens=batch.numel()):
            with run.phase("forward"):
                loss = model(batch)
            ...
        run.report(loss=loss, lr=optimizer)  # read lazily at the reporting interval
        if step % 1000 == 0:
            with run.checkpoint():
                save(...)

Hot-path cost is a few instrument calls per step; nothing here waits on an exporter.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from contextlib import nullcontext
from typing import Any, Callable, Iterable, Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Status, StatusCode

from .. import catalog as c
from .telemetry import Telemetry, current
from .timing import CudaEventTimer, WallTimer, default_timer

log = logging.getLogger("gpuobs.instrument")
CAUSES = ("data_wait", "checkpoint", "startup", "idle")


def _value(source: Any) -> float | None:
    """A reported value as float: numbers, 0-d tensors (.item()), callables, or an optimizer's lr."""
    if source is None:
        return None
    if hasattr(source, "param_groups"):  # a torch optimizer: its first group's learning rate
        source = source.param_groups[0].get("lr")
    if callable(source):
        source = source()
    if hasattr(source, "item"):
        source = source.item()
    return float(source)


class _Step:
    """One step (a context manager; re-used objects would save little and cost clarity)."""
    __slots__ = ("run", "samples", "tokens", "flops", "span", "token", "timer_token", "wait", "wait_start_ns", "ckpt",
                 "inner_wait", "nested", "t0")

    def __init__(self, run: "TrainingRun", samples, tokens, flops):
        self.run, self.samples, self.tokens, self.flops = run, samples, tokens, flops

    def __enter__(self) -> "_Step":
        self.run._begin(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.run._end(self, exc)


class _Span:
    """A child span around a block (checkpoint, phase, micro-step), plus an optional on-exit hook."""

    def __init__(self, tracer, name: str, attributes: dict, on_exit: Callable[[float], None] | None = None):
        self.tracer, self.name, self.attributes, self.on_exit = tracer, name, attributes, on_exit

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.cm = self.tracer.start_as_current_span(self.name, attributes=self.attributes)
        self.span = self.cm.__enter__()
        return self.span

    def __exit__(self, exc_type, exc, tb):
        if self.on_exit:
            self.on_exit(time.perf_counter() - self.t0)
        return self.cm.__exit__(exc_type, exc, tb)


class TrainingRun:
    """Records one training run's steps into a Telemetry (the current one by default).

    flops_per_step and peak_flops (FLOP/s of the hardware in use) enable MFU; timer defaults to
    CUDA events when torch+CUDA are present (sync=True synchronizes at each step end), else the
    wall clock; report_interval_s is how often reported loss/grad norm/lr are read.
    """

    def __init__(self, telemetry: Telemetry | None = None, flops_per_step: float | None = None,
                 peak_flops: float | None = None, sync: bool = False,
                 timer: WallTimer | CudaEventTimer | None = None, report_interval_s: float = 10.0):
        self.tel = telemetry or current()
        self.tracer = self.tel.tracer
        self.tracing = self.tel.enabled and not isinstance(self.tracer, otel_trace.NoOpTracer)
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.timer = timer or default_timer(sync)
        self.report_interval_s = report_interval_s
        self.attrs = self.tel.env.metric_attributes()
        i = self.tel.instrument
        self._h_step, self._h_wait, self._h_ckpt = i(c.STEP_DURATION), i(c.DATA_WAIT), i(c.CHECKPOINT_DURATION)
        self._steps, self._micro = i(c.STEPS), i(c.MICRO_STEPS)
        self._samples, self._tokens = i(c.SAMPLES_TRAINED), i(c.TOKENS_TRAINED)
        self._share, self._last, self._mfu = i(c.DATA_WAIT_SHARE), i(c.LAST_STEP), i(c.MFU)
        self._good, self._bad = i(c.GOODPUT), i(c.BADPUT)
        # the cells each step updates, bound to this run's attributes once
        a = self.attrs
        self._n_steps, self._n_good = self._steps.cell(a), self._good.cell(a)
        self._n_samples, self._n_tokens = self._samples.cell(a), self._tokens.cell(a)
        self._v_share, self._v_last, self._v_mfu = self._share.cell(a), self._last.cell(a), self._mfu.cell(a)
        self._n_bad = {cause: self._bad.cell({**a, "cause": cause}) for cause in CAUSES}
        self._gauges = {"loss": i(c.LOSS), "grad_norm": i(c.GRAD_NORM), "lr": i(c.LEARNING_RATE)}
        self._nonfinite = i(c.NONFINITE)
        self._reported: dict[str, Any] = {}
        self._next_report = time.monotonic() + report_interval_s
        self.step_number = 0
        self._created = time.perf_counter()
        self._last_end: float | None = None
        self._wait = 0.0  # data wait since the last step ended
        self._wait_start_ns: int | None = None
        self._ckpt_in_step = 0.0
        self._ckpt_between = 0.0  # checkpoint time since the last step: badput already, not idle too
        self._local = threading.local()
        self._in_step = False
        self._wait_in_step = 0.0
        self._warned_nested = False

    # ---- data ---------------------------------------------------------------------------------

    def data(self, iterable: Iterable) -> "_Data":
        """Wrap a data loader: time spent in each __next__ is the next step's data wait (or, for a
        batch fetched inside a step, that step's own). Re-iterable, like the loader."""
        return _Data(self, iterable)

    def _add_wait(self, seconds: float, start_ns: int) -> None:
        if self._in_step:  # fetched inside the step (e.g. per micro-batch): this step's wait
            self._wait_in_step += seconds
            return
        self._wait += seconds
        if self._wait_start_ns is None:
            self._wait_start_ns = start_ns

    # ---- steps --------------------------------------------------------------------------------

    def step(self, samples: int | None = None, tokens: int | None = None, flops: float | None = None) -> _Step:
        """Context manager around one optimizer step; samples/tokens feed the throughput counters."""
        return _Step(self, samples, tokens, flops)

    def trace_step(self, fn: Callable) -> Callable:
        """Decorator: each call of fn is one step."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.step():
                return fn(*args, **kwargs)
        return wrapper

    def _begin(self, s: _Step) -> None:
        s.nested = self._in_step
        if s.nested:  # a step inside a step is one step: the inner one records nothing
            if not self._warned_nested:
                self._warned_nested = True
                log.warning("run.step() entered inside another step; the inner one is ignored")
            return
        now = time.perf_counter()
        s.wait, s.wait_start_ns = self._wait, self._wait_start_ns
        self._wait, self._wait_start_ns = 0.0, None
        started = now - s.wait  # the step starts when it began waiting for its batch
        gap = started - (self._created if self._last_end is None else self._last_end) - self._ckpt_between
        self._ckpt_between = 0.0
        if gap > 0:
            self._n_bad["startup" if self._last_end is None else "idle"].add(gap)
        self.step_number += 1
        self._in_step, self._ckpt_in_step, self._wait_in_step = True, 0.0, 0.0
        s.span = s.token = None
        if self.tracing:
            start_ns = s.wait_start_ns if s.wait_start_ns is not None else time.time_ns()
            # rank and job are resource attributes (gpuobs.rank, gpuobs.job.id): not repeated per span
            s.span = self.tracer.start_span("train.step", start_time=start_ns,
                                            attributes={"gpuobs.step": self.step_number})
            s.token = otel_context.attach(otel_trace.set_span_in_context(s.span))
            if s.wait:
                wait_span = self.tracer.start_span("train.data_wait", start_time=start_ns)
                wait_span.end(end_time=start_ns + int(s.wait * 1e9))
        s.t0 = time.perf_counter()
        try:
            s.timer_token = self.timer.start()
        except Exception:  # noqa: BLE001 - e.g. a CUDA error recording an event: fall back to the wall clock
            log.exception("step timer failed to start; timing this step by wall clock")
            s.timer_token = None

    def _end(self, s: _Step, exc: BaseException | None) -> None:
        if s.nested:
            return
        try:
            compute = (time.perf_counter() - s.t0 if s.timer_token is None
                       else self.timer.stop(s.timer_token, s))
        except Exception:  # noqa: BLE001 - never replace the step's own exception with ours
            log.exception("step timer failed to stop; timing this step by wall clock")
            compute = time.perf_counter() - s.t0
        self._in_step, s.ckpt, s.inner_wait = False, self._ckpt_in_step, self._wait_in_step
        if compute is not None:
            self._record(s, compute)
        for payload, seconds in self.timer.poll():  # earlier GPU-timed steps whose events completed
            self._record(payload, seconds)
        self._last_end = time.perf_counter()
        if s.span is not None:
            if exc is not None:
                s.span.record_exception(exc)
                s.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            s.span.end()
            otel_context.detach(s.token)
        if time.monotonic() >= self._next_report:
            self.flush()

    def _record(self, s: _Step, compute: float) -> None:
        a = self.attrs
        total = s.wait + compute  # compute includes waits and checkpoints inside the step
        waited = s.wait + s.inner_wait
        self._h_step.record(total, a)
        self._n_steps.add(1)
        self._n_good.add(max(0.0, compute - s.ckpt - s.inner_wait))
        if waited:
            self._h_wait.record(waited, a)
            self._n_bad["data_wait"].add(waited)
        self._v_share.set(min(1.0, waited / total) if total > 0 else 0.0)
        self._v_last.set(time.time())
        if s.samples:
            self._n_samples.add(s.samples)
        if s.tokens:
            self._n_tokens.add(s.tokens)
        flops = s.flops or self.flops_per_step
        if flops and self.peak_flops and total > 0:
            self._v_mfu.set(min(1.0, flops / total / self.peak_flops))

    def micro_step(self) -> Any:
        """Context manager around one gradient-accumulation pass inside a step."""
        self._micro.add(1, self.attrs)
        if not self.tracing:
            return nullcontext()
        return _Span(self.tracer, "train.micro_step", {})

    def phase(self, name: str) -> Any:
        """Context manager: a child span (forward, backward, optimizer, ...) of the current step."""
        if not self.tracing:
            return nullcontext()
        return _Span(self.tracer, f"train.{name}", {"gpuobs.phase": name})

    def checkpoint(self, **attributes: Any) -> Any:
        """Context manager around a checkpoint save: a span, its duration, and checkpoint badput."""
        attrs = {f"gpuobs.checkpoint.{k}": str(v) for k, v in attributes.items()}
        return _Span(self.tracer, "train.checkpoint", attrs, on_exit=self._checkpoint_done)

    def _checkpoint_done(self, seconds: float) -> None:
        self._h_ckpt.record(seconds, self.attrs)
        self._n_bad["checkpoint"].add(seconds)
        if self._in_step:
            self._ckpt_in_step += seconds  # not goodput, though inside the step
        else:
            self._ckpt_between += seconds  # badput already: not idle as well

    def record_checkpoint(self, seconds: float, start_ns: int, **attributes: Any) -> None:
        """Record a checkpoint measured elsewhere (framework hooks that learn of a save only after
        it): the same duration, badput and span as checkpoint() records around a block."""
        seconds = max(0.0, seconds)
        self._checkpoint_done(seconds)
        if self.tracing:
            attrs = {f"gpuobs.checkpoint.{k}": str(v) for k, v in attributes.items()}
            span = self.tracer.start_span("train.checkpoint", start_time=start_ns, attributes=attrs)
            span.end(end_time=start_ns + int(seconds * 1e9))

    # ---- lazily read values -----------------------------------------------------------------

    def report(self, loss: Any = None, grad_norm: Any = None, lr: Any = None) -> None:
        """Keep references to the latest loss, grad norm and learning rate (numbers, 0-d tensors,
        callables or an optimizer); they are converted only at the reporting interval, so a
        tensor's .item() never adds a CUDA synchronization to every step."""
        for key, value in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr)):
            if value is not None:
                self._reported[key] = value

    def flush(self) -> None:
        """Record pending GPU-timed steps and the reported values now (also done every interval)."""
        self._next_report = time.monotonic() + self.report_interval_s
        for payload, seconds in self.timer.poll():
            self._record(payload, seconds)
        for key, source in list(self._reported.items()):
            try:
                value = _value(source)
            except Exception:  # noqa: BLE001 - a bad value must not break training
                log.warning("cannot read reported value", extra={"key": key})
                continue
            if value is None:
                continue
            if not math.isfinite(value):  # OTel gauges ignore NaN/inf: a diverged run must still show
                self._nonfinite.add(1, {**self.attrs, "value": key})
                log.warning("non-finite value reported", extra={"key": key, "value": str(value)})
                continue
            self._gauges[key].set(value, self.attrs)


class _Data:
    """The wrapped loader: iterating it again starts a new pass over the loader, as a loader does."""

    def __init__(self, run: TrainingRun, iterable: Iterable):
        self._run = run
        self._iterable = iterable
        self._current: _DataIter | None = None

    def __iter__(self) -> "_DataIter":
        return _DataIter(self._run, iter(self._iterable))

    def __next__(self):  # next(run.data(loader)) also works, on one pass kept here
        if self._current is None:
            self._current = iter(self)
        return next(self._current)

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]


class _DataIter:
    """One pass over a loader, measuring the wait inside __next__."""

    def __init__(self, run: TrainingRun, it: Iterator):
        self._run = run
        self._it = it

    def __iter__(self) -> "_DataIter":
        return self

    def __next__(self):
        start_ns, t0 = time.time_ns(), time.perf_counter()
        item = next(self._it)  # the end of the data (StopIteration) is no next step's wait
        self._run._add_wait(time.perf_counter() - t0, start_ns)
        return item


_default: TrainingRun | None = None


def default_run() -> TrainingRun:
    """The process-wide TrainingRun over the current Telemetry (created on first use)."""
    global _default
    if _default is None or _default.tel is not current():
        _default = TrainingRun()
    return _default


def step(samples: int | None = None, tokens: int | None = None, flops: float | None = None) -> _Step:
    """default_run().step(...)"""
    return default_run().step(samples, tokens, flops)


def trace_step(fn: Callable) -> Callable:
    """Decorator: each call of fn is one step of the default run."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with default_run().step():
            return fn(*args, **kwargs)
    return wrapper


def data(iterable: Iterable) -> Iterator:
    """default_run().data(iterable)"""
    return default_run().data(iterable)


def checkpoint(**attributes: Any) -> Any:
    """default_run().checkpoint(...)"""
    return default_run().checkpoint(**attributes)


def phase(name: str) -> Any:
    """default_run().phase(name)"""
    return default_run().phase(name)


def report(loss: Any = None, grad_norm: Any = None, lr: Any = None) -> None:
    """default_run().report(...)"""
    default_run().report(loss, grad_norm, lr)
