"""A daemon thread that calls `refresh()` every `refresh_s` seconds until stopped."""

from __future__ import annotations

import logging
import threading
from typing import TypeVar

log = logging.getLogger("gpuobs.attribution")


_R = TypeVar("_R", bound="Refresher")


class Refresher:
    """Base of the attribution sources: `refresh()` runs once at start, then every `refresh_s`."""

    name = "attribution"

    def __init__(self, refresh_s: float):
        self.refresh_s = refresh_s
        self.refreshes = 0
        self.up = False  # the last refresh got an answer (gpuobs_exporter_attribution_up)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:  # pragma: no cover - overridden
        """Reads the source once and replaces the mapping whole; sets `up`. An exception is logged by
        the thread, sets `up` False and leaves the mapping to the next refresh."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # never let the thread die: the next refresh tries again
                self.up = False
                log.exception("attribution refresh failed", extra={"source": self.name})
            self.refreshes += 1
            self._stop.wait(self.refresh_s)

    def start(self: _R) -> _R:
        """Starts the refresh thread (a daemon: it never holds the process up) and returns self."""
        self._thread = threading.Thread(target=self._run, name=f"gpuobs-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 3.0) -> None:
        """Stops the thread and waits for it at most `timeout` seconds (a refresh in flight ends first)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=timeout)
