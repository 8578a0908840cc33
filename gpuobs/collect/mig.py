"""MIG: mode, and per MIG device its GPU/compute instance ids, profile, memory and GPM activity.
Device-level values stay on the physical GPU's series only."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx
from .gpm import Gpm
from .memory import memory_any


def _enumerate(gpu: GpuCtx) -> list[tuple[object, tuple[str, str], str, str]]:
    """[(MIG handle, (GPU instance id, compute instance id), MIG UUID, profile)] of one GPU.

    The GPU's own labels are not kept here: its index can shift between samples."""
    count = gpu.get("nvmlDeviceGetMaxMigDeviceCount", N.nvmlDeviceGetMaxMigDeviceCount) or 0
    out = []
    for i in range(count):
        handle = gpu.get("nvmlDeviceGetMigDeviceHandleByIndex", N.nvmlDeviceGetMigDeviceHandleByIndex, i,
                         variant=str(i), expected=(N.NVML_ERROR_NOT_FOUND,))
        if handle is None:
            continue  # NOT_FOUND: no device at this index (indexes can be sparse): an answer, not an error
        call = gpu.session.call
        try:
            gi = call("nvmlDeviceGetGpuInstanceId", N.nvmlDeviceGetGpuInstanceId, handle)
            ci = call("nvmlDeviceGetComputeInstanceId", N.nvmlDeviceGetComputeInstanceId, handle)
            mig_uuid = call("nvmlDeviceGetUUID", N.nvmlDeviceGetUUID, handle)
            name = call("nvmlDeviceGetName", N.nvmlDeviceGetName, handle)
        except (N.NVMLError, UnicodeDecodeError):
            continue
        profile = name.rsplit(" MIG ", 1)[-1] if " MIG " in name else ""
        out.append((handle, (str(gi), str(ci)), mig_uuid, profile))
    return out


class Mig(Family):
    name = "mig"

    def collect(self, gpu: GpuCtx) -> None:
        if gpu.slow or "mig_mode" not in gpu.cache:
            mode = gpu.get("nvmlDeviceGetMigMode", N.nvmlDeviceGetMigMode)
            mode = None if mode is None else mode[0]
            if "mig_mode" in gpu.cache and mode != gpu.cache["mig_mode"]:
                # MIG toggled: what the GPU answered before (NOT_SUPPORTED in one mode) may differ now
                gpu.session.forget(gpu.uuid)
            gpu.cache["mig_mode"] = mode
            gpu.cache["migs"] = _enumerate(gpu) if gpu.cache["mig_mode"] == 1 else []
        gpu.emit(c.MIG_MODE, gpu.cache["mig_mode"])
        gpm = gpu.cache.get("gpm")
        for handle, ids, mig_uuid, profile in gpu.cache["migs"]:
            labels = gpu.labels + ids  # this sample's index, not the one seen at enumeration
            gpu.emit(c.MIG_INFO, 1, mig_uuid, profile, labels=labels)
            mem = memory_any(gpu, handle, variant="mig")
            if mem is not None:
                gpu.emit(c.MIG_MEMORY_TOTAL, mem.total, labels=labels)
                gpu.emit(c.MIG_MEMORY_USED, mem.used, labels=labels)
            if gpm:  # set by the gpm family when the GPU supports GPM
                Gpm.sample(gpu, int(labels[2]), c.MIG_GPM_METRICS, labels)

    def release(self, cache) -> None:
        Gpm().release(cache)
