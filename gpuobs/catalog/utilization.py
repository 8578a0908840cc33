"""The utilization family: how busy the GPU's engines are, video encode and capture sessions."""

from __future__ import annotations

from .metric import _m, detail

UTILIZATION = _m("gpu_utilization_ratio", "gauge", "ratio", "Fraction of the sample period a kernel ran on the GPU.",
                 "utilization", "nvmlDeviceGetUtilizationRates .gpu (percent) / 100",
                 dcgm={(): "DCGM_FI_DEV_GPU_UTIL"}, dcgm_scale=100, max_value=1.0)
MEMORY_UTILIZATION = _m("gpu_memory_utilization_ratio", "gauge", "ratio",
                        "Fraction of the sample period device memory was read or written.", "utilization",
                        "nvmlDeviceGetUtilizationRates .memory (percent) / 100",
                        dcgm={(): "DCGM_FI_DEV_MEM_COPY_UTIL"}, dcgm_scale=100, max_value=1.0)
ENCODER_UTILIZATION = _m("gpu_encoder_utilization_ratio", "gauge", "ratio", "Video encoder utilization.",
                         "utilization", "nvmlDeviceGetEncoderUtilization (percent) / 100",
                         dcgm={(): "DCGM_FI_DEV_ENC_UTIL"}, dcgm_scale=100, max_value=1.0)
DECODER_UTILIZATION = _m("gpu_decoder_utilization_ratio", "gauge", "ratio", "Video decoder utilization.",
                         "utilization", "nvmlDeviceGetDecoderUtilization (percent) / 100",
                         dcgm={(): "DCGM_FI_DEV_DEC_UTIL"}, dcgm_scale=100, max_value=1.0)
ENCODER_SESSIONS = _m("gpu_encoder_sessions", "gauge", "", "Video encoder (NVENC) sessions active now.",
                      "utilization", "nvmlDeviceGetEncoderStats sessionCount")
ENCODER_FPS = _m("gpu_encoder_frames_per_second", "gauge", "", "Average frames per second over the active "
                 "encoder sessions (0 without sessions).", "utilization", "nvmlDeviceGetEncoderStats averageFps")
ENCODER_LATENCY = _m("gpu_encoder_average_latency_seconds", "gauge", "seconds", "Average encode latency over the "
                     "active encoder sessions (0 without sessions).", "utilization",
                     "nvmlDeviceGetEncoderStats averageLatency (microseconds) / 1e6")
FBC_SESSIONS = _m("gpu_fbc_sessions", "gauge", "", "Frame buffer capture (NVFBC) sessions active now.",
                  "utilization", "nvmlDeviceGetFBCStats .sessionsCount")
FBC_FPS = _m("gpu_fbc_frames_per_second", "gauge", "", "Average frames per second over the active frame buffer "
             "capture sessions.", "utilization", "nvmlDeviceGetFBCStats .averageFPS")
FBC_LATENCY = _m("gpu_fbc_average_latency_seconds", "gauge", "seconds", "Average capture latency over the active "
                 "frame buffer capture sessions.", "utilization",
                 "nvmlDeviceGetFBCStats .averageLatency (microseconds) / 1e6")

# Tiers (docs/cardinality.md): detail is left out of the default profile (served with --profile full or
# --detail FAMILY)
detail(MEMORY_UTILIZATION, ENCODER_UTILIZATION, DECODER_UTILIZATION, ENCODER_SESSIONS, ENCODER_FPS,
       ENCODER_LATENCY, FBC_SESSIONS, FBC_FPS, FBC_LATENCY)
