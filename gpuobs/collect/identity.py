"""Identity: one `gpuobs_gpu_info` series per GPU with name, PCI bus id, serial and versions, and the
operator-set modes (persistence, compute mode)."""

from __future__ import annotations

from dataclasses import dataclass

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx, register


def _text(value: object) -> str:
    """A label value: always str, never a bytes repr (older pynvml returns bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


@dataclass
class IdentityState:
    """The GPU's identity label values (read by probe) and its persistence and compute modes as last read."""
    info: tuple[str, ...] | None = None  # GPU_INFO's label values after the GPU's own labels
    modes: tuple[int | None, int | None] | None = None  # (persistence, compute mode) as last read; None: unread


@register("identity")
class Identity(Family):
    """Reads the identity once per probe (it is fixed for the GPU's life); emits it every pass."""
    State = IdentityState

    def probe(self, gpu: GpuCtx) -> None:
        """Reads name, PCI bus id, serial, VBIOS, compute capability, brand and architecture (each '' where
        NVML does not answer) with the driver and CUDA versions into the state."""
        cc = gpu.get(N.nvmlDeviceGetCudaComputeCapability)
        pci = gpu.get(N.nvmlDeviceGetPciInfo_v3)
        self.state(gpu).info = (
            _text(gpu.get(N.nvmlDeviceGetName)),
            _text(pci.busId if pci is not None else None),
            _text(gpu.get(N.nvmlDeviceGetSerial)),
            _text(gpu.get(N.nvmlDeviceGetVbiosVersion)),
            *gpu.versions,
            f"{cc[0]}.{cc[1]}" if cc else "",
            _text(BRANDS.get(gpu.get(N.nvmlDeviceGetBrand))),
            _text(ARCHITECTURES.get(gpu.get(N.nvmlDeviceGetArchitecture))))

    def collect(self, gpu: GpuCtx) -> None:
        """Emits c.GPU_INFO (value 1, the identity as labels), c.PERSISTENCE_MODE and one 0/1 c.COMPUTE_MODE
        per mode; the modes are read on slow samples, and only where the profile serves them."""
        st = self.state(gpu)
        if st.info is not None:
            gpu.emit(c.GPU_INFO, 1, *st.info)
        # set by an operator (nvidia-smi -pm / -c): read on slow samples, and only where served
        if (st.modes is None or gpu.slow) and (gpu.serves(c.PERSISTENCE_MODE) or gpu.serves(c.COMPUTE_MODE)):
            st.modes = (gpu.get(N.nvmlDeviceGetPersistenceMode), gpu.get(N.nvmlDeviceGetComputeMode))
        persistence, compute = st.modes or (None, None)
        gpu.emit(c.PERSISTENCE_MODE, persistence)
        if compute is not None:  # one series per mode, 1 for the current one (a mode NVML adds later: none is 1)
            for i, mode in enumerate(c.COMPUTE_MODES):
                gpu.emit(c.COMPUTE_MODE, int(compute == i), mode)


BRANDS = {v: k.removeprefix("NVML_BRAND_").lower() for k, v in vars(N).items()
          if k.startswith("NVML_BRAND_") and k != "NVML_BRAND_COUNT" and isinstance(v, int)}
ARCHITECTURES = {v: k.removeprefix("NVML_DEVICE_ARCH_").lower() for k, v in vars(N).items()
                 if k.startswith("NVML_DEVICE_ARCH_") and isinstance(v, int)}
