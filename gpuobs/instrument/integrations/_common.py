"""Helpers shared by the framework callbacks (no framework imports here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import catalog as c
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
    """Record a checkpoint measured by the caller (start and duration known only afterwards): the
    same span, histogram and badput that TrainingRun.checkpoint() records around a block."""
    seconds = max(0.0, seconds)
    run.tel.instrument(c.CHECKPOINT_DURATION).record(seconds, run.attrs)
    run.tel.instrument(c.BADPUT).add(seconds, {**run.attrs, "cause": "checkpoint"})
    if not getattr(run, "_in_step", False) and hasattr(run, "_ckpt_between"):
        run._ckpt_between += seconds  # as TrainingRun.checkpoint() does: badput already, so not idle too
    if run.tracing:
        attrs = {**run.attrs, **{f"gpuobs.checkpoint.{k}": str(v) for k, v in attributes.items()}}
        span = run.tracer.start_span("train.checkpoint", start_time=start_ns, attributes=attrs)
        span.end(end_time=start_ns + int(seconds * 1e9))
