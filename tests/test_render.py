"""The renderer keeps the text of metrics whose samples did not change: what it serves must equal a
full render of the same snapshot, whatever changed in between (values, GPUs, attribution)."""

from __future__ import annotations

import pytest

from gpuobs.attribution import SlurmJobMap
from gpuobs.collect import Sampler, Session, build_families, default_families
from gpuobs.exporter.render import Renderer
from gpuobs.sim.state import set_val


def full_render(snap, naming, source=None) -> bytes:
    fresh = Renderer(naming, hostname="node-a", attribution=[source] if source else [])
    fresh.render(snap)
    return fresh.fresh


@pytest.mark.parametrize("naming", ["gpuobs", "dcgm"])
def test_cached_render_equals_full_render_as_values_gpus_and_jobs_change(make_sim, tmp_path, naming):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    source = SlurmJobMap(str(jobs))
    session = Session()
    sampler = Sampler(session, build_families(default_families(), process_cap=8), interval=1)
    renderer = Renderer(naming, hostname="node-a", attribution=[source])
    g0 = sim.state.gpu(0)

    def step(change):
        change()
        source.refresh()
        snap = sampler.sample_once()
        renderer.render(snap)
        assert renderer.fresh == full_render(snap, naming, source)
        return renderer.fresh

    first = step(lambda: None)
    same = step(lambda: None)
    temp = step(lambda: set_val(g0.temp_gpu, 83))
    assert b"83" in temp and temp != same
    job = step(lambda: (jobs / "1").write_text("4242\n"))
    assert b'"4242"' in job
    gone = step(lambda: sim.state.lose_gpu(1))
    assert gone.count(b'"4242"') < job.count(b'"4242"')  # the lost GPU's values are gone
    step(lambda: (sim.state.lose_gpu(1, False), (jobs / "1").unlink()))
    assert first  # rendered at all
    session.shutdown()
