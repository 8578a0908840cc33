"""What the Node dashboard's rows share: its variables' matchers, the per-GPU legend and selector,
and the title a panel of one catalog metric gets."""

from __future__ import annotations

from ... import catalog as c
from ..common import Steps, sel

C = 'cluster=~"$cluster"'
N = 'node="$node"'
G = 'gpu=~"$gpu"'
ON = (C, N, G)  # the dashboard's cluster, node and GPUs
GPU = "GPU {{gpu}}"
BAD: Steps = [{"color": "green", "value": None}, {"color": "red", "value": 1}]  # 1 is bad


def m(metric: c.Metric, *matchers: str) -> str:
    """A catalog metric's selector on the dashboard's cluster, node and GPUs, plus matchers."""
    return sel(metric, *ON, *matchers)


def metric_title(metric: c.Metric) -> str:
    """A panel title from a catalog metric's name: 'gpuobs_gpu_sm_active_ratio' -> 'SM active'."""
    words = metric.name.removeprefix("gpuobs_").removeprefix("gpu_").removeprefix("mig_").removesuffix("_ratio")
    upper = {"sm": "SM", "dram": "DRAM", "fp16": "FP16", "fp32": "FP32", "fp64": "FP64"}
    text = " ".join(upper.get(w, w) for w in words.split("_"))
    return text[0].upper() + text[1:]
