"""Records of utilization, power and clock events (throttling)."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CLUSTER,
                   NODE,
                   aggregate,
)

# ---------------------------------------------------------------------------- utilization and power
NODE_UTILIZATION = aggregate("avg", NODE, c.UTILIZATION)
CLUSTER_UTILIZATION = aggregate("avg", CLUSTER, c.UTILIZATION)
CLUSTER_SM_ACTIVE = aggregate("avg", CLUSTER, c.GPM_METRICS[2])  # 2: NVML_GPM_METRIC_SM_UTIL
CLUSTER_POWER = aggregate("sum", CLUSTER, c.POWER_USAGE)
CLUSTER_POWER_LIMIT = aggregate("sum", CLUSTER, c.POWER_LIMIT)
CLUSTER_THROTTLED = aggregate("sum", ("cluster", "reason"), c.CLOCK_EVENT_ACTIVE, '{reason!="gpu_idle"}')
