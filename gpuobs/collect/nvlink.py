"""NVLink per link: state, data bytes sent/received and data-link errors, batched in the
field-values call with the link as scope."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import Family, FieldSpec, GpuCtx, register

KIB = 1024
PER_LINK = [(N.NVML_FI_DEV_NVLINK_GET_STATE, c.NVLINK_UP, 1, ()),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, c.NVLINK_TX, KIB, ()),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, c.NVLINK_RX, KIB, ()),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, c.NVLINK_ERRORS, 1, ("crc",)),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, c.NVLINK_ERRORS, 1, ("replay",)),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, c.NVLINK_ERRORS, 1, ("recovery",))]


@dataclass
class NvlinkState:
    links: int = 0  # links the GPU reported at the last probe
    fields: list[FieldSpec] = field(default_factory=list)  # built per link count: the sampler reuses its batch


@register("nvlink")
class Nvlink(Family):
    """The link count is probed (per GPU, after re-init and every Session.reprobe_after seconds, so
    a fabric or link that comes up later is seen); fields() returns the specs built for it."""
    State = NvlinkState

    def probe(self, gpu: GpuCtx) -> None:
        fv = gpu.get(N.nvmlDeviceGetFieldValues, [N.NVML_FI_DEV_NVLINK_LINK_COUNT], variant="link_count")
        ok = fv is not None and fv[0].nvmlReturn == N.NVML_SUCCESS
        links = fv[0].value.uiVal if ok else 0
        st = self.state(gpu)
        if links != st.links or not st.fields:
            st.links = links
            st.fields = [FieldSpec(fid, metric, scale, (str(link), *extra), scope=link)
                         for link in range(links) for fid, metric, scale, extra in PER_LINK]

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        return self.state(gpu).fields
