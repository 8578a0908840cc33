"""Every real capture imports into the simulator, and what pynvml reads back equals the text.

Expected values are taken from the capture text with regular expressions, independently of
the importer; a value the capture shows as N/A must come back as NVML_ERROR_NOT_SUPPORTED.
"""

from __future__ import annotations

import re

import pynvml as N
import pytest
from conftest import CAPTURES

from gpuobs.sim.capture import sections

FILES = sorted(CAPTURES.glob("*.txt")) if CAPTURES.exists() else []
pytestmark = pytest.mark.skipif(not FILES, reason="shared/captures not present")
MIB = 1024 * 1024


def query_text(path, phase="load"):
    return sections(path.read_text(errors="replace"))[(phase, "query (-q)")]


def grab(text, pattern, conv=int):
    """The first capture group of pattern in text, converted; None when absent or N/A."""
    m = re.search(pattern, text)
    if not m or m.group(1).strip() in ("N/A", "[N/A]", "[Not Supported]"):
        return None
    return conv(m.group(1))


def read(fn):
    """Call fn; NOT_SUPPORTED reads as None, like an absent value in the capture."""
    try:
        return fn()
    except N.NVMLError_NotSupported:
        return None


def watts(s):
    return round(float(s) * 1000)


CHECKS = [  # (what, regex on the -q text, converter, pynvml read of GPU 0)
    ("memory total", r"\n    FB Memory Usage\n\s+Total\s+: (\S+) MiB", int,
     lambda h: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).total // MIB),
    ("memory reserved", r"\n    FB Memory Usage\n.*\n\s+Reserved\s+: (\S+) MiB", int,
     lambda h: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).reserved // MIB),
    ("memory used", r"\n    FB Memory Usage\n.*\n.*\n\s+Used\s+: (\S+) MiB", int,
     lambda h: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).used // MIB),
    ("bar1 total", r"\n    BAR1 Memory Usage\n\s+Total\s+: (\S+) MiB", int,
     lambda h: N.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total // MIB),
    ("power limit", r"GPU Power Readings\n(?:.*\n)*?\s+Current Power Limit\s+: ([\d.]+|N/A)", watts,
     lambda h: N.nvmlDeviceGetEnforcedPowerLimit(h)),
    ("default limit", r"GPU Power Readings\n(?:.*\n)*?\s+Default Power Limit\s+: ([\d.]+|N/A)", watts,
     lambda h: N.nvmlDeviceGetPowerManagementDefaultLimit(h)),
    ("max limit", r"GPU Power Readings\n(?:.*\n)*?\s+Max Power Limit\s+: ([\d.]+|N/A)", watts,
     lambda h: N.nvmlDeviceGetPowerManagementLimitConstraints(h)[1]),
    ("max graphics clock", r"Max Clocks\n\s+Graphics\s+: (\d+) MHz", int,
     lambda h: N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_GRAPHICS)),
    ("max memory clock", r"Max Clocks\n(?:.*\n)*?\s+Memory\s+: (\d+) MHz", int,
     lambda h: N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_MEM)),
    ("memory clock", r"\n    Clocks\n(?:.*\n)*?\s+Memory\s+: (\d+) MHz", int,
     lambda h: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)),
    ("pcie gen", r"PCIe Generation\n\s+Max\s+: .*\n\s+Current\s+: (\S+)", int,
     lambda h: N.nvmlDeviceGetCurrPcieLinkGeneration(h)),
    ("pcie max gen", r"PCIe Generation\n\s+Max\s+: (\S+)", int, lambda h: N.nvmlDeviceGetMaxPcieLinkGeneration(h)),
    ("pcie width", r"Link Width\n\s+Max\s+: .*\n\s+Current\s+: (\d+)x", int,
     lambda h: N.nvmlDeviceGetCurrPcieLinkWidth(h)),
    ("pcie max width", r"Link Width\n\s+Max\s+: (\d+)x", int, lambda h: N.nvmlDeviceGetMaxPcieLinkWidth(h)),
    ("pcie replay", r"Replays Since Reset\s+: (\S+)", int, lambda h: N.nvmlDeviceGetPcieReplayCounter(h)),
    ("gpu temperature", r"GPU Current Temp\s+: (\S+)", lambda s: int(s.rstrip("C")),
     lambda h: N.nvmlDeviceGetTemperature(h, 0)),
    ("pstate", r"Performance State\s+: P(\d+)", int, lambda h: N.nvmlDeviceGetPerformanceState(h)),
    ("ecc mode", r"ECC Mode\n\s+Current\s+: (\S+)", lambda s: int(s == "Enabled"),
     lambda h: N.nvmlDeviceGetEccMode(h)[0]),
    ("remapped correctable", r"Remapped Rows\n\s+Correctable Error\s+: (\d+)", int,
     lambda h: N.nvmlDeviceGetRemappedRows(h)[0]),
    ("vbios", r"VBIOS Version\s+: (\S+)", str, lambda h: N.nvmlDeviceGetVbiosVersion(h)),
    ("name", r"Product Name\s+: (.+)", str.strip, lambda h: N.nvmlDeviceGetName(h)),
    ("fan", r"Fan Speed\s+: (\S+)", int, lambda h: N.nvmlDeviceGetFanSpeed(h)),
    ("bus id", r"\n        Bus Id\s+: (\S+)", str, lambda h: N.nvmlDeviceGetPciInfo(h).busId),  # the capture's
]


@pytest.mark.parametrize("path", FILES, ids=[f.name.split("__")[1] for f in FILES])
def test_capture_reads_back_equal_to_text(make_sim, path):
    text = query_text(path)
    make_sim({"gpus": [{"capture": str(path), "phase": "load"}]})
    h = N.nvmlDeviceGetHandleByIndex(0)
    compared = 0
    for what, pattern, conv, fn in CHECKS:
        expected = grab(text, pattern, conv)
        got = read(lambda fn=fn: fn(h))
        assert got == expected, f"{path.name}: {what}: read {got!r}, capture says {expected!r}"
        compared += expected is not None
    assert compared >= 10, f"only {compared} fields with values in {path.name}"
    assert N.nvmlSystemGetDriverVersion() == grab(text, r"Driver Version\s+: (\S+)", str)
    pids = [int(p) for p in re.findall(r"Process ID\s+: (\d+)", text)]
    procs = N.nvmlDeviceGetComputeRunningProcesses(h) + N.nvmlDeviceGetGraphicsRunningProcesses(h)
    assert sorted({p.pid for p in procs}) == sorted(set(pids))


def mig_expectations():
    """GI ids, CI ids and memory totals (MiB) of the MIG devices in the H100 MIG capture's text."""
    path = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
    text = query_text(path, "idle")
    gi = [int(x) for x in re.findall(r"GPU Instance ID\s+: (\d+)", text)]
    ci = [int(x) for x in re.findall(r"\n        Compute Instance ID\s+: (\d+)", text)]
    totals = [int(x) for x in re.findall(r"Shared FB Memory Usage\n\s+Total\s+: (\d+) MiB", text)]
    return gi, ci, totals


def test_mig_capture_text_has_the_expected_layout():
    gi, _, totals = mig_expectations()
    assert gi == [2, 3, 9, 10] and totals == [40448, 20096, 9984, 9984]


def test_mig_capture_reads_back_through_nvml(make_sim):
    gi, ci, totals = mig_expectations()
    path = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
    make_sim({"gpus": [{"capture": str(path), "phase": "idle"}]})
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetMigMode(h)[0] == 1
    migs = []
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            migs.append(N.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
        except N.NVMLError_NotFound:
            break
    assert [N.nvmlDeviceGetGpuInstanceId(m) for m in migs] == gi
    assert [N.nvmlDeviceGetComputeInstanceId(m) for m in migs] == ci[: len(gi)]
    assert [N.nvmlDeviceGetMemoryInfo(m, version=N.nvmlMemory_v2).total // MIB for m in migs] == totals
    assert [N.nvmlDeviceGetName(m).split(" MIG ")[1] for m in migs] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    # whole-GPU utilization is N/A in MIG mode, so it must not read as 0
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetUtilizationRates(h)
    # NVLink is not supported on MIG-mode GPUs in the capture
    assert N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED


def test_consumer_capture_marks_unsupported_values(make_sim):
    path = CAPTURES / "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt"
    make_sim({"gpus": [{"capture": str(path)}]})
    h = N.nvmlDeviceGetHandleByIndex(0)
    for call in (lambda: N.nvmlDeviceGetEccMode(h), lambda: N.nvmlDeviceGetRemappedRows(h),
                 lambda: N.nvmlDeviceGetSerial(h), lambda: N.nvmlDeviceGetMigMode(h),
                 lambda: N.nvmlDeviceGetTotalEccErrors(h, 1, 1)):
        with pytest.raises(N.NVMLError_NotSupported):
            call()
    fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_MEMORY_TEMP])
    assert fv[0].nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED
