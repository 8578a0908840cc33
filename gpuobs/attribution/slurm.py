"""Slurm job attribution from a job-mapping directory, as dcgm-exporter reads it
(`--hpc-job-mapping-dir`, `DCGM_HPC_JOB_MAPPING_DIR`).

The directory holds one file per GPU, written by the Slurm prolog and removed by the epilog. The
file name is the GPU index (`0`, `1`, ...) or, for a MIG device, `<gpu index>.<GPU instance id>`
(`2.0`); a GPU or MIG UUID is accepted too. The file holds one or more job ids, one per line.
Several ids on one device are joined with commas, sorted, so that each device keeps one series.
The directory is read in a background thread every `refresh_s`; a missing directory means no
attribution.
"""

from __future__ import annotations

import logging
import os

from ._refresh import Refresher

log = logging.getLogger("gpuobs.attribution")


def read_mapping(directory: str) -> dict[str, str]:
    """{file name: comma-joined job ids} of a job-mapping directory ({} if it is missing)."""
    mapping = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return {}
    for entry in entries:
        try:
            if not entry.is_file():
                continue
            with open(entry.path, encoding="utf-8", errors="replace") as f:
                jobs = sorted({line.strip() for line in f if line.strip()})
        except OSError:  # removed by the epilog while being read
            continue
        if jobs:
            mapping[entry.name] = ",".join(jobs)
    return mapping


class SlurmJobMap(Refresher):
    """Keeps {GPU index, index.GI, or UUID: job ids} from a job-mapping directory."""

    name = "slurm"

    def __init__(self, directory: str, refresh_s: float = 10.0):
        super().__init__(refresh_s)
        self.directory = directory
        self._mapping: dict[str, str] = {}
        self._present: bool | None = None

    def refresh(self) -> None:
        """Re-reads the job-mapping directory whole; `up` says whether it exists (its appearance and
        disappearance are logged once each)."""
        present = os.path.isdir(self.directory)
        if present != self._present:
            log.info("slurm job-mapping directory " + ("found" if present else "missing: no job attribution"),
                     extra={"directory": self.directory})
            self._present = present
        self._mapping = read_mapping(self.directory) if present else {}
        self.up = present

    def lookup(self, uuid: str, index: int | str | None = None,
               gpu_instance: str | None = None) -> dict[str, str] | None:
        """{"hpc_job": ids} of the device: by `<index>.<gpu_instance>` for a MIG device, else `<index>`,
        or by UUID; None if no job holds it."""
        m = self._mapping
        if index is not None:
            key = f"{index}.{gpu_instance}" if gpu_instance is not None else str(index)
            if key in m:
                return {"hpc_job": m[key]}
        job = m.get(uuid)
        return {"hpc_job": job} if job else None
