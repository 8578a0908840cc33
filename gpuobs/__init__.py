"""gpuobs: GPU observability and alerting — NVML exporter, training instrumentation, rules and dashboards."""

__version__ = "0.1.0"
