"""What every gpuobs log record carries, whichever way it leaves the process: the active trace and
span ids (so a log line links to its trace), the run environment (rank, job_id, node, pod) and the
standard time/level/logger/pid/message fields. Shared by the JSON-lines and the Fluentd handlers."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from ..runenv import RunEnv


def rfc3339(created: float) -> str:
    """UTC time with milliseconds, e.g. 2025-01-02T03:04:05.678Z."""
    secs = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + ".%03dZ" % int((created - secs) * 1000)


class ContextFilter(logging.Filter):
    """Adds trace_id/span_id (of the span active on the logging thread) and the run environment's
    fields (rank, local_rank, job_id, node, pod; those detected) to each record as attributes, so any
    formatter sees them as `extra` fields. Fields given by the caller's `extra` are kept."""

    def __init__(self, env: RunEnv | None = None):
        super().__init__()
        env = env if env is not None else RunEnv.detect()
        self.fields = {k: v for k, v in env.log_fields().items() if v is not None}

    def filter(self, record: logging.LogRecord) -> bool:
        """Adds the active span's trace_id (32 hex digits) and span_id (16) and the run's fields to the
        record where the caller's `extra` did not set them; keeps every record (True)."""
        d = record.__dict__
        if "trace_id" not in d:
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                d["trace_id"] = format(ctx.trace_id, "032x")
                d["span_id"] = format(ctx.span_id, "016x")
        for key, value in self.fields.items():
            if key not in d:
                d[key] = value
        return True


class RecordFormatter(JsonFormatter):
    """One JSON object per record: time (RFC 3339, UTC), level, logger, pid, message, exc_info and
    stack_info when present, then every `extra` field (trace and run fields included, when a
    ContextFilter ran). `to_dict` gives the same fields unserialised, for the Fluentd handler."""

    def __init__(self) -> None:
        super().__init__("{asctime}{levelname}{name}{process}{message}", style="{",
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger",
                                        "process": "pid"})

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The record's creation time in RFC 3339, UTC, with milliseconds (`datefmt` is ignored)."""
        return rfc3339(record.created)

    def to_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        """The record's fields as the JSON object has them, unserialised: a dict message's keys merged in,
        the exception and stack as text."""
        message_dict: dict[str, Any] = {}
        if isinstance(record.msg, dict):
            message_dict = record.msg.copy()
            record.message = ""
        else:
            record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        if record.exc_info and not record.exc_text:
            text = self.formatException(record.exc_info)  # python-json-logger may give the lines as a list
            record.exc_text = text if isinstance(text, str) else "\n".join(text)
        if record.exc_text and not message_dict.get("exc_info"):
            message_dict["exc_info"] = record.exc_text
        if record.stack_info and not message_dict.get("stack_info"):
            message_dict["stack_info"] = self.formatStack(record.stack_info)
        data: dict[str, Any] = {}
        self.add_fields(data, record, message_dict)
        return self.process_log_record(data)

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (the fields of to_dict())."""
        return self.serialize_log_record(self.to_dict(record))
