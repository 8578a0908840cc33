"""What collectors produce (Samples in an immutable Snapshot) and what they get (a GpuCtx)."""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, NamedTuple

import pynvml

from ..catalog import Metric
from ..nvml import UNAVAILABLE, UNUSABLE, Session

SENTINELS = {0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0xFFFF, 0x7FFFFFFF}  # NVML "not available" markers
# A counter can legitimately pass 65535 or 2^31-1; it never reads exactly 2^32-1 or 2^64-1, which
# are the markers of a 32- or 64-bit value NVML could not read (an ECC count of 1.8e19 is one).
COUNTER_SENTINELS = {0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}


class LogLimiter:
    """Per key, at most `burst` records in each `per`-second window; the others are counted and the
    count is handed to the next record allowed (so that it can say how many were left out)."""

    def __init__(self, per: float = 60.0, burst: int = 1, clock: Callable[[], float] = time.monotonic):
        self.per, self.burst, self._clock = per, burst, clock
        self._lock = threading.Lock()
        self._state: dict[Hashable, list] = {}  # key -> [window start, allowed in window, suppressed]

    def allow(self, key: Hashable) -> int | None:
        """None: leave this record out. Else: how many records of this key were left out since the
        last one allowed (0 if none)."""
        now = self._clock()
        with self._lock:
            st = self._state.get(key)
            if st is None or now - st[0] >= self.per:
                st = self._state[key] = [now, 0, st[2] if st else 0]
            if st[1] >= self.burst:
                st[2] += 1
                return None
            st[1] += 1
            suppressed, st[2] = st[2], 0
            return suppressed


class GpuUnusable(Exception):
    """The GPU answered a code that makes it unusable (nvml.UNUSABLE): stop collecting it for this
    pass. `reason` is the label of gpuobs_gpu_unhealthy: lost, reset_required."""

    def __init__(self, uuid: str, reason: str):
        super().__init__(uuid, reason)
        self.uuid, self.reason = uuid, reason


class GpuLost(GpuUnusable):
    """The GPU answered NVML_ERROR_GPU_IS_LOST (it fell off the bus)."""

    def __init__(self, uuid: str, reason: str = "lost"):
        super().__init__(uuid, reason)


def unusable(uuid: str, code: int) -> GpuUnusable:
    """The exception for an UNUSABLE return code."""
    reason = UNUSABLE[code]
    return GpuLost(uuid) if reason == "lost" else GpuUnusable(uuid, reason)


class Sample(NamedTuple):
    """One value of one series: metric, label values in metric.labels order, value in base units.

    A tuple, so that comparing two snapshots' samples (the renderer reuses the text of unchanged
    metrics) runs in C; Metric compares by identity."""
    metric: Metric
    labels: tuple[str, ...]
    value: float


@dataclass(frozen=True)
class Snapshot:
    """Every Sample of one sampling pass, taken at `time` (Unix seconds) in `duration` seconds."""
    time: float
    duration: float
    samples: tuple[Sample, ...]
    nvml_up: bool
    gpus_present: int


@dataclass(frozen=True)
class FieldSpec:
    """One value read with nvmlDeviceGetFieldValues: NVML field id and scope (e.g. an NVLink link),
    the metric it feeds, a scale to base units, and the metric's extra label values."""
    field_id: int
    metric: Metric | None  # None: read for the family's collect() to use, not emitted directly
    scale: float = 1.0
    extra: tuple[str, ...] = ()
    scope: int = 0


class Family:
    """One metric family. Subclasses read NVML in `collect` and/or declare batched `fields`."""
    name = ""
    slow_every = 10  # samples between reads of values that change rarely (limits, max clocks)

    def fields(self, gpu: "GpuCtx") -> list[FieldSpec]:
        """Field values this family wants for this GPU in this sample."""
        return []

    def collect(self, gpu: "GpuCtx") -> None:
        """Read NVML for one GPU and emit samples; raise GpuUnusable when the GPU is unusable."""

    def node_samples(self, known: dict[str, int]) -> list[Sample]:
        """Samples that outlive a GPU's loss, once per pass; known maps UUID -> last NVML index."""
        return []

    def release(self, cache: dict[str, Any]) -> None:
        """Free NVML resources kept in a GPU's cache when the GPU goes away or NVML re-initialises."""


@dataclass
class GpuCtx:
    """One GPU during one sampling pass: its handle and identity, NVML access, and the output."""
    session: Session
    handle: Any
    index: int
    uuid: str
    sample_no: int
    out: list[Sample]
    dropped: Callable[[Metric, str], None]
    fields: dict[tuple[int, int], float] = field(default_factory=dict)  # values that came back
    labels: tuple[str, ...] = ()
    cache: dict[str, Any] = field(default_factory=dict)  # per-GPU memory kept across samples
    answered: int = 0  # calls in this pass that the GPU answered (values or capability answers)
    failed: int = 0  # calls in this pass that returned an error

    def __post_init__(self) -> None:
        self.labels = (str(self.index), self.uuid)

    @property
    def slow(self) -> bool:
        """True on the samples that also refresh rarely changing values."""
        return self.sample_no % Family.slow_every == 0

    def get(self, call: str, fn: Callable[..., Any], *args: Any, variant: str = "",
            expected: tuple[int, ...] = (), handle: Any = None) -> Any:
        """fn(handle, *args) through the session; None when unavailable (remembered) or failing.
        handle: another handle than the GPU's (one of its MIG devices; give a variant for it).

        expected: codes that are answers, not errors (Session.call); they give None, uncounted.
        A capability answer (nvml.UNAVAILABLE: NOT_SUPPORTED, NO_PERMISSION, a function the
        driver or binding lacks) is remembered per GPU, call and variant and re-probed after
        Session.reprobe_after. Raises GpuUnusable (GpuLost) on an nvml.UNUSABLE code.
        """
        key = (self.uuid, f"{call}:{variant}")
        if self.session.is_unavailable(key):
            return None
        try:
            value = self.session.call(call, fn, self.handle if handle is None else handle, *args, expected=expected)
            self.answered += 1
            return value
        except pynvml.NVMLError as e:
            if e.value in UNAVAILABLE:
                self.answered += 1
                self.session.mark_unavailable(key, call, e.value)
            elif e.value in UNUSABLE:
                raise unusable(self.uuid, e.value) from None
            elif e.value in expected:
                self.answered += 1
            else:
                self.failed += 1
        except (UnicodeDecodeError, ValueError, TypeError):
            self.failed += 1  # counted by the session; one failing call never stops the others
        return None

    def first(self, *calls: tuple[str, Callable[..., Any]], handle: Any = None, variant: str = "") -> Any:
        """The answer of the first (call name, fn) the GPU, driver and binding have: newer calls
        first, then their older fallbacks (e.g. memory info v2, then v1). None if none answers."""
        for call, fn in calls:
            key = (self.uuid, f"{call}:{variant}")
            if self.session.is_unavailable(key):
                continue
            value = self.get(call, fn, variant=variant, handle=handle)
            if value is not None or not self.session.is_unavailable(key):
                return value  # an answer, or an error (counted): do not mask it with an older call
        return None

    def emit(self, metric: Metric, raw: float | None, *extra: str, scale: float = 1.0,
             labels: tuple[str, ...] | None = None) -> None:
        """Add one sample of raw * scale, unless raw is absent, an NVML sentinel, not finite, or
        the scaled value is out of the metric's range; drops are counted, never served."""
        if raw is None:
            return
        value = raw * scale
        upper = metric.max_value if metric.max_value is not None else sys.float_info.max
        sentinel = isinstance(raw, int) and raw in (COUNTER_SENTINELS if metric.kind == "counter" else SENTINELS)
        if 0 <= value <= upper and not sentinel:  # one comparison also rules out NaN and infinity
            self.out.append(Sample(metric, (labels or self.labels) + extra, float(value)))
            return
        reason = "sentinel" if sentinel else "not_finite" if not math.isfinite(value) else "out_of_range"
        self.dropped(metric, reason)
