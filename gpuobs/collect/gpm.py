"""Profiling activity through GPM (Hopper and newer): SM active/occupancy, tensor, DRAM and
FP64/32/16 pipes, per GPU and per MIG GPU instance. Each metric is the average over the time
between two GPM samples; the previous sample is kept, so one nvmlGpmSampleGet per sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from .. import catalog as c
from ..nvml import named
from .base import Family, GpuCtx, register


@named("nvmlGpmMetricsGet")
def metrics_get(sample1: Any, sample2: Any, ids: list[int]) -> dict[int, float]:
    """nvmlGpmMetricsGet for ids between two samples: {metric id: percent} for those that succeeded."""
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = N.NVML_GPM_METRICS_GET_VERSION, len(ids), sample1, sample2
    for i, mid in enumerate(ids):
        mg.metrics[i].metricId = mid
    N.nvmlGpmMetricsGet(mg)
    return {m.metricId: m.value for m in mg.metrics[: len(ids)] if m.nvmlReturn == N.NVML_SUCCESS}


@dataclass
class GpmState:
    """Per-GPU GPM state: whether the GPU supports GPM, and per GPU instance (None: the whole GPU) the two
    sample buffers NVML allocated and whether the previous one holds a sample."""
    supported: bool = False  # the probe's answer (nvmlGpmQueryDeviceSupport)
    # GPU instance id (None: the whole GPU) -> [previous sample, current sample, previous is valid]
    samples: dict[int | None, list[Any]] = field(default_factory=dict)


@register("gpm")
class Gpm(Family):
    """Keeps two GPM sample buffers per GPU (and per GPU instance, for the mig family) and
    alternates them."""
    State = GpmState

    def probe(self, gpu: GpuCtx) -> None:
        """Asks nvmlGpmQueryDeviceSupport whether the GPU supports GPM (Hopper and later); no answer is "no"."""
        support = gpu.get(N.nvmlGpmQueryDeviceSupport)
        self.state(gpu).supported = bool(support and support.isSupportedDevice)

    def supported(self, gpu: GpuCtx) -> bool:
        """The GPU supports GPM (as of the last probe)."""
        st: GpmState = self.state(gpu)
        return st.supported

    def collect(self, gpu: GpuCtx) -> None:
        """One whole-GPU GPM sample, emitting c.GPM_METRICS (NVML percents, exported as ratios 0-1) against the
        previous sample; nothing on an unsupported GPU or on the first sample."""
        if self.supported(gpu):
            self.sample(gpu, None, c.GPM_METRICS, gpu.labels)

    def free(self, state: GpmState) -> None:
        """Frees every GPM sample buffer the state holds (nvmlGpmSampleFree; an NVML error there is ignored:
        the GPU is going away or NVML re-initialised)."""
        for pair in state.samples.values():
            for sample in pair[:2]:
                try:
                    N.nvmlGpmSampleFree(sample)
                except N.NVMLError:
                    pass
        state.samples.clear()

    def sample(self, gpu: GpuCtx, gi: int | None, metrics: dict[int, Any], labels: tuple[str, ...]) -> None:
        """Take one GPM sample (whole GPU, or GPU instance gi) and emit metrics against the previous one."""
        samples = self.state(gpu).samples
        pair = samples.get(gi)
        if pair is None:
            pair = samples[gi] = [N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc(), False]
        prev, cur, have_prev = pair
        if gi is None:
            ok = gpu.get(N.nvmlGpmSampleGet, cur) is not None
        else:
            ok = gpu.get(N.nvmlGpmMigSampleGet, gi, cur, variant=str(gi)) is not None
        if not ok:
            return
        if have_prev:
            try:
                values = gpu.session.call(metrics_get, prev, cur, list(metrics))
            except (N.NVMLError, ValueError):
                values = {}
            for mid, value in values.items():
                gpu.emit(metrics[mid], value, scale=0.01, labels=labels)
        pair[0], pair[1], pair[2] = cur, prev, True  # this sample is the next one's baseline
