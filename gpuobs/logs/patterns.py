"""Counting the log records of this process that match the log-pattern catalog
(gpuobs.logpatterns), by pattern.

`PatternFilter` is a logging.Filter: the gpuobs handlers (FluentdHandler, the JSON-lines handler
of `configure()`) carry one, and any other handler can take one (`handler.addFilter(
PatternFilter())`), so counting needs no Fluentd. It matches the record's message (and, when the
message matches nothing, the exception logged with it, e.g. `log.exception("step failed")` on a
torch.OutOfMemoryError), counts a match in a process-wide counter, sets `log_pattern` on the record
(so the shipped record says what it matched) and always lets the record through. A record that
passes several gpuobs handlers is counted once. It never raises and never blocks: a match costs
one prefilter search, a counted match one uncontended lock; any message, however long and
however built, is matched in bounded time (logpatterns.match: linear patterns on the message's
first MAX_LINE_CHARS characters), so a hostile or huge message cannot stall the training step
that logs it.

`pattern_matches_total()` is the process-wide count per pattern name, every catalog pattern
present (0 until it matches), never decreasing (a forked child starts from 0, as the dropped
records count does). The training metrics endpoint of `gpuobs.instrument` observes it as
`gpuobs_log_pattern_matches_total{pattern=...}`, with no user code."""

from __future__ import annotations

import logging
import os
import threading

from .. import logpatterns

FIELD = "log_pattern"  # the record attribute (and shipped field) naming the matched pattern
_counts: dict[str, int] = dict.fromkeys(logpatterns.BY_NAME, 0)
_lock = threading.Lock()  # replaced in a forked child (a parent thread may hold it at fork)


def _text_of_exception(record: logging.LogRecord) -> str:
    """'TypeName: message' of the exception logged with the record, or ''."""
    exc = record.exc_info[1] if record.exc_info else None
    return f"{type(exc).__name__}: {exc}" if exc is not None else ""


def match_record(record: logging.LogRecord) -> logpatterns.Match | None:
    """The catalog match of a record: its message, else its exception's 'Type: message'. None
    when neither matches. Only the start of a long text is matched (logpatterns.MAX_LINE_CHARS;
    counted in logpatterns.truncated_total()). Raises what record.getMessage() raises (bad
    %-arguments)."""
    found = logpatterns.match(record.getMessage())
    if found is None and record.exc_info:
        found = logpatterns.match(_text_of_exception(record))
    return found


def count(name: str, n: int = 1) -> None:
    """Add n to the process-wide count of pattern `name`; a name outside the catalog is ignored
    (the `pattern` label stays the catalog's fixed set)."""
    if name in _counts:
        with _lock:
            _counts[name] += n


class PatternFilter(logging.Filter):
    """Counts the records that match a log-pattern catalog entry and marks them with `log_pattern`
    (the pattern name); lets every record through. Never raises."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Counts the record under the first log pattern it matches (gpuobs.logpatterns) and names the pattern
        on the record; a record another gpuobs filter counted is not counted again. Keeps every record (True), and
        never raises into the logging call."""
        try:
            if FIELD in record.__dict__:  # counted by another gpuobs handler's filter already
                return True
            found = match_record(record)
            if found is not None:
                record.__dict__[FIELD] = found.name
                count(found.name)
        except Exception:  # noqa: BLE001 - the logging path must never raise into training code
            pass
        return True


def pattern_matches_total() -> dict[str, int]:
    """Records of this process matched per catalog pattern name since it started (a forked child
    starts from 0); every pattern present, counts never decrease. A copy."""
    with _lock:
        return dict(_counts)


def _at_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for name in _counts:
        _counts[name] = 0


os.register_at_fork(after_in_child=_at_fork_in_child)
