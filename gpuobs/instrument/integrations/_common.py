"""Helpers shared by the framework callbacks (no framework imports here)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
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


OnFetch = Callable[[float, int], None]  # (seconds, start in ns since the epoch)

# object's own __class__ setter: accelerate's DataLoaderAdapter (the loader transformers.Trainer
# iterates) hides __class__ behind a read-only property, so `loader.__class__ = ...` would fail on it
_set_class = object.__dict__["__class__"].__set__


class TimedIterator:
    """An iterator timing each next() of the one it wraps: on_fetch(seconds, start_ns) after every
    item (the end of the data, StopIteration, is no fetch). Other attributes are the wrapped one's."""

    def __init__(self, it: Iterator, on_fetch: OnFetch):
        self._it, self._on_fetch = it, on_fetch

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        start_ns, t0 = time.time_ns(), time.perf_counter()
        item = next(self._it)
        self._on_fetch(time.perf_counter() - t0, start_ns)
        return item

    def __getattr__(self, name: str) -> Any:
        if name == "_it":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._it, name)


def _timed(call: Callable[[], Any], on_fetch: OnFetch) -> Any:
    start_ns, t0 = time.time_ns(), time.perf_counter()
    result = call()
    on_fetch(time.perf_counter() - t0, start_ns)
    return result


def time_fetches(loader: Any, on_fetch: OnFetch, *, is_iterator: bool = False) -> Callable[[], None] | None:
    """Time the loader's own fetches on this one object, so that what a framework does between
    fetching a batch and the next step hook (a collective, logging) is not counted as data wait.

    loader: an iterable the training loop calls iter() on once per epoch (a DataLoader, as
    transformers.Trainer does): every iterator it returns from now on is a TimedIterator, and the
    iter() call itself (worker start-up) is timed too; with is_iterator, the object the loop calls
    next() on directly (Lightning's data fetcher): its __next__ and __iter__ are timed.
    on_fetch(seconds, start_ns) is called after each (perf_counter seconds, time_ns start).

    Special methods are looked up on the type, so the instance's class is swapped for a subclass
    made for it (its name and behaviour otherwise unchanged). Returns a function that restores the
    class, or None where the class cannot be swapped (a builtin or slotted type): the caller then
    keeps its own measurement."""
    cls = type(loader)
    parent_iter: Any = getattr(cls, "__iter__", None)
    parent_next: Any = getattr(cls, "__next__", None)
    if parent_iter is None or (is_iterator and parent_next is None):
        return None
    namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if is_iterator:
        namespace["__iter__"] = lambda self: _timed(lambda: parent_iter(self), on_fetch)
        namespace["__next__"] = lambda self: _timed(lambda: parent_next(self), on_fetch)
    else:
        namespace["__iter__"] = lambda self: TimedIterator(_timed(lambda: parent_iter(self), on_fetch), on_fetch)
    try:
        sub = type(cls.__name__, (cls,), namespace)
        _set_class(loader, sub)
    except TypeError:
        return None

    def restore() -> None:
        if type(loader) is sub:
            _set_class(loader, cls)

    return restore
