"""Node dashboard, row "Utilization": GPU, memory and video engine use, encoder and frame-capture
sessions (utilization family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import GPU, m


def row(L: k.Layout) -> None:
    """Append the 'Utilization' row and its panels to the Node dashboard's layout L."""
    L.row("Utilization")
    L.add(k.timeseries("GPU utilization", [target(m(c.UTILIZATION), GPU)], "percentunit",
                       "Share of the sample period a kernel ran.", min=0, max=1), 12, 8)
    L.add(k.timeseries("Memory, encoder and decoder utilization", [
        target(m(c.MEMORY_UTILIZATION), GPU + " memory"), target(m(c.ENCODER_UTILIZATION), GPU + " encoder"),
        target(m(c.DECODER_UTILIZATION), GPU + " decoder")], "percentunit",
        "Share of the sample period device memory was read or written, and video engine use.", min=0, max=1), 12, 8)
    L.add(k.timeseries("Encoder and FBC sessions", [
        target(m(c.ENCODER_SESSIONS), GPU + " encoder"), target(m(c.FBC_SESSIONS), GPU + " frame capture")],
        "short", "Video encoder and frame-buffer-capture sessions running.", min=0), 8, 7)
    L.add(k.timeseries("Encoder and FBC frame rate", [
        target(m(c.ENCODER_FPS), GPU + " encoder"), target(m(c.FBC_FPS), GPU + " frame capture")],
        "short", "Average frames per second over the sessions running.", min=0), 8, 7)
    L.add(k.timeseries("Encoder and FBC latency", [
        target(m(c.ENCODER_LATENCY), GPU + " encoder"), target(m(c.FBC_LATENCY), GPU + " frame capture")],
        "s", "Average latency per frame over the sessions running.", min=0), 8, 7)
