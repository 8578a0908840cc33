"""What a catalog metric is recorded through: Telemetry.instrument() returns a Recorder for every
metric, of one of two kinds chosen per metric (telemetry.HELD):

* LocalValues: values kept by the recording thread in Cells and handed to OTel by an observable
  instrument when metrics are collected. A synchronous instrument call costs several µs, and a
  training step updates about ten counters and gauges; a held Cell costs about 0.1 µs.
* SyncRecorder: the SDK's synchronous instrument, called per recording (histograms, whose
  aggregation is the SDK's, and inference metrics).

Both take the same calls, so recording code does not care which one a metric uses.
"""

from __future__ import annotations

from typing import Any


class Cell:
    """The value of one attribute set of a LocalValues; None until first added to or set.
    The training thread holds its cells and updates `value` directly: no lookup per step."""
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, amount: float) -> None:
        """Adds `amount` (the metric's unit) to the value; the first add sets it."""
        self.value = amount if self.value is None else self.value + amount  # ints stay ints (step counts)

    def set(self, value: float) -> None:
        """Sets the value (a gauge's latest reading, in the metric's unit)."""
        self.value = value


class Recorder:
    """Records values of one catalog metric. attrs: the point's attributes (a dict of str to
    str/int/float/bool). add(value, attrs): counters and up-down counters; set(value, attrs):
    gauges; record(value, attrs): histograms; cell(attrs): an object with add(value) and
    set(value) bound to one attribute set, to keep and update without a lookup per call.
    A call the metric's kind does not take raises TypeError."""

    def add(self, value: float, attrs: dict) -> None:
        """Adds `value` to the counter or up-down counter series of `attrs`. Raises TypeError here: a kind
        that takes it overrides this."""
        raise TypeError(f"{type(self).__name__} does not take add()")

    def set(self, value: float, attrs: dict) -> None:
        """Sets the gauge series of `attrs` to `value`. Raises TypeError here: a kind that takes it overrides this."""
        raise TypeError(f"{type(self).__name__} does not take set()")

    def record(self, value: float, attrs: dict) -> None:
        """Records one observation of `value` in the histogram series of `attrs`. Raises TypeError here:
        a kind that takes it overrides this."""
        raise TypeError(f"{type(self).__name__} does not take record()")

    def cell(self, attrs: dict) -> Any:
        """An object with add(value) and set(value) bound to `attrs`, kept by the caller to record without a
        lookup per call. Raises TypeError here: a kind that takes it overrides this."""
        raise TypeError(f"{type(self).__name__} does not take cell()")


class LocalValues(Recorder):
    """Counter or gauge values kept in the process, one Cell per attribute set, read by an
    observable instrument at collection (counters: summed over the LocalValues of a metric;
    gauges: the last one's value). kind: "counter" or "gauge"."""

    def __init__(self, kind: str):
        self.kind = kind
        self.cells: dict[tuple, Cell] = {}

    def cell(self, attrs: dict) -> Cell:
        """The Cell of these attributes, made on first use; keep it to update without a lookup."""
        key = tuple(attrs.items())
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = Cell()
        return found

    def add(self, value: float, attrs: dict) -> None:
        """Adds `value` to the Cell of `attrs` (made on first use); no OTel call."""
        self.cell(attrs).add(value)

    def set(self, value: float, attrs: dict) -> None:
        """Sets the Cell of `attrs` to `value` (made on first use); no OTel call."""
        self.cell(attrs).set(value)


class NoValues(Recorder):
    """LocalValues of disabled telemetry: keeps nothing (its cells are never read)."""

    def cell(self, attrs: dict) -> Cell:
        """A new Cell that nobody reads (telemetry off): the caller's updates cost what they would when on."""
        return Cell()

    def add(self, value: float, attrs: dict) -> None:
        """Does nothing: telemetry is off."""
        pass

    def set(self, value: float, attrs: dict) -> None:
        """Does nothing: telemetry is off."""
        pass


NO_VALUES = NoValues()


class _BoundCell:
    """SyncRecorder.cell(): add/set of one attribute set, each an instrument call."""
    __slots__ = ("recorder", "attrs")

    def __init__(self, recorder: "SyncRecorder", attrs: dict):
        self.recorder, self.attrs = recorder, attrs

    def add(self, amount: float) -> None:
        self.recorder.add(amount, self.attrs)

    def set(self, value: float) -> None:
        self.recorder.set(value, self.attrs)


class SyncRecorder(Recorder):
    """An OTel synchronous instrument (Counter, UpDownCounter, Gauge or Histogram; the SDK's or
    the no-op API's), called per recording: add/set/record are the instrument's own methods, so
    recording through this costs no more than calling the instrument."""

    def __init__(self, instrument: Any):
        self.instrument = instrument
        for name in ("add", "set", "record"):
            method = getattr(instrument, name, None)
            if method is not None:
                setattr(self, name, method)

    def cell(self, attrs: dict) -> _BoundCell:
        """A cell whose add() and set() call the instrument with a copy of `attrs` (one SDK call each)."""
        return _BoundCell(self, dict(attrs))
