"""NVLink per link: state, data bytes sent/received and data-link errors, batched in the
field-values call with the link as scope; the same summed over the GPU's links (links down, bytes,
errors: the default profile's series, the per-link ones being detail); and the GPU's bytes per
second over all its links."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import pynvml as N

from .. import catalog as c
from .base import COUNTER_SENTINELS, Family, FieldSpec, GpuCtx, Rate, register

KIB = 1024
PER_LINK = [(N.NVML_FI_DEV_NVLINK_GET_STATE, c.NVLINK_UP, 1, ()),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, c.NVLINK_TX, KIB, ()),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, c.NVLINK_RX, KIB, ()),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, c.NVLINK_ERRORS, 1, ("crc",)),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, c.NVLINK_ERRORS, 1, ("replay",)),
            (N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, c.NVLINK_ERRORS, 1, ("recovery",))]

DATA = (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
ERRORS = (N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
          N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY)


def link_sum(gpu: GpuCtx, links: int, fids: tuple[int, ...]) -> int | None:
    """The sum of these fields over every link, None when one of them did not come back or is a
    sentinel: a sum missing a link would read as a counter reset, or as fewer errors than there are."""
    raw = [gpu.fields.get((fid, link)) for link in range(links) for fid in fids]
    values = [v for v in raw if v is not None and v not in COUNTER_SENTINELS]
    if len(values) < len(raw):
        return None
    return int(sum(values))


@dataclass
class NvlinkState:
    """Per-GPU NVLink state: the link count of the last probe, the field specs built for it, and the rate
    of the data bytes over all links."""
    links: int = 0  # links the GPU reported at the last probe
    fields: list[FieldSpec] = field(default_factory=list)  # built per link count: the sampler reuses its batch
    rate: Rate = field(default_factory=Rate)  # of the data bytes sent and received over all links


@functools.lru_cache(maxsize=None)
def link_fields(links: int) -> list[FieldSpec]:
    """The field specs of `links` links (PER_LINK for each), one list shared by every GPU with that
    many links: at 64 GPUs of 18 links, thousands of specs fewer. Not to be modified."""
    return [FieldSpec(fid, metric, scale, (str(link), *extra), scope=link)
            for link in range(links) for fid, metric, scale, extra in PER_LINK]


@register("nvlink")
class Nvlink(Family):
    """The link count is probed (per GPU, after re-init and every Session.reprobe_after seconds, so
    a fabric or link that comes up later is seen); fields() returns the specs built for it."""
    State = NvlinkState

    def probe(self, gpu: GpuCtx) -> None:
        """Reads the link count (NVML_FI_DEV_NVLINK_LINK_COUNT; 0 where the field does not answer) and builds the
        per-link field specs when it changed."""
        fv = gpu.get(N.nvmlDeviceGetFieldValues, [N.NVML_FI_DEV_NVLINK_LINK_COUNT], variant="link_count")
        ok = fv is not None and fv[0].nvmlReturn == N.NVML_SUCCESS
        links = fv[0].value.uiVal if ok else 0
        st = self.state(gpu)
        if links != st.links or not st.fields:
            st.links, st.fields = links, link_fields(links)

    def fields(self, gpu: GpuCtx) -> list[FieldSpec]:
        """Throughput and error counters of every link the last probe counted, one FieldSpec each."""
        st: NvlinkState = self.state(gpu)
        return st.fields

    def collect(self, gpu: GpuCtx) -> None:
        """Emits from the batch: c.NVLINKS_DOWN (links not enabled), c.NVLINKS_TX and c.NVLINKS_RX (bytes, NVML
        counts KiB), c.NVLINKS_ERRORS (CRC, replay and recovery errors summed over links) and c.NVLINK_THROUGHPUT
        (bytes/s between passes, detail); a sum is left out when one link's value is missing."""
        st = self.state(gpu)
        if not st.links:
            return
        states = [gpu.fields.get((N.NVML_FI_DEV_NVLINK_GET_STATE, link)) for link in range(st.links)]
        if None not in states:
            gpu.emit(c.NVLINKS_DOWN, sum(state != N.NVML_FEATURE_ENABLED for state in states))
        tx, rx = (link_sum(gpu, st.links, (fid,)) for fid in DATA)
        gpu.emit(c.NVLINKS_TX, tx, scale=KIB)
        gpu.emit(c.NVLINKS_RX, rx, scale=KIB)
        gpu.emit(c.NVLINKS_ERRORS, link_sum(gpu, st.links, ERRORS))
        if gpu.serves(c.NVLINK_THROUGHPUT):
            total = None if tx is None or rx is None else (tx + rx) * KIB
            gpu.emit(c.NVLINK_THROUGHPUT, st.rate.update(total, time.monotonic()))
