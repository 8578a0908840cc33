"""Time a rank spends in FSDP2's all-gathers and reduce-scatters: the straggler signal under sharding.

FSDP2 (`torch.distributed.fsdp.fully_shard`) all-gathers each module's parameters before its
forward and backward and reduce-scatters its gradients after, so every rank meets its peers many
times per step: a fast rank waits inside these collectives for a slow one. As for DDP
(gpuobs.instrument.collectives), TrainingRun subtracts that wait from the step to get the per-rank
compute time that names a straggler.

FSDP2's public extension points, `FSDPModule.set_custom_all_gather(comm)` and
`set_custom_reduce_scatter(comm)`, take an object that allocates the buffers and runs the
collective. `watch` reads each FSDP module's current comms (FSDP's defaults or the user's own; a
private attribute, `_get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm` and
`_reduce_scatter_comm`) and installs a wrapper that delegates every allocation and call to them,
so results are unchanged, and times each call:

- CPU tensors (gloo): FSDP2 calls its comms synchronously by default (async_op False: the call
  returns once the collective is done), so the call's host duration is the time the training
  thread was blocked. A call that returns a Work (async_op True, `set_unshard_async_op`) is
  counted from launch to the Work's completion (its future's callback): an upper bound of the
  blocked time, since work may overlap it; a completion after the step's end counts in the next.
- CUDA tensors (NCCL): the call returns at enqueue, so the host's duration is about 0. The
  wrapper records a CUDA event on the current stream (FSDP makes its all-gather or reduce-scatter
  stream current around the call) before and after it; the pairs (collectives.DeviceTail) are
  read later, never synchronizing, when the step's own end event has completed. That is the
  collectives' device time, which includes waiting for peers but can overlap compute on other
  streams: an upper bound of the blocked time. Unverified on a GPU from this project's CI.

Limits: a module whose parameters FSDP split into several param groups (per-parameter meshes)
cannot take a custom comm and is skipped with a warning; call `set_symm_mem` or
`set_allocate_memory_from_process_group` before watching (FSDP refuses them once a comm is custom);
call `watch` after `fully_shard` (modules sharded later are not found); a torch whose FSDP2 lacks
the private attribute above is not hooked (one warning). HSDP's extra all-reduce is not timed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, NamedTuple

from .collectives import DeviceTail, _cuda_event_factory

log = logging.getLogger("gpuobs.instrument")
_warned: set[str] = set()  # warnings logged once per process (one per missing torch attribute)


class FsdpTake(NamedTuple):
    """One step's FSDP collectives: `seconds` blocked on the host (gloo; 0 on CUDA), `device` the
    CUDA calls' DeviceTail pairs, `calls` the calls timed, `first` and `last` the perf_counter
    seconds of the first call's launch and the latest completion (None when no host call)."""
    seconds: float
    device: tuple[DeviceTail, ...]
    calls: int
    first: float | None
    last: float | None


class FsdpCommTimer:
    """Accumulates the time of FSDP2's collectives between take()s. Written by the training thread
    and (async calls) the process group's threads, hence the lock. event_factory makes the CUDA
    events (a stand-in in tests), as for collectives.DdpCommTimer."""

    def __init__(self, event_factory: Callable[[], Callable[[], Any]] = _cuda_event_factory) -> None:
        self._lock = threading.Lock()
        self._event_factory = event_factory
        self._events: Callable[[], Any] | None = None  # made at the first CUDA call
        self.total_calls = 0  # calls timed in total (a test and a debugging aid)
        self._reset()

    def _reset(self) -> None:
        self._seconds, self._calls = 0.0, 0
        self._device: list[DeviceTail] = []
        self._first: float | None = None
        self._last: float | None = None

    def _event(self) -> Any:
        if self._events is None:
            self._events = self._event_factory()
        event = self._events()
        event.record()  # on the current stream: FSDP's all-gather or reduce-scatter stream
        return event

    def _host(self, launched: float, done: float) -> None:
        with self._lock:
            self._seconds += max(0.0, done - launched)
            self._calls += 1
            self.total_calls += 1
            self._first = launched if self._first is None else min(self._first, launched)
            self._last = done if self._last is None else max(self._last, done)

    def timed(self, call: Callable[[], Any], cuda: bool) -> Any:
        """Run call() (one collective; returns a Work or None) and time it: the host duration, or
        launch to the Work's completion, or (cuda) a DeviceTail around it. Returns call()'s result."""
        start = self._event() if cuda else None
        launched = time.perf_counter()
        work = call()
        if start is not None:
            tail = DeviceTail(start, self._event())
            with self._lock:
                self._device.append(tail)
                self._calls += 1
                self.total_calls += 1
        elif work is None or not self._on_completion(work, launched):
            self._host(launched, time.perf_counter())
        return work

    def _on_completion(self, work: Any, launched: float) -> bool:
        """Count launched..completion when work's future completes; False (the caller counts the
        call's host duration instead) where the Work has no future to chain on."""
        def completed(fut: Any) -> Any:
            self._host(launched, time.perf_counter())
            return fut.value()
        try:
            work.get_future().then(completed)
        except (AttributeError, RuntimeError, NotImplementedError):  # a backend without Work futures
            return False
        return True

    def take(self) -> FsdpTake:
        """The collectives since the last take (zeros when none); resets."""
        with self._lock:
            got = FsdpTake(self._seconds, tuple(self._device), self._calls, self._first, self._last)
            self._reset()
        return got


@functools.lru_cache(maxsize=1)
def _wrappers() -> tuple[type, type]:
    """The wrapper classes (made on first use: importing this module must not import torch)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    class TimedAllGather(AllGather):
        """FSDP2 all-gather comm: the inner comm's, timed by an FsdpCommTimer."""

        def __init__(self, inner: Any, timer: FsdpCommTimer) -> None:
            self.inner, self.timer = inner, timer

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            """The inner comm's buffer."""
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            return self.timer.timed(lambda: self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                                                       group=group, async_op=async_op), input_tensor.is_cuda)

    class TimedReduceScatter(ReduceScatter):
        """FSDP2 reduce-scatter comm: the inner comm's, timed by an FsdpCommTimer."""

        def __init__(self, inner: Any, timer: FsdpCommTimer) -> None:
            self.inner, self.timer = inner, timer

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            """The inner comm's buffer."""
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            return self.timer.timed(lambda: self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                                                       group=group, op=op, async_op=async_op), input_tensor.is_cuda)

    return TimedAllGather, TimedReduceScatter


def _warn_once(key: str, message: str, **extra: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, extra=extra)


def _current_comms(module: Any) -> tuple[Any, Any] | None:
    """The (all-gather, reduce-scatter) comms of an FSDP module's single param group; None (with a
    warning where it is not simply a module without parameters) when they cannot be replaced."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) == 1:
            return groups[0]._all_gather_comm, groups[0]._reduce_scatter_comm
    except (AttributeError, TypeError, IndexError) as e:
        _warn_once("private", "cannot read FSDP2's current comms in this torch; FSDP collectives are not timed",
                   error=str(e))
        return None
    if len(groups) > 1:  # FSDP's set_custom_* refuse them: the comm would be ambiguous across meshes
        log.warning("an FSDP module with several param groups cannot take a custom comm; its collectives "
                    "are not timed", extra={"fsdp_module": type(module).__name__, "groups": len(groups)})
    return None  # no param group: the module has no parameters of its own, and no collectives


def hook(module: Any, timer: FsdpCommTimer) -> bool:
    """Wrap one FSDPModule's current all-gather and reduce-scatter comms in timed ones (idempotent
    for the same timer). True when its collectives are timed."""
    comms = _current_comms(module)
    if comms is None:
        return False
    gather_cls, scatter_cls = _wrappers()
    gather, scatter = comms
    if isinstance(gather, gather_cls) and getattr(gather, "timer", None) is timer:
        return True  # watched already
    module.set_custom_all_gather(gather_cls(gather, timer))
    module.set_custom_reduce_scatter(scatter_cls(scatter, timer))
    return True


def watch(model: Any, timer: FsdpCommTimer) -> bool:
    """Time the collectives of every FSDPModule in model.modules() (model itself included). Returns
    True when at least one was hooked; False without torch, FSDP2 or a sharded module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    modules = getattr(model, "modules", None)
    if modules is None:
        return False
    return sum(hook(m, timer) for m in modules() if isinstance(m, FSDPModule)) > 0
