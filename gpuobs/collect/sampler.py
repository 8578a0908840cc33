"""The sampling loop: one pass over every GPU and family per interval, published as a Snapshot.

Per GPU, a pass runs every family's probe() first when the GPU is new, after NVML re-initialised
and every Session.reprobe_after seconds (one-off capability reads), then fields() (one batched
nvmlDeviceGetFieldValues) and collect().

GPUs are read by reader threads (`_Readers`) under the pass's deadline, so that a call hung on
one GPU withholds only that GPU's series (gpu_up 0, gpuobs_gpu_unhealthy{reason="timeout"},
a timeout counted) while the others are served. A pass never raises: a failing GPU, field or
family is skipped and counted, an unusable GPU reports up=0 with its reason. The exporter serves
the latest Snapshot and never waits on NVML; the Snapshot's time is when its values were read.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import pynvml as N

from .. import catalog as c
from .. import logpatterns
from ..nvml import UNUSABLE, Session
from ..nvml.fields import FieldValues
from .base import Family, FieldSpec, GpuCtx, GpuUnusable, LogLimiter, Sample, Snapshot, checked
from .profile import FULL, Profile

log = logging.getLogger("gpuobs.sampler")

LOG_EVERY_S = 60.0  # the same failure is logged at most once a minute (with how many were held back)


@dataclass
class _GpuRead:
    """What one GPU's worker brought back from one pass."""
    index: int
    uuid: str
    handle: Any = None
    samples: list[Sample] = field(default_factory=list)
    reason: str | None = None  # None: healthy; else the gpuobs_gpu_unhealthy reason
    failed: list[str] = field(default_factory=list)  # families that raised


@dataclass
class _GpuState:
    """What the sampler keeps of one GPU between passes (the families keep their own)."""
    generation: int  # NVML generation it was made under: handles and answers of another are void
    probed_at: float | None = None  # monotonic end of the last complete probe
    batch: tuple[Hashable, _FieldBatch | None] | None = None  # (key, _FieldBatch or None): the GPU's field batch
    memo: dict[Hashable, Sample] = field(default_factory=dict)  # GpuCtx.memo of its last pass


class _FieldBatch:
    """One GPU's field-values batch: the specs, their reader (FieldValues) and, per spec, the
    Sample made from its last value. read() keeps every value in gpu.fields and emits the specs'
    samples through GpuCtx.emit's gate (base.checked: same checks, same drops counted every pass),
    making a Sample only for a value that changed: comparing the values with the previous read's and copying the
    unchanged samples run in C, and the renderer then finds those samples identical to the
    previous snapshot's."""

    def __init__(self, specs: list[FieldSpec], labels: tuple[str, ...], profile: Profile = FULL):
        # a spec whose series the profile does not serve is still read (its family's collect() may
        # sum it, as NVLink's per-GPU totals do) but makes no Sample
        specs = [s if s.metric is None or profile.keeps(s.metric, labels + s.extra)
                 else dataclasses.replace(s, metric=None) for s in specs]
        self.specs = specs
        self.keys = [(s.field_id, s.scope) for s in specs]
        self.labels = [labels + s.extra for s in specs]
        self.reader = FieldValues(self.keys)
        self.samples: list[Sample | None] = [None] * len(specs)  # None: no metric, dropped or not read
        self.last: list[float | None] | tuple[float | None, ...] | None = None  # the values of the last read
        self.dropping: list[int] = []  # specs whose last value was dropped: counted again each pass
        self.floats: list[int] | None = None  # float-valued specs: always made again (-0.0 == 0.0)

    def read(self, gpu: GpuCtx) -> None:
        read = gpu.get(self.reader.read, name="nvmlDeviceGetFieldValues")
        if read is None:
            return
        rets, values = read
        if self.floats is None:
            self.floats = [i for i, v in enumerate(values) if type(v) is float]
        if any(rets):  # NVML_SUCCESS is 0: some values did not come back
            changed = []
            for i, ret in enumerate(rets):
                if ret == N.NVML_SUCCESS:
                    gpu.fields[self.keys[i]] = values[i]
                    changed.append(i)
                else:
                    gpu.session.field_answer(gpu.uuid, self.keys[i][0], self.keys[i][1], ret)
                    self.samples[i] = None
        else:
            gpu.fields.update(zip(self.keys, values))
            if self.last is None:
                changed = list(range(len(values)))
            elif values == self.last:
                changed = []
            else:
                changed = [i for i, moved in enumerate(map(operator.ne, values, self.last)) if moved]
            if self.floats or self.dropping:
                changed = list(dict.fromkeys(changed + self.floats + self.dropping))  # each once
        self.last, dropping = values, []
        for i in changed:
            if self._make(gpu, i, values[i]) is None and self.specs[i].metric is not None:
                dropping.append(i)
        self.dropping = dropping
        gpu.out.extend(filter(None, self.samples))

    def _make(self, gpu: GpuCtx, i: int, raw: float) -> Sample | None:
        """Spec i's Sample for raw (None: no metric, or dropped and counted)."""
        spec = self.specs[i]
        sample = None
        if spec.metric is not None:
            sample = checked(spec.metric, self.labels[i], raw, raw * spec.scale / spec.per, gpu.dropped)
        self.samples[i] = sample
        return sample


class _Pass:
    """One pass's GPU reads: a queue that readers take from, and what came back by index."""

    def __init__(self, jobs: list[tuple[int, Callable[[], _GpuRead]]]):
        self.pending = collections.deque(jobs)
        self.total = len(jobs)
        self.running: dict[int, float] = {}  # index -> monotonic start of its read
        self.results: dict[int, _GpuRead | None] = {}  # None: the read raised
        self.closed = False
        self.joining = 0  # readers given the pass that have not started on it yet
        self.cv = threading.Condition()

    def arrive(self) -> None:
        with self.cv:
            self.joining -= 1

    def take(self) -> tuple[int, Callable[[], _GpuRead]] | None:
        with self.cv:
            if self.closed or not self.pending:
                return None
            index, fn = self.pending.popleft()
            self.running[index] = time.monotonic()
            return index, fn

    def finish(self, index: int, result: _GpuRead | None) -> None:
        with self.cv:
            self.running.pop(index, None)
            self.results[index] = result
            self.cv.notify_all()

    def close(self) -> None:
        """The pass is over: what is still queued is not read (a late reader's result is ignored)."""
        with self.cv:
            self.closed = True
            self.pending.clear()


class _Reader:
    """A daemon thread that reads the GPUs of a pass one after another until its queue is empty."""

    def __init__(self, pool: "_Readers", name: str):
        self._pool = pool
        self._cv = threading.Condition()
        self._pass: _Pass | None = None
        self._closed = False
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def give(self, p: _Pass) -> None:
        with self._cv:
            self._pass = p
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._pass is None and not self._closed:
                    self._cv.wait()
                if self._pass is None:
                    return
                p, self._pass = self._pass, None
            p.arrive()
            while (job := p.take()) is not None:
                index, fn = job
                result = None
                try:
                    result = fn()
                except Exception:  # noqa: BLE001 - reported as a sampler error by the coordinator
                    log.exception("gpu read failed")
                p.finish(index, result)
            self._pool.idle(self)


class _Readers:
    """The threads that read GPUs. One reads a pass's GPUs one after another (one thread handoff per
    pass, as cheap as reading them on the sampler's thread). When every read in progress has
    taken longer than `stall` seconds and GPUs still wait, another thread joins the pass: a call
    hung or slow on one GPU holds one thread, never the GPUs after it."""

    def __init__(self) -> None:
        self._idle: list[_Reader] = []
        self._all: list[_Reader] = []
        self._lock = threading.Lock()

    def idle(self, reader: _Reader) -> None:
        with self._lock:
            self._idle.append(reader)

    def _add(self, p: _Pass) -> None:
        with p.cv:
            p.joining += 1
        with self._lock:
            reader = self._idle.pop() if self._idle else None
            if reader is None:
                reader = _Reader(self, f"gpuobs-reader{len(self._all)}")
                self._all.append(reader)
        reader.give(p)

    def run(self, p: _Pass, deadline: float, stall: float) -> dict[int, _GpuRead | None]:
        """Read the pass until every GPU is done or `deadline` (monotonic); the results by index."""
        if p.total:
            self._add(p)
        with p.cv:
            while len(p.results) < p.total:
                now = time.monotonic()
                if now >= deadline:
                    break
                if p.pending and not p.joining and all(now - t >= stall for t in p.running.values()):
                    self._add(p)  # every reader is stuck on a slow GPU (or done): another one goes on
                p.cv.wait(min(deadline - now, stall / 2))
            results = dict(p.results)
        p.close()
        return results

    def close(self) -> None:
        for reader in self._all:
            reader.close()


class Sampler:
    """Samples every GPU with the given families (in their order) every `interval` seconds in a
    daemon thread.

    expected_gpus: how many GPUs the node should have (None: the most ever seen).
    deadline: seconds a pass's GPU reads may take (default 0.8 x interval): a GPU still reading (or
    not yet read) then is withheld from the pass. GPUs are read one after another on a reader
    thread; a read stalled for `stall` seconds gets another reader going on with the next GPUs.
    Served values are thus at most about 1.8 intervals old; the exporter withholds a snapshot
    older than 2 intervals.
    on_snapshot: called with each new Snapshot (the exporter renders it there, once).
    profile: which series the families make (collect.profile: the exporter's default profile, or
    FULL, every series, the default here).
    """

    def __init__(self, session: Session, families: list[Family], interval: float,
                 expected_gpus: int | None = None, on_snapshot: Callable[[Snapshot], None] | None = None,
                 deadline: float | None = None, profile: Profile = FULL):
        self.session = session
        self.profile = profile  # the series served (profile.py); FULL unless the exporter says otherwise
        self.families = families
        self.interval = interval
        self.deadline = 0.8 * interval if deadline is None else deadline
        self.expected_gpus = expected_gpus
        self.on_snapshot = on_snapshot
        self.latest: Snapshot | None = None
        self.dropped: collections.Counter[tuple[str, str]] = collections.Counter()
        self.timeouts: collections.Counter[str] = collections.Counter()  # uuid -> passes past the deadline
        self._accounted: dict[str, int] = {}  # uuid -> index of the GPUs the last pass accounted for
        self.collector_errors: collections.Counter[str] = collections.Counter()
        self.collector_failed: set[str] = set()  # collectors that raised in the last pass
        self.samples = 0
        self.versions = ("", "", "")
        self._max_seen = 0
        self._known: dict[str, int] = {}  # uuid -> last index, for up=0 after loss
        self._lost: frozenset[str] = frozenset()  # GPUs the latest read found lost or gone (GpuCtx.lost)
        self._index_uuid: dict[int, str] = {}  # index -> last UUID read there (for a GPU that stops answering)
        self._gpus: dict[str, _GpuState] = {}  # uuid -> what the sampler keeps of the GPU
        self._generation = -1
        self._count: tuple[int, int] | None = None  # (NVML generation, GPUs the driver counts)
        self._handles: dict[int, tuple[Any, str]] = {}  # index -> (handle, uuid) of this generation
        self._readers = _Readers()
        self.stall = min(0.25, self.deadline / 10)  # a read this long gets another reader going on
        self._reading: set[str] = set()  # UUIDs a worker is reading now
        self._lock = threading.Lock()
        self._limiter = LogLimiter(LOG_EVERY_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_pass_end = time.monotonic()  # monotonic end of the last completed pass (liveness)

    # ---- loop -----------------------------------------------------------------------------

    def start(self) -> "Sampler":
        """Starts the sampling thread (a daemon: one pass every interval) and returns self."""
        self._thread = threading.Thread(target=self._run, name="gpuobs-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the sampling thread and its GPU readers; waits at most 2 s for a pass in flight."""
        self._stop.set()
        self._readers.close()
        if self._thread:
            self._thread.join(timeout=2)  # a pass stuck in NVML must not hold up shutdown

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - the loop must survive anything; counted and logged
                self.collector_errors["sampler"] += 1
                self.collector_failed.add("sampler")
                self._log("sampler", "sampling pass failed", exc_info=True)
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - self.interval)  # after a hang, do not catch up in a burst

    # ---- one pass ---------------------------------------------------------------------------

    def sample_once(self) -> Snapshot:
        """Take one complete pass and publish it as the latest Snapshot."""
        start, wall = time.monotonic(), time.time()
        calls_before = self.session.calls
        failed = {"sampler"} & self.collector_failed  # the previous pass raised out of sample_once
        self.collector_failed = set()
        out: list[Sample] = []
        present = 0
        self._accounted = {}
        if self.session.ensure():
            if self.session.generation != self._generation:
                self._reset_gpus()
                self._generation = self.session.generation
                self.versions = self._versions()
            generation = self.session.generation
            gpus: list[Sample] = []
            present = self._sample_gpus(gpus, start + self.deadline)
            if self.session.up and self.session.generation == generation:
                out.extend(gpus)
            else:  # NVML went down during the pass: what it read, and its cached values, prove nothing
                present, self._accounted = 0, {}
            for fam in self.families:
                try:
                    out.extend(fam.node_samples(self._known))
                except Exception:  # noqa: BLE001 - one collector failing never affects the others
                    self._family_failed(fam.name)
        self._max_seen = max(self._max_seen, present)
        self.samples += 1
        self.collector_failed |= failed
        out.extend(self._self_samples(present, time.monotonic() - start, self.session.calls - calls_before, wall))
        duration = time.monotonic() - start
        if duration > self.interval:
            self._log("slow", "sampling pass took longer than the interval", seconds=round(duration, 3),
                      interval=self.interval)
        # stamped with the pass's start: no value in it was read before then, so the snapshot's
        # age bounds the age of every value it holds
        snap = Snapshot(wall, tuple(out))
        self.latest = snap
        self.last_pass_end = time.monotonic()
        if self.on_snapshot:
            self.on_snapshot(snap)
        return snap

    def _versions(self) -> tuple[str, str, str]:
        """(driver, NVML, CUDA driver) versions; '' for one NVML does not give."""
        def safe(fn: Callable[[], object]) -> str:
            try:
                return str(self.session.call(fn))
            except (N.NVMLError, UnicodeDecodeError):
                return ""
        cuda = safe(N.nvmlSystemGetCudaDriverVersion)
        cuda = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda.isdigit() else ""
        return safe(N.nvmlSystemGetDriverVersion), safe(N.nvmlSystemGetNVMLVersion), cuda

    def _reset_gpus(self) -> None:
        """NVML re-initialised: every GPU's state is void (a hung read's is released when its GPU
        is next read, see _gpu_state)."""
        for uuid in list(self._gpus):
            if uuid not in self._reading:
                self._release(uuid)
        self._handles.clear()
        self._count = None

    def _release(self, uuid: str) -> None:
        """Drop what the sampler and every family keep of a GPU (Family.release)."""
        self._gpus.pop(uuid, None)
        for fam in self.families:
            try:
                fam.release(uuid)
            except Exception:  # noqa: BLE001 - freeing must not stop sampling
                self._log(("release", fam.name), "release failed", exc_info=True)

    def _gpu_state(self, uuid: str) -> _GpuState:
        """The sampler's state of a GPU being read, made anew for a new GPU and after NVML
        re-initialised (a read that hung through the re-init kept its old one: released here)."""
        st = self._gpus.get(uuid)
        if st is not None and st.generation != self.session.generation:
            self._release(uuid)
            st = None
        if st is None:
            st = self._gpus[uuid] = _GpuState(self.session.generation)
        return st

    # ---- GPUs -------------------------------------------------------------------------------

    def _device_count(self) -> int | None:
        """GPUs the driver counts; asked on slow samples, after a GPU was lost or unreadable, and
        after NVML re-initialised (1 call per node saved on the other passes). None if NVML
        cannot count them."""
        slow = self.samples % Family.slow_every == 0
        if self._count is not None and not slow and self._count[0] == self.session.generation:
            return self._count[1]
        try:
            count: int = self.session.call(N.nvmlDeviceGetCount, name="nvmlDeviceGetCount_v2")
        except N.NVMLError:
            self._count = None
            return None
        if slow or self._count is None or self._count[1] != count:
            self._handles.clear()  # looked up again: a GPU that appears shows within slow_every samples
        self._count = (self.session.generation, count)
        return count

    def _sample_gpus(self, out: list[Sample], deadline: float) -> int:
        count = self._device_count()
        if count is None:
            return 0
        cached = bool(self._handles)
        results = self._read_all(count, deadline)
        newly_lost = _lost_in(results) - self._lost
        if newly_lost or (cached and any(r.reason in ("lost", "unreadable") for r in results.values())):
            # A GPU was lost in this pass, and the others' NVML indices may have shifted with it:
            # read once more with a fresh count and lookup rather than serve the old indices; and a
            # GPU newly lost was named as a peer (topology pairs) by the GPUs read before it.
            self._lost |= newly_lost
            self._handles.clear()
            self._count = None
            count = self._device_count()
            if count is None:
                return 0
            results = self._read_all(count, deadline)
        accounted: dict[str, int] = {}
        for index in range(count):
            r = results[index]
            accounted[r.uuid] = index
            if r.reason is None:
                out.extend(r.samples)
                out.append(Sample(c.GPU_UP, (str(index), r.uuid), 1.0))
                self._handles[index] = (r.handle, r.uuid)
                self._known[r.uuid] = index
                with self._lock:  # served from the first pass, so that increase() sees the first timeout
                    self.timeouts.setdefault(r.uuid, 0)
                self._index_uuid[index] = r.uuid
            else:
                self._down(out, index, r.uuid, r.reason)
                if r.reason != "timeout":
                    self._handles.pop(index, None)
            for fam in r.failed:
                self._family_failed(fam)
        for uuid, index in list(self._known.items()):
            if uuid not in accounted:  # no longer counted by the driver: fell off the bus
                self._down(out, index, uuid, "lost")
        self._lost = _lost_in(results) | (self._known.keys() - accounted.keys())
        for uuid in set(list(self._gpus)) - set(accounted) - self._reading:
            self._release(uuid)
        self._accounted = accounted
        return count

    def _down(self, out: list[Sample], index: int, uuid: str, reason: str) -> None:
        labels = (str(index), uuid)
        out.append(Sample(c.GPU_UP, labels, 0.0))
        out.append(Sample(c.GPU_UNHEALTHY, labels + (reason,), 1.0))
        if reason == "timeout":
            with self._lock:
                self.timeouts[uuid] += 1

    def _read_all(self, count: int, deadline: float) -> dict[int, _GpuRead]:
        """Every counted GPU read by the readers, waited for until `deadline` (monotonic)."""
        results: dict[int, _GpuRead] = {}
        jobs: list[tuple[int, Callable[[], _GpuRead]]] = []
        for index in range(count):
            handle, uuid = self._handles.get(index, (None, ""))
            if uuid and uuid in self._reading:  # its read of an earlier pass still hangs
                results[index] = _GpuRead(index, uuid, reason="timeout")
                continue
            jobs.append((index, functools.partial(self._read_gpu, index, handle, uuid)))
        done = self._readers.run(_Pass(jobs), deadline, self.stall)
        for index, _ in jobs:
            result = done.get(index)
            if result is None:  # late (withheld from this pass), or the read raised
                if index in done:
                    self._family_failed("sampler")
                uuid = self._handles.get(index, (None, ""))[1] or self._index_uuid.get(index, "")
                result = _GpuRead(index, uuid, reason="unreadable" if index in done else "timeout")
            results[index] = result
        return results

    def _read_gpu(self, index: int, handle: Any, uuid: str) -> _GpuRead:
        """One GPU's pass, on its worker: look it up if needed, then every family."""
        if handle is None:
            try:
                handle = self.session.call(N.nvmlDeviceGetHandleByIndex, index, name="nvmlDeviceGetHandleByIndex_v2")
                uuid = self.session.call(N.nvmlDeviceGetUUID, handle)
            except N.NVMLError as e:
                return _GpuRead(index, self._index_uuid.get(index, ""), reason=UNUSABLE.get(e.value, "unreadable"))
            except UnicodeDecodeError:
                return _GpuRead(index, self._index_uuid.get(index, ""), reason="unreadable")
        with self._lock:
            if uuid in self._reading:  # its earlier read (under another index) still hangs
                return _GpuRead(index, uuid, handle, reason="timeout")
            self._reading.add(uuid)
        try:
            return self._read_families(index, handle, uuid)
        finally:
            with self._lock:
                self._reading.discard(uuid)

    def _read_families(self, index: int, handle: Any, uuid: str) -> _GpuRead:
        result = _GpuRead(index, uuid, handle)
        state = self._gpu_state(uuid)
        gpu = GpuCtx(self.session, handle, index, uuid, self.samples, result.samples, self._drop,
                     versions=(self.versions[0], self.versions[2]), memo_before=state.memo, profile=self.profile,
                     lost=self._lost)
        state.memo = gpu.memo  # this pass's Samples, for the next pass
        try:
            if state.probed_at is None or time.monotonic() - state.probed_at >= self.session.reprobe_after:
                if self._each_family(gpu, "probe", result):
                    state.probed_at = time.monotonic()  # else (one raised) the probes run again next pass
            self._read_fields(gpu, state)
            self._each_family(gpu, "collect", result)
        except GpuUnusable as e:
            self._log(("unusable", uuid, e.reason), "gpu unusable", uuid=uuid, index=index, reason=e.reason)
            return _GpuRead(index, uuid, handle, reason=e.reason, failed=result.failed)
        if gpu.failed and not gpu.answered:  # every call failed: its kept values are not news of it
            return _GpuRead(index, uuid, handle, reason="unreadable", failed=result.failed)
        return result

    def _each_family(self, gpu: GpuCtx, step: str, result: _GpuRead) -> bool:
        """Run one step (probe or collect) of every family on a GPU; a family that raises is
        counted and logged, the others go on. True if none raised. Raises GpuUnusable."""
        ok = True
        for fam in self.families:
            try:
                getattr(fam, step)(gpu)
            except GpuUnusable:
                raise
            except Exception:  # noqa: BLE001 - one family failing never affects the others
                ok = False
                if fam.name not in result.failed:  # one error per family, GPU and pass
                    result.failed.append(fam.name)
                self._log(("family", fam.name), "collector failed", exc_info=True, collector=fam.name,
                          uuid=gpu.uuid, step=step)
        return ok

    def _read_fields(self, gpu: GpuCtx, state: _GpuState) -> None:
        """One nvmlDeviceGetFieldValues for every field the families want (_FieldBatch)."""
        batch = self._field_batch(gpu, state)
        if batch is not None:
            batch.read(gpu)

    def _field_batch(self, gpu: GpuCtx, state: _GpuState) -> "_FieldBatch | None":
        """The fields the families want from this GPU now, less those it does not give, as a
        _FieldBatch; made again only when the wanted fields, the capability answers or the GPU's
        labels change."""
        wanted = tuple(itertools.chain.from_iterable([fam.fields(gpu) for fam in self.families]))
        key = (wanted, self.session.capability_version, gpu.labels)
        if state.batch is not None and state.batch[0] == key:  # same FieldSpec objects: compared by identity, in C
            return state.batch[1]
        specs = [s for s in wanted if not self.session.field_unavailable(gpu.uuid, s.field_id, s.scope)]
        batch = _FieldBatch(specs, gpu.labels, self.profile) if specs else None
        state.batch = (key, batch)  # after expired answers went
        return batch

    def _log(self, key: Any, msg: str, exc_info: bool = False, **extra: Any) -> None:
        """An error record, at most once per LOG_EVERY_S per key, saying how many were held back."""
        held = self._limiter.allow(key)
        if held is not None:
            log.error(msg, exc_info=exc_info, extra={**extra, "suppressed": held})

    def _drop(self, metric: c.Metric, reason: str) -> None:
        with self._lock:
            self.dropped[(metric.name, reason)] += 1

    def _family_failed(self, name: str) -> None:
        with self._lock:
            self.collector_errors[name] += 1
            self.collector_failed.add(name)

    # ---- self-health ---------------------------------------------------------------------------

    def _self_samples(self, present: int, duration: float, calls: int, wall: float) -> list[Sample]:
        s = self.session
        out = [Sample(c.NVML_UP, (), float(s.up)),
               Sample(c.GPUS_PRESENT, (), float(present)),
               Sample(c.GPUS_EXPECTED, (), float(self.expected_gpus if self.expected_gpus is not None
                                                 else self._max_seen)),
               Sample(c.COLLECTION_DURATION, (), duration),
               Sample(c.NVML_CALLS, (), float(calls)),
               Sample(c.SAMPLES, (), float(self.samples)),
               Sample(c.NVML_REINITS, (), float(s.reinits))]
        if s.up:
            out.append(Sample(c.LAST_SUCCESS, (), wall))
            out.append(Sample(c.NVML_INFO, self.versions, 1.0))
        elif self.latest is not None:
            out.extend(x for x in self.latest.samples if x.metric is c.LAST_SUCCESS)
        if s.init_error:
            out.append(Sample(c.NVML_INIT_ERROR, (s.init_error,), 1.0))
        out.extend(Sample(c.NVML_ERRORS, key, float(n)) for key, n in s.error_counts())
        out.extend(Sample(c.NVML_UNAVAILABLE, key, float(n)) for key, n in sorted(s.unavailable_counts().items()))
        with self._lock:
            out.extend(Sample(c.DROPPED, key, float(n)) for key, n in sorted(self.dropped.items()))
            out.extend(Sample(c.GPU_TIMEOUTS, (str(index), uuid), float(self.timeouts.get(uuid, 0)))
                       for uuid, index in sorted(self._accounted.items()))  # GPUs counted now, at their index
            failed = set(self.collector_failed)
        for name in ["sampler"] + [f.name for f in self.families]:  # every collector, errors from 0
            out.append(Sample(c.COLLECTOR_SUCCESS, (name,), float(name not in failed)))
            out.append(Sample(c.COLLECTOR_ERRORS, (name,), float(self.collector_errors.get(name, 0))))
        out.append(Sample(c.LOGS_DROPPED, (), float(_log_records_dropped())))
        out.append(Sample(c.LOG_LINES_TRUNCATED, (), float(logpatterns.truncated_total())))
        return out


def _lost_in(results: dict[int, _GpuRead]) -> frozenset[str]:
    """UUIDs of the GPUs a read found lost (GPU_IS_LOST): not those that timed out, which are still
    there, nor one whose UUID was never known."""
    return frozenset(r.uuid for r in results.values() if r.reason == "lost" and r.uuid)


def _log_records_dropped() -> int:
    """Log records this process's Fluentd handlers dropped (0 without Fluentd)."""
    from ..logs import records_dropped_total

    return records_dropped_total()
