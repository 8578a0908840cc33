"""Fabric: the GPU's NVSwitch fabric registration (state, status, clique) and fabric health, as
nvidia-smi -q shows under Fabric. Read on slow samples: the registration changes when the fabric
manager (re)starts or a GPU is reset, not from one pass to the next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml as N

from .. import catalog as c
from ..nvml import named
from .base import Family, GpuCtx, register

COMPLETED = c.FABRIC_STATES.index("completed")  # NVML_GPU_FABRIC_STATE_COMPLETED


def _struct(name: str) -> Any:
    """A new pynvml structure; a binding too old to have it answers as for a function it lacks."""
    cls = getattr(N, name, None)
    if cls is None:
        raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
    return cls()


@named("nvmlDeviceGetGpuFabricInfoV")
def _fabric_v(handle: Any) -> Any:
    """nvmlGpuFabricInfo_v2_t (with healthMask), R550+ drivers and Hopper or newer GPUs."""
    info = _struct("c_nvmlGpuFabricInfo_v2_t")
    N.nvmlDeviceGetGpuFabricInfoV(handle, N.byref(info))
    return info


@named("nvmlDeviceGetGpuFabricInfo")
def _fabric_v1(handle: Any) -> Any:
    """nvmlGpuFabricInfo_t (no health), the call drivers before R550 have."""
    info = _struct("c_nvmlGpuFabricInfo_t")
    N.nvmlDeviceGetGpuFabricInfo(handle, N.byref(info))
    return info


@dataclass
class FabricState:
    """The last fabric answer (nvmlDeviceGetGpuFabricInfoV or its v1 fallback; None: neither answered) and
    whether it was read at all."""
    info: Any = None  # last answer of the V call or its v1 fallback; None: none answered
    read: bool = False


@register("fabric", summary="NVSwitch fabric registration and health")
class Fabric(Family):
    """Absent on GPUs without NVSwitch fabric support (NOT_SUPPORTED, remembered) and on drivers
    without the calls (FUNCTION_NOT_FOUND); the health mask only where the V call answers."""
    State = FabricState

    def collect(self, gpu: GpuCtx) -> None:
        """Emits one 0/1 c.FABRIC_STATE per registration state, and c.FABRIC_STATUS and c.FABRIC_CLIQUE once
        registration completed, c.FABRIC_HEALTH where the V call gives the health mask; read on slow samples,
        and only where the profile serves the family (all detail)."""
        st = self.state(gpu)
        if not gpu.serves(c.FABRIC_STATE):  # all of it is detail: no call under the default profile
            return
        if gpu.slow or not st.read:
            st.info, st.read = gpu.first(_fabric_v, _fabric_v1), True
        info = st.info
        if info is None:
            return
        for i, state in enumerate(c.FABRIC_STATES):
            gpu.emit(c.FABRIC_STATE, int(info.state == i), state)
        if info.state == COMPLETED:  # status and clique are valid only then
            gpu.emit(c.FABRIC_STATUS, info.status)
            gpu.emit(c.FABRIC_CLIQUE, info.cliqueId)
        if hasattr(info, "healthMask"):
            gpu.emit(c.FABRIC_HEALTH, info.healthMask)
