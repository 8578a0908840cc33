"""Structured logging for gpuobs processes: JSON lines on a stream, or records shipped to Fluentd
(forward protocol, each chunk acknowledged) when one is configured. Both carry the same fields:
time, level, logger, pid, message, any `extra` fields, trace_id/span_id of the active span, and
rank/job_id/node/pod.

`records_dropped_total()` is the process's count of log records that Fluentd did not acknowledge
in time or that never left the process (full queue, packing errors): a counter that never
decreases. The exporter reads it for its /metrics; the training metrics endpoint of
`gpuobs.instrument` serves it as gpuobs_telemetry_log_records_dropped_total, with no user code.

Both handlers also count the records that match the log-pattern catalog (gpuobs.logpatterns:
NCCL timeouts, CUDA OOM, Xid lines, ...) and mark them with `log_pattern` (PatternFilter, usable
on any handler); `pattern_matches_total()` is served as gpuobs_log_pattern_matches_total.

`configure()` also logs the exceptions that end the process or a thread (gpuobs.logs.uncaught: a
hook chained in front of sys.excepthook and threading.excepthook, the original still called), so a
collective timeout or CUDA OOM raised and never caught is shipped and counted too."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

from ..runenv import RunEnv
from .fields import ContextFilter, RecordFormatter, rfc3339
from .fluentd import DroppedRecordsCollector, FluentdHandler, address_from_env, parse_address, records_dropped_total
from .patterns import PatternFilter, pattern_matches_total
from .uncaught import install as install_uncaught_hooks

__all__ = ["ContextFilter", "DroppedRecordsCollector", "FluentdHandler", "PatternFilter",
           "RecordFormatter", "address_from_env", "configure", "install_uncaught_hooks", "json_handler",
           "parse_address", "pattern_matches_total", "records_dropped_total", "rfc3339", "setup"]


def json_handler(stream: IO[str] | None = None, env: RunEnv | None = None) -> logging.Handler:
    """One JSON object per line on stream (default: sys.stdout at call time); records matching the
    log-pattern catalog are counted (PatternFilter)."""
    handler = logging.StreamHandler(sys.stdout if stream is None else stream)
    handler.setFormatter(RecordFormatter())
    handler.addFilter(ContextFilter(env))
    handler.addFilter(PatternFilter())
    return handler


def configure(level: str | int = "info", fluentd: str | None = None, tag: str = "gpuobs",
              stream: IO[str] | None = None, env: RunEnv | None = None, uncaught: bool = True,
              **fluentd_options: Any) -> logging.Handler:
    """Install one handler on the root logger and return it: a FluentdHandler when `fluentd`
    ('host:port') or the environment (GPUOBS_FLUENTD, or FLUENTD_HOST and FLUENTD_PORT) names a
    Fluentd, else JSON lines on `stream` (default sys.stdout). `fluentd_options` go to
    FluentdHandler (queue_maxsize, timeout, delivery_timeout, connect_timeout, close_timeout,
    bufmax). A handler installed by an earlier call is closed (its drops stay counted in
    records_dropped_total()); the application's other handlers (files, ...) stay. With `uncaught`
    (default), an exception that ends the process or a thread is logged as a CRITICAL record of
    `gpuobs.uncaught` before the previous sys/threading excepthook runs (install_uncaught_hooks)."""
    address = fluentd or address_from_env()
    if address:
        host, port = parse_address(address)
        handler: logging.Handler = FluentdHandler(host, port, tag=tag, env=env, **fluentd_options)
    else:
        handler = json_handler(stream, env)
    # marks the handlers configure() installed (replaced on the next call); not a Handler attribute
    handler._gpuobs = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    # Replace earlier gpuobs handlers and plain console handlers (they would print every record
    # twice); keep the application's own, such as a FileHandler.
    old = [h for h in root.handlers if getattr(h, "_gpuobs", False) or type(h) is logging.StreamHandler]
    root.handlers[:] = [h for h in root.handlers if h not in old] + [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    if uncaught:
        install_uncaught_hooks()
    for h in old:
        try:
            h.close()
        except Exception:
            pass
    return handler


def setup(level: str = "info") -> None:
    """The exporter's logs: one JSON object per line on stderr (time, level, logger, message and
    any `extra` fields, plus pid, node and trace fields), or to Fluentd when GPUOBS_FLUENTD (or
    FLUENTD_HOST) is set."""
    configure(level, stream=sys.stderr)
