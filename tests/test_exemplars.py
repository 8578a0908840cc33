"""Exemplars on slow steps and requests (gpuobs.instrument.exemplars): the slow rule, the bucket
each exemplar lands on, the OpenMetrics body (parsed) and the unchanged classic body, the OTel
exporter's private parts we rely on, and end to end: examples/train.py scraped by a real Prometheus
with exemplar storage, a trace id read back through /api/v1/query_exemplars and found, as a slow
`train.step` span, in what the OTLP receiver got."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from conftest import REPO, OTLPReceiver, free_port, stop
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_instrument import isolated  # noqa: F401  (autouse: no launcher or OTEL_* variables, fresh module state)

from gpuobs import catalog as c
from gpuobs import instrument
from gpuobs.instrument import exemplars
from gpuobs.instrument.env import RunEnv
from gpuobs.instrument.quantiles import WindowedQuantiles, slow_threshold

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class ScriptedTimer:
    """A step timer returning the durations given, in order (seconds): steps of known length."""

    def __init__(self, durations):
        self.durations = list(durations)

    def start(self):
        return 0  # a token (None would make the step fall back to the wall clock)

    def stop(self, token, payload=None):
        return self.durations.pop(0)

    def poll(self):
        return iter(())


def scrape(port: int, accept: str | None = None) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def exemplars_in(body: str, name: str) -> list[tuple[dict, object]]:
    """(bucket labels, Exemplar) of every exemplar of histogram `name` in an OpenMetrics body (the
    client library's parser: it fails on a malformed body)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    return [(s.labels, s.exemplar) for fam in text_string_to_metric_families(body) if fam.name == name
            for s in fam.samples if s.exemplar is not None]


def test_slow_threshold_is_p90_twice_the_median_or_the_floor():
    assert slow_threshold([1.0] * 10) == 2.0  # a tight distribution: its p90 is jitter, not slow
    assert slow_threshold([1.0] * 8 + [10.0] * 2) == pytest.approx(10.0)  # p90 above twice the median
    assert slow_threshold([1.0] * 10, floor=5.0) == 5.0
    windows = WindowedQuantiles(60, 100)
    window = windows.window({"rank": "0"})
    assert window.slow == float("inf")  # nothing is slow before the first collection
    for v in (0.01,) * 9 + (0.5,):
        window.add(v)
    windows.quantiles()  # a collection sets it
    assert window.slow == pytest.approx(0.059)  # p90 = 0.01 + 0.1 x (0.5 - 0.01); twice the median 0.02


def test_settings_read_the_exemplar_variables(monkeypatch, caplog):
    from gpuobs.instrument.providers import Settings

    env = RunEnv()
    assert Settings().resolved(env).exemplars is True and Settings().resolved(env).exemplar_min_s == 0.0
    monkeypatch.setenv("GPUOBS_EXEMPLARS", "off")
    monkeypatch.setenv("GPUOBS_EXEMPLAR_MIN_S", "0.25")
    assert Settings().resolved(env).exemplars is False and Settings().resolved(env).exemplar_min_s == 0.25
    assert Settings(exemplars=True).resolved(env).exemplars is True  # an argument wins
    monkeypatch.setenv("GPUOBS_EXEMPLAR_MIN_S", "slow")
    assert Settings().resolved(env).exemplar_min_s == 0.0 and "GPUOBS_EXEMPLAR_MIN_S" in caplog.text


def test_only_slow_steps_get_exemplars_on_their_buckets():
    port = free_port()
    spans = InMemorySpanExporter()
    tel = instrument.configure(prometheus_port=port, prometheus_addr="127.0.0.1", span_exporters=[spans],
                               env=RunEnv(rank=2, job_id="job-x"))
    fast, slow = 0.004, (0.07, 0.3, 0.07)
    script = [fast] * 40 + [fast] * 10 + [slow[0]] + [fast] * 10 + [slow[1]] + [slow[2]]
    run = instrument.TrainingRun(tel, timer=ScriptedTimer(script))
    for _ in range(40):
        with run.step():
            pass
    assert exemplars_in(scrape(port, OPENMETRICS), c.STEP_DURATION.name) == []  # no threshold known before
    for _ in range(len(script) - 40):  # the scrape set the threshold: 2 x 4 ms
        with run.step():
            pass
    tel.tracer_provider.force_flush()
    body = scrape(port, OPENMETRICS)
    found = exemplars_in(body, c.STEP_DURATION.name)
    by_span = {s.context.span_id: s for s in spans.get_finished_spans() if s.name == "train.step"}
    # one exemplar per bucket (the two 70 ms steps share the 0.1 bucket: the later one stays)
    assert sorted((labels["le"], ex.value) for labels, ex in found) == [("0.1", 0.07), ("0.5", 0.3)]
    steps = sorted(by_span.values(), key=lambda s: s.attributes["gpuobs.step"])
    expected = {"0.1": steps[-1], "0.5": steps[-2]}  # the last 70 ms step, the 300 ms step
    for labels, ex in found:
        span = expected[labels["le"]]
        assert ex.labels == {"trace_id": format(span.context.trace_id, "032x"),
                             "span_id": format(span.context.span_id, "016x")}
        assert labels["rank"] == "2" and labels["job_id"] == "job-x"
    assert "# {" not in scrape(port)  # the classic text format carries no exemplars


def test_slow_requests_get_exemplars_fast_ones_do_not(monkeypatch):
    monkeypatch.setenv("GPUOBS_EXEMPLAR_MIN_S", "0.02")  # a floor far above a fast request: no jitter flakes
    port = free_port()
    spans = InMemorySpanExporter()
    tel = instrument.configure(prometheus_port=port, prometheus_addr="127.0.0.1", span_exporters=[spans])
    for operation in ("chat", "predict") * 20:  # two series, each with its own window
        with instrument.request(model="m", operation=operation):
            pass
    scrape(port)  # the collection that sets the thresholds
    for operation, slow in [("chat", False)] * 10 + [("predict", True)] + [("chat", False)] * 10 + [("chat", True)]:
        with instrument.request(model="m", operation=operation):
            if slow:
                time.sleep(0.05)
    tel.tracer_provider.force_flush()
    found = exemplars_in(scrape(port, OPENMETRICS), c.REQUEST_DURATION.name)
    by_trace = {format(s.context.trace_id, "032x"): s for s in spans.get_finished_spans()}
    assert sorted(labels["gen_ai_operation_name"] for labels, _ in found) == ["chat", "predict"]
    for labels, ex in found:
        span = by_trace[ex.labels["trace_id"]]
        assert format(span.context.span_id, "016x") == ex.labels["span_id"]
        assert (span.end_time - span.start_time) / 1e9 >= 0.05 and ex.value >= 0.05
        assert labels["gen_ai_operation_name"] == span.attributes["gen_ai.operation.name"]
        assert float(labels["le"]) >= ex.value


def test_exemplars_off_by_variable_and_without_spans(monkeypatch):
    monkeypatch.setenv("GPUOBS_EXEMPLARS", "false")
    tel = instrument.configure(prometheus_port=free_port(), prometheus_addr="127.0.0.1")
    assert tel.exemplars is None
    tel.shutdown(timeout_s=2)
    monkeypatch.delenv("GPUOBS_EXEMPLARS")
    port = free_port()
    tel = instrument.configure(prometheus_port=port, prometheus_addr="127.0.0.1", spans=False)
    run = instrument.TrainingRun(tel, timer=ScriptedTimer([0.001] * 10 + [1.0]))
    for _ in range(10):
        with run.step():
            pass
    scrape(port)
    with run.step():  # slow, but no span: no trace to point to
        pass
    assert exemplars_in(scrape(port, OPENMETRICS), c.STEP_DURATION.name) == []


def test_classic_text_is_unchanged_and_exemplars_sit_in_their_bucket():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import HistogramMetricFamily

    def family():
        f = HistogramMetricFamily(c.STEP_DURATION.name, "steps", labels=["job_id", "otel_scope_name", "rank"])
        f.add_metric(["", "gpuobs.instrument", "0"], buckets=[("0.1", 3), ("0.5", 4), ("+Inf", 5)], sum_value=2.0)
        f.add_metric(["", "gpuobs.instrument", "1"], buckets=[("0.1", 1), ("0.5", 1), ("+Inf", 1)], sum_value=0.1)
        return f

    store = exemplars.ExemplarStore((0.1, 0.5))

    class Span:
        def __init__(self, trace_id):
            from opentelemetry.trace import SpanContext, TraceFlags
            self.ctx = SpanContext(trace_id, 7, False, TraceFlags(TraceFlags.SAMPLED))

        def get_span_context(self):
            return self.ctx

    assert store.offer(c.STEP_DURATION.name, {"rank": "0", "job_id": ""}, 0.3, Span(1))
    assert store.offer(c.STEP_DURATION.name, {"rank": "0", "job_id": ""}, 0.9, Span(2))
    plain, marked = family(), family()
    marked.samples = exemplars.with_exemplars(marked.samples, store.exemplars(c.STEP_DURATION.name))
    on = {(s.labels["rank"], s.labels.get("le")): s.exemplar for s in marked.samples}
    assert on[("0", "0.5")].labels["trace_id"] == format(1, "032x") and on[("0", "+Inf")].value == 0.9
    assert on[("0", "0.1")] is None and all(on[("1", le)] is None for le in ("0.1", "0.5", "+Inf"))

    def text(f):
        registry = CollectorRegistry()
        registry.register(type("C", (), {"collect": lambda self: [f]})())
        return generate_latest(registry)

    assert text(plain) == text(marked)


def test_the_otel_exporter_parts_we_use_are_there():
    """serve() swaps the reader's private `_collector` in its `_registry` and label_sanitizer() takes
    the exporter's private sanitize_attribute: an exporter release that renames them fails here
    (metrics would still be served, without exemplars)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.exporter.prometheus._mapping import sanitize_attribute
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    inner = reader._collector
    assert exemplars.serve(reader, exemplars.ExemplarStore(()), [c.STEP_DURATION.name])
    assert isinstance(reader._collector, exemplars.ExemplarCollector) and reader._collector.inner is inner
    assert list(registry._collector_to_names) == [reader._collector]
    reader.shutdown()  # unregisters ours
    assert not registry._collector_to_names
    assert exemplars.label_sanitizer() is sanitize_attribute
    assert sanitize_attribute("gen_ai.request.model") == "gen_ai_request_model"


def query_exemplars(url: str, promql: str, since: float) -> list[dict]:
    args = urllib.parse.urlencode({"query": promql, "start": since, "end": time.time() + 1})
    with urllib.request.urlopen(f"{url}/api/v1/query_exemplars?{args}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return [e for series in body["data"] for e in series["exemplars"]]


def test_prometheus_stores_exemplars_of_slow_steps_and_the_receiver_has_their_spans(prometheus):
    receiver = OTLPReceiver()
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "1", "GPUOBS_JOB_ID": "exemplar-job",
           "GPUOBS_PROMETHEUS_PORT": str(port), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
           # on a loaded test machine a 5 ms step can take twice the median (slow by the relative rule,
           # rightly): the floor makes "fast" unambiguous here
           "GPUOBS_EXEMPLAR_MIN_S": "0.1"}
    since = time.time()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "train.py"), "--steps", "100000", "--compute-ms", "4",
         "--data-ms", "1", "--slow-every", "25", "--slow-ms", "150", "--checkpoint-every", "100000",
         "--eval-every", "100000"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        query = prometheus([f"127.0.0.1:{port}"], exemplars=True)
        promql = f'{c.STEP_DURATION.name}_bucket{{job="gpuobs"}}'
        deadline = time.monotonic() + 60
        found: list[dict] = []
        while time.monotonic() < deadline and len({e["labels"]["trace_id"] for e in found}) < 3:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            time.sleep(1)
            found = query_exemplars(query.url, promql, since)
        assert len({e["labels"]["trace_id"] for e in found}) >= 3, found
        proc.send_signal(signal.SIGINT)  # exits through atexit: the telemetry flushes its spans
        proc.wait(15)
    finally:
        stop(proc)
        receiver.close()
    spans = {(s.trace_id.hex(), s.span_id.hex()): s for req in receiver.traces for rs in req.resource_spans
             for ss in rs.scope_spans for s in ss.spans}
    for e in found:
        span = spans.get((e["labels"]["trace_id"], e["labels"]["span_id"]))
        assert span is not None, e
        assert span.name == "train.step"
        seconds = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        assert seconds >= 0.15, (e, seconds)  # a slow step: fast ones (about 5 ms) got no exemplar
        assert float(e["value"]) >= 0.1
        step = {a.key: a.value.int_value for a in span.attributes}["gpuobs.step"]
        assert step % 25 == 0, step  # one of the slow steps
        assert float(e["value"]) == pytest.approx(seconds, abs=0.02)
