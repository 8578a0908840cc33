"""What collectors are (Family, registered with @register), what they produce (Samples in an
immutable Snapshot) and what they get (a GpuCtx)."""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, NamedTuple, TypeVar

import pynvml

from ..catalog import Metric
from ..nvml import UNAVAILABLE, UNUSABLE, Session, call_name
from .profile import FULL, Profile

SENTINELS = {0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0xFFFF, 0x7FFFFFFF}  # NVML "not available" markers
# A counter can legitimately pass 65535 or 2^31-1; it never reads exactly 2^32-1 or 2^64-1, which
# are the markers of a 32- or 64-bit value NVML could not read (an ECC count of 1.8e19 is one).
COUNTER_SENTINELS = {0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}


_LIMITS: dict[Metric, tuple[float, float, frozenset[int]]] = {}


def limits(metric: Metric) -> tuple[float, float, frozenset[int]]:
    """(lowest, highest possible value, raw values that are NVML sentinels) of a metric: its declared
    valid range (Metric.valid) and its kind's sentinels, kept per metric: every sample asks once."""
    got = _LIMITS.get(metric)
    if got is None:
        lower, upper = metric.valid
        got = _LIMITS[metric] = (lower, min(upper, sys.float_info.max),
                                 frozenset(COUNTER_SENTINELS if metric.kind == "counter" else SENTINELS))
    return got


def drop_reason(raw: float, value: float, sentinels: frozenset[int]) -> str:
    """Why a value is dropped: sentinel, not_finite or out_of_range."""
    if type(raw) is int and raw in sentinels:
        return "sentinel"
    return "not_finite" if not math.isfinite(value) else "out_of_range"


def checked(metric: Metric, labels: tuple[str, ...], raw: float, value: float,
            dropped: Callable[[Metric, str], None]) -> Sample | None:
    """The one gate every collected value passes (GpuCtx.emit and the field-values batch): the Sample
    of `value` (raw NVML value after the caller's scaling) unless raw is an NVML sentinel or value is
    not finite or outside the metric's declared valid range, in which case `dropped(metric, reason)`
    counts it (gpuobs_exporter_dropped_values_total) and None is returned: never served."""
    lower, upper, sentinels = limits(metric)
    if lower <= value <= upper and not (type(raw) is int and raw in sentinels):  # also rules out NaN and inf
        return Sample(metric, labels, float(value))
    dropped(metric, drop_reason(raw, value, sentinels))
    return None


class LogLimiter:
    """Per key, at most `burst` records in each `per`-second window; the others are counted and the
    count is handed to the next record allowed (so that it can say how many were left out)."""

    def __init__(self, per: float = 60.0, burst: int = 1, clock: Callable[[], float] = time.monotonic):
        self.per, self.burst, self._clock = per, burst, clock
        self._lock = threading.Lock()
        self._state: dict[Hashable, list[int | float]] = {}  # key -> [window start, allowed in window, suppressed]

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
            suppressed, st[2] = int(st[2]), 0
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
    """Every Sample of one sampling pass, whose reads started at `time` (Unix seconds)."""
    time: float
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class FieldSpec:
    """One value read with nvmlDeviceGetFieldValues: NVML field id and scope (e.g. an NVLink link),
    the metric it feeds, how it becomes base units (value * scale / per), and the metric's extra
    label values."""
    field_id: int
    metric: Metric | None  # None: read for the family's collect() to use, not emitted directly
    scale: float = 1.0
    extra: tuple[str, ...] = ()
    scope: int = 0
    per: float = 1  # a divisor: 72600 / 1000 is 72.6, where 72600 * 0.001 is 72.60000000000001


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What build() hands a family class: the families built before it (enabled ones, by name),
    the XID watcher and the kernel-log watcher (None when the exporter runs without one), and the
    most processes per GPU."""
    built: dict[str, "Family"]
    watcher: Any = None
    kernel_log: Any = None
    process_cap: int


class Family:
    """One metric family. Subclasses register with @register, read NVML in `collect` and/or
    declare batched `fields`, and read one-off capabilities in `probe`.

    Per-GPU memory lives in one typed object per GPU and family (`state(gpu)`, of the class
    `State`), dropped by `release(uuid)` when the GPU goes away or NVML re-initialises.
    """
    name = ""  # set by @register
    spec: "FamilySpec"  # set by @register
    State: Callable[[], Any] = dict  # per-GPU state: a class (a dataclass) made with no arguments
    slow_every = 10  # samples between reads of values that change rarely (limits, max clocks)

    def __init__(self) -> None:
        self._states: dict[str, Any] = {}  # uuid -> State(); one reader thread per GPU at a time

    @classmethod
    def build(cls, needs: Needs) -> "Family | None":
        """The family's instance for the exporter (None: it cannot run, e.g. no XID watcher)."""
        return cls()

    def state(self, gpu: "GpuCtx | str") -> Any:
        """This family's state of a GPU (by GpuCtx or UUID), made on first use."""
        uuid = gpu if isinstance(gpu, str) else gpu.uuid
        st = self._states.get(uuid)
        if st is None:
            st = self._states[uuid] = self.State()
        return st

    def probe(self, gpu: "GpuCtx") -> None:
        """Read what a GPU answers once (capabilities, fixed limits) into its state; the sampler
        runs it before fields() and collect() for a new GPU, after NVML re-initialises and every
        Session.reprobe_after seconds. Raises GpuUnusable as collect() does."""

    def fields(self, gpu: "GpuCtx") -> list[FieldSpec]:
        """Field values this family wants for this GPU in this sample (no I/O: from its state)."""
        return []

    def collect(self, gpu: "GpuCtx") -> None:
        """Read NVML for one GPU and emit samples; raise GpuUnusable when the GPU is unusable."""

    def node_samples(self, known: dict[str, int]) -> list[Sample]:
        """Samples that outlive a GPU's loss, once per pass; known maps UUID -> last NVML index."""
        return []

    def release(self, uuid: str) -> None:
        """Forget a GPU's state (it went away, or NVML re-initialised), freeing the NVML resources
        it holds (free())."""
        st = self._states.pop(uuid, None)
        if st is not None:
            self.free(st)

    def free(self, state: Any) -> None:
        """Free the NVML resources one GPU's state holds (none by default)."""


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """A family as the exporter offers it (what node_exporter's registerCollector records).

    default: collected unless the operator names the families (--families).
    uses: families whose per-GPU state this one reads when they are enabled; they are registered,
    and so run in each pass, before it. Enabling this one does not enable them.
    needs_watcher: runs only with an XidWatcher (the exporter starts one when such a family is on).
    summary: what the family adds, for the CLI's help (a flag --<name> for a family off by default).
    """
    name: str
    cls: type[Family]
    default: bool = True
    uses: tuple[str, ...] = ()
    needs_watcher: bool = False
    summary: str = ""


F = TypeVar("F", bound=Family)
REGISTRY: dict[str, FamilySpec] = {}  # in registration order: the order families run and are listed


def register(name: str, *, default: bool = True, uses: tuple[str, ...] = (), needs_watcher: bool = False,
             summary: str = "") -> Callable[[type[F]], type[F]]:
    """Class decorator: add a Family subclass to REGISTRY under `name` (see FamilySpec). Raises
    ValueError for a name registered twice or a `uses` not registered before."""
    def wrap(cls: type[F]) -> type[F]:
        if name in REGISTRY:
            raise ValueError(f"metric family {name} registered twice")
        missing = [u for u in uses if u not in REGISTRY]
        if missing:
            raise ValueError(f"metric family {name} uses {missing}, which must be registered before it")
        cls.name = name
        cls.spec = REGISTRY[name] = FamilySpec(name=name, cls=cls, default=default, uses=uses,
                                               needs_watcher=needs_watcher, summary=summary)
        return cls
    return wrap

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
    versions: tuple[str, str] = ("", "")  # driver and CUDA driver versions (Identity's labels)
    answered: int = 0  # calls in this pass that the GPU answered (values or capability answers)
    failed: int = 0  # calls in this pass that returned an error
    last_error: int | None = None  # NVML code of the last get() that failed (None: it answered)
    # emit()'s Samples of this pass and of the previous one, by what made them: an unchanged value is
    # served as the same Sample (no new object; the renderer's comparison stops at the identity)
    memo: dict[Hashable, Sample] = field(default_factory=dict)
    memo_before: dict[Hashable, Sample] = field(default_factory=dict)
    profile: Profile = FULL  # which series are served: others are never made
    # UUIDs of the node's GPUs the driver reports lost (GPU_IS_LOST) or no longer counts, as of the
    # sampler's latest read: series naming one as a peer are left out (a timed-out GPU is not lost)
    lost: frozenset[str] = frozenset()

    def serves(self, metric: Metric) -> bool:
        """True when the profile serves some series of the metric: a family skips the NVML call of
        one it does not (Profile.serves)."""
        return self.profile.serves(metric)

    def __post_init__(self) -> None:
        self.labels = (str(self.index), self.uuid)

    @property
    def slow(self) -> bool:
        """True on the samples that also refresh rarely changing values."""
        return self.sample_no % Family.slow_every == 0

    def get(self, fn: Callable[..., Any], *args: Any, name: str | None = None, variant: str = "",
            expected: tuple[int, ...] = (), handle: Any = None) -> Any:
        """fn(handle, *args) through the session; None when unavailable (remembered) or failing.
        name: the call's name in counts and capability answers (default fn.__name__, see
        nvml.call_name). handle: another handle than the GPU's (one of its MIG devices; give a
        variant for it).

        expected: codes that are answers, not errors (Session.call); they give None, uncounted.
        A capability answer (nvml.UNAVAILABLE: NOT_SUPPORTED, NO_PERMISSION, a function the
        driver or binding lacks) is remembered per GPU, call and variant and re-probed after
        Session.reprobe_after. Raises GpuUnusable (GpuLost) on an nvml.UNUSABLE code.
        """
        call = name or call_name(fn)
        what = f"{call}:{variant}"
        if self.session.is_unavailable(self.uuid, what):
            return None
        self.last_error = None
        try:
            value = self.session.call(fn, self.handle if handle is None else handle, *args, name=call,
                                      expected=expected)
            self.answered += 1
            return value
        except pynvml.NVMLError as e:
            self.last_error = e.value
            if e.value in UNAVAILABLE:
                self.answered += 1
                self.session.mark_unavailable(self.uuid, what, call, e.value)
            elif e.value in expected:  # before UNUSABLE: a pair call answers a lost peer's code
                self.answered += 1
            elif e.value in UNUSABLE:
                raise unusable(self.uuid, e.value) from None
            else:
                self.failed += 1
        except (UnicodeDecodeError, ValueError, TypeError):
            self.failed += 1  # counted by the session; one failing call never stops the others
        return None

    def first(self, *fns: Callable[..., Any], handle: Any = None, variant: str = "") -> Any:
        """The answer of the first fn (named by call_name) the GPU, driver and binding have: newer
        calls first, then their older fallbacks (e.g. memory info v2, then v1). None if none answers."""
        for fn in fns:
            what = f"{call_name(fn)}:{variant}"
            if self.session.is_unavailable(self.uuid, what):
                continue
            value = self.get(fn, variant=variant, handle=handle)
            if value is not None or not self.session.is_unavailable(self.uuid, what):
                return value  # an answer, or an error (counted): do not mask it with an older call
        return None

    def emit(self, metric: Metric, raw: float | None, *extra: str, scale: float = 1.0, per: float = 1,
             labels: tuple[str, ...] | None = None) -> None:
        """Add one sample of raw * scale / per, unless raw is absent or `checked` drops it (an NVML
        sentinel, not finite, or outside the metric's valid range): drops are counted, never served."""
        if raw is None:
            return
        rule = self.profile.rules.get(metric, True)
        if rule is not True and not self.profile.keeps(metric, (labels or self.labels) + extra):
            return  # not served by this profile: no Sample, no drop counted
        key = (metric, raw, extra, labels or self.labels, scale, per)
        sample = self.memo.get(key) or self.memo_before.get(key)
        if sample is not None and (raw or type(raw) is int):  # a float zero is made again: -0.0 == 0.0
            self.memo[key] = sample
            self.out.append(sample)
            return
        sample = checked(metric, (labels or self.labels) + extra, raw, raw * scale / per, self.dropped)
        if sample is not None:  # a drop is never kept: it is counted on every pass
            self.memo[key] = sample
            self.out.append(sample)


@dataclass
class Rate:
    """Per-second increase of a counter between two reads, for a gauge of the rate itself (what
    dcgm-exporter's throughput fields report). update() gives None on the first read, after a
    missing or sentinel value, when the counter went down (reset, wrap) or when no time passed."""
    last: tuple[float, float] | None = None  # (value, monotonic seconds) of the previous read

    def update(self, value: float | None, now: float) -> float | None:
        """Record `value` (counter units) read at `now` (monotonic seconds); the rate in units/s."""
        prev, self.last = self.last, None
        if value is None or value in COUNTER_SENTINELS:
            return None
        self.last = (value, now)
        if prev is None or value < prev[0] or now <= prev[1]:
            return None
        return (value - prev[0]) / (now - prev[1])
