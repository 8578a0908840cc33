"""One NVML session over pynvml: initialisation with backoff, re-initialisation after repeated
driver-level errors, NOT_SUPPORTED remembered per device and call, and error/call accounting.

Everything that talks to NVML goes through `Session.call`, so counts and errors are complete.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

import pynvml

log = logging.getLogger("gpuobs.nvml")

# Return codes that mean the driver, not one GPU or one field, is in trouble.
DRIVER_LEVEL = {pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, pynvml.NVML_ERROR_UNKNOWN,
                pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}
CODE_NAMES = {v: k.removeprefix("NVML_ERROR_") for k, v in vars(pynvml).items()
              if k.startswith("NVML_ERROR_") and isinstance(v, int)}


def code_name(err: BaseException) -> str:
    """A short name for an error: the NVML code name (e.g. NOT_SUPPORTED) or the exception type."""
    if isinstance(err, pynvml.NVMLError):
        return CODE_NAMES.get(err.value, str(err.value))
    return type(err).__name__


class Session:
    """NVML state shared by the sampling thread and the event thread.

    reinit_after: consecutive driver-level errors (with no success between) that trigger
    nvmlShutdown + nvmlInit. Backoff for failed inits doubles from 1 s to backoff_max seconds.
    """

    def __init__(self, reinit_after: int = 20, backoff_max: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.reinit_after = reinit_after
        self.backoff_max = backoff_max
        self._clock = clock
        self._lock = threading.RLock()
        self.up = False
        self.init_error: str | None = None
        self.generation = 0  # increments on every successful init: handles of older generations are void
        self._next_try = 0.0
        self._backoff = 1.0
        self._driver_errors = 0
        self.reinits = 0
        self.calls = 0
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self.unsupported: set[tuple[str, str]] = set()  # (device key, call) answered NOT_SUPPORTED

    def ensure(self) -> bool:
        """Initialise NVML if it is down and the backoff allows; True when NVML is up."""
        with self._lock:
            if self.up:
                return True
            now = self._clock()
            if now < self._next_try:
                return False
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                self.init_error = code_name(e)
                retry_in, self._next_try = self._backoff, now + self._backoff
                self._backoff = min(self._backoff * 2, self.backoff_max)
                log.warning("nvml init failed", extra={"error": self.init_error, "retry_in_s": retry_in})
                return False
            self.up, self.init_error = True, None
            self._backoff, self._driver_errors = 1.0, 0
            self.generation += 1
            self.unsupported.clear()  # capabilities are re-probed after (re-)init
            log.info("nvml initialised", extra={"generation": self.generation})
            return True

    def shutdown(self) -> None:
        """Release NVML (idempotent)."""
        with self._lock:
            if self.up:
                self.up = False
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass

    def call(self, name: str, fn: Callable[..., Any], *args: Any, expected: tuple[int, ...] = ()) -> Any:
        """Call one pynvml function; count it; count and re-raise its error.

        expected: return codes that are answers, not errors (e.g. NOT_FOUND past the last MIG
        device): re-raised but not counted; NOT_SUPPORTED is always such an answer. Repeated driver-level errors shut NVML down so that
        the next ensure() re-initialises it.
        """
        self.calls += 1
        try:
            result = fn(*args)
        except pynvml.NVMLError as e:
            if e.value in expected or e.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                raise  # an answer (the GPU lacks it, or nothing is there), not an error
            self.errors[(name, code_name(e))] += 1
            if e.value in DRIVER_LEVEL:
                self._driver_error()
            raise
        except (UnicodeDecodeError, ValueError, TypeError) as e:  # e.g. a name that is not UTF-8
            self.errors[(name, code_name(e))] += 1
            raise
        self._driver_errors = 0
        return result

    def _driver_error(self) -> None:
        self._driver_errors += 1
        if self._driver_errors >= self.reinit_after:
            log.error("repeated driver-level NVML errors: re-initialising", extra={"errors": self._driver_errors})
            self.reinits += 1
            self.shutdown()
            self._next_try = 0.0
            self._driver_errors = 0
