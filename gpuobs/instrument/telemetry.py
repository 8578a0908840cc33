"""Recording training and inference telemetry into OpenTelemetry providers.

`Telemetry` records: given a TracerProvider and a MeterProvider (as contrib's instrumentors are),
it takes its tracer and meter from them under the instrumenting scope `gpuobs.instrument` and
gpuobs's version, and creates every instrument of the catalog's training, inference and
telemetry families once. Without providers it is disabled: OTel's no-op tracer and meter, and
recording costs a method call on a no-op object.

`configure()` builds the providers from its arguments and the standard OTEL_* variables
(gpuobs.instrument.providers: resource attributes from the run's rank/job/node, OTLP exporters,
a Prometheus endpoint) and makes the resulting Telemetry the current one.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any, Sequence

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import Observation

from .. import __version__, logpatterns
from .. import catalog as c
from ..runenv import RunEnv
from . import ending
from .providers import BATCH_BUCKETS, DURATION_BUCKETS, SPAN_QUEUE, Providers, Settings, build, install_global
from .quantiles import DEFAULT_MAX_SAMPLES, DEFAULT_WINDOW_S, WindowedQuantiles
from .recorders import NO_VALUES, Cell, LocalValues, Recorder, SyncRecorder

# the buckets, the span queue and the recorders are defined apart and stay importable from here
__all__ = ["BATCH_BUCKETS", "DURATION_BUCKETS", "HELD", "SCOPE", "SPAN_QUEUE", "Cell", "LocalValues", "Recorder",
           "SyncRecorder", "Telemetry", "configure", "current"]

log = logging.getLogger("gpuobs.instrument")

SCOPE = "gpuobs.instrument"  # the instrumentation scope of gpuobs's spans and metrics

# How each catalog metric is recorded, chosen per metric. HELD: in LocalValues, observed at
# collection: the counters and gauges a training step updates (about ten per step, where a
# synchronous instrument call would cost several µs each). The histograms and the inference
# metrics are SDK instruments called per recording (SyncRecorder); the quantile and drop gauges
# are observed from callbacks of their own and take no recording calls.
HELD = frozenset(m.name for m in (
    c.STEPS, c.STEPS_FAILED, c.MICRO_STEPS, c.LAST_STEP, c.SAMPLES_TRAINED, c.TOKENS_TRAINED, c.LOSS, c.GRAD_NORM,
    c.LEARNING_RATE, c.NONFINITE, c.FLOPS, c.PEAK_FLOPS, c.COMPUTE, c.COLLECTIVE_WAIT, c.GOODPUT, c.BADPUT))
DROPS = frozenset((c.SPANS_DROPPED.name, c.LOGS_DROPPED.name, c.LOG_LINES_TRUNCATED.name))
# observed from gpuobs.logs's process-wide counts, like the dropped log records, and from how the
# process ended (gpuobs.instrument.ending)
ENDING = (c.RUN_END, c.RUN_CRASH)
# and from the run environment: where the rank runs (host, pod, GPU UUID), one series per process
OBSERVED = DROPS | {c.LOG_PATTERN_MATCHES.name, c.RANK_INFO.name} | {m.name for m in ENDING}
EXIT_TIMEOUT_S = 3.0  # the exit hook's bound on the final flush and export
_QUANTILE_OF = {q.name: d for d, q in c.QUANTILES.items()}  # quantile gauge -> its duration histogram


class Telemetry:
    """What instrumentation records into.

    env: the run environment (its metric attributes go on every training point); providers: the
    SDK providers to record into and what exports from them (configure() builds them; default: none,
    disabled). The tracer and meter come from those providers (scope `gpuobs.instrument`, gpuobs's
    version); without a tracer provider no spans are recorded. quantile_window_s: the window of
    the exact duration quantiles. exemplar_min_s: no observation shorter than this gets an
    exemplar (GPUOBS_EXEMPLAR_MIN_S); exemplars: the providers' ExemplarStore (None: none kept).
    on_shutdown: callables run first at shutdown (runs end their spans). exit_grace_s: how long the
    process may keep serving its Prometheus endpoint at exit until a scrape carried how it ended
    (gpuobs.instrument.ending; configure() sets it, 0 here)."""

    def __init__(self, env: RunEnv, providers: Providers | None = None,
                 quantile_window_s: float = DEFAULT_WINDOW_S, exemplar_min_s: float = 0.0):
        self.env = env
        self.providers = providers if providers is not None else Providers()
        self.exemplars = self.providers.exemplars
        self.exemplar_min_s = exemplar_min_s
        tracer_provider, meter_provider = self.providers.tracer_provider, self.providers.meter_provider
        self.enabled = tracer_provider is not None or meter_provider is not None
        self.tracer = (tracer_provider.get_tracer(SCOPE, __version__) if tracer_provider is not None
                       else otel_trace.NoOpTracer())
        self.meter = (meter_provider.get_meter(SCOPE, __version__) if meter_provider is not None
                      else otel_metrics.NoOpMeter(SCOPE, __version__))
        self.quantile_window_s = quantile_window_s
        self.local: dict[str, list[LocalValues]] = {}  # metric name -> LocalValues handed out
        self.windows: dict[str, WindowedQuantiles] = {}  # duration metric name -> its window
        self.on_shutdown: list = []
        self.zeroed: set[tuple] = set()  # attribute sets whose error counter is emitted at 0 (instrument.inference)
        self.exit_grace_s = 0.0
        self._closed = False
        self.instruments: dict[str, Any] = {m.name: self._create(m) for m in c.OTEL}  # name -> OTel instrument
        self._sync = {m.name: SyncRecorder(self.instruments[m.name]) for m in c.OTEL
                      if m.name not in HELD and m.name not in OBSERVED and m.name not in _QUANTILE_OF}

    # the providers' parts, as attributes of the telemetry (what tests, benchmarks and users read)
    tracer_provider = property(lambda self: self.providers.tracer_provider)
    meter_provider = property(lambda self: self.providers.meter_provider)
    span_processor = property(lambda self: self.providers.span_processor)
    http_server = property(lambda self: self.providers.http_server)
    readers = property(lambda self: self.providers.readers)
    owns_providers = property(lambda self: self.providers.owned)

    def instrument(self, metric: c.Metric) -> Recorder:
        """The Recorder of a catalog metric: for a HELD metric a new LocalValues (one per call,
        observed at collection; keeps nothing when disabled), else the metric's SyncRecorder.
        Raises TypeError for the metrics observed from gpuobs's own callbacks (quantiles, drops, log
        pattern counts)."""
        found = self._sync.get(metric.name)
        if found is not None:
            return found
        if metric.name not in HELD:
            raise TypeError(f"{metric.otel_name} is observed by gpuobs itself; nothing records into it")
        if not self.enabled:
            return NO_VALUES
        values = LocalValues(metric.kind)
        self.local.setdefault(metric.name, []).append(values)
        return values

    def quantiles(self, metric: c.Metric) -> WindowedQuantiles:
        """The windowed quantiles kept for a duration histogram of catalog.QUANTILES (one per
        Telemetry, shared by every recorder); observed as the metric's `..._quantile_seconds` gauge."""
        found = self.windows.get(metric.name)
        if found is None:
            found = self.windows[metric.name] = WindowedQuantiles(
                self.quantile_window_s if self.enabled else 0.0, DEFAULT_MAX_SAMPLES if self.enabled else 1,
                slow_floor_s=self.exemplar_min_s)
        return found

    def exemplar(self, metric: c.Metric, attrs: dict, value: float, span: Any) -> None:
        """Keep an exemplar of span for a slow observation of a histogram (value seconds, the
        histogram point's attributes), for the Prometheus endpoint; nothing without one. Callers
        call it only at or above their window's `slow` threshold (gpuobs.instrument.exemplars)."""
        if self.exemplars is not None:
            self.exemplars.offer(metric.name, attrs, value, span)

    @property
    def spans_dropped(self) -> int:
        """Spans dropped because the export queue was full (the exporter was slow or down)."""
        return getattr(self.span_processor, "dropped", 0)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Run the on_shutdown hooks, then flush and stop exporting within timeout_s whatever state
        the endpoint is in (Providers.shutdown; providers someone else gave are only flushed).
        Never raises; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        for hook in list(self.on_shutdown):
            try:
                hook()
            except Exception:  # noqa: BLE001 - shutting down must not raise into training code
                log.exception("telemetry shutdown hook failed")
        self.providers.shutdown(timeout_s)

    def end(self, timeout_s: float = EXIT_TIMEOUT_S) -> None:
        """End the run's telemetry as the process's exit does: mark how the run ended (a crash the
        excepthook saw, else a normal end: gpuobs.instrument.ending), keep serving the Prometheus
        endpoint until one scrape carried it (at most exit_grace_s seconds, nothing if never
        scraped), then shutdown(timeout_s). Call it instead of shutdown() at the end of a training
        script; the exit hook calls it for the current telemetry. Never raises; again does nothing."""
        if self._closed or not self.enabled:
            return
        ending.linger(self.exit_grace_s, serving=self.http_server is not None)
        ending.finish()
        self.shutdown(timeout_s)

    # ---- instruments ----------------------------------------------------------------------------

    def _create(self, m: c.Metric) -> Any:
        """The OTel instrument of a catalog metric, on this telemetry's meter."""
        meter, kw = self.meter, {"unit": m.otel_unit, "description": m.help}
        name = m.otel_name
        if name is None:
            raise ValueError(f"{m.name} is not an OpenTelemetry instrument (no otel_name)")
        if m.name in _QUANTILE_OF:
            return meter.create_observable_gauge(name, callbacks=[self._quantile_observer(
                _QUANTILE_OF[m.name])], **kw)
        if m.name in DROPS:
            return meter.create_observable_counter(name, callbacks=[self._drops_observer(m)], **kw)
        if m is c.LOG_PATTERN_MATCHES:
            return meter.create_observable_counter(name, callbacks=[self._patterns_observer], **kw)
        if m in ENDING:
            return meter.create_observable_gauge(name, callbacks=[self._ending_observer(m)], **kw)
        if m is c.RANK_INFO:
            return meter.create_observable_gauge(name, callbacks=[self._rank_info_observer], **kw)
        if m.name in HELD:
            make = meter.create_observable_counter if m.kind == "counter" else meter.create_observable_gauge
            return make(name, callbacks=[self._held_observer(m)], **kw)
        if m is c.ACTIVE_REQUESTS:
            return meter.create_up_down_counter(name, **kw)
        make = {"histogram": meter.create_histogram, "counter": meter.create_counter}.get(m.kind, meter.create_gauge)
        return make(name, **kw)

    def _held_observer(self, metric: c.Metric):
        def observe(_options):
            merged: dict[tuple, float] = {}
            for values in list(self.local.get(metric.name, ())):
                for key, cell in list(values.cells.items()):  # one C-level copy: safe against the trainer
                    value = cell.value
                    if value is not None:
                        merged[key] = merged.get(key, 0) + value if metric.kind == "counter" else value
            return [Observation(value, dict(key)) for key, value in merged.items()]
        return observe

    def _quantile_observer(self, duration: c.Metric):
        def observe(_options):
            window = self.windows.get(duration.name)
            if window is None:
                return []
            return [Observation(value, {**attrs, "quantile": f"{q:g}"}) for attrs, q, value in window.quantiles()]
        return observe

    def _drops_observer(self, metric: c.Metric):
        def observe(_options):
            if metric is c.SPANS_DROPPED:
                return [Observation(self.spans_dropped)]
            if metric is c.LOG_LINES_TRUNCATED:
                return [Observation(logpatterns.truncated_total())]
            from ..logs.fluentd import records_dropped_total  # no logs import at module level

            return [Observation(records_dropped_total())]
        return observe

    def _patterns_observer(self, _options):
        """gpuobs_log_pattern_matches_total: one point per catalog pattern (0 until it matches),
        with the run's rank and job_id."""
        from ..logs.patterns import pattern_matches_total  # no logs import at module level

        attrs = self.env.metric_attributes()
        return [Observation(n, {**attrs, "pattern": name}) for name, n in pattern_matches_total().items()]


    def _rank_info_observer(self, _options):
        """gpuobs_training_rank_info: 1, with where this rank runs (RunEnv.rank_info_attributes)."""
        return [Observation(1, self.env.rank_info_attributes())]

    def _ending_observer(self, metric: c.Metric):
        """RUN_END or RUN_CRASH: 0 while the process runs, its end's Unix time once marked."""
        def observe(_options):
            end, crash = ending.gauge_values()
            return [Observation(end if metric is c.RUN_END else crash, self.env.metric_attributes())]
        return observe


_current: Telemetry | None = None


def configure(service_name: str | None = None, endpoint: str | None = None, protocol: str | None = None,
              prometheus_port: int | None = None, enabled: bool | None = None, export_interval_s: float = 10.0,
              export_timeout_s: float = 5.0, span_exporters: Sequence[Any] = (), metric_readers: Sequence[Any] = (),
              env: RunEnv | None = None, spans: bool = True, prometheus_addr: str | None = None,
              quantile_window_s: float | None = None, tracer_provider: Any = None, meter_provider: Any = None,
              set_global: bool = True, exit_grace_s: float | None = None) -> Telemetry:
    """Set up tracing and metrics for this process and make it the current Telemetry.

    Defaults come from the standard variables: OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf or grpc),
    OTEL_METRIC_EXPORT_INTERVAL (ms), OTEL_METRICS_EXEMPLAR_FILTER (default here: always_off) and
    OTEL_SDK_DISABLED; GPUOBS_PROMETHEUS_PORT (plus the local rank) and GPUOBS_PROMETHEUS_ADDR
    (default 0.0.0.0) serve the metrics for scraping; GPUOBS_QUANTILE_WINDOW_S (default 300) is
    the window of the exact step/request quantiles; GPUOBS_EXEMPLARS (default true) and
    GPUOBS_EXEMPLAR_MIN_S (default 0) put exemplars on slow steps and requests at the Prometheus
    endpoint (gpuobs.instrument.exemplars). With nothing to export to (no endpoint, port,
    exporter, reader or provider), or OTEL_SDK_DISABLED=true, everything stays a no-op.
    spans=False records metrics only.

    tracer_provider / meter_provider: use these SDK providers (an OTel distro's, or the
    instrumentor's arguments) instead of building ours; they are flushed, never shut down, and a
    given MeterProvider keeps its own readers and histogram buckets (no Prometheus port is added).
    set_global=True (the default) installs our providers as OTel's global ones when none is set
    yet, so user spans and other instrumentations nest under `train.step` and export with them.

    exit_grace_s (default GPUOBS_EXIT_GRACE_S, else 30; 0 disables): at exit, a process serving a
    Prometheus endpoint that has been scraped keeps serving until one more scrape carried how it
    ended (a crash by uncaught exception with its log-pattern count, or a normal end), for at most
    this long (gpuobs.instrument.ending).
    """
    global _current
    if _current is not None:
        _current.shutdown(timeout_s=1.0)
    run_env = env or RunEnv.detect()
    settings = Settings(
        service_name=service_name, endpoint=endpoint, protocol=protocol, prometheus_port=prometheus_port,
        prometheus_addr=prometheus_addr, enabled=enabled, export_interval_s=export_interval_s,
        export_timeout_s=export_timeout_s, span_exporters=tuple(span_exporters), metric_readers=tuple(metric_readers),
        spans=spans, quantile_window_s=quantile_window_s, tracer_provider=tracer_provider,
        meter_provider=meter_provider).resolved(run_env)
    if not settings.enabled:
        _current = Telemetry(run_env)
        log.info(f"gpuobs telemetry: {destinations(settings, _current, asked_off=enabled is False)}",
                 extra={"rank": run_env.rank})
        return _current
    # resolved() set both; the defaults only make the types total
    window = settings.quantile_window_s if settings.quantile_window_s is not None else DEFAULT_WINDOW_S
    tel = Telemetry(run_env, build(settings, run_env), window, settings.exemplar_min_s or 0.0)
    tel.exit_grace_s = ending.exit_grace_s(exit_grace_s)
    ending.install_hook()
    if tel.http_server is not None:
        ending.count_scrapes()  # after the reader build() registered: counts the scrapes that observed the gauges
    if set_global:
        install_global(tel.tracer_provider, tel.meter_provider)
    _current = tel
    log.info(f"gpuobs telemetry: {destinations(settings, tel)}",
             extra={"endpoint": settings.endpoint, "protocol": settings.protocol,
                    "prometheus_port": settings.prometheus_port, "rank": run_env.rank})
    return tel


def destinations(settings: Settings, tel: Telemetry, asked_off: bool = False) -> str:
    """Where telemetry goes, in words, for configure()'s one log line: `off (...why)`, or the OTLP
    endpoint and protocol, the Prometheus scrape address (only if its server started), the given
    span exporters and metric readers by class (a ConsoleSpanExporter reads `ConsoleSpanExporter`),
    and given providers; `spans off` when spans=False. asked_off: configure(enabled=False) was called."""
    if not tel.enabled:
        if asked_off:
            why = "enabled=False"
        elif os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in ("1", "true", "yes", "on"):
            why = "OTEL_SDK_DISABLED is set"
        else:
            why = ("nothing to export to: no OTEL_EXPORTER_OTLP_ENDPOINT, GPUOBS_PROMETHEUS_PORT, "
                   "exporter, reader or provider")
        return f"off ({why})"
    parts = []
    if settings.endpoint:
        parts.append(f"OTLP {settings.protocol} to {settings.endpoint}")
    if tel.http_server is not None:
        host, port = tel.http_server.server_address[:2]
        parts.append(f"Prometheus scrape on http://{host}:{port}/metrics")
    elif settings.prometheus_port is not None:
        parts.append(f"no Prometheus endpoint (port {settings.prometheus_port} not served)")
    parts += [f"span exporter {type(e).__name__}" for e in settings.span_exporters]
    parts += [f"metric reader {type(r).__name__}" for r in settings.metric_readers]
    if settings.tracer_provider is not None or settings.meter_provider is not None:
        parts.append("the given OTel providers")
    if not settings.spans:
        parts.append("spans off")
    return ", ".join(parts)


def current() -> Telemetry:
    """The Telemetry set by the last configure(); a disabled one if configure was never called."""
    global _current
    if _current is None:  # not configure(): its log line is for a configuration someone chose
        _current = Telemetry(RunEnv.detect())
    return _current


def _after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker), stop the inherited periodic metric exports."""
    tel = _current
    if tel is not None and tel.enabled:
        tel.providers.stop_inherited_exports()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _at_exit() -> None:
    """When the process exits: end the current telemetry (Telemetry.end: mark how the run ended,
    serve that to one more scrape within the exit grace, then flush for at most EXIT_TIMEOUT_S; the
    final OTLP export carries the mark)."""
    if _current is not None:
        _current.end(EXIT_TIMEOUT_S)


atexit.register(_at_exit)
