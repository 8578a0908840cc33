"""Profiling activity through GPM (Hopper and newer): SM active/occupancy, tensor, DRAM and
FP64/32/16 pipes, per GPU and per MIG GPU instance. Each metric is the average over the time
between two GPM samples; the previous sample is kept, so one nvmlGpmSampleGet per sample."""

from __future__ import annotations

from typing import Any

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx


def metrics_get(sample1: Any, sample2: Any, ids: list[int]) -> dict[int, float]:
    """nvmlGpmMetricsGet for ids between two samples: {metric id: percent} for those that succeeded."""
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = N.NVML_GPM_METRICS_GET_VERSION, len(ids), sample1, sample2
    for i, mid in enumerate(ids):
        mg.metrics[i].metricId = mid
    N.nvmlGpmMetricsGet(mg)
    return {m.metricId: m.value for m in mg.metrics[: len(ids)] if m.nvmlReturn == N.NVML_SUCCESS}


class Gpm(Family):
    """Keeps two GPM sample buffers per GPU (and per GPU instance) and alternates them."""
    name = "gpm"

    def collect(self, gpu: GpuCtx) -> None:
        if "gpm" not in gpu.cache:
            support = gpu.get("nvmlGpmQueryDeviceSupport", N.nvmlGpmQueryDeviceSupport)
            gpu.cache["gpm"] = bool(support and support.isSupportedDevice)
        if gpu.cache["gpm"]:
            self.sample(gpu, None, c.GPM_METRICS, gpu.labels)

    def release(self, cache: dict[str, Any]) -> None:
        for key in [k for k in cache if k.startswith("gpm_samples:")]:
            for sample in cache.pop(key)[:2]:
                try:
                    N.nvmlGpmSampleFree(sample)
                except N.NVMLError:
                    pass

    @staticmethod
    def sample(gpu: GpuCtx, gi: int | None, metrics: dict[int, Any], labels: tuple[str, ...]) -> None:
        """Take one GPM sample (whole GPU, or GPU instance gi) and emit metrics against the previous one."""
        key = f"gpm_samples:{gi}"
        pair = gpu.cache.get(key)
        if pair is None:
            pair = gpu.cache[key] = [N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc(), False]
        prev, cur, have_prev = pair
        if gi is None:
            ok = gpu.get("nvmlGpmSampleGet", N.nvmlGpmSampleGet, cur) is not None
        else:
            ok = gpu.get("nvmlGpmMigSampleGet", N.nvmlGpmMigSampleGet, gi, cur, variant=str(gi)) is not None
        if not ok:
            return
        if have_prev:
            try:
                values = gpu.session.call("nvmlGpmMetricsGet", metrics_get, prev, cur, list(metrics))
            except (N.NVMLError, ValueError):
                values = {}
            for mid, value in values.items():
                gpu.emit(metrics[mid], value, scale=0.01, labels=labels)
        pair[0], pair[1], pair[2] = cur, prev, True  # this sample is the next one's baseline
