"""Peak dense FLOP/s per GPU model and dtype, for MFU when the user gives no peak_flops.

Values are the vendors' datasheet peaks without structured sparsity (NVIDIA's datasheets print the
tensor-core figures with 2:4 sparsity, marked "*" below; the dense peak is half of it, given in
whole TFLOP/s as commonly quoted: 989 for the H100 SXM's 1,979* BF16), one row per
board: an SXM and a PCIe board of one GPU differ (clocks and power), and so do L4, L40 and L40S.

A device is matched by its exact model name, as `torch.cuda.get_device_name()` and NVML's
nvmlDeviceGetName report it ("NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA A100-SXM4-80GB",
"Tesla V100-SXM2-16GB"), normalized (normalize()): never by substring, where "L4" would match an
L40 and read its MFU 1.5x high. A board missing here (H100 NVL, H200 NVL, A10G, a MIG slice, ...)
has no peak: local_peak_flops() warns once and the run has no MFU series; pass peak_flops for it.
"""

from __future__ import annotations

import logging
import re

T = 1e12
log = logging.getLogger(__name__)


def _tf(fp32: float, tf32: float | None = None, bf16: float | None = None, fp16: float | None = None,
        fp8: float | None = None) -> dict[str, float]:
    """{dtype: dense FLOP/s} from dense TFLOP/s: fp16 defaults to bf16 (equal on every tensor-core
    GPU since Ampere); a dtype the GPU lacks (None) is left out."""
    fp16 = bf16 if fp16 is None else fp16
    given = {"fp8": fp8, "bf16": bf16, "fp16": fp16, "tf32": tf32, "fp32": fp32}
    return {k: v * T for k, v in given.items() if v is not None}


# (model, device names as torch/NVML report them, {dtype: dense FLOP/s}). fp32 is the non-tensor peak.
MODELS: tuple[tuple[str, tuple[str, ...], dict[str, float]], ...] = (
    # NVIDIA GB200 NVL72 datasheet, per GPU (72 GPUs): FP8 720 PF*, BF16 360 PF*, TF32 180 PF*, FP32 5,760 TF
    ("GB200", ("NVIDIA GB200",), _tf(fp32=80, tf32=1250, bf16=2500, fp8=5000)),
    # NVIDIA HGX B200 datasheet, per GPU (8 GPUs): FP8 72 PF*, BF16 36 PF*, TF32 18 PF*, FP32 600 TF
    ("B200", ("NVIDIA B200",), _tf(fp32=75, tf32=1125, bf16=2250, fp8=4500)),
    # NVIDIA H200 datasheet, H200 SXM: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*, FP8 3,958 TF*
    ("H200 SXM", ("NVIDIA H200",), _tf(fp32=67, tf32=494, bf16=989, fp8=1979)),
    # NVIDIA H100 datasheet, H100 SXM: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*, FP8 3,958 TF*
    ("H100 SXM", ("NVIDIA H100 80GB HBM3",), _tf(fp32=67, tf32=494, bf16=989, fp8=1979)),
    # NVIDIA H100 datasheet, H100 PCIe: FP32 51 TF, TF32 756 TF*, BF16/FP16 1,513 TF*, FP8 3,026 TF*
    ("H100 PCIe", ("NVIDIA H100 PCIe",), _tf(fp32=51, tf32=378, bf16=756, fp8=1513)),
    # NVIDIA GH200 Grace Hopper datasheet, its H100: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*, FP8 3,958 TF*
    ("GH200", ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"), _tf(fp32=67, tf32=494, bf16=989, fp8=1979)),
    # NVIDIA L40S datasheet: FP32 91.6 TF, TF32 183 TF (366*), BF16/FP16 362.05 TF (733*), FP8 733 TF (1,466*)
    ("L40S", ("NVIDIA L40S",), _tf(fp32=91.6, tf32=183, bf16=362, fp8=733)),
    # NVIDIA L40 datasheet: FP32 90.5 TF, TF32 90.5 TF (181*), BF16/FP16 181.05 TF (362.1*), FP8 362 TF (724*)
    ("L40", ("NVIDIA L40",), _tf(fp32=90.5, tf32=90.5, bf16=181, fp8=362)),
    # NVIDIA L4 datasheet: FP32 30.3 TF, TF32 120 TF*, BF16/FP16 242 TF*, FP8 485 TF*
    ("L4", ("NVIDIA L4",), _tf(fp32=30.3, tf32=60, bf16=121, fp8=242)),
    # NVIDIA A100 datasheet (SXM and PCIe, 40 and 80 GB alike): FP32 19.5 TF, TF32 156 TF, BF16/FP16 312 TF
    ("A100", ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB", "NVIDIA A100-PCIE-40GB",
               "NVIDIA A100 80GB PCIe"),
     _tf(fp32=19.5, tf32=156, bf16=312)),
    # NVIDIA A10 datasheet: FP32 31.2 TF, TF32 62.5 TF (125*), BF16/FP16 125 TF (250*)
    ("A10", ("NVIDIA A10",), _tf(fp32=31.2, tf32=62.5, bf16=125)),
    # NVIDIA V100 datasheet, SXM2: FP32 15.7 TF, tensor (FP16) 125 TF; no BF16 or TF32
    ("V100 SXM2", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"), _tf(fp32=15.7, fp16=125)),
    # NVIDIA V100 datasheet, PCIe: FP32 14 TF, tensor (FP16) 112 TF
    ("V100 PCIe", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"), _tf(fp32=14, fp16=112)),
    # NVIDIA V100S datasheet, PCIe: FP32 16.4 TF, tensor (FP16) 130 TF
    ("V100S PCIe", ("Tesla V100S-PCIE-32GB",), _tf(fp32=16.4, fp16=130)),
)
ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
           "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "tensorfloat32": "tf32"}
_VENDOR = re.compile(r"^(?:nvidia|tesla) ")


def normalize(device_name: str) -> str:
    """The lookup key of a device name: lower case, runs of blanks, "-" and "_" as one blank, the
    vendor prefix ("NVIDIA ", "Tesla ") dropped: "NVIDIA A100-SXM4-80GB" -> "a100 sxm4 80gb"."""
    key = re.sub(r"[\s_-]+", " ", device_name.strip().lower())
    return _VENDOR.sub("", key)


_BY_NAME: dict[str, tuple[str, dict[str, float]]] = {
    normalize(name): (model, peaks) for model, names, peaks in MODELS for name in names}
assert len(_BY_NAME) == sum(len(names) for _, names, _ in MODELS), "two models share a device name"


def dtype_key(dtype: object) -> str:
    """The table's dtype key of dtype: "bf16", "fp16", "fp8", "tf32", "fp32", from those or torch's
    names ("bfloat16", torch.bfloat16, "float8_e4m3fn", ...); another name comes back lower-cased."""
    key = str(dtype).removeprefix("torch.").lower()
    return ALIASES.get(key, key)


def model_of(device_name: str) -> str | None:
    """The table's model ("H100 SXM", "L40S", ...) of a device name as torch or NVML reports it,
    matched exactly after normalize(); None for a name the table lacks."""
    found = _BY_NAME.get(normalize(device_name))
    return found[0] if found else None


def peak_flops(device_name: str, dtype: object) -> float | None:
    """Dense peak FLOP/s of one GPU named device_name (exactly as torch or NVML reports it, see
    normalize()) computing in dtype (see dtype_key()); None for an unknown device name or a dtype
    the table has no peak for on that GPU (fp8 on an A100, bf16 on a V100)."""
    found = _BY_NAME.get(normalize(device_name))
    return found[1].get(dtype_key(dtype)) if found else None


_warned: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], message: str, *args: object) -> None:
    """Logs message at WARNING the first time this process sees key (a dtype given in every
    TrainingRun of a loop, or every rank's, must not repeat it)."""
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def local_peak_flops(dtype: object) -> float | None:
    """peak_flops() of the CUDA device this process uses (torch), or None with one WARNING per
    cause and process (no MFU series follows): torch missing, no CUDA device, a device name the
    table lacks, or no peak for dtype on it. The message says to pass peak_flops instead."""
    try:
        import torch
    except ImportError:
        _warn_once(("torch",), "dtype=%s was given but torch is not installed: no peak FLOP/s is known and no MFU "
                   "is reported; pass peak_flops=", dtype)
        return None
    if not torch.cuda.is_available():
        _warn_once(("cuda",), "dtype=%s was given but no CUDA device is available: no peak FLOP/s is known and no "
                   "MFU is reported; pass peak_flops=", dtype)
        return None
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    peak = peak_flops(name, dtype)
    if peak is None:
        model = model_of(name)
        what = f"no {dtype_key(dtype)} peak for {model}" if model else f"no peak FLOP/s table entry for {name!r}"
        _warn_once(("peak", name, dtype_key(dtype)), "%s (gpuobs/instrument/flops.py): no MFU is reported; pass "
                   "peak_flops= (the dense peak of this GPU and dtype)", what)
    return peak
