"""A daemon thread that calls `refresh()` every `refresh_s` seconds until stopped."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("gpuobs.attribution")


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

    def start(self):
        self._thread = threading.Thread(target=self._run, name=f"gpuobs-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=timeout)
