"""The exporter's self-health: NVML, sampling passes, collectors, watchers, HTTP."""

from __future__ import annotations

from .metric import _m

NVML_UP = _m("nvml_up", "gauge", "", "1 if NVML is initialised and answering.", "exporter", "nvmlInit_v2",
             labels=())
NVML_INIT_ERROR = _m("nvml_init_error", "gauge", "", "1 with the NVML error that keeps NVML down (its NVML code "
                     "name; 'initializing' while the first nvmlInit and sampling pass have not completed).", "exporter",
                     "nvmlInit_v2 error", labels=("reason",))
BUILD_INFO = _m("exporter_build", "info", "", "The exporter's own version and the Python that runs it; served from "
                "the first request on, before NVML answers.", "exporter", "gpuobs.__version__, platform",
                labels=("version", "python_version"))
NVML_INFO = _m("nvml", "info", "", "Driver and NVML versions.", "exporter",
               "nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion",
               labels=("driver_version", "nvml_version", "cuda_version"))
GPUS_EXPECTED = _m("gpus_expected", "gauge", "", "GPUs this node should have (--expected-gpus, else the most seen).",
                   "exporter", "configuration / nvmlDeviceGetCount_v2 high-water mark", labels=())
GPUS_PRESENT = _m("gpus_present", "gauge", "", "GPUs the driver counts (each has a gpuobs_gpu_up series, 1 or 0).",
                  "exporter", "nvmlDeviceGetCount_v2", labels=())
COLLECTION_DURATION = _m("exporter_collection_duration_seconds", "gauge", "seconds",
                         "Wall time of the last complete sampling pass.", "exporter", "sampler clock", labels=())
LAST_SUCCESS = _m("exporter_last_success_timestamp_seconds", "gauge", "seconds",
                  "Unix time the last complete sampling pass started: its values were read after it.", "exporter",
                  "sampler clock", labels=())
SNAPSHOT_STALE = _m("exporter_snapshot_stale", "gauge", "",
                    "1 when the last snapshot is older than two intervals; GPU series are then withheld.",
                    "exporter", "sampler clock", labels=())
NVML_ERRORS = _m("exporter_nvml_errors", "counter", "", "NVML calls that returned an error, by call and code.",
                 "exporter", "NVMLError.value of each failed call", labels=("call", "code"))
NVML_CALLS = _m("exporter_nvml_calls_per_sample", "gauge", "", "NVML calls made in the last sampling pass.",
                "exporter", "call accounting in gpuobs.nvml", labels=())
DROPPED = _m("exporter_dropped_values", "counter", "", "Values dropped as impossible (sentinels, out of range).",
             "exporter", "validation in gpuobs.collect", labels=("metric", "reason"))
NVML_REINITS = _m("exporter_nvml_reinits", "counter", "", "NVML re-initialisations after repeated driver-level errors.",
                  "exporter", "nvmlShutdown + nvmlInit_v2", labels=())
SAMPLES = _m("exporter_samples", "counter", "", "Sampling passes completed.", "exporter", "sampler", labels=())
GPU_TIMEOUTS = _m("exporter_gpu_timeouts", "counter", "", "Sampling passes in which a GPU's NVML reads missed "
                  "the pass deadline (its series were withheld from that pass).", "exporter", "sampler deadline")
COLLECTOR_SUCCESS = _m("exporter_collector_success", "gauge", "", "1 if the collector ran without raising in the "
                       "last pass (on every GPU), else 0; as node_exporter's scrape_collector_success.", "exporter",
                       "exceptions raised by gpuobs.collect families and the sampler", labels=("collector",))
COLLECTOR_ERRORS = _m("exporter_collector_errors", "counter", "", "Exceptions raised by a collector (per GPU and "
                      "pass) or by the sampler itself; each is logged, rate-limited.", "exporter",
                      "exceptions raised by gpuobs.collect families and the sampler", labels=("collector",))
NVML_UNAVAILABLE = _m("exporter_nvml_unavailable_calls", "gauge", "", "GPUs (0 for a node-wide call: 1) on which an "
                      "NVML call gives no value by design: not_supported, no_permission, or function_not_found / "
                      "argument_version_mismatch (an older driver; a fallback call is used where one exists). "
                      "Re-probed every few minutes and after MIG mode changes.", "exporter",
                      "NVML return codes remembered by gpuobs.nvml", labels=("call", "reason"))
XID_WATCHER_UP = _m("exporter_xid_watcher_up", "gauge", "", "1 if the XID event thread runs and waits on its "
                    "event set; 0 while it cannot (XIDs may be missed then).", "exporter",
                    "nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2", labels=())
XID_WATCHER_ERRORS = _m("exporter_xid_watcher_errors", "counter", "", "Errors of the XID event thread, by NVML code "
                        "(restarted: the thread died and was started again).", "exporter",
                        "nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2", labels=("code",))
KERNEL_LOG_UP = _m("exporter_kernel_log_up", "gauge", "", "1 if the kernel-log watcher reads its source; 0 while "
                   "it cannot (missing, not permitted, failed): kernel-log XIDs and driver messages are not counted "
                   "then. Absent with the kernel_log family off.", "exporter",
                   "open/read of /dev/kmsg, a kernel-log file, or journalctl -k", labels=("source",))
KERNEL_LOG_LOST = _m("exporter_kernel_log_records_lost", "counter", "", "Kernel-log records the kernel overwrote in "
                     "its ring buffer before the watcher read them (their XIDs and messages are not counted).",
                     "exporter", "EPIPE from read(2) on /dev/kmsg; sequence-number gaps", labels=())
KERNEL_LOG_OVERFLOW = _m("exporter_kernel_log_label_overflow", "counter", "", "Kernel-log records matched but not "
                         "counted in gpuobs_gpu_kernel_xid_errors_total or gpuobs_gpu_kernel_log_matches_total because "
                         "their (PCI address, code) label set would pass the cap (256 per counter and node, 64 of "
                         "them for addresses no GPU of the node has), or their XID code is not one (over 4 digits): "
                         "forged lines, or a node logging for far more devices than it has.", "exporter",
                         "the kernel-log watcher's label-set cap (gpuobs.collect.kernel_log.MAX_LABEL_SETS)", labels=())
KERNEL_LOG_TRUNCATED = _m("exporter_kernel_log_truncations", "counter", "", "Times the kernel-log file was found "
                          "truncated (shorter than the position read to, or its bytes before that position changed: "
                          "truncated and written again): it is read again from its start, and records written "
                          "between the last read and the truncation may be lost (possibly lost records).", "exporter",
                          "fstat(2) size and pread(2) of the last bytes read of a regular --kernel-log file",
                          labels=())
SCRAPES = _m("exporter_scrapes", "counter", "", "Metrics responses served, by exposition format (text: 0.0.4; "
             "openmetrics: 1.0.0, what Prometheus asks for) and content encoding (gzip when the scraper accepts "
             "it, else identity).", "exporter", "Accept and Accept-Encoding of each request",
             labels=("format", "encoding"))
HTTP_REFUSED = _m("exporter_http_connections_refused", "counter", "", "HTTP connections closed without an "
                  "answer, by reason: limit (every connection slot taken), client_limit (the client's address "
                  "holds its share of them), deadline (request headers, TLS handshake or response not done in "
                  "time; no byte restarts it), open_files (accept() failed for want of file descriptors; the "
                  "server backed off 1 s). Rising: a client holds connections open (e.g. slowloris).", "exporter",
                  "the exporter's HTTP server (connection caps and deadlines, accept errors)", labels=("reason",))
ATTRIBUTION_UP = _m("exporter_attribution_up", "gauge", "",
                    "1 if the attribution source answered at its last refresh; only with attribution on.", "exporter",
                    "kubelet PodResources List() (podresources); the job-mapping directory is there (slurm)",
                    labels=("source",))
