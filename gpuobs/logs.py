"""Structured (JSON) logging for gpuobs processes, via python-json-logger."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def setup(level: str = "info") -> None:
    """One JSON object per line on stderr: time, level, logger, message and any `extra` fields."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter("{asctime}{levelname}{name}{message}", style="{",
                                       rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
