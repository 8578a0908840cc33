"""Shared fixtures: a simulated node that this process's pynvml talks to."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpuobs.sim import Simulator

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO.parent / "shared" / "captures"


@pytest.fixture
def make_sim(tmp_path):
    """Factory: make_sim(spec_dict) -> Simulator, activated and with NVML initialised."""
    made: list[Simulator] = []

    def factory(spec: dict, init: bool = True) -> Simulator:
        sim = Simulator(spec, base=REPO, directory=tmp_path / f"node{len(made)}").activate()
        made.append(sim)
        if init:
            pynvml.nvmlInit()
        return sim

    yield factory
    for sim in made:
        sim.state.clear_faults()
        sim.state.clear_init_error()
    while True:  # drop every reference this test took, so the next test maps its own state
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            break
    for sim in made:
        sim.close()


@pytest.fixture
def h100x2(make_sim):
    """Two idle H100s with a process each; NVML initialised."""
    return make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}],
                     "processes": [{"gpu": 0, "pid": 1111, "name": "python train.py", "used_mib": 1024,
                                    "sm_util": 77, "mem_util": 33}]})
