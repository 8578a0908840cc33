"""One NVML session over pynvml: initialisation with backoff, re-initialisation after repeated
driver-level errors, capability answers (NOT_SUPPORTED, NO_PERMISSION, a function the driver or
binding lacks) remembered per device and call and re-probed, and error/call accounting.

Everything that talks to NVML goes through `Session.call`, so counts and errors are complete, and
every string it returns is `str` (pynvml releases before 11.5 return `bytes`).

Binding drift: older pynvml releases (11.4.1 was pip's default for years) lack field ids, value
types and whole functions that gpuobs uses. At import, the names gpuobs needs and the binding
lacks are filled in: constants with their values from nvml.h, functions with a stub that raises
NVMLError(FUNCTION_NOT_FOUND) -- the same answer pynvml gives when the driver lacks the symbol, so
one code path (a remembered capability, a fallback call) covers an old binding and an old driver.
Nothing the binding has is replaced.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

import pynvml as pynvml  # re-exported: gpuobs.sim reads the field ids through it, backfilled

log = logging.getLogger("gpuobs.nvml")

# nvml.h values of the constants gpuobs uses that pynvml releases before 11.5/12 lack.
ABI_CONSTANTS = {
    "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY": 161, "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY": 162,
    "NVML_FI_DEV_NVLINK_ERROR_DL_CRC": 163, "NVML_FI_DEV_NVLINK_GET_STATE": 165,
    "NVML_FI_DEV_POWER_INSTANT": 186, "NVML_FI_DEV_POWER_MIN_LIMIT": 187, "NVML_FI_DEV_POWER_MAX_LIMIT": 188,
    "NVML_FI_DEV_POWER_DEFAULT_LIMIT": 189, "NVML_FI_DEV_POWER_CURRENT_LIMIT": 190,
    "NVML_FI_DEV_POWER_AVERAGE": 185, "NVML_FI_DEV_POWER_REQUESTED_LIMIT": 192,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
    "NVML_GPM_METRIC_GRAPHICS_UTIL": 1, "NVML_GPM_METRIC_SM_UTIL": 2, "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5, "NVML_GPM_METRIC_DRAM_BW_UTIL": 10, "NVML_GPM_METRIC_FP64_UTIL": 11,
    "NVML_GPM_METRIC_FP32_UTIL": 12, "NVML_GPM_METRIC_FP16_UTIL": 13,
    "NVML_GPM_METRICS_GET_VERSION": 1, "NVML_VALUE_TYPE_SIGNED_INT": 5, "NVML_VALUE_TYPE_UNSIGNED_SHORT": 6,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25, "NVML_ERROR_DEPRECATED": 26, "NVML_ERROR_NOT_READY": 27,
    "NVML_ERROR_GPU_NOT_FOUND": 28, "NVML_ERROR_INVALID_STATE": 29,
}
# Functions gpuobs calls that older bindings lack (each has a fallback or is optional).
ABI_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3",
                 "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                 "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
                 "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
                 "nvmlEventSetWait_v2", "nvmlDeviceGetMarginTemperature", "nvmlDeviceGetGpuFabricInfo",
                 "nvmlDeviceGetGpuFabricInfoV")


def _missing(name: str) -> Callable[..., Any]:
    def stub(*_args: Any, **_kw: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    stub.__name__ = name
    stub.__doc__ = f"{name} is not in this pynvml release: raises NVMLError(FUNCTION_NOT_FOUND)."
    return stub


def _backfill() -> list[str]:
    """Add the ABI names this pynvml lacks (never replacing one it has); the names added."""
    added = []
    for name, value in ABI_CONSTANTS.items():
        if not hasattr(pynvml, name):
            setattr(pynvml, name, value)
            added.append(name)
    for name in ABI_FUNCTIONS:
        if not hasattr(pynvml, name):
            setattr(pynvml, name, _missing(name))
            added.append(name)
    return added


BACKFILLED = _backfill()

# Return codes that mean the driver, not one GPU or one field, is in trouble.
DRIVER_LEVEL = {pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, pynvml.NVML_ERROR_UNKNOWN,
                pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}
CODE_NAMES: dict[int, str] = {v: k.removeprefix("NVML_ERROR_") for k, v in vars(pynvml).items()
              if k.startswith("NVML_ERROR_") and isinstance(v, int)}
# Codes that are answers about a capability, not errors: the GPU, the driver, the binding or our
# privileges do not give this value. Remembered per device and call, re-probed now and then.
UNAVAILABLE = {pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported", pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
               pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "function_not_found",
               pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "argument_version_mismatch"}
# Codes that mean the GPU itself is unusable until someone acts (reseat, reboot, reset).
UNUSABLE = {pynvml.NVML_ERROR_GPU_IS_LOST: "lost", pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required"}


def call_name(fn: Callable[..., Any]) -> str:
    """The name an NVML call is counted and remembered under: the function's __name__, which is the
    NVML symbol for pynvml's functions (decorated ones keep it through functools.wraps) and for the
    stubs backfilled above. Raises AttributeError for a callable without one (pass a name)."""
    return fn.__name__


def named(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: count a function that stands in for an NVML call under that call's name (its
    __name__ becomes `name`), e.g. a wrapper that picks a structure version."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__name__ = name
        return fn
    return wrap


def code_name(err: BaseException) -> str:
    """A short name for an error: the NVML code name (e.g. NOT_SUPPORTED) or the exception type."""
    if isinstance(err, pynvml.NVMLError):
        value: int = err.value  # pynvml is untyped: NVMLError.value is the nvmlReturn_t code
        return CODE_NAMES.get(value) or str(value)
    return type(err).__name__


def text(value: Any) -> Any:
    """`bytes` (older pynvml releases) as `str`; anything else unchanged. Raises UnicodeDecodeError
    for bytes that are not UTF-8 (a corrupted VBIOS string), which callers count as an error."""
    return value.decode("utf-8") if type(value) is bytes else value


class Session:
    """NVML state shared by the sampling thread and the event thread.

    reinit_after: consecutive driver-level errors (with no success between) that trigger
    nvmlShutdown + nvmlInit. Backoff for failed inits doubles from 1 s to backoff_max seconds.
    reprobe_after: seconds a capability answer (UNAVAILABLE) is trusted before the call is tried
    again, so an NVLink link that comes up, a fabric that starts or a permission granted later
    gives values without a restart. Thread-safe: per-GPU sampling threads share one session.
    """

    def __init__(self, reinit_after: int = 20, backoff_max: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 reprobe_after: float = 300.0):
        self.reinit_after = reinit_after
        self.backoff_max = backoff_max
        self.reprobe_after = reprobe_after
        self._clock = clock
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self.up = False
        self.init_error: str | None = None
        self.generation = 0  # increments on every successful init: handles of older generations are void
        self._next_try = 0.0
        self._backoff = 1.0
        self._driver_errors = 0
        self._retiring = -1  # generation being shut down after repeated driver-level errors
        self.reinits = 0
        # monotonic time since which NVML has answered nothing but driver-level errors or failed
        # inits (None: it answered since); down from the start until a first call answers
        self.down_since: float | None = clock()
        self.last_error: str | None = None  # code of the last driver-level error or failed init
        self._calls = 0
        self._errors: collections.Counter[tuple[str, str]] = collections.Counter()
        # (device, what: "call:variant" or "field:id:scope") -> (call, reason, monotonic time of the answer)
        self._unavailable: dict[tuple[str, str], tuple[str, str, float]] = {}
        self._capability_version = 0  # changes whenever _unavailable does (callers cache on it)
        self._announced: set[tuple[str, str]] = set()  # (call, reason) logged once per process

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
                self.init_error = self.last_error = code_name(e)
                self._went_down(now)
                retry_in, self._next_try = self._backoff, now + self._backoff
                self._backoff = min(self._backoff * 2, self.backoff_max)
                log.warning("nvml init failed", extra={"error": self.init_error, "retry_in_s": retry_in})
                return False
            self.up, self.init_error = True, None
            self._backoff, self._driver_errors = 1.0, 0
            self.generation += 1
            self.forget()  # capabilities are re-probed after (re-)init
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

    # ---- capabilities ---------------------------------------------------------------------
    # Keys are (device, what): what is "call:variant" for a call (GpuCtx.get) or "field:id:scope"
    # for one value of nvmlDeviceGetFieldValues (Session.field_answer).

    @property
    def capability_version(self) -> int:
        """A number that changes whenever a capability answer is remembered or forgotten (callers
        that cache what they derive from the answers compare it)."""
        return self._capability_version

    def is_unavailable(self, device: str, what: str) -> bool:
        """True if (device, what) gave a capability answer less than reprobe_after ago."""
        key = (device, what)
        entry = self._unavailable.get(key)
        if entry is None:
            return False
        if self._clock() - entry[2] < self.reprobe_after:
            return True
        with self._count_lock:  # expired: the next call probes again
            if self._unavailable.pop(key, None) is not None:
                self._capability_version += 1
        return False

    def mark_unavailable(self, device: str, what: str, call: str, code: int) -> None:
        """Remember a capability answer (an UNAVAILABLE code) of `call` for (device, what); log each
        (call, reason) once per process -- a driver without a call answers so for every GPU on
        every pass."""
        reason = UNAVAILABLE.get(code, CODE_NAMES.get(code, str(code)).lower())
        with self._count_lock:
            self._unavailable[(device, what)] = (call, reason, self._clock())
            self._capability_version += 1
            first = (call, reason) not in self._announced
            self._announced.add((call, reason))
        if first:
            level = logging.WARNING if code == pynvml.NVML_ERROR_NO_PERMISSION else logging.INFO
            log.log(level, "nvml call unavailable", extra={"call": call, "reason": reason, "device": device})

    def field_answer(self, device: str, field_id: int, scope: int, code: int) -> None:
        """Account one value of nvmlDeviceGetFieldValues that came back with `code` (not SUCCESS):
        an UNAVAILABLE code is remembered for (device, field, scope) and the value is then left out
        of the device's batch (see field_unavailable); any other is counted as an error of
        "nvmlDeviceGetFieldValues:<field id>"."""
        call = f"nvmlDeviceGetFieldValues:{field_id}"
        if code in UNAVAILABLE:
            self.mark_unavailable(device, f"field:{field_id}:{scope}", call, code)
        else:
            self.count_error(call, code_name(pynvml.NVMLError(code)))

    def field_unavailable(self, device: str, field_id: int, scope: int) -> bool:
        """True if the device answered for this field and scope that it does not give it."""
        return self.is_unavailable(device, f"field:{field_id}:{scope}")

    def forget(self, device: str | None = None) -> None:
        """Drop remembered capability answers: of one device (its MIG mode changed), or all."""
        with self._count_lock:
            if device is None:
                self._unavailable.clear()
            else:
                for key in [k for k in self._unavailable if k[0] == device]:
                    del self._unavailable[key]
            self._capability_version += 1

    def unavailable_counts(self) -> collections.Counter[tuple[str, str]]:
        """{(call, reason): devices} of the capability answers remembered now."""
        with self._count_lock:
            return collections.Counter((call, reason) for call, reason, _ in self._unavailable.values())

    # ---- calls ------------------------------------------------------------------------------

    @property
    def calls(self) -> int:
        """NVML calls made through this session so far (all threads)."""
        return self._calls

    def call(self, fn: Callable[..., Any], *args: Any, name: str | None = None, expected: tuple[int, ...] = ()) -> Any:
        """Call one pynvml function; count it; count and re-raise its error. A `bytes` result is
        returned as `str` (UnicodeDecodeError, counted, when it is not UTF-8).

        name: the call's name in error counts (gpuobs_exporter_nvml_errors_total{call}); default
        call_name(fn), i.e. fn.__name__. Give it where fn is not the NVML function of that name (a
        wrapper, a bound method, pynvml's unversioned alias of a versioned symbol).

        expected: return codes that are answers, not errors (e.g. NOT_FOUND past the last MIG
        device): re-raised but not counted; the UNAVAILABLE codes are always such answers.
        Repeated driver-level errors shut NVML down so that the next ensure() re-initialises it.
        """
        with self._count_lock:
            self._calls += 1
        generation = self.generation
        try:
            result = text(fn(*args))
        except pynvml.NVMLError as e:
            if e.value in expected or e.value in UNAVAILABLE:
                self.down_since = None  # the driver answered
                raise  # an answer (the GPU, driver or binding lacks it, or nothing is there), not an error
            self.count_error(name or call_name(fn), code_name(e))
            if e.value in DRIVER_LEVEL:
                self.last_error = code_name(e)
                self._went_down(self._clock())
                self._driver_error(generation)
            raise
        except (UnicodeDecodeError, ValueError, TypeError) as e:  # e.g. a name that is not UTF-8
            self.count_error(name or call_name(fn), code_name(e))
            raise
        self._driver_errors = 0
        if self.down_since is not None:
            self.down_since = None
        return result

    def _went_down(self, now: float) -> None:
        if self.down_since is None:
            self.down_since = now

    def down_for(self) -> float:
        """Seconds NVML has answered nothing but driver-level errors (UNKNOWN, UNINITIALIZED, ...)
        and failed initialisations, re-initialisations included, since it last answered a call
        (since this session was made if it never did); 0.0 while it answers."""
        since = self.down_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def count_error(self, name: str, code: str) -> None:
        """Count one error of `name` (a call, or a value inside one) with `code` (code_name)."""
        with self._count_lock:
            self._errors[(name, code)] += 1

    def error_counts(self) -> list[tuple[tuple[str, str], int]]:
        """[((call, code), errors)], sorted: a copy, safe while other threads count."""
        with self._count_lock:
            return sorted(self._errors.items())

    def _driver_error(self, generation: int) -> None:
        """Count one driver-level error of a call made under `generation`; re-initialise after
        reinit_after in a row. Errors of calls made before the current initialisation, or while
        NVML is down (other GPUs' threads answered UNINITIALIZED after a shutdown), are not
        counted: one driver failure is one re-initialisation."""
        with self._count_lock:
            if not self.up or generation != self.generation or generation == self._retiring:
                return
            self._driver_errors += 1
            if self._driver_errors < self.reinit_after:
                return
            self._driver_errors = 0
            self._retiring = generation  # until shutdown() below lands, other threads' errors are its own
            self.reinits += 1
        log.error("repeated driver-level NVML errors: re-initialising", extra={"errors": self.reinit_after})
        self.shutdown()
        self._next_try = 0.0
