"""Alerts of a node's GPUs and NVML: lost, unusable, too slow to read, missing."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ...records import GPU_BY
from ..common import GPU, Alert, Thresholds, _unreliable


def _gpu_unusable(t: Thresholds) -> tuple[str, str]:
    """(GpuLost, GpuUnhealthy): one GPU down (GPU_UP 0, now or flapping) pages once, by its reason
    (GPU_UNHEALTHY, there only while it is unusable): GpuLost for `lost`, or no reason at all
    (an exporter without the metric); GpuUnhealthy, with the reason, for the others. A GPU seen lost
    within for_medium stays GpuLost whatever other reason it also gave."""
    down = _unreliable(c.GPU_UP.name, 0, t)

    def seen(match: str) -> str:
        return f'max_over_time({c.GPU_UNHEALTHY.name}{{reason{match}"lost"}}[{t.for_medium}])'
    other = f"({seen('!=')} unless on ({GPU_BY}) {seen('=')})"
    return f"({down}) unless on ({GPU_BY}) {other}", f"{other} and on ({GPU_BY}) ({down})"


def presence(t: Thresholds) -> list[Alert]:
    """A node's GPUs and NVML: lost, unusable, too slow to read, missing."""
    alert = partial(Alert, family="presence")
    lost, unhealthy = _gpu_unusable(t)
    timeouts = c.GPU_TIMEOUTS.exposed_name
    flapping = f"{t.flap_share:.0%} of the last {t.long_window}'s"
    return [
        alert(name="GpuLost", expr=lost, for_=t.for_now, severity="critical", scope="gpu",
              summary="A GPU stopped answering NVML.",
              description=f"{GPU} is lost: it no longer answers NVML, now or in more than {flapping} samples."),
        alert(name="GpuUnhealthy", expr=unhealthy, for_=t.for_now, severity="critical", scope="gpu",
              summary="A GPU is unusable: it needs a reset, its reads time out, or it cannot be read.",
              description=f"{GPU} is unusable ({{{{ $labels.reason }}}}), now or in more than {flapping} samples: "
                          "its metrics are withheld meanwhile."),
        alert(name="GpuSamplingTimeouts",
              expr=f"rate({timeouts}[{t.long_window}]) / ignoring (gpu, uuid) group_left "
                   f"rate({c.SAMPLES.exposed_name}[{t.long_window}]) > {t.gpu_timeout_share:g} "
                   f"and {timeouts}",  # not for an hour after its exporter went (other alerts' case)
              for_=t.for_medium, severity="warning", scope="gpu",
              summary="A GPU's NVML reads keep missing the sampling deadline.",
              description=f"{GPU} missed the exporter's sampling deadline in {{{{ $value | humanizePercentage }}}} "
                          f"of its sampling passes over the last {t.long_window}: its series have gaps."),
        alert(name="GpuMissing", expr=f"{c.GPUS_PRESENT.name} < {c.GPUS_EXPECTED.name}", for_=t.for_short,
              severity="critical", scope="node", summary="A node has fewer GPUs than expected.",
              description="{{ $labels.node }} has {{ $value }} GPUs, fewer than it should have."),
        alert(name="NvmlDown", expr=_unreliable(c.NVML_UP.name, 0, t), for_=t.for_short, severity="critical",
              scope="node", summary="NVML is down on a node.",
              description="NVML does not answer on {{ $labels.node }} (or has not finished initialising since "
                          f"the exporter started), now or in more than {flapping} scrapes: no GPU can be read "
                          "then."),
    ]
