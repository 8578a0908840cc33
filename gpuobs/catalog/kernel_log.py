"""The kernel_log family: XIDs and driver messages counted from the kernel log."""

from __future__ import annotations

from .metric import GPU_LABELS, _m

# A second XID source beside the NVML events: the driver's own "NVRM: Xid" lines in the kernel log,
# counted since boot (the watcher keeps its read position across exporter restarts), so XIDs from
# while the exporter was down, or missed by the event thread, are seen. pci_bus_id is NVML's form
# (00000000:18:00.0); gpu/uuid are those of the GPU the exporter saw at that address (also after it
# fell off the bus), empty for an address no GPU seen since the exporter started has.
KERNEL_LABELS = GPU_LABELS + ("pci_bus_id",)
KERNEL_XID_ERRORS = _m("gpu_kernel_xid_errors", "counter", "", "XID errors the NVIDIA driver wrote to the kernel "
                       "log since boot, per GPU and XID code (a second source beside gpuobs_gpu_xid_errors_total).",
                       "kernel_log", "/dev/kmsg (or journalctl -k) lines 'NVRM: Xid (PCI:<address>): <code>'; the "
                       "address matched to a GPU by nvmlDeviceGetPciInfo_v3 .busId", labels=KERNEL_LABELS + ("xid",))
KERNEL_LOG_MATCHES = _m("gpu_kernel_log_matches", "counter", "", "NVIDIA driver messages in the kernel log since boot "
                        "that matched a pattern of the log-pattern catalog (gpuobs.logpatterns: nvrm_xid, ecc_error, "
                        "nvlink_error, ...), per GPU where the line names one.", "kernel_log",
                        "/dev/kmsg (or journalctl -k) lines matched by gpuobs.logpatterns.match",
                        labels=KERNEL_LABELS + ("pattern",))
