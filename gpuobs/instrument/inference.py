"""Inference instrumentation with OTel GenAI semantic-convention names: request duration, time to
first token, time per output token, tokens by type, batch size, errors and requests in flight,
plus a span per request (`error.type` and ERROR status on failure), and exact windowed quantiles
of the three latencies (what the rules and alerts read).

    with request(model="llama-3-8b", provider="vllm", batch_size=4) as r:
        for i, tok in enumerate(generate(...)):
            if i == 0:
                r.first_token()
        r.tokens(input=prompt_tokens, output=generated)
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any, Callable

from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import catalog as c
from .telemetry import Telemetry, current


class Request:
    """One inference request (context manager); see module docstring."""

    def __init__(self, tel: Telemetry, model: str, operation: str, batch_size: int | None,
                 provider: str | None = None):
        self.tel = tel
        self.attrs = {"gen_ai.operation.name": operation, "gen_ai.request.model": model,
                      **tel.env.metric_attributes()}
        # gen_ai.provider.name goes on the span only: the metric series stay one per model
        self.span_attrs = {**self.attrs, **({"gen_ai.provider.name": provider} if provider else {})}
        self.batch_size = batch_size
        self._first: float | None = None
        self._tokens: dict[str, int] = {}

    def first_token(self) -> None:
        """Mark the first output token now (time to first token)."""
        if self._first is None:
            self._first = time.perf_counter() - self._t0

    def tokens(self, input: int | None = None, output: int | None = None) -> None:
        """Tokens of the request by gen_ai.token.type."""
        if input is not None:
            self._tokens["input"] = input
        if output is not None:
            self._tokens["output"] = output

    def __enter__(self) -> "Request":
        self._t0 = time.perf_counter()
        name = f"{self.attrs['gen_ai.operation.name']} {self.attrs['gen_ai.request.model']}"
        self._cm = self.tel.tracer.start_as_current_span(name, kind=SpanKind.SERVER, attributes=self.span_attrs,
                                                         record_exception=True, set_status_on_exception=False)
        self._span = self._cm.__enter__()
        self.tel.instrument(c.ACTIVE_REQUESTS).add(1, self.attrs)
        return self

    def __exit__(self, exc_type, exc, tb):
        duration = time.perf_counter() - self._t0
        i, q = self.tel.instrument, self.tel.quantiles
        attrs = self.attrs
        i(c.ACTIVE_REQUESTS).add(-1, attrs)
        if exc is not None:
            attrs = {**attrs, "error.type": type(exc).__name__}
            i(c.INFERENCE_ERRORS).add(1, attrs)
            self._span.set_attribute("error.type", type(exc).__name__)
            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        i(c.REQUEST_DURATION).record(duration, attrs)
        window = q(c.REQUEST_DURATION).window(self.attrs)
        window.add(duration)
        if duration >= window.slow:  # a slow request: its span is the exemplar of its bucket
            self.tel.exemplar(c.REQUEST_DURATION, attrs, duration, self._span)
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
            self._span.set_attribute(f"gen_ai.usage.{kind}_tokens", n)
        return self._cm.__exit__(exc_type, exc, tb)


def request(model: str, operation: str = "chat", batch_size: int | None = None,
            telemetry: Telemetry | None = None, provider: str | None = None) -> Request:
    """Context manager around one inference request; provider is gen_ai.provider.name on its span."""
    return Request(telemetry or current(), model, operation, batch_size, provider)


def trace_request(model: str, operation: str = "chat", provider: str | None = None) -> Callable:
    """Decorator: each call is one request; the function may take a `request` keyword to mark
    the first token and token counts."""
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
                return fn(*args, **kwargs)
        return wrapper
    return wrap
