"""Helpers shared by the framework callbacks (no framework imports here)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..telemetry import Telemetry
from ..train import TrainingRun


def make_run(run: TrainingRun | None, telemetry: Telemetry | None, **kwargs: Any) -> TrainingRun:
    """The given run, else a new TrainingRun over telemetry (or the current one at this moment, so
    configure() may be called any time before training starts)."""
    return run if run is not None else TrainingRun(telemetry=telemetry, **kwargs)


def batch_size(batch: Any, _depth: int = 0) -> int | None:
    """The leading dimension of the first tensor-like (anything with a non-empty .shape) in a batch,
    looking into mappings, lists and tuples; None when it cannot be told. Reads shapes only: no
    device synchronization."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, IndexError):
            return None
    if _depth > 3:
        return None
    items: Iterable[Any]
    if isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        n = batch_size(item, _depth + 1)
        if n is not None:
            return n
    return None


def number(value: Any) -> float:
    """A float from a number or a 0-d tensor (.item(): only ever called at the reporting interval)."""
    return float(value.item() if hasattr(value, "item") else value)


class Scaled:
    """A lazily read value times a factor (a loss Lightning divided by the accumulation count)."""
    __slots__ = ("value", "factor")

    def __init__(self, value: Any, factor: float):
        self.value, self.factor = value, factor

    def __call__(self) -> float:
        return number(self.value) * self.factor


def record_checkpoint(run: TrainingRun, seconds: float, start_ns: int, **attributes: Any) -> None:
    """Record a checkpoint whose start and duration are known only afterwards (TrainingRun.record_checkpoint)."""
    run.record_checkpoint(seconds, start_ns, **attributes)
