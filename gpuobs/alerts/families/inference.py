"""Alerts of the inference family: latency and failing requests, per model."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import records
from ..common import Alert, Thresholds


def inference(t: Thresholds) -> list[Alert]:
    """Inference services: latency and failing requests, per model."""
    alert = partial(Alert, family="inference", scope="service", for_=t.for_short)
    return [
        alert(name="InferenceLatencyHigh", expr=f"{records.MODEL_REQUEST_P99.name} > {t.inference_p99_seconds:g}",
              severity="warning", summary="Inference p99 latency is high.",
              description="Model {{ $labels.gen_ai_request_model }} p99 latency is {{ $value | humanize }} s."),
        alert(name="InferenceErrorRate",
              # errors counted from each series' birth, as MODEL_REQUESTS counts requests (records.born_rate)
              expr=f"{records.born_rate(c.INFERENCE_ERRORS.exposed_name, t)} / "
                   f"{records.MODEL_REQUESTS.name} > {t.inference_error_ratio:g}",
              severity="critical", summary="Inference requests are failing.",
              description="{{ $value | humanizePercentage }} of requests to {{ $labels.gen_ai_request_model }} "
                          "fail."),
    ]
