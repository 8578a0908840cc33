"""NVLink per link: state, data bytes sent/received and data-link errors, batched in the
field-values call with the link as scope."""

from __future__ import annotations

import time

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx

KIB = 1024
PER_LINK = [(N.NVML_FI_DEV_NVLINK_GET_STATE, c.NVLINK_UP, 1, ()),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, c.NVLINK_TX, KIB, ()),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, c.NVLINK_RX, KIB, ()),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, c.NVLINK_ERRORS, 1, ("crc",)),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, c.NVLINK_ERRORS, 1, ("replay",)),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, c.NVLINK_ERRORS, 1, ("recovery",))]


class Nvlink(Family):
    name = "nvlink"

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        links, read_at = gpu.cache.get("links", (None, 0.0))
        # The link count is read once per GPU (and after re-init); a GPU that had none is asked
        # again every Session.reprobe_after seconds (a fabric or link that comes up later).
        if links is None or (links == 0 and time.monotonic() - read_at > gpu.session.reprobe_after):
            fv = gpu.get("nvmlDeviceGetFieldValues", N.nvmlDeviceGetFieldValues,
                         [N.NVML_FI_DEV_NVLINK_LINK_COUNT], variant="link_count")
            ok = fv is not None and fv[0].nvmlReturn == N.NVML_SUCCESS
            links = fv[0].value.uiVal if ok else 0
            gpu.cache["links"] = (links, time.monotonic())
        if gpu.cache.get("link_fields", (None,))[0] != links:  # built once: the sampler reuses its batch
            gpu.cache["link_fields"] = (links, [FieldSpec(fid, metric, scale, (str(link), *extra), scope=link)
                                                for link in range(links) for fid, metric, scale, extra in PER_LINK])
        return gpu.cache["link_fields"][1]
