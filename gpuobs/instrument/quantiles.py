"""Exact quantiles of recent durations, kept in the process and read at metric collection.

Why not histogram buckets: `histogram_quantile()` interpolates inside a bucket, so with the
1-2.5-5 buckets a real 1.79x step-time regression moved the recorded p50 by nothing while an 8 %
slowdown that crossed a bucket edge doubled it. Buckets dense enough for 5 % error from 1 ms to
100 s need ~240 per series. A window of the last observations gives the exact quantile (the same
linear interpolation as `statistics.quantiles(method="inclusive")`) for two deque appends per
observation and a sort of at most `max_samples` values per collection. The price: quantiles of
different ranks or replicas cannot be merged exactly (rules take the median or max of them), and
the window is the process's, not the query's.

The same collection also sets each window's `slow` threshold (slow_threshold()): observations at
or above it get an exemplar (gpuobs.instrument.exemplars), so the hot path pays one comparison.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Iterable

QUANTILES = (0.5, 0.9, 0.99)
DEFAULT_WINDOW_S = 300.0  # the default profile's rate window (5m)
DEFAULT_MAX_SAMPLES = 4096  # at 500 steps/s the window is then the last ~8 s
SLOW_QUANTILE = 0.9
SLOW_FACTOR = 2.0  # x the median: a p90 that is plain jitter (a tight distribution) is not slow


def quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of an ascending, non-empty list, interpolating linearly between closest ranks
    (numpy's default, `statistics.quantiles(method="inclusive")`)."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def slow_threshold(ordered: list[float], floor: float = 0.0) -> float:
    """The duration at or above which an observation is slow (and gets an exemplar): the largest of
    the window's p90, SLOW_FACTOR times its median, and floor (GPUOBS_EXEMPLAR_MIN_S), in the
    window's unit (seconds). ordered: the window's values, ascending, non-empty."""
    return max(quantile(ordered, SLOW_QUANTILE), SLOW_FACTOR * quantile(ordered, 0.5), floor)


class Window:
    """Observations of one attribute set: the last max_samples, no older than window_s seconds.

    add() is called by the instrumented thread (two deque appends, ~0.2 µs); values() by the metric
    collector thread: `list(deque)` copies in C under the GIL, so no lock is needed. slow: the
    threshold of slow_threshold() as of the last collection (seconds; infinite before the first, or
    while the window is empty), which the recorder compares each observation with."""
    __slots__ = ("times", "values_", "window_s", "slow")

    def __init__(self, window_s: float, max_samples: int):
        self.window_s = window_s
        self.slow = math.inf
        self.times: collections.deque = collections.deque(maxlen=max_samples)
        self.values_: collections.deque = collections.deque(maxlen=max_samples)

    def add(self, value: float) -> None:
        """Adds one observation (the metric's unit), stamped with monotonic now; past max_samples the oldest goes."""
        # value first: a collector copying between the two appends sees at most one time without a
        # value, never a value stamped with the previous observation's time
        self.values_.append(value)
        self.times.append(time.monotonic())

    def values(self, now: float | None = None) -> list[float]:
        """The observations inside the window, oldest first."""
        values, times = list(self.values_), list(self.times)
        n = min(len(values), len(times))
        values, times = values[len(values) - n:], times[len(times) - n:]
        cutoff = (time.monotonic() if now is None else now) - self.window_s
        start = 0
        while start < n and times[start] < cutoff:
            start += 1
        return values[start:]


class WindowedQuantiles:
    """Windows by attribute set for one duration metric; quantiles() feeds an observable gauge."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, max_samples: int = DEFAULT_MAX_SAMPLES,
                 quantiles: Iterable[float] = QUANTILES, slow_floor_s: float = 0.0):
        self.window_s, self.max_samples, self.slow_floor_s = window_s, max_samples, slow_floor_s
        self.qs = tuple(quantiles)
        self.windows: dict[tuple, Window] = {}

    def window(self, attrs: dict) -> Window:
        """The Window of these attributes (made on first use); keep it to add without a lookup."""
        key = tuple(attrs.items())
        found = self.windows.get(key)
        if found is None:
            found = self.windows[key] = Window(self.window_s, self.max_samples)
        return found

    def add(self, value: float, attrs: dict) -> None:
        """Adds one observation to the window of this attribute set (made on first use)."""
        self.window(attrs).add(value)

    def quantiles(self) -> list[tuple[dict, float, float]]:
        """(attributes, q, value) for every attribute set with observations in its window; a set
        whose window is empty has no points (no stale quantile is reported as current). Updates
        each window's slow threshold on the way."""
        out: list[tuple[dict, float, float]] = []
        now = time.monotonic()
        for key, window in list(self.windows.items()):
            values = sorted(window.values(now))
            window.slow = slow_threshold(values, self.slow_floor_s) if values else math.inf
            if values:
                attrs = dict(key)
                out.extend((attrs, q, quantile(values, q)) for q in self.qs)
        return out
