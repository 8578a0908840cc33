"""Peak dense FLOP/s per GPU by model and dtype, for MFU when the user gives no peak_flops.

Values are the vendors' published dense (no structured sparsity) tensor-core peaks for the SXM or
flagship board of each name; a PCIe board of the same name is slower (lower clocks and power), so
MFU reads low there: pass peak_flops to be exact. Matching is by substring of the device name
(`torch.cuda.get_device_name()` or NVML's), most specific first.
"""

from __future__ import annotations

T = 1e12
# (name substring, {dtype: dense FLOP/s}); first match wins, so "H100 PCIe" precedes "H100"
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("GB200", {"fp8": 5000 * T, "bf16": 2500 * T, "fp16": 2500 * T, "tf32": 1250 * T, "fp32": 80 * T}),
    ("B200", {"fp8": 4500 * T, "bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 80 * T}),
    ("H200", {"fp8": 1979 * T, "bf16": 989 * T, "fp16": 989 * T, "tf32": 494 * T, "fp32": 67 * T}),
    ("H100 PCIe", {"fp8": 1513 * T, "bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51 * T}),
    ("H100", {"fp8": 1979 * T, "bf16": 989 * T, "fp16": 989 * T, "tf32": 494 * T, "fp32": 67 * T}),
    ("GH200", {"fp8": 1979 * T, "bf16": 989 * T, "fp16": 989 * T, "tf32": 494 * T, "fp32": 67 * T}),
    ("L40S", {"fp8": 733 * T, "bf16": 362 * T, "fp16": 362 * T, "tf32": 183 * T, "fp32": 91.6 * T}),
    ("A100", {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T}),
    ("A10G", {"bf16": 70 * T, "fp16": 70 * T, "tf32": 35 * T, "fp32": 31.2 * T}),
    ("L4", {"fp8": 242 * T, "bf16": 121 * T, "fp16": 121 * T, "tf32": 60 * T, "fp32": 30.3 * T}),
    ("V100", {"fp16": 125 * T, "fp32": 15.7 * T}),
)
ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
           "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "tensorfloat32": "tf32"}


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of one GPU named device_name computing in dtype ("bf16", "fp16", "fp8",
    "tf32", "fp32", or torch's names such as "bfloat16" / "torch.bfloat16"); None when unknown."""
    key = str(dtype).removeprefix("torch.").lower()
    key = ALIASES.get(key, key)
    for fragment, peaks in PEAKS:
        if fragment.lower() in device_name.lower():
            return peaks.get(key)
    return None


def local_peak_flops(dtype: str) -> float | None:
    """peak_flops() of the CUDA device this process uses (torch), or None without torch/CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return peak_flops(torch.cuda.get_device_name(torch.cuda.current_device()), dtype)
