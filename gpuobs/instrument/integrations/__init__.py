"""Framework integrations over gpuobs.instrument.TrainingRun.

Each lives in its own module and imports its framework only there, so importing gpuobs (or this
package) never imports torch, Lightning or transformers:

    from gpuobs.instrument.integrations.lightning import GpuobsCallback            # PyTorch Lightning
    from gpuobs.instrument.integrations.huggingface import GpuobsTrainerCallback   # transformers.Trainer

The OpenTelemetry auto-instrumentation entry point is gpuobs.instrument.instrumentor.GpuobsInstrumentor.
"""
