"""The sampling loop: one pass over every GPU and family per interval, published as a Snapshot.

A pass never raises: a failing GPU or field is skipped and counted, a lost GPU reports up=0.
The exporter serves the latest Snapshot and never waits on NVML.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

import pynvml as N

from .. import catalog as c
from ..nvml import Session, code_name
from ..nvml.fields import FieldValues
from .base import Family, FieldSpec, GpuCtx, GpuLost, Sample, Snapshot

log = logging.getLogger("gpuobs.sampler")


class Sampler:
    """Samples every GPU with the given families every `interval` seconds in a daemon thread.

    expected_gpus: how many GPUs the node should have (None: the most ever seen).
    on_snapshot: called with each new Snapshot (the exporter renders it there, once).
    """

    def __init__(self, session: Session, families: list[Family], interval: float = 5.0,
                 expected_gpus: int | None = None, on_snapshot: Callable[[Snapshot], None] | None = None):
        self.session = session
        self.families = families
        self.interval = interval
        self.expected_gpus = expected_gpus
        self.on_snapshot = on_snapshot
        self.latest: Snapshot | None = None
        self.dropped: collections.Counter[tuple[str, str]] = collections.Counter()
        self.samples = 0
        self.versions = ("", "", "")
        self._max_seen = 0
        self._known: dict[str, int] = {}  # uuid -> last index, for up=0 after loss
        self._caches: dict[str, dict] = {}  # uuid -> per-GPU cache kept across samples
        self._generation = -1
        self._enumerated: tuple[int, list, bool] | None = None  # (NVML generation, devices, some missing)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_pass_end = time.monotonic()  # monotonic end of the last completed pass (liveness)

    # ---- loop -----------------------------------------------------------------------------

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run, name="gpuobs-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)  # a pass stuck in NVML must not hold up shutdown

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - the loop must survive anything; the cause is logged
                log.exception("sampling pass failed")
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - self.interval)  # after a hang, do not catch up in a burst

    # ---- one pass ---------------------------------------------------------------------------

    def sample_once(self) -> Snapshot:
        """Take one complete pass and publish it as the latest Snapshot."""
        start, wall = time.monotonic(), time.time()
        calls_before = self.session.calls
        out: list[Sample] = []
        present = 0
        if self.session.ensure():
            if self.session.generation != self._generation:
                self._reset_caches()
                self._generation = self.session.generation
                self.versions = self._versions()
            present = self._sample_gpus(out)
            for fam in self.families:
                out.extend(fam.node_samples(self._known))
        self._max_seen = max(self._max_seen, present)
        self.samples += 1
        out.extend(self._self_samples(present, time.monotonic() - start, self.session.calls - calls_before, wall))
        duration = time.monotonic() - start
        if duration > self.interval:
            log.warning("sampling pass took longer than the interval", extra={"seconds": round(duration, 3),
                                                                             "interval": self.interval})
        # stamped when complete: its age is how old its newest value is, whatever the pass took
        snap = Snapshot(time.time(), duration, tuple(out), self.session.up, present)
        self.latest = snap
        self.last_pass_end = time.monotonic()
        if self.on_snapshot:
            self.on_snapshot(snap)
        return snap

    def _versions(self) -> tuple[str, str, str]:
        def safe(name, fn):
            try:
                return str(self.session.call(name, fn))
            except (N.NVMLError, UnicodeDecodeError):
                return ""
        cuda = safe("nvmlSystemGetCudaDriverVersion", N.nvmlSystemGetCudaDriverVersion)
        cuda = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda.isdigit() else ""
        return (safe("nvmlSystemGetDriverVersion", N.nvmlSystemGetDriverVersion),
                safe("nvmlSystemGetNVMLVersion", N.nvmlSystemGetNVMLVersion), cuda)

    def _reset_caches(self) -> None:
        for cache in self._caches.values():
            self._release(cache)
        self._caches.clear()

    def _release(self, cache: dict) -> None:
        for fam in self.families:
            try:
                fam.release(cache)
            except Exception:  # noqa: BLE001 - freeing must not stop sampling
                log.exception("release failed")

    def _sample_gpus(self, out: list[Sample]) -> int:
        for attempt in range(2):
            devices = self._devices()
            if devices is None:
                return 0
            seen: dict[str, int] = {}
            gpus: list[Sample] = []
            for index, handle, uuid in devices:
                if self._sample_gpu(handle, index, uuid, gpus):
                    seen[uuid] = index
                else:
                    self._enumerated = None  # a GPU was lost: enumerate afresh
            if self._enumerated is not None or attempt:
                break
            # A GPU was lost in this pass, and the others' NVML indices may have shifted with it:
            # sample once more with a fresh enumeration rather than serve the old indices.
        out.extend(gpus)
        for uuid, index in list(self._known.items()):
            if uuid not in seen:
                out.append(Sample(c.GPU_UP, (str(index), uuid), 0.0))
        for uuid in set(self._caches) - set(seen):
            self._release(self._caches.pop(uuid))
        for uuid, index in seen.items():
            out.append(Sample(c.GPU_UP, (str(index), uuid), 1.0))
        self._known.update(seen)
        return len(seen)

    def _devices(self) -> list[tuple[int, object, str]] | None:
        """[(index, handle, UUID)] of the answering GPUs; None if NVML cannot count them. The GPUs
        are counted and looked up again only on slow samples, after a GPU was lost or missing, or
        after NVML re-initialised: 2 calls per GPU and 1 per node saved on the other passes. A GPU
        that vanishes answers GPU_IS_LOST at once; one that appears shows within slow_every samples."""
        slow = self.samples % Family.slow_every == 0
        if self._enumerated is not None and not slow \
                and self._enumerated[0] == self.session.generation and not self._enumerated[2]:
            return self._enumerated[1]
        try:
            count = self.session.call("nvmlDeviceGetCount_v2", N.nvmlDeviceGetCount)
        except N.NVMLError:
            return None
        devices, missing = [], False
        for index in range(count):
            try:
                handle = self.session.call("nvmlDeviceGetHandleByIndex_v2", N.nvmlDeviceGetHandleByIndex, index)
                uuid = self.session.call("nvmlDeviceGetUUID", N.nvmlDeviceGetUUID, handle)
            except (N.NVMLError, UnicodeDecodeError):
                missing = True  # lost or unreadable: reported as up=0 under its last known UUID
                continue
            devices.append((index, handle, uuid))
        self._enumerated = (self.session.generation, devices, missing)
        return devices

    def _sample_gpu(self, handle, index: int, uuid: str, out: list[Sample]) -> bool:
        """All families for one GPU into `out`; False (and nothing added) if the GPU is lost."""
        mine: list[Sample] = []
        gpu = GpuCtx(self.session, handle, index, uuid, self.samples, mine, self._drop,
                     cache=self._caches.setdefault(uuid, {}))
        gpu.cache["versions"] = (self.versions[0], self.versions[2])
        try:
            self._read_fields(gpu)
            for fam in self.families:
                try:
                    fam.collect(gpu)
                except GpuLost:
                    raise
                except Exception:  # noqa: BLE001 - one family failing never affects the others
                    log.exception("family failed", extra={"family": fam.name, "uuid": uuid})
        except GpuLost:
            log.warning("gpu lost", extra={"uuid": uuid, "index": index})
            return False
        out.extend(mine)
        return True

    def _read_fields(self, gpu: GpuCtx) -> None:
        batch = self._field_batch(gpu)
        if batch is None:
            return
        specs, reader = batch
        values = gpu.get("nvmlDeviceGetFieldValues", reader.read)
        if values is None:
            return
        for spec, (ret, raw) in zip(specs, values):
            if ret == N.NVML_SUCCESS:
                gpu.fields[(spec.field_id, spec.scope)] = raw
                if spec.metric is not None:
                    gpu.emit(spec.metric, raw, *spec.extra, scale=spec.scale)
            elif ret == N.NVML_ERROR_NOT_SUPPORTED:
                self.session.unsupported.add((gpu.uuid, f"field:{spec.field_id}:{spec.scope}"))
            else:
                self.session.errors[(f"nvmlDeviceGetFieldValues:{spec.field_id}", code_name(N.NVMLError(ret)))] += 1

    def _field_batch(self, gpu: GpuCtx) -> tuple[list[FieldSpec], FieldValues] | None:
        """The fields the families want from this GPU now, less those it does not support, and
        their reusable reader; rebuilt only when the wanted fields or the unsupported set change
        (the set only grows between re-initialisations, which clear the GPU caches)."""
        wanted = tuple(s for fam in self.families for s in fam.fields(gpu))
        key = (wanted, len(self.session.unsupported))
        cached = gpu.cache.get("field_batch")
        if cached is not None and cached[0] == key:  # same FieldSpec objects: compared by identity, in C
            return cached[1]
        specs = [s for s in wanted if (gpu.uuid, f"field:{s.field_id}:{s.scope}") not in self.session.unsupported]
        batch = (specs, FieldValues([(s.field_id, s.scope) for s in specs])) if specs else None
        gpu.cache["field_batch"] = (key, batch)
        return batch

    def _drop(self, metric: c.Metric, reason: str) -> None:
        self.dropped[(metric.name, reason)] += 1

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
        out.extend(Sample(c.NVML_ERRORS, key, float(n)) for key, n in sorted(s.errors.items()))
        out.extend(Sample(c.DROPPED, key, float(n)) for key, n in sorted(self.dropped.items()))
        return out
