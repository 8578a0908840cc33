"""The instrumentation's own self-health (OpenTelemetry), on the same endpoint and OTLP stream."""

from __future__ import annotations

from .metric import _otel

SPANS_DROPPED = _otel("gpuobs.telemetry.spans_dropped", "counter", "{span}", "gpuobs_telemetry_spans_dropped",
                      "Spans dropped because the export queue was full (the trace endpoint was slow or down).",
                      "telemetry", labels=())
LOGS_DROPPED = _otel("gpuobs.telemetry.log_records_dropped", "counter", "{record}",
                     "gpuobs_telemetry_log_records_dropped",
                     "Log records the Fluentd handlers of this process dropped (full queue, send failures).",
                     "telemetry", labels=())
LOG_LINES_TRUNCATED = _otel("gpuobs.telemetry.log_lines_truncated", "counter", "{line}",
                            "gpuobs_telemetry_log_lines_truncated",
                            "Log lines of this process (log record messages; the exporter's kernel-log records) "
                            "longer than the log-pattern catalog's cap (gpuobs.logpatterns.MAX_LINE_CHARS): only "
                            "their start was matched.", "telemetry", labels=())
