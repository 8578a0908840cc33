"""The run environment (rank, job, node, pod) as gpuobs.instrument has always exported it; the
detection lives in gpuobs.runenv, shared with gpuobs.logs."""

from ..runenv import RunEnv

__all__ = ["RunEnv"]
