"""Built-in GPU profiles, in the same schema that gpuobs.sim.capture produces from real captures.

Units are in the key names (MiB, W, C, MHz, KB/s); None means the GPU does not support the
value and the simulator answers NVML_ERROR_NOT_SUPPORTED. The H100 and H200 numbers come
from the captures in shared/captures; the others from NVIDIA's published specifications.
"""

from __future__ import annotations

import copy
from typing import Any

Profile = dict[str, Any]

H100_SXM_80GB: Profile = {
    "name": "NVIDIA H100 80GB HBM3", "brand": "NVIDIA", "architecture": "Hopper",
    "serial": "1650123000001", "uuid": None, "vbios": "96.00.A5.00.01",
    "board_part_number": "692-2G520-0200-000", "inforom_image": "G520.0200.00.05",
    "minor_number": None, "persistence_mode": 1, "compute_mode": 0,
    "compute_capability": [9, 0], "cores": 16896,
    "pci": {"bus_id": None, "domain": 0, "bus": None, "device": 0,
            "device_id": 0x233010DE, "subsystem_id": 0x16C110DE},
    "memory_mib": {"total": 81559, "reserved": 479, "used": 59},
    "bar1_mib": {"total": 131072, "used": 2},
    "utilization_pct": {"gpu": 0, "memory": 0, "encoder": 0, "decoder": 0},
    "power_w": {"draw": 72.6, "average": 71.3, "limit": 700.0, "enforced_limit": 700.0,
                "default_limit": 700.0, "min_limit": 200.0, "max_limit": 700.0, "memory_average": 43.19},
    "temperature_c": {"gpu": 33, "memory": 40, "shutdown": 93, "slowdown": 87, "gpu_max": 85,
                      "memory_max": 95, "target": None, "margin": 52},
    "clocks_mhz": {"graphics": 345, "sm": 345, "memory": 2619, "video": 765},
    "max_clocks_mhz": {"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1545},
    "pstate": 0, "fan_speed_pct": None,
    "clock_event_reasons": 0x1,
    "violation_us": {"power": 0, "thermal": 0, "sync_boost": 0, "sw_thermal": 0, "hw_thermal": 0, "hw_power_brake": 0},
    "pcie": {"gen": 5, "max_gen": 5, "gpu_max_gen": 5, "width": 16, "max_width": 16, "replay": 0,
             "tx_kbps": 350, "rx_kbps": 330},
    "encoder_stats": {"sessions": 0, "average_fps": 0, "average_latency_us": 0},
    "fbc_stats": {"sessions": 0, "average_fps": 0, "average_latency_us": 0},
    "ecc": {"mode": 1, "pending": 1, "corrected_volatile": 0, "corrected_aggregate": 0,
            "uncorrected_volatile": 0, "uncorrected_aggregate": 0,
            "sram_corrected_volatile": 0, "sram_uncorrected_volatile": 0, "sram_corrected_aggregate": 0,
            "sram_uncorrected_aggregate": 0, "dram_corrected_volatile": 0, "dram_uncorrected_volatile": 0,
            "dram_corrected_aggregate": 0, "dram_uncorrected_aggregate": 0},
    "retired_pages": None,  # Hopper replaced page retirement with row remapping
    "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0,
                      "histogram": {"max": 2560, "high": 0, "partial": 0, "low": 0, "none": 0}},
    # NVSwitch fabric registration (nvmlGpuFabricState_t 3: completed; status an nvmlReturn_t); the
    # health mask None: the capture's driver reports Health N/A, so nvmlDeviceGetGpuFabricInfoV is unsupported
    "fabric": {"state": 3, "status": 0, "clique_id": 0, "health_mask": None},
    "mig": {"mode": 0, "pending": 0, "devices": []},
    "processes": [],
    # Not in nvidia-smi -q: simulator-only keys.
    "nvlink": {"links": 18, "version": 4, "speed_mbps": 53125, "tx_bytes_per_s": 2.0e8,
               "rx_bytes_per_s": 2.0e8},
    "gpm": {"sm_util": 0.0, "sm_occupancy": 0.0, "any_tensor_util": 0.0, "dram_bw_util": 0.0,
            "fp64_util": 0.0, "fp32_util": 0.0, "fp16_util": 0.0, "graphics_util": 0.0},
    "events": 0x8 | 0x1 | 0x2 | 0x4 | 0x10,
    "unsupported": [],
}


def _derive(base: Profile, **changes: Any) -> Profile:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


H200: Profile = _derive(
    H100_SXM_80GB, name="NVIDIA H200", vbios="96.00.AF.00.01", board_part_number="692-2G520-0280-000",
    cores=16896, pci={"device_id": 0x233510DE, "subsystem_id": 0x18BE10DE},
    memory_mib={"total": 143771, "reserved": 578, "used": 0},
    power_w={"draw": 76.2, "average": 75.9},
    temperature_c={"gpu": 29, "memory": 36, "margin": 56},
    clocks_mhz={"graphics": 345, "sm": 345, "memory": 3201, "video": 765},
    max_clocks_mhz={"graphics": 1980, "sm": 1980, "memory": 3201, "video": 1545},
)

A100_40GB: Profile = _derive(
    H100_SXM_80GB, name="NVIDIA A100-SXM4-40GB", architecture="Ampere", vbios="92.00.36.00.02",
    board_part_number="692-2G506-0200-002", compute_capability=[8, 0], cores=6912,
    pci={"device_id": 0x20B010DE, "subsystem_id": 0x134F10DE},
    memory_mib={"total": 40960, "reserved": 434, "used": 0}, bar1_mib={"total": 65536, "used": 1},
    power_w={"draw": 55.0, "average": 54.0, "limit": 400.0, "enforced_limit": 400.0,
             "default_limit": 400.0, "min_limit": 100.0, "max_limit": 400.0, "memory_average": None},
    temperature_c={"shutdown": 92, "slowdown": 89, "gpu_max": 85, "memory_max": 95, "margin": None},
    clocks_mhz={"graphics": 210, "sm": 210, "memory": 1215, "video": 585},
    max_clocks_mhz={"graphics": 1410, "sm": 1410, "memory": 1215, "video": 1290},
    pcie={"gen": 4, "max_gen": 4, "gpu_max_gen": 4},
    retired_pages=None,
    nvlink={"links": 12, "version": 3, "speed_mbps": 25781},
    gpm=None,  # GPM needs Hopper or newer
    fabric=None,  # fabric registration through NVML: Hopper or newer
)

L40S_PCIE: Profile = _derive(
    H100_SXM_80GB, name="NVIDIA L40S", architecture="Ada Lovelace", vbios="95.02.66.00.02",
    board_part_number="900-2G133-0080-000", compute_capability=[8, 9], cores=18176,
    pci={"device_id": 0x26B910DE, "subsystem_id": 0x185110DE},
    memory_mib={"total": 46068, "reserved": 515, "used": 0}, bar1_mib={"total": 65536, "used": 1},
    power_w={"draw": 35.0, "average": 34.0, "limit": 350.0, "enforced_limit": 350.0,
             "default_limit": 350.0, "min_limit": 100.0, "max_limit": 350.0, "memory_average": None},
    temperature_c={"shutdown": 92, "slowdown": 89, "gpu_max": 87, "memory_max": None,
                   "memory": None, "margin": None},
    clocks_mhz={"graphics": 210, "sm": 210, "memory": 405, "video": 765},
    max_clocks_mhz={"graphics": 2520, "sm": 2520, "memory": 9001, "video": 1965},
    pcie={"gen": 4, "max_gen": 4, "gpu_max_gen": 4},
    fan_speed_pct=None, mig=None, nvlink=None, gpm=None, fabric=None,
)

RTX_4080_SUPER: Profile = _derive(
    H100_SXM_80GB, name="NVIDIA GeForce RTX 4080 SUPER", brand="GeForce", architecture="Ada Lovelace",
    serial=None, vbios="95.03.44.00.B2", board_part_number=None, inforom_image="G002.0000.00.03",
    persistence_mode=0, compute_capability=[8, 9], cores=10240,
    pci={"device_id": 0x270210DE, "subsystem_id": 0x51101462},
    memory_mib={"total": 16376, "reserved": 434, "used": 1100}, bar1_mib={"total": 16384, "used": 35},
    power_w={"draw": 20.0, "average": 19.0, "limit": 320.0, "enforced_limit": 320.0,
             "default_limit": 320.0, "min_limit": 150.0, "max_limit": 400.0, "memory_average": None},
    temperature_c={"gpu": 38, "memory": None, "shutdown": 101, "slowdown": 96, "gpu_max": 90,
                   "memory_max": None, "target": 84, "margin": None},
    clocks_mhz={"graphics": 210, "sm": 210, "memory": 405, "video": 1185},
    max_clocks_mhz={"graphics": 3165, "sm": 3165, "memory": 11501, "video": 2415},
    pstate=8, fan_speed_pct=0,
    pcie={"gen": 1, "max_gen": 4, "gpu_max_gen": 4},
    ecc={"mode": None, "pending": None, "corrected_volatile": None, "corrected_aggregate": None,
         "uncorrected_volatile": None, "uncorrected_aggregate": None,
         **{f"{loc}_{kind}_{counter}": None for loc in ("sram", "dram") for kind in ("corrected", "uncorrected")
            for counter in ("volatile", "aggregate")}},
    retired_pages=None, remapped_rows=None, mig=None, nvlink=None, gpm=None, fabric=None,
    events=0x8 | 0x4 | 0x10,
    unsupported=["nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetViolationStatus",
                 "nvmlDeviceGetNumGpuCores"],
)

PROFILES: dict[str, Profile] = {
    "h100-sxm-80gb": H100_SXM_80GB,
    "h200": H200,
    "a100-40gb": A100_40GB,
    "l40s-pcie": L40S_PCIE,
    "rtx-4080-super": RTX_4080_SUPER,
}


def get(name: str) -> Profile:
    """A deep copy of a built-in profile; KeyError lists the known names."""
    try:
        return copy.deepcopy(PROFILES[name])
    except KeyError:
        raise KeyError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)}") from None
