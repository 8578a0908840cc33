"""Training instrumentation: steps, data waits, checkpoints, phases and micro-steps as spans and
metrics, with goodput/badput accounting and MFU. Works with any loop::

    run = TrainingRun(flops_per_step=6 * params * tokens_per_step, dtype="bf16")  # peak FLOP/s looked up
    model = DistributedDataParallel(model)
    run.watch(model)                         # the one extra line: per-rank compute vs collective wait
    for batch in run.data(loader):          # time inside __next__ is the step's data wait
        with run.step(samples=len(batch), tokens=batch.numel()):
            with run.phase("forward"):
                loss = model(batch)
            ...
        run.report(loss=loss, lr=optimizer)  # read lazily at the reporting interval
        if step % 1000 == 0:
            with run.checkpoint(path=path):  # a child of the run's span
                save(...)
    run.close()                              # ends the run span (also done at exit)

Traces: one `train.run` span per run; each `train.step` is the root of its own trace (a job's
steps would make one unbrowsable trace) with a link to the run span; data waits, phases,
micro-steps, collective waits and checkpoints inside a step are its children, checkpoints between
steps are children of the run span. Hot-path cost is a few instrument calls per step; nothing here
waits on an exporter.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import time
import warnings
from contextlib import nullcontext
from typing import Any, Callable, Iterable, Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Status, StatusCode

from .. import catalog as c
from . import collectives, fsdp
from .flops import local_peak_flops
from .telemetry import Telemetry, current
from .timing import CudaEventTimer, WallTimer, default_timer

log = logging.getLogger("gpuobs.instrument")
CAUSES = ("data_wait", "checkpoint", "startup", "idle", "failed_step")
EXCEPTION_TYPES = 8  # exception types a run counts failed steps by; later ones are "other" (bounded series)
OTHER_EXCEPTION = "other"  # the exception label of failed steps past EXCEPTION_TYPES types, emitted at 0 from the start


def _failure(exc: BaseException | None) -> str | None:
    """What a step that exited with exc was: None, completed (no exception); the exception's class
    name, a failed step; "" for the end of the data (StopIteration) or of the process (KeyboardInterrupt,
    SystemExit, anything not an Exception): no step happened, neither progress nor a failure."""
    if exc is None:
        return None
    if isinstance(exc, StopIteration) or not isinstance(exc, Exception):
        return ""
    return type(exc).__name__


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


WARN_UNTIMED_AFTER = 20  # steps of a multi-rank run before warning that no collective was timed


class _Step:
    """One step (a context manager; re-used objects would save little and cost clarity)."""
    __slots__ = ("run", "samples", "tokens", "flops", "span", "token", "timer_token", "wait", "wait_start_ns", "ckpt",
                 "inner_wait", "nested", "t0", "coll", "failed", "coll_device")
    # set by TrainingRun._begin and _end (slots: declared here, assigned there)
    span: Any  # the train.step span, None when the step is nested or the tracer is off
    token: Any  # its contextvars token from otel_context.attach (None with no span)
    timer_token: Any  # the GPU timer's start token (None: timed on the host)
    wait: float  # seconds waited for this step's batch before it began
    wait_start_ns: int | None  # wall clock (ns) the wait began; None: no wait seen
    ckpt: float  # seconds of checkpoints inside the step
    inner_wait: float  # seconds of data waits inside the step
    nested: bool  # a step inside a step: records nothing
    t0: float  # perf_counter() at the step's start
    coll: float  # seconds of collectives inside the step
    failed: str | None  # None: completed; else how it ended (_failure): recorded as no progress
    coll_device: tuple[collectives.DeviceTail, ...]  # NCCL: DDP's tail and FSDP's calls on the GPU, read in _record

    def __init__(self, run: "TrainingRun", samples: float | None, tokens: float | None, flops: float | None):
        self.run, self.samples, self.tokens, self.flops = run, samples, tokens, flops
        self.coll_device = ()

    def __enter__(self) -> "_Step":
        self.run._begin(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.run._end(self, exc)


def _failed(span: Any, exc: BaseException) -> None:
    """Mark a span failed by exc: the exception as an event and an ERROR status naming its type."""
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


class _Span:
    """A child span around a block (checkpoint, phase, micro-step, collective), plus an optional
    on-exit hook. start_span + attach rather than start_as_current_span: the latter's generator
    context manager costs a few µs per span, a lot at thousands of steps per second."""
    __slots__ = ("tracer", "name", "attributes", "on_exit", "context", "t0", "span", "token")

    def __init__(self, tracer, name: str, attributes: dict, on_exit: Callable[[float], None] | None = None,
                 context: Any = None):
        self.tracer, self.name, self.attributes, self.on_exit, self.context = tracer, name, attributes, on_exit, context

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.span = self.tracer.start_span(self.name, self.context, attributes=self.attributes)
        self.token = otel_context.attach(otel_trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, exc_type, exc, tb):
        if self.on_exit:
            self.on_exit(time.perf_counter() - self.t0)
        otel_context.detach(self.token)
        if exc is not None:
            _failed(self.span, exc)
        self.span.end()
        return False


class _Timed:
    """A block timed without a span (tracing off): collective waits still count."""
    __slots__ = ("on_exit", "t0")

    def __init__(self, on_exit: Callable[[float], None]):
        self.on_exit = on_exit

    def __enter__(self):
        self.t0 = time.perf_counter()
        return otel_trace.INVALID_SPAN

    def __exit__(self, exc_type, exc, tb):
        self.on_exit(time.perf_counter() - self.t0)
        return False


class TrainingRun:
    """Records one training run's steps into a Telemetry (the current one by default).

    flops_per_step enables the FLOPs counter (MFU = its rate / peak FLOP/s); peak_flops is the
    FLOP/s of the hardware one rank uses, else looked up for the local CUDA device and dtype
    (gpuobs.instrument.flops). timer defaults to CUDA events when torch+CUDA are present
    (sync=True synchronizes at each step end), else the wall clock; report_interval_s is how often
    reported loss/grad norm/lr are read.
    """

    def __init__(self, telemetry: Telemetry | None = None, flops_per_step: float | None = None,
                 peak_flops: float | None = None, sync: bool = False,
                 timer: WallTimer | CudaEventTimer | None = None, report_interval_s: float = 10.0,
                 dtype: str | None = None):
        self.tel = telemetry or current()
        self.tracer = self.tel.tracer
        self.tracing = self.tel.enabled and not isinstance(self.tracer, otel_trace.NoOpTracer)
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops if peak_flops is not None else (local_peak_flops(dtype) if dtype else None)
        self.timer = timer or default_timer(sync)
        self.report_interval_s = report_interval_s
        self.attrs = self.tel.env.metric_attributes()
        i = self.tel.instrument
        self._h_step, self._h_wait, self._h_ckpt = i(c.STEP_DURATION), i(c.DATA_WAIT), i(c.CHECKPOINT_DURATION)
        q = self.tel.quantiles
        a = self.attrs
        self._q_step, self._q_wait = q(c.STEP_DURATION).window(a), q(c.DATA_WAIT).window(a)
        self._q_ckpt = q(c.CHECKPOINT_DURATION).window(a)
        self._micro = i(c.MICRO_STEPS)
        self._nonfinite = i(c.NONFINITE)
        # the cells each step updates, bound to this run's attributes once
        self._n_steps, self._n_good = i(c.STEPS).cell(a), i(c.GOODPUT).cell(a)
        self._n_samples, self._n_tokens = i(c.SAMPLES_TRAINED).cell(a), i(c.TOKENS_TRAINED).cell(a)
        self._n_compute, self._n_coll = i(c.COMPUTE).cell(a), i(c.COLLECTIVE_WAIT).cell(a)
        self._n_flops, self._v_last = i(c.FLOPS).cell(a), i(c.LAST_STEP).cell(a)
        bad = i(c.BADPUT)
        self._n_bad = {cause: bad.cell({**a, "cause": cause}) for cause in CAUSES}
        self._steps_failed = i(c.STEPS_FAILED)
        self._n_failed: dict[str, Any] = {}  # exception type -> its cell, at most EXCEPTION_TYPES
        # the rank's "other" series at 0 from the start (one series per rank): the rules count the
        # steps a new exception type's series was created with, and tell such a birth from a restarted
        # Prometheus by this series having been scraped before it (records.born_watched)
        self._n_other = self._steps_failed.cell({**a, "exception": OTHER_EXCEPTION})
        self._n_other.add(0)
        if self.peak_flops:
            i(c.PEAK_FLOPS).set(self.peak_flops, a)
        self._gauges = {"loss": i(c.LOSS), "grad_norm": i(c.GRAD_NORM), "lr": i(c.LEARNING_RATE)}
        self._reported: dict[str, Any] = {}
        self._next_report = time.monotonic() + report_interval_s
        self.step_number = 0
        self._created = time.perf_counter()
        self._last_end: float | None = None
        self._wait = 0.0  # data wait since the last step ended
        self._wait_start_ns: int | None = None
        self._ckpt_in_step = 0.0
        self._ckpt_between = 0.0  # checkpoint time since the last step: badput already, not idle too
        self._in_step = False
        self._wait_in_step = 0.0
        self._coll_in_step = 0.0
        self._warned_nested = False
        self._coll_seen = False  # any collective timed in this run (DDP's hook or collective())
        self._warned_untimed = False
        self._comm = collectives.DdpCommTimer()
        self._fsdp = fsdp.FsdpCommTimer()
        self._run_span: Any = None  # train.run, started with the first step or checkpoint
        self._run_ctx: Any = None
        self._links: Any = ()
        self.tel.on_shutdown.append(self.close)

    # ---- the run span -------------------------------------------------------------------------

    def _start_run_span(self) -> None:
        start_ns = time.time_ns() - int((time.perf_counter() - self._created) * 1e9)
        self._run_span = self.tracer.start_span("train.run", otel_context.Context(), start_time=start_ns)
        self._run_ctx = otel_trace.set_span_in_context(self._run_span, otel_context.Context())
        self._links = (otel_trace.Link(self._run_span.get_span_context()),)

    def close(self) -> None:
        """End the run: pending values are recorded and its `train.run` span ends (a later step
        starts a new one). The framework callbacks call it at the end of training, telemetry
        shutdown at exit; calling it again does nothing more."""
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - closing must not raise into training code
            log.exception("flushing the training run failed")
        span, self._run_span, self._run_ctx, self._links = self._run_span, None, None, ()
        if span is not None:
            span.set_attribute("gpuobs.steps", self.step_number)
            span.end()

    # ---- data ---------------------------------------------------------------------------------

    def data(self, iterable: Iterable) -> "_Data":
        """Wrap a data loader: time spent in each __next__ is the next step's data wait (or, for a
        batch fetched inside a step, that step's own). Re-iterable, like the loader."""
        return _Data(self, iterable)

    def add_data_wait(self, seconds: float, start_ns: int | None = None) -> None:
        """Record a wait for data measured elsewhere (the framework callbacks time the gap between
        batches): before a step it is that step's data wait, inside a step the step's own."""
        self._add_wait(max(0.0, seconds), time.time_ns() - int(seconds * 1e9) if start_ns is None else start_ns)

    def _add_wait(self, seconds: float, start_ns: int) -> None:
        if self._in_step:  # fetched inside the step (e.g. per micro-batch): this step's wait
            self._wait_in_step += seconds
            if self.tracing:  # a child of the step, which is the current span
                span = self.tracer.start_span("train.data_wait", start_time=start_ns)
                span.end(end_time=start_ns + int(seconds * 1e9))
            return
        self._wait += seconds
        if self._wait_start_ns is None:
            self._wait_start_ns = start_ns

    # ---- collectives ----------------------------------------------------------------------------

    def watch(self, model: Any) -> bool:
        """Time this rank's data-parallel collectives, with no other code around them: DDP's gradient
        all-reduce (a DistributedDataParallel model, or the model DDP wraps: the wrapper is found at
        the first forward; gpuobs.instrument.collectives) and FSDP2's all-gathers and reduce-scatters
        (every FSDPModule in model.modules(), sharded already; gpuobs.instrument.fsdp). Steps then
        split into compute and collective wait, the per-rank straggler signal. Returns True when
        something is or will be hooked; False where neither is in use or the model has its own DDP
        communication hook (a warning says so)."""
        sharded = fsdp.watch(model, self._fsdp)
        return collectives.watch(model, self._comm) or sharded

    def watch_ddp(self, model: Any) -> bool:
        """The former name of watch() (which also times FSDP2), kept for existing callers."""
        return self.watch(model)

    def collective(self, name: str = "collective") -> Any:
        """Context manager around a blocking collective or other wait on peers inside a step
        (pipeline stages, a hand-written all_reduce or barrier; DDP and FSDP2 are timed by watch()):
        its time is collective wait, not compute, and it gets a `train.collective` span."""
        if not self.tracing:
            return _Timed(self._collective_done)
        return _Span(self.tracer, "train.collective", {"gpuobs.collective": name}, on_exit=self._collective_done)

    def _collective_done(self, seconds: float) -> None:
        if self._in_step:
            self._coll_in_step += seconds

    # ---- steps --------------------------------------------------------------------------------

    def step(self, samples: int | None = None, tokens: int | None = None, flops: float | None = None) -> _Step:
        """Context manager around one optimizer step; samples/tokens feed the throughput counters,
        flops (default flops_per_step) the FLOPs counter. Attributes samples/tokens of the entered
        step may also be set inside it. A step whose body raises (and the loop catches) is a failed
        step (catalog STEPS_FAILED, by exception type), not progress: see _record_failed."""
        return _Step(self, samples, tokens, flops)

    def trace_step(self, fn: Callable | None = None, *, samples: int | None = None, tokens: int | None = None,
                   step_arg: str | None = None) -> Any:
        """Decorator: each call of fn is one step. `@run.trace_step(samples=32, tokens=4096)` gives
        fixed counts; `@run.trace_step(step_arg="gstep")` passes the open step to fn's parameter
        `gstep` (it may set .samples and .tokens from its batch). fn's own parameters, `step`
        included, are never touched unless step_arg names one (see _trace_step). Raises TypeError
        when step_arg names no parameter of fn."""
        return _trace_step(lambda: self, fn, samples, tokens, step_arg)

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
        self._in_step, self._ckpt_in_step, self._wait_in_step, self._coll_in_step = True, 0.0, 0.0, 0.0
        self._comm.take()  # all-reduce outside any step (an evaluation pass) is not this step's
        self._fsdp.take()
        s.span = s.token = None
        if self.tracing:
            if self._run_span is None:
                self._start_run_span()
            start_ns = s.wait_start_ns if s.wait_start_ns is not None else time.time_ns()
            # rank and job are resource attributes (gpuobs.rank, gpuobs.job.id): not repeated per span
            s.span = self.tracer.start_span("train.step", otel_context.Context(), start_time=start_ns,
                                            attributes={"gpuobs.step": self.step_number}, links=self._links)
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
        s.failed = _failure(exc)  # kept on the step: a GPU-timed step is recorded later, by poll()
        try:
            compute = (time.perf_counter() - s.t0 if s.timer_token is None
                       else self.timer.stop(s.timer_token, s))
        except Exception:  # noqa: BLE001 - never replace the step's own exception with ours
            log.exception("step timer failed to stop; timing this step by wall clock")
            compute = time.perf_counter() - s.t0
        s.coll_device = self._take_collectives(s)
        self._in_step, s.ckpt, s.inner_wait, s.coll = False, self._ckpt_in_step, self._wait_in_step, self._coll_in_step
        if compute is not None:
            self._record(s, compute)
        for payload, seconds in self.timer.poll():  # earlier GPU-timed steps whose events completed
            self._record(payload, seconds)
        self._last_end = time.perf_counter()
        if s.span is not None:
            if exc is not None:
                _failed(s.span, exc)
            s.span.end()
            otel_context.detach(s.token)
        if time.monotonic() >= self._next_report:
            self.flush()

    def _take_collectives(self, s: _Step) -> tuple[collectives.DeviceTail, ...]:
        """Add the step's timed DDP and FSDP host waits to its collective time (with their spans);
        return the CUDA pairs, read in _record once the step's own end event (after theirs) has
        completed: on NCCL the host saw completion at enqueue (about 0), so no span, no sync."""
        device: tuple[collectives.DeviceTail, ...] = ()
        tail = self._comm.take()  # DDP's all-reduce: the time this rank was blocked after its backward
        if tail is not None and tail.device is not None:
            device = (tail.device,)
        elif tail is not None:
            self._coll_in_step += tail.seconds
            if s.span is not None:
                self._collective_span(tail.launched, tail.launched + tail.seconds, "ddp_all_reduce", {})
        sharded = self._fsdp.take()  # FSDP2's all-gathers and reduce-scatters inside the step
        self._coll_in_step += sharded.seconds
        if s.span is not None and sharded.first is not None and sharded.last is not None:
            # one span per step, not per call (dozens per step): from the first launch to the last
            # completion, which may include compute between calls; the blocked time is an attribute
            self._collective_span(sharded.first, sharded.last, "fsdp",
                                  {"gpuobs.collective.calls": sharded.calls,
                                   "gpuobs.collective.blocked_s": sharded.seconds})
        return device + sharded.device

    def _collective_span(self, start: float, end: float, name: str, attributes: dict) -> None:
        """A train.collective span over perf_counter seconds start..end (past), a child of the step."""
        start_ns = time.time_ns() - int((time.perf_counter() - start) * 1e9)
        span = self.tracer.start_span("train.collective", start_time=start_ns,
                                      attributes={"gpuobs.collective": name, **attributes})
        span.end(end_time=start_ns + int((end - start) * 1e9))

    def _record(self, s: _Step, duration: float) -> None:
        if s.failed is not None:
            self._record_failed(s, duration)
            return
        a = self.attrs
        total = s.wait + duration  # duration includes waits, collectives and checkpoints inside the step
        waited = s.wait + s.inner_wait
        busy = max(0.0, duration - s.ckpt - s.inner_wait)  # the job progresses: goodput
        device = sum(seconds for pair in s.coll_device if (seconds := pair.seconds()) is not None)  # complete ones
        coll = min(s.coll + device, busy)
        self._check_collectives_timed(coll)
        self._h_step.record(total, a)
        self._q_step.add(total)
        if total >= self._q_step.slow and s.span is not None:  # one comparison for a fast step
            self.tel.exemplar(c.STEP_DURATION, a, total, s.span)
        self._n_steps.add(1)
        self._n_good.add(busy)
        self._n_compute.add(busy - coll)
        self._n_coll.add(coll)
        if waited:
            self._h_wait.record(waited, a)
            self._q_wait.add(waited)
            self._n_bad["data_wait"].add(waited)
        self._v_last.set(time.time())
        if s.samples:
            self._n_samples.add(s.samples)
        if s.tokens:
            self._n_tokens.add(s.tokens)
        flops = s.flops or self.flops_per_step
        if flops:
            self._n_flops.add(flops)

    def _check_collectives_timed(self, coll: float) -> None:
        """Warn once when a multi-rank run has stepped WARN_UNTIMED_AFTER times with no collective
        timed: its straggler signal (compute = step - collective wait) is then blind, e.g. a DDP or
        FSDP2 model not given to watch(), or a hand-written all-reduce outside collective()."""
        self._coll_seen = self._coll_seen or coll > 0
        if self._coll_seen or self._warned_untimed or self.step_number < WARN_UNTIMED_AFTER:
            return
        if (self.tel.env.world_size or 1) > 1:
            self._warned_untimed = True
            log.warning("a multi-rank run with no timed collective after %d steps: per-rank compute equals "
                        "the step time and no straggler can be named; time DDP or FSDP2 with run.watch(model), "
                        "hand-written collectives with run.collective()", self.step_number)

    def _record_failed(self, s: _Step, duration: float) -> None:
        """A step that raised: its data wait is still data wait (the loader did wait), the rest of its
        time (checkpoints excepted, counted already) failed_step badput, and one failed step by
        exception type; nothing of the progress counters (steps, samples, tokens, FLOPs, goodput,
        compute, step duration, last-step time), so that a loop catching every step's exception
        reads as stalled, not as training."""
        waited = s.wait + s.inner_wait
        if waited:
            self._h_wait.record(waited, self.attrs)
            self._q_wait.add(waited)
            self._n_bad["data_wait"].add(waited)
        self._n_bad["failed_step"].add(max(0.0, duration - s.ckpt - s.inner_wait))
        if s.failed:  # "": the data or the process ended inside the step; no step, no failure
            self._failed_cell(s.failed).add(1)

    def _failed_cell(self, exception: str) -> Any:
        """The failed-steps cell of an exception type; past EXCEPTION_TYPES types, the "other" cell."""
        found = self._n_failed.get(exception)
        if found is None:
            if exception == OTHER_EXCEPTION or len(self._n_failed) >= EXCEPTION_TYPES:
                return self._n_other
            found = self._n_failed[exception] = self._steps_failed.cell({**self.attrs, "exception": exception})
        return found

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
        """Context manager around a checkpoint save: a span (child of the step, or of the run span
        between steps; attributes become `gpuobs.checkpoint.<key>`, e.g. path=, step=), its
        duration, and checkpoint badput."""
        attrs = {f"gpuobs.checkpoint.{k}": str(v) for k, v in attributes.items()}
        attrs.setdefault("gpuobs.checkpoint.step", str(self.step_number))
        if not self.tracing:
            return _Timed(self._checkpoint_done)
        return _Span(self.tracer, "train.checkpoint", attrs, on_exit=self._checkpoint_done,
                     context=self._checkpoint_parent())

    def _checkpoint_parent(self) -> Any:
        """The step's context inside a step (the current one), else the run span's."""
        if self._in_step:
            return None
        if self._run_span is None:
            self._start_run_span()
        return self._run_ctx

    def _checkpoint_done(self, seconds: float) -> None:
        self._h_ckpt.record(seconds, self.attrs)
        self._q_ckpt.add(seconds)
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
            attrs.setdefault("gpuobs.checkpoint.step", str(self.step_number))
            span = self.tracer.start_span("train.checkpoint", self._checkpoint_parent(), start_time=start_ns,
                                          attributes=attrs)
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
        # a Sized iterable (a DataLoader) has a length; any other raises TypeError, as len() of it would
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


def trace_step(fn: Callable | None = None, *, samples: int | None = None, tokens: int | None = None,
               step_arg: str | None = None) -> Any:
    """Decorator: each call of fn is one step of the default run (see TrainingRun.trace_step)."""
    return _trace_step(default_run, fn, samples, tokens, step_arg)


LEGACY_STEP_ARG = "step"  # before step_arg, a parameter of this name received the open step


def _trace_step(get_run: Callable[[], TrainingRun], fn: Callable | None, samples: int | None,
                tokens: int | None, step_arg: str | None) -> Any:
    """The decorator behind both trace_step()s. With step_arg, the open step is passed as that
    keyword argument (TypeError at decoration when fn has no such parameter). Without it, nothing
    is injected, except for backwards compatibility into a `step` parameter that has no default
    and that the caller left out (the call would fail otherwise; a DeprecationWarning says to
    write step_arg="step"): a `step` the caller passes, or one with a default, stays the user's."""
    def wrap(f: Callable) -> Callable:
        name, is_given = _step_parameter(f, step_arg)
        if name is None:
            @functools.wraps(f)
            def plain(*args, **kwargs):
                with get_run().step(samples, tokens):
                    return f(*args, **kwargs)
            return plain

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            with get_run().step(samples, tokens) as s:
                if not is_given(args, kwargs):
                    kwargs[name] = s
                return f(*args, **kwargs)
        return wrapper
    return wrap if fn is None else wrap(fn)


def _step_parameter(f: Callable, step_arg: str | None) -> tuple[str | None, Callable[[tuple, dict], bool]]:
    """(the parameter of f that receives the open step, or None; a test of whether a call's own
    (args, kwargs) already bind it). See _trace_step for which parameter that is."""
    params = inspect.signature(f).parameters
    name = step_arg if step_arg is not None else LEGACY_STEP_ARG
    param = params.get(name)
    if param is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
        if step_arg is not None:
            raise TypeError(f"trace_step(step_arg={step_arg!r}): {f.__qualname__} has no keyword parameter "
                            f"{step_arg!r}")
        return None, lambda args, kwargs: True
    if step_arg is None:
        if param.default is not param.empty:  # the user's own `step` with a default: theirs
            return None, lambda args, kwargs: True
        warnings.warn(f"trace_step: {f.__qualname__}'s `step` parameter receives the open step only when the "
                      f"caller leaves it out; write trace_step(step_arg=\"step\") to keep that",
                      DeprecationWarning, stacklevel=4)
    positional = list(params).index(name) if param.kind is param.POSITIONAL_OR_KEYWORD else None

    def is_given(args: tuple, kwargs: dict) -> bool:
        return name in kwargs or (positional is not None and len(args) > positional)
    return name, is_given


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
