"""The nvlink family: NVLink links, traffic and errors, per link and per GPU."""

from __future__ import annotations

from .metric import GPU_LABELS, _m, detail

NVLINK_UP = _m("gpu_nvlink_link_up", "gauge", "", "1 if the NVLink link is active.", "nvlink",
               "NVML_FI_DEV_NVLINK_GET_STATE, scope = link", labels=GPU_LABELS + ("link",))
NVLINK_TX = _m("gpu_nvlink_transmit_bytes", "counter", "bytes", "Data bytes sent on the link.", "nvlink",
               "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB) * 1024, scope = link", labels=GPU_LABELS + ("link",))
NVLINK_RX = _m("gpu_nvlink_receive_bytes", "counter", "bytes", "Data bytes received on the link.", "nvlink",
               "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (KiB) * 1024, scope = link", labels=GPU_LABELS + ("link",))
NVLINK_ERRORS = _m("gpu_nvlink_errors", "counter", "", "NVLink data-link errors per link.", "nvlink",
                   "NVML_FI_DEV_NVLINK_ERROR_DL_{CRC,REPLAY,RECOVERY}, scope = link",
                   labels=GPU_LABELS + ("link", "error_type"))
# The same, summed over the GPU's links: what the alerts and records read (one series per GPU where
# the per-link ones are 18 x 6 on an H100 SXM; those are detail, --detail nvlink)
NVLINKS_DOWN = _m("gpu_nvlinks_down", "gauge", "", "NVLink links of the GPU that are not active (of those it "
                  "reports, NVML_FI_DEV_NVLINK_LINK_COUNT); 0 when every link is up.", "nvlink",
                  "NVML_FI_DEV_NVLINK_GET_STATE per link, counted where not NVML_FEATURE_ENABLED", max_value=64)
NVLINKS_TX = _m("gpu_nvlinks_transmit_bytes", "counter", "bytes", "Data bytes sent over all the GPU's NVLink links.",
                "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB) * 1024 summed over links")
NVLINKS_RX = _m("gpu_nvlinks_receive_bytes", "counter", "bytes", "Data bytes received over all the GPU's NVLink "
                "links.", "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (KiB) * 1024 summed over links")
NVLINKS_ERRORS = _m("gpu_nvlinks_errors", "counter", "", "NVLink data-link errors (CRC, replay and recovery) over "
                    "all the GPU's links.", "nvlink",
                    "NVML_FI_DEV_NVLINK_ERROR_DL_{CRC,REPLAY,RECOVERY} summed over links")
NVLINK_THROUGHPUT = _m("gpu_nvlink_throughput_bytes_per_second", "gauge", "bytes_per_second",
                       "NVLink data bytes sent plus received per second over all links, between the last two "
                       "passes.", "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX} (KiB) * 1024 summed over "
                       "links: increase between passes / time between them",
                       dcgm={(): "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}, dcgm_scale=1 / 1024 / 1000, dcgm_int=True,
                       dcgm_zero=True)

# NVLINK_THROUGHPUT in dcgm naming: DCGM's DcgmCacheManager::ReadAndCacheNvLinkBandwidth divides
# NVML's KiB per second by 1000 (KiB/s -> "MiB/s", so 1.024e6 bytes/s reads 1) into an INT64, and
# publishes 0 for a zero sum and for the first reading.

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(NVLINK_UP, NVLINK_TX, NVLINK_RX, NVLINK_ERRORS, NVLINK_THROUGHPUT)
