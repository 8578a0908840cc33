"""Inference service: requests/s, errors, latency p50/p99, time to first token, batch size, tokens,
and the GPUs of the nodes serving the model. Series use the OpenTelemetry GenAI semantic
conventions (gen_ai_server_*), as recorded by gpuobs.instrument.request."""

from __future__ import annotations

from .. import catalog as c
from . import common as k
from .common import mean, quantile, rate, sel, target, windowed

MODEL = 'gen_ai_request_model=~"$model"'
OPERATION = 'gen_ai_operation_name=~"$operation"'
M = (MODEL, OPERATION)
OUTPUT = 'gen_ai_token_type="output"'
BY = "gen_ai_request_model"
LEGEND = "{{gen_ai_request_model}}"


def serving_nodes() -> str:
    """`on` the nodes serving the selected models (the scrape's cluster and node labels)."""
    return f"on (cluster, node) group by (cluster, node) ({sel(c.REQUEST_DURATION, *M, suffix='count')})"


def m(metric: c.Metric, *matchers: str, suffix: str = "") -> str:
    """A selector over a catalog metric restricted to the selected model and operation (M), plus
    matchers; suffix: a histogram's bucket, sum or count."""
    return sel(metric, *M, *matchers, suffix=suffix)


def build():
    """The Inference service dashboard: rows Service, Traffic and latency, GPUs serving (the nodes
    serving the selected model); variables model and operation."""
    L = k.Layout()
    nodes = serving_nodes()
    requests = f"sum({rate(m(c.REQUEST_DURATION, suffix='count'))})"
    requests_by = f"sum by ({BY}) ({rate(m(c.REQUEST_DURATION, suffix='count'))})"
    # no failed request yet means no error series: count those as 0 errors, not as no data
    errors_by = f"(sum by ({BY}) ({rate(m(c.INFERENCE_ERRORS))}) or {requests_by} * 0)"

    L.row("Service")
    L.add(k.stat("Requests/s", [target(requests)], "reqps", "Requests completed per second."), 5, 5)
    L.add(k.stat("Error ratio", [target(f"sum({errors_by}) / {requests}")], "percentunit",
                 "Share of requests that failed.",
                 thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.01},
                             {"color": "red", "value": 0.05}]), 5, 5)
    L.add(k.stat("Latency p99", [target(windowed(0.99, c.REQUEST_DURATION, M))], "s",
                 "99th percentile request duration, all selected models."), 5, 5)
    L.add(k.stat("Time to first token p99", [target(windowed(0.99, c.TIME_TO_FIRST_TOKEN, M))], "s",
                 "99th percentile time from a request's start to its first output token."), 5, 5)
    L.add(k.stat("Output tokens/s", [target(f"sum({rate(m(c.INFERENCE_TOKENS, OUTPUT))})")],
                 "suffix: tokens/s", "Output tokens generated per second."), 4, 5)

    L.row("Traffic and latency")
    L.add(k.timeseries("Requests/s by model", [target(requests_by, LEGEND)], "reqps",
                       "Requests completed per second per model.", min=0, stack=True), 12, 8)
    L.add(k.timeseries("Errors by model and type", [
        target(f"sum by ({BY}, error_type) ({rate(m(c.INFERENCE_ERRORS))})", LEGEND + " {{error_type}}"),
        target(f"{errors_by} / {requests_by}", LEGEND + " error ratio")], "reqps",
        "Failed requests per second by error.type, and the share of requests that failed.", min=0,
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*error ratio"},
                    "properties": [{"id": "unit", "value": "percentunit"},
                                   {"id": "custom.axisPlacement", "value": "right"}]}]), 12, 8)
    L.add(k.timeseries("Latency p50 and p99", [
        target(windowed(0.5, c.REQUEST_DURATION, M, BY), LEGEND + " p50"),
        target(windowed(0.99, c.REQUEST_DURATION, M, BY), LEGEND + " p99")], "s",
        "Request duration percentiles per model.", min=0), 12, 8)
    L.add(k.heatmap("Latency distribution", [target(
        f"sum by (le) ({rate(m(c.REQUEST_DURATION, suffix='bucket'), 'increase')})", exemplar=True)], "s",
        "Requests per latency bucket over time; the dots are slow requests' exemplars (click one for its "
        "trace)."), 12, 8)
    L.add(k.timeseries("Time to first token p50 and p99", [
        target(windowed(0.5, c.TIME_TO_FIRST_TOKEN, M, BY), LEGEND + " p50"),
        target(windowed(0.99, c.TIME_TO_FIRST_TOKEN, M, BY), LEGEND + " p99"),
        target(mean(c.TIME_TO_FIRST_TOKEN, M, BY), LEGEND + " mean")], "s",
        "Time from a request's start to its first output token.", min=0), 12, 8)
    L.add(k.timeseries("Time per output token p50 and p99", [
        target(windowed(0.5, c.TIME_PER_OUTPUT_TOKEN, M, BY), LEGEND + " p50"),
        target(windowed(0.99, c.TIME_PER_OUTPUT_TOKEN, M, BY), LEGEND + " p99"),
        target(mean(c.TIME_PER_OUTPUT_TOKEN, M, BY), LEGEND + " mean")], "s",
        "Decoding time per output token after the first.", min=0), 12, 8)
    L.add(k.timeseries("Requests in flight", [target(f"sum by ({BY}) ({m(c.ACTIVE_REQUESTS)})", LEGEND)], "short",
                       "Requests started and not yet finished, per model.", min=0, stack=True), 12, 8)
    L.add(k.timeseries("Batch size", [
        target(mean(c.BATCH_SIZE, M, BY), LEGEND + " mean"),
        target(quantile(0.99, c.BATCH_SIZE, M, BY), LEGEND + " p99")], "short",
        "Requests batched together per inference call.", min=0), 12, 8)
    L.add(k.timeseries("Tokens/s by type", [target(
        f"sum by ({BY}, gen_ai_token_type) ({rate(m(c.INFERENCE_TOKENS))})", LEGEND + " {{gen_ai_token_type}}")],
        "suffix: tokens/s", "Input and output tokens per second.", min=0), 12, 8)
    L.add(k.timeseries("Slow requests: p99 with exemplars", [target(
        quantile(0.99, c.REQUEST_DURATION, M, BY), LEGEND + " p99", exemplar=True)], "s",
        "99th percentile request duration from the histogram buckets; each dot is a slow request (at or above "
        "its series' p90 and twice its median) whose exemplar links to the request's trace.", min=0), 12, 8)

    L.row("GPUs serving")
    L.add(k.timeseries("GPU utilization", [target(f"{sel(c.UTILIZATION)} and {nodes}",
                                                  "{{node}} GPU {{gpu}}")], "percentunit",
                       "Utilization of the GPUs on the nodes serving the selected models.", min=0, max=1,
                       links=[k.TO_NODE_SERIES]), 8, 8)
    L.add(k.timeseries("GPU memory used", [target(f"{sel(c.MEMORY_USED)} and {nodes}",
                                                  "{{node}} GPU {{gpu}}")], "bytes",
                       "Device memory used on the serving nodes.", min=0), 8, 8)
    L.add(k.timeseries("GPU power", [target(f"{sel(c.POWER_USAGE)} and {nodes}", "{{node}} GPU {{gpu}}")],
                       "watt", "Board power on the serving nodes.", min=0), 8, 8)

    count = sel(c.REQUEST_DURATION, suffix="count")
    variables = [
        k.variable("model", f"label_values({count}, gen_ai_request_model)", "Model"),
        k.variable("operation", f"label_values({sel(c.REQUEST_DURATION, MODEL, suffix='count')}, "
                                f"gen_ai_operation_name)", "Operation"),
    ]
    links = [k.dashboard_link("Fleet overview", "fleet"), k.dashboard_link("Node", "node"),
             k.dashboard_link("Training job", "training")]
    return k.dashboard("gpuobs / Inference service", "inference",
                       "Requests, errors, latency, time to first token, batch size, tokens and the serving GPUs, "
                       "from the GenAI semantic-convention metrics.", L, variables, links, time_from="now-3h")
