"""Records of the fleet's inventory and health: GPUs expected, present and lost."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CLUSTER,
                   NODE,
                   aggregate,
                   count_of,
)

# -------------------------------------------------------------------------------- inventory, health
NODE_GPUS_EXPECTED = aggregate("sum", NODE, c.GPUS_EXPECTED)
NODE_GPUS_PRESENT = aggregate("sum", NODE, c.GPUS_PRESENT)
CLUSTER_GPUS_EXPECTED = aggregate("sum", CLUSTER, NODE_GPUS_EXPECTED)
CLUSTER_GPUS_PRESENT = aggregate("sum", CLUSTER, NODE_GPUS_PRESENT)
CLUSTER_GPUS_LOST = count_of(CLUSTER, "gpuobs_gpus_lost", lambda t: f"{c.GPU_UP.name} == 0")
