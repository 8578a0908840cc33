"""Records of GPU temperature."""

from __future__ import annotations

from .. import catalog as c
from .base import (
                   CLUSTER,
                   NODE,
                   aggregate,
)

# ----------------------------------------------------------------------------------- temperature
CLUSTER_MAX_TEMPERATURE = aggregate("max", CLUSTER, c.TEMPERATURE)
NODE_MAX_TEMPERATURE = aggregate("max", NODE, c.TEMPERATURE)
