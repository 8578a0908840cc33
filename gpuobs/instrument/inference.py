"""Inference instrumentation with OTel GenAI semantic-convention names: request duration, time to
first token, time per output token, tokens by type, batch size, errors and requests in flight,
plus a span per request (`error.type` and ERROR status on failure), and exact windowed quantiles
of the three latencies (what the rules and alerts read).

    with request(model="llama-3-8b", provider="vllm", batch_size=4) as r:
        for i, tok in enumerate(generate(...)):
            if i == 0:
                r.first_token()
        r.tokens(input=prompt_tokens, output=generated)

A serving engine that admits and completes requests out of order in one loop holds handles:

    r = start_request(model="llama-3-8b", links=[step_span])   # at admission
    r.first_token()                                             # after its prefill
    r.finish()                                                  # at completion, in any order

A request's span is handled explicitly: it is never attached to the current context, because
requests that overlap in one thread (an engine loop, asyncio tasks sharing a loop) would otherwise
nest (attach B over A, detach A, detach B: A, ended, is current again and parents every later
request). Each request is the root of its own trace unless the caller passes `parent=` (a Context
or a Span); `links=` (spans or span contexts, e.g. the batch or step that served it) become span
links. `r.context` is a Context holding the request's span, for parenting child spans explicitly.
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any, Callable, Iterable

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from .. import catalog as c
from .telemetry import Telemetry, current

# OpenTelemetry's semantic conventions' error.type for an error without a more specific type: the
# series each model's error counter shows at 0 from its first request
OTHER_ERROR = "_OTHER"
Parent = otel_context.Context | otel_trace.Span | None
Linkable = otel_trace.Span | SpanContext | Link


def _parent_context(parent: Parent) -> otel_context.Context:
    """The Context a request's span starts in: an empty one (a new trace) for None, the span's own
    for a Span, the caller's for a Context. Never the ambient current context (module docstring)."""
    if parent is None:
        return otel_context.Context()
    if isinstance(parent, otel_trace.Span):
        return otel_trace.set_span_in_context(parent, otel_context.Context())
    return parent


def _link(target: Linkable) -> Link:
    """An OTel Link to a span, a span context or an existing Link (returned as is)."""
    if isinstance(target, Link):
        return target
    if isinstance(target, otel_trace.Span):
        return Link(target.get_span_context())
    return Link(target)


class Request:
    """One inference request: a handle with start() / first_token() / tokens() / finish(), and a
    context manager built on them (start on enter, finish on exit with the exception, if any).

    Neither start() nor the context manager makes the span current (module docstring): child spans
    take `context=r.context`. parent: a Context or Span the request's span is a child of (None: a
    new trace); links: spans, span contexts or Links the span links to (e.g. the batch/step that
    served it). Times are time.perf_counter() seconds from start(); metrics are recorded at
    finish(), exactly once."""

    def __init__(self, tel: Telemetry, model: str, operation: str, batch_size: int | None,
                 provider: str | None = None, parent: Parent = None, links: Iterable[Linkable] = ()):
        self.tel = tel
        self.attrs = {"gen_ai.operation.name": operation, "gen_ai.request.model": model,
                      **tel.env.metric_attributes()}
        # gen_ai.provider.name goes on the span only: the metric series stay one per model
        self.span_attrs = {**self.attrs, **({"gen_ai.provider.name": provider} if provider else {})}
        self.batch_size = batch_size
        self.parent = parent
        self.links = [_link(t) for t in links]
        self._first: float | None = None
        self._tokens: dict[str, int] = {}
        self._span: otel_trace.Span | None = None
        self._done = False

    @property
    def span(self) -> otel_trace.Span:
        """The request's span (started by start()); RuntimeError before start()."""
        if self._span is None:
            raise RuntimeError("the request has not started: call start() or enter it first")
        return self._span

    @property
    def context(self) -> otel_context.Context:
        """A Context holding the request's span and nothing else, to parent child spans explicitly:
        tracer.start_span("decode", context=r.context). Not attached anywhere."""
        return otel_trace.set_span_in_context(self.span, otel_context.Context())

    def start(self) -> "Request":
        """Start the request now: its span (child of `parent`, else a new trace root; not made
        current) and one more request in flight. Returns self. RuntimeError if already started."""
        if self._span is not None:
            raise RuntimeError("a Request starts once; make a new one per request")
        name = f"{self.attrs['gen_ai.operation.name']} {self.attrs['gen_ai.request.model']}"
        self._span = self.tel.tracer.start_span(name, context=_parent_context(self.parent), kind=SpanKind.SERVER,
                                                attributes=self.span_attrs, links=self.links)
        self._t0 = time.perf_counter()
        self.tel.instrument(c.ACTIVE_REQUESTS).add(1, self.attrs)
        self._zero_errors()
        return self

    def _zero_errors(self) -> None:
        """At a model's first request in this process (per operation and run attributes), its error
        counter's OTHER_ERROR series at 0: one series per model, which the rules need to count the
        errors a new error type's series is created with (records.born_watched)."""
        key = tuple(self.attrs.items())
        if key not in self.tel.zeroed:
            self.tel.zeroed.add(key)
            self.tel.instrument(c.INFERENCE_ERRORS).add(0, {**self.attrs, "error.type": OTHER_ERROR})

    def link(self, target: Linkable, attributes: dict | None = None) -> None:
        """Link the started request's span to a span or span context, e.g. each decode step of a
        continuous batch that served it (OTel Span.add_link)."""
        self.span.add_link(_link(target).context, attributes)

    def first_token(self) -> None:
        """Mark the first output token now (time to first token); only the first call counts."""
        if self._span is None:
            raise RuntimeError("the request has not started: call start() or enter it first")
        if self._first is None:
            self._first = time.perf_counter() - self._t0

    def tokens(self, input: int | None = None, output: int | None = None) -> None:
        """Tokens of the request by gen_ai.token.type."""
        if input is not None:
            self._tokens["input"] = input
        if output is not None:
            self._tokens["output"] = output

    def finish(self, error: BaseException | str | None = None) -> None:
        """End the request now: record its metrics and end its span. error: the exception that
        failed it (recorded on the span) or an error type name (e.g. "timeout" for an engine's
        abort); it sets `error.type` and ERROR status. A second call does nothing."""
        span = self.span
        if self._done:
            return
        self._done = True
        duration = time.perf_counter() - self._t0
        attrs = self.attrs
        self.tel.instrument(c.ACTIVE_REQUESTS).add(-1, attrs)
        if error is not None:
            error_type = error if isinstance(error, str) else type(error).__name__
            attrs = {**attrs, "error.type": error_type}
            self.tel.instrument(c.INFERENCE_ERRORS).add(1, attrs)
            if isinstance(error, BaseException):
                span.record_exception(error)
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
        self._record(duration, attrs)
        span.end()

    def _record(self, duration: float, attrs: dict) -> None:
        """The request's histograms, windowed quantiles, exemplar and token counts (attrs: the
        metric attributes, with error.type on a failure)."""
        i, q = self.tel.instrument, self.tel.quantiles
        i(c.REQUEST_DURATION).record(duration, attrs)
        window = q(c.REQUEST_DURATION).window(self.attrs)
        window.add(duration)
        if duration >= window.slow:  # a slow request: its span is the exemplar of its bucket
            self.tel.exemplar(c.REQUEST_DURATION, attrs, duration, self.span)
        if self._first is not None:
            i(c.TIME_TO_FIRST_TOKEN).record(self._first, self.attrs)
            q(c.TIME_TO_FIRST_TOKEN).add(self._first, self.attrs)
            output = self._tokens.get("output", 0)
            if output > 1:  # the semantic conventions' time per output token: after the first
                per_token = max(0.0, duration - self._first) / (output - 1)
                i(c.TIME_PER_OUTPUT_TOKEN).record(per_token, self.attrs)
                q(c.TIME_PER_OUTPUT_TOKEN).add(per_token, self.attrs)
        if self.batch_size:
            i(c.BATCH_SIZE).record(self.batch_size, self.attrs)
        for kind, n in self._tokens.items():
            i(c.INFERENCE_TOKENS).add(n, {**self.attrs, "gen_ai.token.type": kind})
            self.span.set_attribute(f"gen_ai.usage.{kind}_tokens", n)

    def __enter__(self) -> "Request":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc)


def request(model: str, operation: str = "chat", batch_size: int | None = None,
            telemetry: Telemetry | None = None, provider: str | None = None,
            parent: Parent = None, links: Iterable[Linkable] = ()) -> Request:
    """A not yet started Request (use it as a context manager, or call start()); provider is
    gen_ai.provider.name on its span; parent (Context or Span; None: a new trace) and links (spans
    or span contexts, e.g. the serving batch) as in Request. The span is never made current."""
    return Request(telemetry or current(), model, operation, batch_size, provider, parent, links)


def start_request(model: str, operation: str = "chat", batch_size: int | None = None,
                  telemetry: Telemetry | None = None, provider: str | None = None,
                  parent: Parent = None, links: Iterable[Linkable] = ()) -> Request:
    """request(...).start(): a started handle for an engine loop, to finish() when the request
    completes, in any order relative to other requests."""
    return request(model, operation, batch_size, telemetry, provider, parent, links).start()


def trace_request(model: str, operation: str = "chat", provider: str | None = None) -> Callable:
    """Decorator: each call is one request (a new trace); the function may take a `request`
    keyword to mark the first token and token counts. The request's span is current during the
    call, so spans the function starts are its children: safe here, unlike in request(), because
    a plain (not async, not generator) call ends before the thread can start another request."""
    def wrap(fn: Callable) -> Callable:
        if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            # the call would return at once, before the request's work: the numbers would be false
            raise TypeError(f"trace_request cannot time {fn.__qualname__}: it is async or a generator; "
                            "use `with request(...)` inside it instead")
        takes_request = "request" in inspect.signature(fn).parameters  # a parameter, not any local name

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any):
            with request(model, operation, provider=provider) as r:
                if takes_request:
                    kwargs.setdefault("request", r)
                # finish() records the exception and status: use_span must not do it twice
                with otel_trace.use_span(r.span, end_on_exit=False, record_exception=False,
                                         set_status_on_exception=False):
                    return fn(*args, **kwargs)
        return wrapper
    return wrap
