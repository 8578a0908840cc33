"""The training family (OpenTelemetry, recorded by gpuobs.instrument): steps, waits, goodput."""

from __future__ import annotations

from .metric import RUN_LABELS, _otel, _quantile

STEP_DURATION = _otel("gpuobs.training.step.duration", "histogram", "s", "gpuobs_training_step_duration_seconds",
                      "Duration of one optimizer step, data wait included (CUDA events when on a GPU).",
                      "training", unit="seconds")
STEPS = _otel("gpuobs.training.steps", "counter", "{step}", "gpuobs_training_steps",
              "Optimizer steps completed.", "training")
STEPS_FAILED = _otel("gpuobs.training.steps.failed", "counter", "{step}", "gpuobs_training_steps_failed",
                     "Steps whose body raised (the loop caught the exception and went on), by exception type "
                     "(its class name; a run's first 8 types, later ones as `other`): not progress, never in "
                     "the step, sample, token or last-step counts.", "training", labels=RUN_LABELS + ("exception",))
MICRO_STEPS = _otel("gpuobs.training.micro_steps", "counter", "{step}", "gpuobs_training_micro_steps",
                    "Micro-steps (gradient-accumulation passes) completed.", "training")
LAST_STEP = _otel("gpuobs.training.step.last_timestamp", "gauge", "s",
                  "gpuobs_training_step_last_timestamp_seconds",
                  "Unix time the last step finished (training stalls when it stops moving).", "training",
                  unit="seconds")
DATA_WAIT = _otel("gpuobs.training.data_wait.duration", "histogram", "s",
                  "gpuobs_training_data_wait_duration_seconds",
                  "Time a step waited for its batch inside the data loader's __next__.", "training", unit="seconds")
CHECKPOINT_DURATION = _otel("gpuobs.training.checkpoint.duration", "histogram", "s",
                            "gpuobs_training_checkpoint_duration_seconds", "Duration of a checkpoint save.",
                            "training", unit="seconds")
SAMPLES_TRAINED = _otel("gpuobs.training.samples", "counter", "{sample}", "gpuobs_training_samples",
                        "Samples trained on (rate() gives samples/s).", "training")
TOKENS_TRAINED = _otel("gpuobs.training.tokens", "counter", "{token}", "gpuobs_training_tokens",
                       "Tokens trained on (rate() gives tokens/s).", "training")
LOSS = _otel("gpuobs.training.loss", "gauge", "", "gpuobs_training_loss", "Last reported training loss.", "training")
GRAD_NORM = _otel("gpuobs.training.grad_norm", "gauge", "", "gpuobs_training_grad_norm",
                  "Last reported gradient norm.", "training")
LEARNING_RATE = _otel("gpuobs.training.learning_rate", "gauge", "", "gpuobs_training_learning_rate",
                      "Learning rate, read at the reporting interval.", "training")
NONFINITE = _otel("gpuobs.training.nonfinite_reports", "counter", "{report}", "gpuobs_training_nonfinite_reports",
                  "Reported loss, grad norm or learning rate that was NaN or infinite (a diverging run).",
                  "training", labels=RUN_LABELS + ("value",))
FLOPS = _otel("gpuobs.training.flops", "counter", "{flop}", "gpuobs_training_flops",
              "Model FLOPs of the steps completed (flops_per_step per step); rate() over peak FLOP/s is MFU.",
              "training")
PEAK_FLOPS = _otel("gpuobs.training.peak_flops", "gauge", "{flop}/s", "gpuobs_training_peak_flops_per_second",
                   "Peak FLOP/s of the hardware one rank runs on (given, or looked up for the GPU and dtype).",
                   "training")
COMPUTE = _otel("gpuobs.training.compute", "counter", "s", "gpuobs_training_compute_seconds",
                "Time inside steps spent computing: step time less data wait, time blocked in collectives "
                "and checkpoints. Per step, the straggler signal.", "training", unit="seconds")
COLLECTIVE_WAIT = _otel("gpuobs.training.collective_wait", "counter", "s", "gpuobs_training_collective_wait_seconds",
                        "Time inside steps blocked in collective communication (DDP gradient all-reduce tail, "
                        "FSDP2 all-gathers and reduce-scatters, run.collective() blocks): the fast ranks of a "
                        "synchronous job wait for the slow one.",
                        "training", unit="seconds")
GOODPUT = _otel("gpuobs.training.goodput", "counter", "s", "gpuobs_training_goodput_seconds",
                "Time spent in steps, data wait and checkpoints excluded (collective waits included: the job "
                "as a whole is progressing).", "training", unit="seconds")
BADPUT = _otel("gpuobs.training.badput", "counter", "s", "gpuobs_training_badput_seconds",
               "Time not spent computing steps, by cause: data_wait, checkpoint, startup, idle, failed_step (the "
               "time of steps that raised, their data wait and checkpoints excepted).", "training",
               labels=RUN_LABELS + ("cause",), unit="seconds")
LOG_PATTERN_MATCHES = _otel("gpuobs.log.pattern_matches", "counter", "{record}", "gpuobs_log_pattern_matches",
                           "Log records of this process that matched a pattern of the log-pattern catalog "
                           "(gpuobs.logpatterns: NCCL timeout or error, CUDA OOM, illegal address, Xid, ECC, "
                           "NVLink), by pattern; every pattern is exported from 0.", "training",
                           labels=RUN_LABELS + ("pattern",))
RUN_END = _otel("gpuobs.training.run.end_timestamp", "gauge", "s", "gpuobs_training_run_end_timestamp_seconds",
                "Unix time the process ended normally (served during its exit grace, GPUOBS_EXIT_GRACE_S); 0 while "
                "it runs, after a crash and after a signal: a target whose last scrape read it non-zero is done, "
                "not down.", "training", unit="seconds")
RUN_CRASH = _otel("gpuobs.training.run.crash_timestamp", "gauge", "s",
                  "gpuobs_training_run_crash_timestamp_seconds",
                  "Unix time an uncaught exception ended the process (served during its exit grace, with the log "
                  "pattern it matched counted); 0 otherwise.", "training", unit="seconds")
STEP_QUANTILE = _quantile(STEP_DURATION, "gpuobs.training.step.duration.quantile", "the step durations")
DATA_WAIT_QUANTILE = _quantile(DATA_WAIT, "gpuobs.training.data_wait.duration.quantile", "the data waits")
CHECKPOINT_QUANTILE = _quantile(CHECKPOINT_DURATION, "gpuobs.training.checkpoint.duration.quantile",
                                "the checkpoint saves")
RANK_INFO = _otel("gpuobs.training.rank.info", "gauge", "", "gpuobs_training_rank_info",
                  "Always 1: where the rank runs, which the slowdown records join to the GPUs' series: host (the "
                  "run's host.name, which must equal the exporter's `node` label), k8s_namespace and k8s_pod "
                  "(empty off Kubernetes) and uuid (the GPU the rank drives: GPUOBS_GPU_UUID, a UUID entry of "
                  "CUDA_VISIBLE_DEVICES or torch's device properties; empty when unknown).", "training",
                  labels=RUN_LABELS + ("host", "k8s_namespace", "k8s_pod", "uuid"))
