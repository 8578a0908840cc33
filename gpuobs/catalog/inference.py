"""The inference family (OpenTelemetry, GenAI semantic conventions): requests, tokens, latency."""

from __future__ import annotations

from .metric import _otel, _quantile

GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_request_model", "rank", "job_id")
REQUEST_DURATION = _otel("gen_ai.server.request.duration", "histogram", "s", "gen_ai_server_request_duration_seconds",
                         "Duration of one inference request (GenAI semantic conventions).", "inference",
                         labels=GENAI_LABELS + ("error_type",), unit="seconds")
TIME_TO_FIRST_TOKEN = _otel("gen_ai.server.time_to_first_token", "histogram", "s",
                            "gen_ai_server_time_to_first_token_seconds",
                            "Time from the request's start to its first output token.", "inference",
                            labels=GENAI_LABELS, unit="seconds")
INFERENCE_TOKENS = _otel("gpuobs.inference.tokens", "counter", "{token}", "gpuobs_inference_tokens",
                         "Tokens processed, by gen_ai.token.type (input or output).", "inference",
                         labels=GENAI_LABELS + ("gen_ai_token_type",))
BATCH_SIZE = _otel("gpuobs.inference.batch_size", "histogram", "{request}", "gpuobs_inference_batch_size",
                   "Requests batched together per inference call.", "inference", labels=GENAI_LABELS)
INFERENCE_ERRORS = _otel("gpuobs.inference.errors", "counter", "{request}", "gpuobs_inference_errors",
                         "Requests that failed, by error.type.", "inference", labels=GENAI_LABELS + ("error_type",))

TIME_PER_OUTPUT_TOKEN = _otel("gen_ai.server.time_per_output_token", "histogram", "s",
                              "gen_ai_server_time_per_output_token_seconds",
                              "Time per output token after the first: (duration - time to first token) / "
                              "(output tokens - 1).", "inference", labels=GENAI_LABELS, unit="seconds")
ACTIVE_REQUESTS = _otel("gpuobs.inference.active_requests", "gauge", "{request}",
                        "gpuobs_inference_active_requests", "Requests in flight (an OTel UpDownCounter).", "inference",
                        labels=GENAI_LABELS)
REQUEST_QUANTILE = _quantile(REQUEST_DURATION, "gpuobs.inference.request.duration.quantile",
                             "the request durations")
TTFT_QUANTILE = _quantile(TIME_TO_FIRST_TOKEN, "gpuobs.inference.time_to_first_token.quantile",
                          "the times to first token")
TPOT_QUANTILE = _quantile(TIME_PER_OUTPUT_TOKEN, "gpuobs.inference.time_per_output_token.quantile",
                          "the times per output token")
