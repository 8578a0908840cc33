"""Training and inference instrumentation over OpenTelemetry.

    from gpuobs import instrument
    instrument.configure()                   # from OTEL_* variables; a cheap no-op when disabled
    run = instrument.TrainingRun(flops_per_step=..., peak_flops=...)
    for batch in run.data(loader):
        with run.step(samples=len(batch)):
            ...

Metric names and units are defined in gpuobs.catalog (families training and inference).
"""

from .env import RunEnv
from .inference import Request, request, start_request, trace_request
from .telemetry import Telemetry, configure, current
from .timing import CudaEventTimer, WallTimer
from .train import TrainingRun, checkpoint, data, default_run, phase, report, step, trace_step

__all__ = ["CudaEventTimer", "Request", "RunEnv", "Telemetry", "TrainingRun", "WallTimer", "checkpoint",
           "configure", "current", "data", "default_run", "phase", "report", "request", "start_request", "step",
           "trace_request", "trace_step"]
