"""Request spans in serving engines (gpuobs.instrument.inference): requests that overlap in one
thread (a continuous-batching loop admitting and completing out of order, asyncio tasks) each stay
their own trace, a parent the caller passes is honoured, a serving batch span becomes a link, and
nothing is left current afterwards. Spans are decoded from the OTel SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import random

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from test_instrument import Mem, isolated  # noqa: F401  (autouse: no launcher or OTEL_* variables, fresh module state)

from gpuobs import catalog as c
from gpuobs import instrument

N = 1000


def _engine_loop(m: Mem, rng: random.Random, admit, complete) -> list:
    """One thread, continuous batching: each step admits a few requests and completes a random
    subset of those in flight (never in admission order), under an `engine.step` span that the
    requests admitted in it link to. Returns the step spans' contexts in order."""
    in_flight: list = []
    steps, admitted = [], 0
    while admitted < N or in_flight:
        with m.tel.tracer.start_as_current_span("engine.step") as step:  # current, as an engine's own span would be
            steps.append(step.get_span_context())
            for _ in range(min(rng.randint(1, 8), N - admitted)):
                in_flight.append(admit(step))
                admitted += 1
            rng.shuffle(in_flight)
            for r in in_flight:
                r.first_token()  # only the first call counts: the step after admission
            k = rng.randint(0, len(in_flight))
            done, in_flight = in_flight[:k], in_flight[k:]
            for r in done:
                r.tokens(input=4, output=3)
                complete(r)
    return steps


def _assert_one_trace_per_request(m: Mem, steps: list) -> None:
    """N request spans, each a root of its own trace linked to the step that admitted it; every
    step span is its own root too (nothing leaked into it); the metrics counted every request."""
    requests = m.spans("chat m")
    assert len(requests) == N
    assert len({s.context.trace_id for s in requests}) == N
    assert all(s.parent is None for s in requests), sum(s.parent is not None for s in requests)
    step_ids = {s.span_id for s in steps}
    assert all(len(s.links) == 1 and s.links[0].context.span_id in step_ids for s in requests)
    assert all(s.parent is None for s in m.spans("engine.step"))
    assert m.point(c.REQUEST_DURATION).count == N and m.point(c.TIME_TO_FIRST_TOKEN).count == N
    assert m.point(c.TIME_PER_OUTPUT_TOKEN).count == N and m.value(c.ACTIVE_REQUESTS) == 0
    assert not otel_trace.get_current_span().get_span_context().is_valid  # nothing left current


def test_engine_loop_with_handles_gives_one_trace_per_request():
    m = Mem()
    steps = _engine_loop(m, random.Random(1),
                         admit=lambda step: instrument.start_request("m", telemetry=m.tel, links=[step]),
                         complete=lambda r: r.finish())
    _assert_one_trace_per_request(m, steps)


def test_engine_loop_entering_and_exiting_context_managers_out_of_order():
    """The issue's shape: the engine enters `request()` at admission and leaves it at completion.
    Had enter attached the span as current, these out-of-order exits would leave an ended request
    current and parent every later one to it."""
    m = Mem()

    def admit(step):
        return instrument.request("m", telemetry=m.tel, links=[step]).__enter__()

    steps = _engine_loop(m, random.Random(2), admit=admit, complete=lambda r: r.__exit__(None, None, None))
    _assert_one_trace_per_request(m, steps)


def test_asyncio_tasks_interleaved_give_one_trace_per_request():
    m = Mem()
    rng = random.Random(3)

    async def serve(i: int) -> None:
        with instrument.request("m", telemetry=m.tel) as r:
            for _ in range(rng.randint(1, 4)):
                await asyncio.sleep(0)
            r.first_token()
            await asyncio.sleep(0)
            r.tokens(input=4, output=3)

    async def main() -> None:
        with m.tel.tracer.start_as_current_span("server"):  # an ambient span the requests must not join
            await asyncio.gather(*(serve(i) for i in range(N)))

    asyncio.run(main())
    requests = m.spans("chat m")
    assert len(requests) == N and len({s.context.trace_id for s in requests}) == N
    assert all(s.parent is None for s in requests)
    assert m.point(c.TIME_PER_OUTPUT_TOKEN).count == N and m.value(c.ACTIVE_REQUESTS) == 0


@pytest.mark.parametrize("as_context", [False, True])
def test_a_parent_the_caller_passes_holds_the_request(as_context):
    m = Mem()
    with m.tel.tracer.start_as_current_span("http POST /v1/chat") as http:
        parent = otel_trace.set_span_in_context(http) if as_context else http
        with instrument.request("m", telemetry=m.tel, parent=parent) as r:
            child = m.tel.tracer.start_span("decode", context=r.context)  # children parented explicitly
            child.end()
    (req,), (dec,) = m.spans("chat m"), m.spans("decode")
    assert req.context.trace_id == http.get_span_context().trace_id
    assert req.parent.span_id == http.get_span_context().span_id
    assert dec.context.trace_id == req.context.trace_id and dec.parent.span_id == req.context.span_id


def test_batch_spans_become_links_at_start_and_later():
    m = Mem()
    prefill = m.tel.tracer.start_span("engine.prefill")
    decode = m.tel.tracer.start_span("engine.decode")
    r = instrument.start_request("m", telemetry=m.tel, links=[prefill])
    r.link(decode, {"gen_ai.request.batch_index": 2})
    r.finish()
    prefill.end()
    decode.end()
    (req,) = m.spans("chat m")
    assert [link.context.span_id for link in req.links] == [prefill.get_span_context().span_id,
                                                            decode.get_span_context().span_id]
    assert req.links[1].attributes["gen_ai.request.batch_index"] == 2
    assert req.parent is None and req.context.trace_id != prefill.get_span_context().trace_id


def test_finish_once_with_an_error_type_and_handle_misuse():
    m = Mem()
    r = instrument.start_request("m", telemetry=m.tel)
    r.finish(error="timeout")
    r.finish()  # an engine that aborts then completes: counted once
    assert m.value(c.INFERENCE_ERRORS, **{"error.type": "timeout"}) == 1
    assert m.point(c.REQUEST_DURATION, **{"error.type": "timeout"}).count == 1 and m.value(c.ACTIVE_REQUESTS) == 0
    (span,) = m.spans("chat m")
    assert span.attributes["error.type"] == "timeout" and span.status.status_code is otel_trace.StatusCode.ERROR
    with pytest.raises(RuntimeError):
        r.start()
    with pytest.raises(RuntimeError):
        instrument.request("m", telemetry=m.tel).first_token()


def test_trace_request_makes_its_span_current_only_during_the_call():
    m = Mem()
    tracer = m.tel.tracer

    @instrument.trace_request(model="m")
    def generate():
        with tracer.start_as_current_span("tokenize"):
            pass

    token = otel_context.attach(otel_context.Context())
    try:
        generate()
        generate()
        assert not otel_trace.get_current_span().get_span_context().is_valid
    finally:
        otel_context.detach(token)
    requests, tokenize = m.spans("chat m"), m.spans("tokenize")
    assert len({s.context.trace_id for s in requests}) == 2 and all(s.parent is None for s in requests)
    assert sorted(t.parent.span_id for t in tokenize) == sorted(s.context.span_id for s in requests)
