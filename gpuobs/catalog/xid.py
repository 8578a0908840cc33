"""The xid family: XID errors from NVML's event path."""

from __future__ import annotations

from .metric import GPU_LABELS, _m

# gpu_instance_id/compute_instance_id: the MIG instance the event names (empty when it names none);
# mig_uuid: its MIG device's UUID, by which attribution finds the pod holding it. After the xid
# label, so that the series keep the GPU identity (not a MIG device's).
XID_LABELS = GPU_LABELS + ("xid", "gpu_instance_id", "compute_instance_id", "mig_uuid")
XID_ERRORS = _m("gpu_xid_errors", "counter", "", "XID errors reported by the driver, per XID code (and MIG instance). "
                "mig_uuid: the UUID of the MIG device the event names (pods on it get its attribution labels); "
                "for an event naming only a GPU instance, the UUIDs of its compute instances' devices joined "
                "with commas (one series: each event counted once); empty when it names none, or with the mig "
                "family off.",
                "xid", "nvmlEventSetWait_v2 (else nvmlEventSetWait) nvmlEventTypeXidCriticalError .eventData, "
                ".gpuInstanceId, .computeInstanceId; mig_uuid from the mig family's last listing "
                "(nvmlDeviceGetMigDeviceHandleByIndex, GetUUID)", labels=XID_LABELS)
XID_LAST_SEEN = _m("gpu_xid_last_seen_timestamp_seconds", "gauge", "seconds",
                   "Unix time the XID code was last reported.", "xid", "time of the nvmlEventSetWait_v2 event",
                   labels=XID_LABELS)
# dcgm-exporter's XID series: a gauge holding the code of the last XID (labels err_code, err_msg), not
# a per-code counter; served by dcgm naming from XID_LAST_SEEN, read by the rule pack's dcgm flavour.
DCGM_XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
