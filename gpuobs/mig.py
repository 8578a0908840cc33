"""MIG profiles of the GPUs that have them, in one table: the recording rules of MIG right-sizing
(gpuobs.records), the "Fleet efficiency" dashboard and `gpuobs mig-advice` all read it.

From NVIDIA's Multi-Instance GPU user guide ("Supported MIG Profiles"): a GPU instance takes compute
slices (of 7: the fraction of SMs) and memory slices (of 8: the fraction of memory). Media-extension
variants (+me) have the same slices and are left out. A profile's memory is its name's nominal size
in GB (10^9 bytes): NVIDIA rounds the memory slice in the name, and the right-sizing headroom (20 %
by default) is far larger than the rounding.

A GPU fits a profile when its peak memory used and its peak SM activity, each raised by the headroom,
fit the profile's memory and its share of the SMs; the recommendation is the smallest profile that
fits (fewest compute slices, then fewest memory slices), or none (nothing fits, or the model has no
MIG: L40S, consumer GPUs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPUTE_SLICES = 7  # a full GPU's compute slices (GPCs available to MIG) on A100, H100, H200
MEMORY_SLICES = 8
GB = 10 ** 9


@dataclass(frozen=True)
class Profile:
    """One GPU instance profile: name as nvidia-smi writes it (`3g.40gb`), compute slices of 7,
    memory slices of 8, memory in bytes (the name's nominal GB)."""
    name: str
    compute_slices: int
    memory_slices: int
    memory_bytes: float

    @property
    def sm_share(self) -> float:
        """The share of the GPU's SMs the profile holds (compute slices / 7), a ratio 0-1."""
        return self.compute_slices / COMPUTE_SLICES

    def fits(self, memory_bytes: float, sm_ratio: float, headroom: float) -> bool:
        """Whether peak memory used (bytes) and peak SM activity (ratio 0-1), each times
        (1 + headroom), fit in this profile."""
        grow = 1 + headroom
        return memory_bytes * grow <= self.memory_bytes and sm_ratio * grow <= self.sm_share


@dataclass(frozen=True)
class Model:
    """A GPU model with MIG: its key, a regex over NVML's device name (gpuobs_gpu_info's `name`
    label) and its profiles, smallest first."""
    key: str
    name_regex: str
    profiles: tuple[Profile, ...]

    def matches(self, name: str) -> bool:
        """Whether an NVML device name is this model (anchored, as PromQL's =~ is)."""
        return re.fullmatch(self.name_regex, name) is not None


def _profiles(gb: tuple[int, int, int, int]) -> tuple[Profile, ...]:
    """The six standard profiles of a 7-slice GPU from the nominal GB of 1, 2, 4 and 8 memory slices."""
    one, two, four, full = gb
    shapes = ((1, 1, one), (1, 2, two), (2, 2, two), (3, 4, four), (4, 4, four), (7, 8, full))
    return tuple(Profile(f"{g}g.{size}gb", g, m, size * GB) for g, m, size in shapes)


MODELS: tuple[Model, ...] = (
    Model("A100-40GB", r"NVIDIA A100-(SXM4|PCIE)-40GB", _profiles((5, 10, 20, 40))),
    Model("A100-80GB", r"NVIDIA A100-SXM4-80GB|NVIDIA A100 80GB PCIe", _profiles((10, 20, 40, 80))),
    Model("H100-80GB", r"NVIDIA H100 80GB HBM3|NVIDIA H100 PCIe", _profiles((10, 20, 40, 80))),
    Model("H100-94GB", r"NVIDIA H100 NVL|NVIDIA H100 94GB.*", _profiles((12, 24, 47, 94))),
    Model("H200-141GB", r"NVIDIA H200( NVL)?", _profiles((18, 35, 71, 141))),
)


def model_for(name: str) -> Model | None:
    """The MIG model of an NVML device name, or None (no MIG, or a model not in MODELS)."""
    return next((m for m in MODELS if m.matches(name)), None)


def recommend(name: str, memory_bytes: float, sm_ratio: float, headroom: float) -> Profile | None:
    """The smallest profile of the model named `name` that fits a peak of memory_bytes used and
    sm_ratio SM activity with headroom (a ratio, 0.2 = 20 %); None if none fits or the model has no MIG."""
    model = model_for(name)
    if model is None:
        return None
    return next((p for p in model.profiles if p.fits(memory_bytes, sm_ratio, headroom)), None)
