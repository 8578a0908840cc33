"""The processes family: GPU memory and SM use per process."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, detail

PROCESS_MEMORY = _m("gpu_process_memory_used_bytes", "gauge", "bytes", "Device memory used by one process "
                    "(in MIG mode, on one MIG device: gpu_instance_id/compute_instance_id set); process_type: "
                    "compute, graphics or compute_graphics (nvidia-smi's C, G, C+G).",
                    "processes",
                    "nvmlDeviceGetComputeRunningProcesses_v3/GetGraphicsRunningProcesses_v3 .usedGpuMemory "
                    "(else _v2), per MIG device handle in MIG mode; the list a pid is in gives its type",
                    labels=GPU_LABELS + ("pid", "process_name", "gpu_instance_id", "compute_instance_id",
                                         "process_type"))
PROCESS_SM = _m("gpu_process_sm_utilization_ratio", "gauge", "ratio", "SM utilization of one process.",
                "processes", "nvmlDeviceGetProcessUtilization .smUtil (percent) / 100",
                labels=GPU_LABELS + ("pid",), max_value=1.0)
PROCESS_INFO = _m("gpu_process_info", "gauge", "", "Always 1: one series per process NVML lists on the GPU (in MIG "
                  "mode, on one MIG device), also where the driver cannot tell its memory (Windows WDDM), so "
                  "that no running process is lost; labels as gpu_process_memory_used_bytes.",
                  "processes",
                  "nvmlDeviceGetComputeRunningProcesses_v3/GetGraphicsRunningProcesses_v3 (else _v2): the listed pids",
                  labels=PROCESS_MEMORY.labels)
# The process list itself: served by the full profile (and read by the capture fidelity check); the
# default profile keeps the memory series, which carry the same labels wherever the memory is known.
detail(PROCESS_INFO)
