"""How a training process ended, told to Prometheus before the process is gone.

A rank that dies of its error (a collective timeout, a CUDA OOM: an uncaught exception) counts it in
gpuobs_log_pattern_matches_total from sys.excepthook (gpuobs.logs), then exits at once: Prometheus's
next scrape finds nothing, so the count never reaches the alerts of the scrape path. And a job that
ends normally behind a static target reads `up == 0`, like a crashed one.

So the process says how it ended, and waits to be scraped once more:
- an uncaught exception in the main thread (the hook chained here in front of sys.excepthook) marks
  a crash: `RUN_CRASH` = its Unix time;
- interpreter exit without one (the end of the script, sys.exit) marks a normal end: `RUN_END` =
  its Unix time;
- KeyboardInterrupt marks neither (someone stopped the run: neither done nor failed), and a fatal
  signal (torchrun's SIGTERM to the ranks that survive a failed one, SIGKILL) runs no Python at all:
  the target then reads down without the end mark, as the job did not finish.
Then telemetry's exit hook (gpuobs.instrument.telemetry._at_exit) calls `linger`: while the
Prometheus endpoint is served and has been scraped before, the process keeps serving until one scrape
has carried the mark, for at most the grace (GPUOBS_EXIT_GRACE_S, default 30 s: two 15 s scrape
intervals; 0 disables it). It never waits longer than the grace, and not at all for a process never
scraped (nobody would read the mark) or without a Prometheus endpoint (the OTLP exporter's final
export at shutdown carries both gauges).

Limits: sys.exit(n) with n != 0 reads as an end (Python tells the exit code to no exit hook); the
exit hook does not run after os._exit (multiprocessing children). With two Prometheus replicas
scraping one target, the first scrape ends the wait: raise the grace's scrape count (`scrapes`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, Callable

log = logging.getLogger("gpuobs.instrument")

GRACE_ENV = "GPUOBS_EXIT_GRACE_S"
DEFAULT_GRACE_S = 30.0  # two scrape intervals of 15 s
SETTLE_S = 0.2  # after the collector saw the mark: the response is encoded and sent (ms) before the process ends
_MARK = "_gpuobs_ending"  # set on our excepthook, so that installing it is idempotent


class Ending:
    """The process's end as the gauges serve it, and the scrapes that served it.

    ended_at / crashed_at: Unix time (s) of a normal end / of the uncaught exception, 0.0 until
    then; interrupted: a KeyboardInterrupt ended it (no mark); scrapes: Prometheus scrapes answered
    (counted by ScrapeCounter, the last collector of a scrape); carried: those that served a mark;
    seen_in: the scrape count when the gauges' callback last observed a mark (during the scrape
    that is then counted)."""

    def __init__(self) -> None:
        self.ended_at = 0.0
        self.crashed_at = 0.0
        self.interrupted = False
        self.scrapes = 0
        self.seen_in = -1
        self.carried = 0  # scrapes that carried the mark
        self.served = threading.Event()  # set at each of those

    @property
    def marked(self) -> bool:
        """Whether a crash or a normal end is marked."""
        return self.crashed_at > 0 or self.ended_at > 0

    def observed(self) -> None:
        """The gauges' callback ran (a scrape, or an OTLP export, collects them now)."""
        if self.marked:
            self.seen_in = self.scrapes

    def scraped(self) -> None:
        """A Prometheus scrape collected every other collector: it carries the mark if the gauges'
        callback observed one during it."""
        if self.marked and self.seen_in == self.scrapes:
            self.carried += 1
            self.served.set()
        self.scrapes += 1


STATE = Ending()  # one per process: the process ends once


def exit_grace_s(given: float | None) -> float:
    """The grace in seconds: given, else GPUOBS_EXIT_GRACE_S, else DEFAULT_GRACE_S; a bad or negative
    value is logged and replaced by the default (0 disables)."""
    raw: Any = given if given is not None else os.environ.get(GRACE_ENV)
    if raw is None or raw == "":
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        log.warning(f"{GRACE_ENV} is not a number of seconds >= 0; using the default", extra={"value": raw})
        return DEFAULT_GRACE_S
    return value


def gauge_values(state: Ending = STATE) -> tuple[float, float]:
    """(RUN_END, RUN_CRASH) to observe now, Unix seconds or 0; tells state it was observed."""
    state.observed()
    return state.ended_at, state.crashed_at


class ScrapeCounter:
    """A prometheus_client collector that yields nothing and counts scrapes (Ending.scraped). Register
    it after the OpenTelemetry reader's collector, so it runs after the gauges were observed."""

    def __init__(self, state: Ending = STATE):
        self.state = state

    def describe(self) -> list:
        """No metrics: registering calls this instead of collect(), which would count a scrape."""
        return []

    def collect(self) -> list:
        """Count one scrape; no metrics."""
        self.state.scraped()
        return []


_counter: list[ScrapeCounter] = []  # the one registered in prometheus_client's REGISTRY


def count_scrapes() -> None:
    """(Re-)register the ScrapeCounter last in prometheus_client's default registry (the one
    start_http_server serves), after the reader configure() just added. Never raises."""
    try:
        from prometheus_client import REGISTRY

        if _counter:
            REGISTRY.unregister(_counter.pop())
        _counter.append(ScrapeCounter())
        REGISTRY.register(_counter[0])
    except Exception:  # noqa: BLE001 - no scrape counting only shortens the exit grace to none
        log.exception("cannot count scrapes; no exit grace")


def _chain(previous: Callable[..., Any]) -> Callable[..., Any]:
    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            if issubclass(exc_type, KeyboardInterrupt):
                STATE.interrupted = True
            elif not issubclass(exc_type, SystemExit) and not STATE.crashed_at:
                STATE.crashed_at = time.time()
        finally:
            previous(exc_type, exc, tb)
    setattr(hook, _MARK, True)
    return hook


def install_hook() -> None:
    """Chain the crash-marking hook in front of sys.excepthook, unless the current hook is already
    ours; the hook it replaced always runs after it (the traceback is printed, gpuobs.logs counts
    the exception's pattern)."""
    if not getattr(sys.excepthook, _MARK, False):
        sys.excepthook = _chain(sys.excepthook)


def finish(state: Ending = STATE) -> bool:
    """At interpreter exit: mark a normal end unless a crash or an interrupt was seen. Returns
    whether anything is marked (the grace is worth waiting for)."""
    if not state.marked and not state.interrupted:
        state.ended_at = time.time()
    return state.marked


def linger(grace_s: float, serving: bool, scrapes: int = 1, state: Ending = STATE) -> float:
    """Keep the process up until `scrapes` Prometheus scrapes carried the mark, for at most grace_s
    seconds; nothing when not serving, never scraped, nothing marked or grace_s <= 0. Returns the
    seconds waited. Ctrl-C ends the wait (never raises)."""
    if grace_s <= 0 or not serving or state.scrapes == 0 or not finish(state):
        return 0.0
    start = time.monotonic()
    deadline = start + grace_s
    # said, because a process that lingers unexplained looks hung
    log.warning("serving how the run ended until Prometheus scrapes it once more, for at most %.0f s "
                "(%s=0: exit at once)", grace_s, GRACE_ENV)
    try:
        while state.carried < max(1, scrapes):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            state.served.wait(left)
            state.served.clear()  # carried, read next, says whether that was enough
        else:
            time.sleep(max(0.0, min(SETTLE_S, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    return time.monotonic() - start
