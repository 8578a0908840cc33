"""Records of inference services: request and time-to-first-token quantiles, request rates."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   MODEL,
                   Record,
                   Windows,
                   _by,
                   born_counted,
                   born_watched,
                   duration_seconds,
                   windowed_quantile,
)

# ----------------------------------------------------------------------------------------- inference
MODEL_REQUEST_P99 = windowed_quantile(MODEL, c.REQUEST_DURATION, 99)


def born_rate(sel: str, t: Windows, label: str = "error_type") -> str:
    """Per model, the per-second rate over rate_window of counter selector sel, counting the events a
    series was created with (records.born_counted): a model's first request of an error type creates
    its error and request-count series at once, first scraped at 1 or more."""
    counted = born_counted(sel, t.rate_window, _by(MODEL), born_watched(sel, t.rate_window, label))
    return f"{counted} / {duration_seconds(t.rate_window):g}"


MODEL_REQUESTS = Record(MODEL, "gen_ai_server_requests", "rate",
                        lambda t: born_rate(f"{c.REQUEST_DURATION.name}_count", t))
