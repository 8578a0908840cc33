"""Configuring OpenTelemetry for gpuobs: the TracerProvider, MeterProvider, exporters and metric
readers, from configure()'s arguments and the standard OTEL_* (and GPUOBS_*) variables. Nothing
here records anything: gpuobs.instrument.telemetry.Telemetry takes the providers built here (or
any others) and records into them.

    settings = Settings(endpoint="http://collector:4318").resolved(RunEnv.detect())
    providers = build(settings, env) if settings.enabled else Providers()

Exporting runs on the SDK's own threads with bounded queues and timeouts, so no telemetry sink can
block a training step; shutdown and flush are bounded by their own timeouts.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from .. import catalog as c
from ..runenv import RunEnv
from . import exemplars
from .quantiles import DEFAULT_WINDOW_S

log = logging.getLogger("gpuobs.instrument")

# Seconds: from a millisecond data wait to a half-hour checkpoint.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0, 1800.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SPAN_QUEUE = 8192  # spans waiting for export (~3 s of 500 steps/s); beyond it spans are dropped, never waited for
# the histograms whose slow observations carry exemplars on the Prometheus endpoint (gpuobs.instrument.exemplars)
EXEMPLAR_METRICS = (c.STEP_DURATION, c.REQUEST_DURATION)


# ------------------------------------------------------------------------------------------ settings


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _env_float(name: str, default: float | None, what: str) -> float | None:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        log.warning(f"{name} is not {what}; using the default", extra={"value": raw})
        return default


@dataclass(frozen=True)
class Settings:
    """configure()'s arguments (see its docstring); None where a variable gives the default.
    resolved() fills those from the environment."""
    service_name: str | None = None
    endpoint: str | None = None
    protocol: str | None = None
    prometheus_port: int | None = None
    prometheus_addr: str | None = None
    enabled: bool | None = None
    export_interval_s: float = 10.0
    export_timeout_s: float = 5.0
    span_exporters: Sequence[Any] = ()
    metric_readers: Sequence[Any] = ()
    spans: bool = True
    quantile_window_s: float | None = None
    exemplars: bool | None = None
    exemplar_min_s: float | None = None
    tracer_provider: Any = None
    meter_provider: Any = None

    def resolved(self, env: RunEnv) -> "Settings":
        """These settings with the variables' values where an argument was not given:
        OTEL_EXPORTER_OTLP_ENDPOINT / _PROTOCOL (default http/protobuf), OTEL_METRIC_EXPORT_INTERVAL
        (ms), GPUOBS_PROMETHEUS_PORT (+ env.local_rank) / _ADDR (default 0.0.0.0),
        GPUOBS_QUANTILE_WINDOW_S (default 300), GPUOBS_EXEMPLARS (default true),
        GPUOBS_EXEMPLAR_MIN_S (default 0) and OTEL_SDK_DISABLED. Enabled when not disabled and
        there is something to export to. Bad values are logged and replaced by the defaults."""
        ms = _env_float("OTEL_METRIC_EXPORT_INTERVAL", None, "a number of milliseconds")
        out = dataclasses.replace(
            self, endpoint=self.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
            protocol=(self.protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").lower(),
            prometheus_port=_prometheus_port(self.prometheus_port, env),
            prometheus_addr=self.prometheus_addr or os.environ.get("GPUOBS_PROMETHEUS_ADDR") or "0.0.0.0",
            export_interval_s=ms / 1000 if ms else self.export_interval_s,
            quantile_window_s=_quantile_window(self.quantile_window_s),
            exemplars=self.exemplars if self.exemplars is not None else _truthy(
                os.environ.get("GPUOBS_EXEMPLARS", "true")),
            exemplar_min_s=self.exemplar_min_s if self.exemplar_min_s is not None else _env_float(
                "GPUOBS_EXEMPLAR_MIN_S", 0.0, "a number of seconds"))
        return out if out.enabled is not None else dataclasses.replace(out, enabled=out.wanted())

    def wanted(self) -> bool:
        """Whether telemetry is on when `enabled` is not given: OTEL_SDK_DISABLED is not true and
        there is something to export to (endpoint, Prometheus port, exporter, reader or provider)."""
        if _truthy(os.environ.get("OTEL_SDK_DISABLED")):
            return False
        return bool(self.endpoint or self.prometheus_port is not None or self.span_exporters
                    or self.metric_readers or self.tracer_provider or self.meter_provider)


def _quantile_window(given: float | None) -> float | None:
    if given is not None:
        return given
    return _env_float("GPUOBS_QUANTILE_WINDOW_S", DEFAULT_WINDOW_S, "a number of seconds")


def _prometheus_port(given: int | None, env: RunEnv) -> int | None:
    """The port given, else GPUOBS_PROMETHEUS_PORT plus the local rank (every rank of a node
    inherits the variable: each serves on base + its local rank), else None."""
    raw = os.environ.get("GPUOBS_PROMETHEUS_PORT")
    if given is not None or not raw:
        return given
    try:
        return int(raw) + (env.local_rank or 0)
    except ValueError:
        log.warning("GPUOBS_PROMETHEUS_PORT is not a port number; not serving metrics", extra={"value": raw})
        return None


# ----------------------------------------------------------------------------------------- providers


@dataclass
class Providers:
    """The SDK providers telemetry records into, and what exports from them.

    tracer_provider: None records no spans; meter_provider: None (with no tracer provider either)
    is disabled telemetry. span_processor: the CountingBatchSpanProcessor added (its `dropped`);
    http_server: the Prometheus scrape server (closed at shutdown); readers: the metric readers
    added (their exports stop in forked children); owned: False for providers someone else gave,
    which are flushed at shutdown, never shut down; exemplars: the ExemplarStore the Prometheus
    endpoint serves (None without one, or with exemplars off)."""
    tracer_provider: Any = None
    meter_provider: Any = None
    span_processor: Any = None
    http_server: Any = None
    readers: list = field(default_factory=list)
    owned: bool = True
    exemplars: Any = None

    def shutdown(self, timeout_s: float) -> None:
        """Shut the providers down (or only flush them when not owned) within timeout_s, whatever
        state the endpoint is in: the SDK's own shutdown can wait 30 s on a stuck exporter, so
        each provider's runs on a daemon thread we stop waiting for. Never raises."""
        if not self.owned:  # someone else's providers: send what we recorded, leave them running
            self.flush(timeout_s)
            return
        # One thread per provider: a stuck span export must not leave the MeterProvider unclosed,
        # or its atexit handler would wait on the stuck endpoint when the process exits.
        deadline = time.monotonic() + timeout_s
        workers = [threading.Thread(target=_close, args=(p,), name="gpuobs-telemetry-shutdown", daemon=True)
                   for p in (self.tracer_provider, self.meter_provider) if p is not None]
        for worker in workers:
            worker.start()
        if self.http_server is not None:  # free the port for the next configure()
            self.http_server.shutdown()
            self.http_server.server_close()
            self.http_server = None
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        if any(worker.is_alive() for worker in workers):
            log.warning("telemetry shutdown timed out; unsent data dropped", extra={"timeout_s": timeout_s})

    def flush(self, timeout_s: float) -> None:
        """force_flush both providers (each for at most timeout_s). Never raises."""
        for provider in (self.tracer_provider, self.meter_provider):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                try:
                    flush(int(timeout_s * 1000))
                except Exception:  # noqa: BLE001 - shutting down must not raise into training code
                    log.exception("telemetry flush failed")

    def stop_inherited_exports(self) -> None:
        """In a forked child (a DataLoader worker): stop the periodic metric exports the SDK
        restarts there, which would report the parent's frozen cumulative values under the same
        rank and look like counter resets."""
        for reader in self.readers:
            _stop_periodic_export(reader)


def _close(provider: Any) -> None:
    try:
        provider.shutdown()
    except Exception:  # noqa: BLE001 - shutting down must not raise into training code
        log.exception("telemetry shutdown failed")


def build(settings: Settings, env: RunEnv) -> Providers:
    """SDK providers for resolved, enabled settings: ours (with the run's resource, OTLP exporters
    for the endpoint, the Prometheus reader and server for the port), or the ones given."""
    resource = _resource(settings.service_name, env)
    span_exporters, readers = list(settings.span_exporters), list(settings.metric_readers)
    if settings.endpoint:
        span_exporter, reader = _otlp(settings)
        span_exporters.append(span_exporter)
        readers.append(reader)
    http_server, store = _serve_prometheus(settings, readers)
    tracer_provider, processor = _tracer_provider(settings, resource, span_exporters)
    meter_provider = settings.meter_provider
    if meter_provider is None:
        meter_provider = _meter_provider(resource, readers)
    elif readers:
        log.warning("a MeterProvider was given: the metric readers and endpoint passed along are not added")
    owned = settings.tracer_provider is None and settings.meter_provider is None
    return Providers(tracer_provider, meter_provider, processor, http_server, readers, owned, exemplars=store)


def _resource(service_name: str | None, env: RunEnv) -> Any:
    """The run's resource attributes, merged with OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    (service_name wins, then OTEL_SERVICE_NAME); service.name `training` when none sets it."""
    from opentelemetry.sdk.resources import Resource

    attrs: dict[str, Any] = dict(env.resource_attributes())
    if service_name:
        attrs["service.name"] = service_name
    resource = Resource.create(attrs)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):  # neither sets it
        resource = resource.merge(Resource({"service.name": "training"}))
    return resource


def _otlp(settings: Settings) -> tuple[Any, Any]:
    """(span exporter, periodic metric reader) for the OTLP endpoint over http/protobuf or grpc."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if not settings.endpoint:
        raise ValueError("no OTLP endpoint: build() asks for exporters only with one")
    span_exporter, metric_exporter = _otlp_exporters(settings.endpoint, settings.protocol or "http/protobuf",
                                                     settings.export_timeout_s)
    return span_exporter, PeriodicExportingMetricReader(
        metric_exporter, export_interval_millis=settings.export_interval_s * 1000,
        export_timeout_millis=settings.export_timeout_s * 1000)


def _otlp_exporters(endpoint: str, protocol: str, timeout_s: float) -> tuple[SpanExporter, MetricExporter]:
    """(span exporter, metric exporter) for an OTLP endpoint over http/protobuf (default) or grpc."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        insecure = not endpoint.startswith("https://")
        return (GrpcSpans(endpoint=endpoint, insecure=insecure, timeout=timeout_s),
                GrpcMetrics(endpoint=endpoint, insecure=insecure, timeout=timeout_s))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    base = endpoint.rstrip("/")
    return (HttpSpans(endpoint=f"{base}/v1/traces", timeout=timeout_s),
            HttpMetrics(endpoint=f"{base}/v1/metrics", timeout=timeout_s))


def _serve_prometheus(settings: Settings, readers: list) -> tuple[Any, Any]:
    """Start the scrape server for the Prometheus port (adding its reader to readers) and return
    (it, the ExemplarStore it serves, None with exemplars off); (None, None) without a port, with a
    given MeterProvider (its own readers export), or when the port is taken (logged: a taken port
    must not stop training)."""
    port, addr = settings.prometheus_port, settings.prometheus_addr
    if port is None:
        return None, None
    if settings.meter_provider is not None:
        log.warning("a MeterProvider was given: its own readers export; no Prometheus endpoint added")
        return None, None
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    try:
        http_server, _ = start_http_server(port, addr=addr or "0.0.0.0")
    except OSError as e:
        log.warning("cannot serve metrics for Prometheus", extra={"port": port, "addr": addr, "error": str(e)})
        return None, None
    reader = PrometheusMetricReader()
    readers.append(reader)
    store = None
    if settings.exemplars:
        store = exemplars.ExemplarStore(DURATION_BUCKETS, exemplars.label_sanitizer())
        if not exemplars.serve(reader, store, [m.name for m in EXEMPLAR_METRICS]):
            store = None
    return http_server, store


def _tracer_provider(settings: Settings, resource: Any, span_exporters: list) -> tuple[Any, Any]:
    """(tracer provider, the last span processor added) for spans=True: the given provider or
    ours, with a CountingBatchSpanProcessor per exporter; (None, None) for spans=False."""
    if not settings.spans:
        return None, None
    provider = settings.tracer_provider
    if provider is None:
        from opentelemetry.sdk.trace import TracerProvider

        # The SDK's own exit hooks can wait 30 s on a stuck endpoint: telemetry's (_at_exit) is bounded.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    processor = None
    for exporter in span_exporters:
        processor = CountingBatchSpanProcessor(exporter, SPAN_QUEUE)
        provider.add_span_processor(processor)
    return provider, processor


def _meter_provider(resource: Any, readers: list) -> Any:
    from opentelemetry.sdk.metrics import MeterProvider

    return MeterProvider(resource=resource, metric_readers=readers, views=_views(), shutdown_on_exit=False,
                         exemplar_filter=_exemplar_filter())


def _views() -> list:
    """Explicit buckets for every histogram of the catalog: seconds or batch sizes."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    views = []
    for m in c.OTEL:
        if m.kind == "histogram":
            buckets = DURATION_BUCKETS if m.otel_unit == "s" else BATCH_BUCKETS
            views.append(View(instrument_name=m.otel_name, aggregation=ExplicitBucketHistogramAggregation(buckets)))
    return views


def _exemplar_filter():
    """OTEL_METRICS_EXEMPLAR_FILTER (always_on, always_off, trace_based), else always_off: with the
    SDK's trace_based default, every step-duration point inside a step span stored an exemplar, which
    cost more than the point itself (about 11 µs a step), and the step span already has the duration."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, AlwaysOnExemplarFilter, TraceBasedExemplarFilter

    choice = os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER", "always_off").strip().lower()
    filters = {"always_on": AlwaysOnExemplarFilter, "always_off": AlwaysOffExemplarFilter,
               "trace_based": TraceBasedExemplarFilter}
    if choice not in filters:
        log.warning("OTEL_METRICS_EXEMPLAR_FILTER is not always_on, always_off or trace_based; exemplars off",
                    extra={"value": choice})
    return filters.get(choice, AlwaysOffExemplarFilter)()


def install_global(tracer_provider: Any, meter_provider: Any) -> None:
    """Make these OTel's global providers where none is set yet. OTel allows setting each once per
    process: an earlier configure() or the application's own SDK set-up keeps its place (spans
    still nest by context: a user span started inside a step is its child, whichever provider)."""
    from opentelemetry.sdk.metrics import MeterProvider

    if tracer_provider is not None and isinstance(otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider):
        otel_trace.set_tracer_provider(tracer_provider)
    if not isinstance(otel_metrics.get_meter_provider(), MeterProvider):
        otel_metrics.set_meter_provider(meter_provider)


# ------------------------------------------------------------------------------- span drop counting


class _TakenCounter(SpanExporter):
    """Passes spans on to an exporter, telling on_taken how many the batch processor took off its
    queue for each export (it pops a batch, then calls export)."""

    def __init__(self, exporter: SpanExporter, on_taken: Any):
        self.exporter, self.on_taken = exporter, on_taken

    def export(self, spans):
        self.on_taken(len(spans))
        return self.exporter.export(spans)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        # the batch processor passes its time left where the exporter's shutdown takes it (grpc does)
        shutdown: Callable[..., None] = self.exporter.shutdown  # SpanExporter declares no arguments
        if "timeout_millis" in inspect.signature(shutdown).parameters:
            shutdown(timeout_millis=timeout_millis)
        else:
            self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor (queue of max_queue_size spans; when it is full the oldest span
    is dropped), counting what it drops in `dropped`.

    queued tracks the spans in the queue from the outside: +1 for each sampled span ended, -n when
    the processor hands a batch of n to the exporter. A span ended while queued is at the bound
    pushes the oldest one out (the SDK's policy, and its once-per-20-s warning), which counts one
    drop. Spans ended while a batch is being taken off the queue, before it reaches the exporter,
    may be counted dropped early; the count stays within one batch of the SDK's own.
    """

    def __init__(self, exporter: SpanExporter, max_queue_size: int = SPAN_QUEUE, schedule_delay_millis: float = 1000,
                 max_export_batch_size: int = 512, export_timeout_millis: float = 5000):
        self.queue_bound = max_queue_size
        self.queued = 0
        self.dropped = 0
        self._lock = threading.Lock()  # spans end on any thread; the worker thread takes batches
        super().__init__(_TakenCounter(exporter, self._taken), max_queue_size=max_queue_size,
                         schedule_delay_millis=schedule_delay_millis, max_export_batch_size=max_export_batch_size,
                         export_timeout_millis=export_timeout_millis)
        reset = weakref.WeakMethod(self._reset_after_fork)  # the hook must not keep the processor alive

        def after_fork_in_child() -> None:
            method = reset()
            if method is not None:
                method()

        os.register_at_fork(after_in_child=after_fork_in_child)

    def on_end(self, span) -> None:
        """Counts a sampled span into the queue (or as dropped when the queue is at its bound, as the SDK
        then drops it) and hands it to the batch processor."""
        if span.context is not None and span.context.trace_flags.sampled:  # what the SDK queues
            with self._lock:
                if self.queued >= self.queue_bound:
                    self.dropped += 1
                else:
                    self.queued += 1
        super().on_end(span)

    def _taken(self, n: int) -> None:
        with self._lock:
            self.queued = max(0, self.queued - n)

    def _reset_after_fork(self) -> None:
        """A forked child's SDK processor starts with an empty queue (its own at-fork hook)."""
        self._lock = threading.Lock()  # the parent's may have been held by one of its threads
        self.queued = self.dropped = 0


# ----------------------------------------------------------------------------------------- fork


class _NullMetricExporter:
    """Swallows exports: what a forked child's copy of the metric readers sends to."""

    def export(self, *args, **kwargs):
        from opentelemetry.sdk.metrics.export import MetricExportResult

        return MetricExportResult.SUCCESS

    def force_flush(self, *args, **kwargs) -> bool:
        return True

    def shutdown(self, *args, **kwargs) -> None:
        pass


def _stop_periodic_export(reader: Any) -> None:
    """Stop a PeriodicExportingMetricReader's exports in a forked child. The SDK has no public way:
    its own at-fork hook restarts the export thread in every child, and shutdown() would export
    the frozen values once more. So this replaces the reader's exporter with a null one and sets
    the event its thread stops on (SDK private attributes: `_exporter`, `_shutdown_event`, checked
    for first). Only in the child, where nothing else uses the reader."""
    if hasattr(reader, "_shutdown_event") and hasattr(reader, "_exporter"):
        reader._exporter = _NullMetricExporter()
        reader._shutdown_event.set()
