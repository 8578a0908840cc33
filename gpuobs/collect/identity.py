"""Identity: one `gpuobs_gpu_info` series per GPU with name, PCI bus id, serial and versions."""

from __future__ import annotations

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx


def _text(value) -> str:
    """A label value: always str, never a bytes repr (older pynvml returns bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


class Identity(Family):
    name = "identity"

    def collect(self, gpu: GpuCtx) -> None:
        info = gpu.cache.get("info")
        if info is None:  # fixed for the GPU's life: read once (again after NVML re-initialises)
            cc = gpu.get("nvmlDeviceGetCudaComputeCapability", N.nvmlDeviceGetCudaComputeCapability)
            pci = gpu.get("nvmlDeviceGetPciInfo_v3", N.nvmlDeviceGetPciInfo_v3)
            versions = gpu.cache.get("versions", ("", ""))
            info = (_text(gpu.get("nvmlDeviceGetName", N.nvmlDeviceGetName)),
                    _text(pci.busId if pci is not None else None),
                    _text(gpu.get("nvmlDeviceGetSerial", N.nvmlDeviceGetSerial)),
                    _text(gpu.get("nvmlDeviceGetVbiosVersion", N.nvmlDeviceGetVbiosVersion)),
                    *versions,
                    f"{cc[0]}.{cc[1]}" if cc else "",
                    _text(BRANDS.get(gpu.get("nvmlDeviceGetBrand", N.nvmlDeviceGetBrand))),
                    _text(ARCHITECTURES.get(gpu.get("nvmlDeviceGetArchitecture", N.nvmlDeviceGetArchitecture))))
            gpu.cache["info"] = info
        gpu.emit(c.GPU_INFO, 1, *info)


BRANDS = {v: k.removeprefix("NVML_BRAND_").lower() for k, v in vars(N).items()
          if k.startswith("NVML_BRAND_") and k != "NVML_BRAND_COUNT" and isinstance(v, int)}
ARCHITECTURES = {v: k.removeprefix("NVML_DEVICE_ARCH_").lower() for k, v in vars(N).items()
                 if k.startswith("NVML_DEVICE_ARCH_") and isinstance(v, int)}
