"""Records of inference services: request and time-to-first-token quantiles, request rates."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   MODEL,
                   Record,
                   _sum_rate,
                   windowed_quantile,
)

# ----------------------------------------------------------------------------------------- inference
MODEL_REQUEST_P99 = windowed_quantile(MODEL, c.REQUEST_DURATION, 99)
MODEL_REQUESTS = Record(MODEL, "gen_ai_server_requests", "rate",
                        lambda t: _sum_rate(MODEL, f"{c.REQUEST_DURATION.name}_count", t))
