"""The peak-FLOPs table (gpuobs.instrument.flops): each board is found by the exact name torch and NVML
report, never by a substring (an L40 is no L4, an H100 PCIe no H100 SXM), with its datasheet dense peak
per dtype; a run given dtype= without a known peak (no CUDA, an unknown board, a dtype the board lacks)
warns once and has no MFU."""

from __future__ import annotations

import logging

import pytest

from gpuobs import instrument
from gpuobs.instrument import flops, telemetry
from gpuobs.instrument.timing import WallTimer

TF = 1e12

# device name as torch.cuda.get_device_name() / nvmlDeviceGetName() report it -> {dtype: dense TFLOP/s}
# from the board's datasheet (2:4-sparsity figures halved); a dtype absent is one the board lacks.
BOARDS: dict[str, dict[str, float]] = {
    "NVIDIA L4": {"fp8": 242, "bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3},
    "NVIDIA L40": {"fp8": 362, "bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5},
    "NVIDIA L40S": {"fp8": 733, "bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6},
    "NVIDIA H100 80GB HBM3": {"fp8": 1979, "bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67},  # SXM
    "NVIDIA H100 PCIe": {"fp8": 1513, "bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51},
    "NVIDIA H200": {"fp8": 1979, "bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67},
    "NVIDIA B200": {"fp8": 4500, "bf16": 2250, "fp16": 2250, "tf32": 1125, "fp32": 75},
    "NVIDIA GB200": {"fp8": 5000, "bf16": 2500, "fp16": 2500, "tf32": 1250, "fp32": 80},
    "NVIDIA A100-SXM4-80GB": {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
    "NVIDIA A100 80GB PCIe": {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
    "Tesla V100-SXM2-32GB": {"fp16": 125, "fp32": 15.7},
    "Tesla V100-PCIE-16GB": {"fp16": 112, "fp32": 14},
}
DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_each_board_has_its_datasheet_peak_per_dtype(name):
    for dtype in DTYPES:
        want = BOARDS[name].get(dtype)
        assert flops.peak_flops(name, dtype) == (None if want is None else pytest.approx(want * TF)), (name, dtype)


def test_look_alike_names_are_different_boards():
    """A substring lookup gave "NVIDIA L40" the L4's peak (its MFU read 1.5x high) and an H100 NVL the
    SXM's; exact names keep every pair apart, and a board the table lacks is unknown."""
    for a, b in [("NVIDIA L4", "NVIDIA L40"), ("NVIDIA L40", "NVIDIA L40S"), ("NVIDIA L4", "NVIDIA L40S"),
                 ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"), ("NVIDIA B200", "NVIDIA GB200")]:
        assert flops.model_of(a) != flops.model_of(b) and flops.peak_flops(a, "bf16") != flops.peak_flops(b, "bf16")
    assert flops.peak_flops("NVIDIA L40", "bf16") / flops.peak_flops("NVIDIA L4", "bf16") == pytest.approx(181 / 121)
    # boards the table lacks are unknown, not their namesakes' peaks
    for name in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A10G", "NVIDIA L4 MIG 1g.6gb", "Tesla T4", "H100",
                 "NVIDIA RTX 6000 Ada Generation", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", ""):
        assert flops.model_of(name) is None and flops.peak_flops(name, "bf16") is None, name


def test_names_are_normalized_not_searched():
    for spelled in ("NVIDIA A100-SXM4-80GB", "nvidia a100 sxm4 80gb", "  NVIDIA A100_SXM4-80GB ", "A100-SXM4-80GB"):
        assert flops.normalize(spelled) == "a100 sxm4 80gb" and flops.model_of(spelled) == "A100", spelled
    assert flops.normalize("Tesla V100-SXM2-16GB") == "v100 sxm2 16gb"
    every = [name for _, names, _ in flops.MODELS for name in names]
    assert len({flops.normalize(n) for n in every}) == len(every)  # no two rows share a name


def test_dtype_names_of_torch_and_short_ones_agree():
    torch = pytest.importorskip("torch")
    for short, long in [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32),
                        ("fp8", torch.float8_e4m3fn), ("bf16", "bfloat16"), ("fp16", "half")]:
        assert flops.dtype_key(long) == short
        assert flops.peak_flops("NVIDIA H100 PCIe", long) == flops.peak_flops("NVIDIA H100 PCIe", short)
    assert flops.peak_flops("NVIDIA H100 PCIe", "int4") is None


def _fake_torch(monkeypatch, name: str | None):
    """torch.cuda as this test wants it: no CUDA (name None) or one device named name."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: name is not None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _i=None: name)
    monkeypatch.setattr(flops, "_warned", set())


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == flops.__name__ and r.levelno == logging.WARNING]


@pytest.mark.parametrize("name, dtype, says", [
    (None, "bf16", "no CUDA device"), ("NVIDIA H100 NVL", "bf16", "'NVIDIA H100 NVL'"),
    ("NVIDIA A100-SXM4-80GB", "fp8", "no fp8 peak for A100")])
def test_no_known_peak_warns_once(monkeypatch, caplog, name, dtype, says):
    _fake_torch(monkeypatch, name)
    with caplog.at_level(logging.WARNING, logger=flops.__name__):
        assert [flops.local_peak_flops(dtype) for _ in range(3)] == [None] * 3
    (message,) = _warnings(caplog)
    assert says in message and "peak_flops" in message


def test_a_known_board_gives_its_peak_without_warning(monkeypatch, caplog):
    _fake_torch(monkeypatch, "NVIDIA L40")
    with caplog.at_level(logging.WARNING, logger=flops.__name__):
        assert flops.local_peak_flops("torch.bfloat16") == flops.peak_flops("NVIDIA L40", "bf16")
    assert _warnings(caplog) == []


def test_no_torch_warns_too(monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    monkeypatch.setattr(flops, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=flops.__name__):
        assert flops.local_peak_flops("bf16") is None and flops.local_peak_flops("bf16") is None
    (message,) = _warnings(caplog)
    assert "torch is not installed" in message


def test_a_run_given_dtype_without_cuda_says_why_it_has_no_mfu(monkeypatch, caplog):
    _fake_torch(monkeypatch, None)
    monkeypatch.setattr(telemetry, "_current", None)  # this test's own Telemetry, not a global one left behind
    tel = instrument.configure(metric_readers=[], span_exporters=[])
    try:
        with caplog.at_level(logging.WARNING, logger=flops.__name__):
            run = instrument.TrainingRun(tel, flops_per_step=1e9, dtype="bf16", timer=WallTimer())
        assert run.peak_flops is None
        assert any("no CUDA device" in m for m in _warnings(caplog))
        _fake_torch(monkeypatch, "NVIDIA L40S")
        assert instrument.TrainingRun(tel, flops_per_step=1e9, dtype="bf16", timer=WallTimer()).peak_flops == 362 * TF
    finally:
        tel.shutdown(timeout_s=2)

