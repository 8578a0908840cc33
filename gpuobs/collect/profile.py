"""Which series the exporter serves: the default profile (what every alert, recording rule and
default panel reads, within the per-GPU series budget) or full (every series), with detail opt-in
per family (`--detail nvlink,ecc`). The tiers themselves are in the catalog (catalog.DETAIL,
catalog.DEFAULT_VALUES); this module turns a choice of profile into a per-metric test that the
sampling pass runs on every value before it makes a Sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .. import catalog as c

PROFILES = ("default", "full")

# Per metric: True (every series served), False (none) or (label index, values served)
Rule = Union[bool, tuple[int, frozenset[str]]]


@dataclass(frozen=True)
class Profile:
    """A choice of series. name: "default" or "full"; detail: families served in full under the
    default profile (each a name of gpuobs.collect.REGISTRY; checked by the exporter's config).
    Raises ValueError for another name."""
    name: str = "default"
    detail: frozenset[str] = frozenset()
    rules: dict[c.Metric, Rule] = field(default_factory=dict, compare=False, repr=False)  # filled at init

    def __post_init__(self) -> None:
        if self.name not in PROFILES:
            raise ValueError(f"unknown profile {self.name!r}: one of {', '.join(PROFILES)}")
        for metric in c.EXPORTED:
            self.rules[metric] = self._rule(metric)

    def _rule(self, metric: c.Metric) -> Rule:
        if self.name == "full" or metric.family in self.detail:
            return True
        if metric in c.DETAIL:
            return False
        narrowed = c.DEFAULT_VALUES.get(metric)
        if narrowed is None:
            return True
        label, values = narrowed
        return metric.labels.index(label), values

    def serves(self, metric: c.Metric) -> bool:
        """True when some series of the metric is served (a family may skip the NVML call of one
        that is not)."""
        return self.rules.get(metric, True) is not False

    def keeps(self, metric: c.Metric, labels: tuple[str, ...]) -> bool:
        """True when the series of the metric with these label values (all of them, in
        metric.labels order) is served."""
        rule = self.rules.get(metric, True)
        if rule is True or rule is False:
            return rule
        index, values = rule
        return labels[index] in values


FULL = Profile("full")
