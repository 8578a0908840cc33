"""The one catalog of metrics: every series gpuobs exports is defined here, once.

The collectors emit these definitions, the exporter renders them (native or DCGM names),
docs/metrics.md is generated from them, and rules and dashboards refer to them by their
Python names. Naming follows Prometheus conventions: one `gpuobs_` namespace, base units
(bytes, watts, joules, celsius, hertz, seconds, ratio 0-1) and `_total` only on counters
(prometheus_client adds it to counter families at exposition).

One module per family (catalog/power.py, catalog/thermal.py, ...: the family's metrics, its
constants and its detail tier), the `Metric` class and what the families share in catalog/metric.py;
this package re-exports every public name of them (`catalog.POWER_USAGE`) and assembles the
catalog-wide views: ALL, BY_NAME, DETAIL, DEFAULT_VALUES, EXPORTED, OTEL. A metric added to a family
module is in all of them without an edit here; a family module is added to FAMILY_MODULES below.
"""

from __future__ import annotations

from types import ModuleType

# isort: off
# The family modules, in the catalog's order (ALL, docs/metrics.md): importing them fills the
# registries of .metric (QUANTILES, the detail tier) in this order too.
from . import identity, utilization, gpm, memory, power, thermal, clocks, clock_events, ecc, pcie
from . import nvlink, fabric, topology, mig, processes, xid, kernel_log, exporter, training, inference, telemetry
# isort: on
from .clock_events import *  # noqa: F403
from .clocks import *  # noqa: F403
from .ecc import *  # noqa: F403
from .exporter import *  # noqa: F403
from .fabric import *  # noqa: F403
from .gpm import *  # noqa: F403
from .identity import *  # noqa: F403
from .inference import *  # noqa: F403
from .kernel_log import *  # noqa: F403
from .memory import *  # noqa: F403
from .metric import *  # noqa: F403
from .metric import DEFAULT_VALUES_DECLARED, DETAIL_DECLARED, MIG_LABELS, Metric
from .mig import *  # noqa: F403
from .nvlink import *  # noqa: F403
from .pcie import *  # noqa: F403
from .power import *  # noqa: F403
from .processes import *  # noqa: F403
from .telemetry import *  # noqa: F403
from .thermal import *  # noqa: F403
from .topology import *  # noqa: F403
from .training import *  # noqa: F403
from .utilization import *  # noqa: F403
from .xid import *  # noqa: F403

FAMILY_MODULES: tuple[ModuleType, ...] = (
    identity, utilization, gpm, memory, power, thermal, clocks, clock_events, ecc, pcie, nvlink, fabric, topology,
    mig, processes, xid, kernel_log, exporter, training, inference, telemetry)


def defined_in(module: ModuleType) -> tuple[Metric, ...]:
    """The Metric objects a family module defines as module attributes, in definition order (those
    built in a dict, GPM_METRICS and MIG_GPM_METRICS, are not attributes and not included)."""
    return tuple(v for v in vars(module).values() if isinstance(v, Metric))


# Every metric: the family modules' in their order, then the GPM ratios of GPUs and of MIG devices
ALL: tuple[Metric, ...] = tuple(dict.fromkeys(m for module in FAMILY_MODULES for m in defined_in(module))) + \
    tuple(gpm.GPM_METRICS.values()) + tuple(mig.MIG_GPM_METRICS.values())
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}
# Fields DCGM reports per GPU instance on a MIG GPU: those gpuobs reads per MIG device. dcgm-exporter
# (its default `-d f`) watches a MIG GPU's GPU instances, not the GPU: these come per instance only,
# every other field on each instance with the GPU's value (gpuobs.exporter.render, gpuobs.alerts.dcgm)
DCGM_INSTANCE_FIELDS: frozenset[str] = frozenset(f for m in ALL if m.identity == MIG_LABELS for f in m.dcgm.values())
# The tiers (docs/cardinality.md), as the family modules declare them: detail metrics, left out of
# the default profile, and metrics of which the default profile serves only some label values
DETAIL: frozenset[Metric] = frozenset(DETAIL_DECLARED)
DEFAULT_VALUES: dict[Metric, tuple[str, frozenset[str]]] = dict(DEFAULT_VALUES_DECLARED)
# The exporter's families (names, default on/off) are registered with their collectors: gpuobs.collect.REGISTRY
APP_FAMILIES = ("training", "inference", "telemetry")  # recorded by gpuobs.instrument, not the exporter
# What the exporter emits: every non-OTel metric, plus its own dropped log records (gpuobs.logs in its process)
# and its truncated log lines (the kernel-log watcher's, through gpuobs.logpatterns.match)
EXPORTED: tuple[Metric, ...] = tuple(m for m in ALL if not m.otel_name) + (telemetry.LOGS_DROPPED,
                                                                           telemetry.LOG_LINES_TRUNCATED)
OTEL: tuple[Metric, ...] = tuple(m for m in ALL if m.otel_name)  # opt-in: per-process series are unbounded by nature
