"""The exporter on GPUs seeded from each real capture reports the capture's values, and leaves out
what the capture marks N/A or Not Supported (absent, never zero)."""

from __future__ import annotations

import re

import pytest
from conftest import CAPTURES
from test_sim_captures import FILES, grab, query_text

pytestmark = pytest.mark.skipif(not FILES, reason="shared/captures not present")
MIB = 1024 * 1024


def one(run, name: str, **labels):
    """The single value of a metric on GPU 0, or None when the series is absent."""
    found = [v for n, l, v in run.scrape() if n == name and l.get("gpu", "0") == "0"
             and all(l.get(k) == v2 for k, v2 in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


EXPECTATIONS = [  # (metric, labels, regex on the -q text, converter to the exported unit)
    ("gpuobs_gpu_memory_total_bytes", {}, r"\n    FB Memory Usage\n\s+Total\s+: (\S+) MiB", lambda s: int(s) * MIB),
    ("gpuobs_gpu_memory_reserved_bytes", {}, r"\n    FB Memory Usage\n.*\n\s+Reserved\s+: (\S+) MiB",
     lambda s: int(s) * MIB),
    ("gpuobs_gpu_power_limit_watts", {}, r"GPU Power Readings\n(?:.*\n)*?\s+Current Power Limit\s+: ([\d.]+|N/A)", float),
    ("gpuobs_gpu_power_max_limit_watts", {}, r"GPU Power Readings\n(?:.*\n)*?\s+Max Power Limit\s+: ([\d.]+|N/A)", float),
    ("gpuobs_gpu_max_clock_hertz", {"clock": "sm"}, r"Max Clocks\n(?:.*\n)*?\s+SM\s+: (\d+) MHz", lambda s: int(s) * 1e6),
    ("gpuobs_gpu_max_clock_hertz", {"clock": "memory"}, r"Max Clocks\n(?:.*\n)*?\s+Memory\s+: (\d+) MHz",
     lambda s: int(s) * 1e6),
    ("gpuobs_gpu_pcie_link_generation", {}, r"PCIe Generation\n\s+Max\s+: .*\n\s+Current\s+: (\S+)", int),
    ("gpuobs_gpu_pcie_link_generation_max", {}, r"PCIe Generation\n\s+Max\s+: (\S+)", int),
    ("gpuobs_gpu_pcie_link_width", {}, r"Link Width\n\s+Max\s+: .*\n\s+Current\s+: (\d+)x", int),
    ("gpuobs_gpu_pcie_link_width_max", {}, r"Link Width\n\s+Max\s+: (\d+)x", int),
    ("gpuobs_gpu_pcie_replays_total", {}, r"Replays Since Reset\s+: (\S+)", int),
    ("gpuobs_gpu_ecc_errors_total", {"error_type": "corrected", "counter_type": "volatile"},
     r"ECC Errors\n\s+Volatile\n(?:.*\n)*?\s+DRAM Correctable\s+: (\S+)", int),
    ("gpuobs_gpu_ecc_errors_total", {"error_type": "uncorrected", "counter_type": "aggregate"},
     r"ECC Errors\n(?:.*\n)*?\s+Aggregate\n(?:.*\n)*?\s+DRAM Uncorrectable\s+: (\S+)", int),
    ("gpuobs_gpu_remapped_rows_total", {"error_type": "correctable"}, r"Remapped Rows\n\s+Correctable Error\s+: (\d+)", int),
    ("gpuobs_gpu_remapped_rows_total", {"error_type": "uncorrectable"},
     r"Remapped Rows\n.*\n\s+Uncorrectable Error\s+: (\d+)", int),
    ("gpuobs_gpu_temperature_celsius", {}, r"GPU Current Temp\s+: (\d+) C", int),
    ("gpuobs_gpu_memory_temperature_celsius", {}, r"Memory Current Temp\s+: (\S+)", lambda s: int(s)),
    ("gpuobs_gpu_utilization_ratio", {}, r"\n    Utilization\n\s+GPU\s+: (\S+)", lambda s: int(s) / 100),
    ("gpuobs_gpu_fan_speed_ratio", {}, r"Fan Speed\s+: (\S+)", lambda s: int(s) / 100),
    ("gpuobs_gpu_ecc_enabled", {}, r"ECC Mode\n\s+Current\s+: (\S+)", lambda s: int(s == "Enabled")),
]


@pytest.mark.parametrize("path", FILES, ids=[f.name.split("__")[1] for f in FILES])
def test_exported_values_equal_the_capture(exporter, path):
    text = query_text(path)
    run = exporter({"gpus": [{"capture": str(path), "phase": "load"}]})
    run.next_snapshot(2)
    present = absent = 0
    for name, labels, pattern, conv in EXPECTATIONS:
        expected = grab(text, pattern, conv)
        got = one(run, name, **labels)
        if expected is None:
            assert got is None, f"{path.name}: {name}{labels} is N/A in the capture but exported as {got}"
            absent += 1
        else:
            assert got == pytest.approx(expected), f"{path.name}: {name}{labels}: {got} != capture {expected}"
            present += 1
    assert present >= 10
    info = [l for n, l, _ in run.scrape() if n == "gpuobs_gpu_info"]
    assert info[0]["name"] == grab(text, r"Product Name\s+: (.+)", str.strip)
    assert info[0]["driver_version"] == grab(text, r"Driver Version\s+: (\S+)", str)
    assert info[0]["pci_bus_id"] == grab(text, r"\n        Bus Id\s+: (\S+)", str)  # the capture's, not generated


def test_mig_instances_report_the_capture_memory(exporter):
    path = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
    text = query_text(path, "idle")
    totals = [int(x) * MIB for x in re.findall(r"Shared FB Memory Usage\n\s+Total\s+: (\d+) MiB", text)]
    gi = re.findall(r"GPU Instance ID\s+: (\d+)", text)
    run = exporter({"gpus": [{"capture": str(path), "phase": "idle"}]})
    got = {l["gpu_instance_id"]: v for n, l, v in run.scrape() if n == "gpuobs_mig_memory_total_bytes"}
    assert got == dict(zip(gi, totals))
    profiles = {l["gpu_instance_id"]: l["profile"] for n, l, _ in run.scrape() if n == "gpuobs_mig_info"}
    assert profiles == {"2": "3g.40gb", "3": "2g.20gb", "9": "1g.10gb", "10": "1g.10gb"}
    assert one(run, "gpuobs_gpu_mig_enabled") == 1
    assert one(run, "gpuobs_gpu_utilization_ratio") is None  # N/A in MIG mode: absent, not 0
    assert not [n for n, _, _ in run.scrape() if n.startswith("gpuobs_gpu_nvlink")]
