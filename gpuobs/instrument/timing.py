"""Step timers: wall clock on the CPU, CUDA events on a GPU (resolved later, never synchronizing
unless asked), behind one small interface."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Iterator


class WallTimer:
    """perf_counter timing; stop() returns seconds at once."""

    def start(self) -> float:
        """The token of a start: perf_counter() now, in seconds."""
        return time.perf_counter()

    def stop(self, token: float, payload: Any = None) -> float:
        """Seconds since the start of `token` (host wall clock; the payload is not kept)."""
        return time.perf_counter() - token

    def poll(self) -> Iterator[tuple[Any, float]]:
        """Nothing: every stop() answered at once."""
        return iter(())


class CudaEventTimer:
    """Times steps with events recorded on the GPU stream.

    event_factory makes an event with record(), query(), synchronize() and elapsed_time(other)
    in milliseconds (torch.cuda.Event(enable_timing=True), or a stand-in in tests). stop() returns
    None and keeps the pair; poll() yields (payload, seconds) for pairs whose end event has
    completed, in order, without waiting. With sync=True, stop() synchronizes and returns at once.
    """

    def __init__(self, event_factory: Callable[[], Any], sync: bool = False, max_pending: int = 1024):
        self.event_factory = event_factory
        self.sync = sync
        self.pending: collections.deque = collections.deque(maxlen=max_pending)  # oldest dropped if never resolved

    def start(self) -> Any:
        """A new event recorded on the current stream now: the token stop() takes."""
        event = self.event_factory()
        event.record()
        return event

    def stop(self, token: Any, payload: Any = None) -> float | None:
        """Records an end event. With sync, waits for it and returns the seconds between the events; else
        keeps (start, end, payload) for poll() and returns None (at most max_pending kept: the oldest go)."""
        end = self.event_factory()
        end.record()
        if self.sync:
            end.synchronize()
            return token.elapsed_time(end) / 1000.0
        self.pending.append((token, end, payload))
        return None

    def poll(self) -> Iterator[tuple[Any, float]]:
        """(payload, seconds) of each kept pair whose end event has completed, oldest first, stopping at
        the first that has not: never waits on the GPU."""
        while self.pending and self.pending[0][1].query():
            start, end, payload = self.pending.popleft()
            yield payload, start.elapsed_time(end) / 1000.0


def default_timer(sync: bool = False) -> WallTimer | CudaEventTimer:
    """CUDA-event timing when torch with CUDA is importable and available, else the wall clock."""
    try:
        import torch  # optional: gpuobs never requires it
    except ImportError:
        return WallTimer()
    if not torch.cuda.is_available():
        return WallTimer()
    return CudaEventTimer(lambda: torch.cuda.Event(enable_timing=True), sync=sync)
