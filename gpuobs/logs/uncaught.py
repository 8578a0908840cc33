"""Logging the exceptions that end a training process or one of its threads.

An uncaught exception never passes through Python logging: the interpreter hands it to
sys.excepthook (threading.excepthook for a thread), which prints the traceback on stderr. A
collective that timed out (gloo's "Timed out waiting 3000ms for recv operation to complete", a
RuntimeError), a CUDA OOM raised in the training loop, are exactly those exceptions, so without
this the gpuobs handlers would never count them (gpuobs_log_pattern_matches_total).

`install()` chains a hook in front of each: it logs the exception as one CRITICAL record of the
logger `gpuobs.uncaught` (with exc_info, so the handlers ship the traceback and PatternFilter
matches the exception's text), then always calls the hook it replaced, so the traceback is still
printed and any other hook (PyTorch's "[rank0]:" prefixing one, a debugger's) still runs.
KeyboardInterrupt and SystemExit are passed on without a record. An exception logged once is not
logged again when two gpuobs hooks are chained (torch.distributed.init_process_group wraps
sys.excepthook; a later configure() may chain again).

Lines that C++ code writes to stderr itself (the c10d/NCCL watchdog's "[PG 0 Rank 3] Watchdog
caught collective operation timeout", gloo's own logging) never reach Python at all: those are
counted by the Fluent Bit pipeline of deploy/fluent-bit/ from the container's log."""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import Any, Callable

LOGGER = "gpuobs.uncaught"
_MARK = "_gpuobs_uncaught"  # set on our hooks, so that install() is idempotent
_lock = threading.Lock()
_last: list[BaseException | None] = [None]  # the exception logged last (chained hooks log it once)


def _log(exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None,
         where: str) -> None:
    """One CRITICAL record for an uncaught exception; never raises (the original hook must run)."""
    if exc is None or issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        return
    try:
        with _lock:
            if _last[0] is exc:
                return
            _last[0] = exc
        logging.getLogger(LOGGER).critical("Uncaught %s in %s", exc_type.__name__, where,
                                           exc_info=(exc_type, exc, tb))
    except Exception:  # noqa: BLE001 - a broken handler must not hide the traceback
        pass


def _chain_sys(previous: Callable[..., Any]) -> Callable[..., Any]:
    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            _log(exc_type, exc, tb, "the main thread")
        finally:
            previous(exc_type, exc, tb)
    setattr(hook, _MARK, True)
    return hook


def _chain_threading(previous: Callable[..., Any]) -> Callable[..., Any]:
    def hook(args: Any) -> None:
        try:
            name = args.thread.name if args.thread is not None else "a thread"
            _log(args.exc_type, args.exc_value, args.exc_traceback, f"thread {name}")
        finally:
            previous(args)
    setattr(hook, _MARK, True)
    return hook


def install() -> None:
    """Chain the logging hooks in front of sys.excepthook and threading.excepthook, unless the
    current hook is already one of ours. Never raises."""
    if not getattr(sys.excepthook, _MARK, False):
        sys.excepthook = _chain_sys(sys.excepthook)
    if not getattr(threading.excepthook, _MARK, False):
        threading.excepthook = _chain_threading(threading.excepthook)
