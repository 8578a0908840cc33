"""Time a rank spends blocked in DDP's gradient all-reduce: the straggler signal under collectives.

In synchronous data parallelism every rank's step takes as long as the slowest rank's: the fast
ranks finish their backward pass early and wait inside the all-reduce. Step times are therefore
equal across ranks and name no one; what differs is how long each rank *computes* before it
blocks. DDP launches each gradient bucket's all-reduce through a communication hook as soon as the
bucket is ready, and its backward pass returns once every bucket's future has completed, so per
step the time the training thread is blocked is

    (last bucket's all-reduce completed) - (last bucket launched)

which `DdpCommTimer` measures with torch's own default all-reduce hook (results unchanged). The
slow rank launches its last bucket last and waits only for the transfer; each fast rank waits for
the slow rank. TrainingRun subtracts this from the step to get the per-rank compute time.

On GPUs the host's view is blind: ProcessGroupNCCL marks the work's future complete on the host as
soon as the kernel is enqueued, so "completed - launched" is about 0 there. With CUDA buckets the
hook therefore records a CUDA event on the compute stream at launch and another in the completion
callback, which torch runs on the stream the reduced gradients are ready on; the pair's elapsed time
is the device's view of the same tail, read later (`DeviceTail.seconds`, never synchronizing), once
the step's own end event, which follows it, has completed. Unverified on a GPU from this project's
CI: `bench/device_check.py` checks the principle on one (BENCHMARKS.md, "Device check").

Limits: one communication hook per DDP model (a model with its own hook is left alone and logs a
warning). FSDP2 is timed by gpuobs.instrument.fsdp (the same `TrainingRun.watch`), which reuses
DeviceTail and the CUDA event factory from here; pipeline parallelism and hand-written collectives
are not hooked — time those waits with `TrainingRun.collective()`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, NamedTuple

log = logging.getLogger("gpuobs.instrument")


class DeviceTail(NamedTuple):
    """The blocked tail as the GPU saw it: `start` recorded on the compute stream when the last bucket
    was launched, `end` when its all-reduce's result was ready (events with query() and
    elapsed_time(other) in milliseconds: torch.cuda.Event(enable_timing=True))."""
    start: Any
    end: Any

    def seconds(self) -> float | None:
        """Device seconds from launch to completion once `end` has completed, else None (never waits)."""
        if not self.end.query():
            return None
        return max(0.0, float(self.start.elapsed_time(self.end)) / 1000.0)


class Tail(NamedTuple):
    """One step's blocked tail: `launched` (perf_counter seconds of the last bucket's launch),
    `seconds` (host view: completion - launch) and, for CUDA buckets, the device's view."""
    launched: float
    seconds: float
    device: DeviceTail | None = None


def _cuda_event_factory() -> Callable[[], Any]:
    import torch

    return lambda: torch.cuda.Event(enable_timing=True)


class DdpCommTimer:
    """A DDP communication hook (torch's allreduce_hook, timed) and the blocked tail it measures.

    launched / done: perf_counter seconds of the latest bucket launch and all-reduce completion
    since the last take(); device: the latest CUDA bucket's DeviceTail. Written from the autograd
    thread and the process group's threads. event_factory makes the CUDA events (a stand-in in tests)."""

    def __init__(self, event_factory: Callable[[], Callable[[], Any]] = _cuda_event_factory) -> None:
        self.launched: float | None = None
        self.done: float | None = None
        self.device: DeviceTail | None = None
        self.buckets = 0  # buckets all-reduced in total (a test and a debugging aid)
        self._event_factory = event_factory
        self._events: Callable[[], Any] | None = None  # made at the first CUDA bucket

    def _event(self) -> Any:
        if self._events is None:
            self._events = self._event_factory()
        event = self._events()
        event.record()  # on the current stream: the one this bucket's gradients were computed on
        return event

    def hook(self, process_group, bucket):  # no annotations: DDP rejects any but its own
        """The communication hook: launch the bucket's all-reduce as DDP does, stamp launch and
        completion (on the host; with CUDA buckets, on the device too)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.launched = time.perf_counter()
        start = self._event() if bucket.buffer().is_cuda else None
        future = default_hooks.allreduce_hook(process_group, bucket)

        def completed(fut: Any) -> Any:
            if start is not None:  # runs with the current stream set to where the result is ready
                self.device = DeviceTail(start, self._event())
            self.done = time.perf_counter()
            self.buckets += 1
            return fut.value()
        return future.then(completed)

    def take(self) -> Tail | None:
        """The blocked tail since the last take, or None if no bucket was reduced."""
        launched, done, device = self.launched, self.done, self.device
        self.launched = self.done = self.device = None
        if launched is None or done is None or done < launched:
            return None
        return Tail(launched, done - launched, device)


def register(ddp_model: Any, timer: DdpCommTimer) -> bool:
    """Register timer.hook on a DistributedDataParallel model; False (with a warning) when it
    already has a communication hook or cannot take one."""
    try:
        ddp_model.register_comm_hook(getattr(ddp_model, "process_group", None), timer.hook)
    except (RuntimeError, AssertionError, AttributeError) as e:
        log.warning("cannot time DDP's all-reduce (the model may have its own communication hook); "
                    "collective waits are not measured", extra={"error": str(e)})
        return False
    return True


def watch(model: Any, timer: DdpCommTimer) -> bool:
    """Time the all-reduce of a DDP model, or of the DDP model that will wrap `model` (found at its
    first forward, before any backward: how the framework callbacks reach a wrapper they are never
    given). Returns True when a hook was or will be registered; False when torch.distributed or
    DDP is not in use."""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:
        return False
    if isinstance(model, DDP):
        return register(model, timer)
    active = getattr(DDP, "_get_active_ddp_module", None)  # set by DDP around its forward (torch >= 2.1)
    if active is None or not hasattr(model, "register_forward_pre_hook"):
        return False
    handle: Any = None  # torch's RemovableHandle, set below before the first forward

    def first_forward(module: Any, args: Any) -> None:
        handle.remove()  # once: a model that is not under DDP at its first forward never will be
        wrapper = active()
        if wrapper is not None and _wraps(wrapper, module):
            register(wrapper, timer)

    handle = model.register_forward_pre_hook(first_forward)
    return True


def _wraps(wrapper: Any, module: Any) -> bool:
    """Whether module is inside wrapper (Lightning wraps the LightningModule once more)."""
    try:
        return any(m is module for m in wrapper.modules())
    except Exception:  # noqa: BLE001 - a strange wrapper: not ours to hook
        return False
