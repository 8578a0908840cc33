"""The renderer keeps the text of metrics whose samples did not change: what it serves must equal a
full render of the same snapshot, whatever changed in between (values, GPUs, attribution). And the
series dcgm naming derives: the last XID per GPU, aliased DCGM field names."""

from __future__ import annotations

import pytest

from gpuobs import catalog as c
from gpuobs.attribution import SlurmJobMap
from gpuobs.collect import Sampler, Session, build_families, default_families
from gpuobs.collect.base import Sample
from gpuobs.exporter.render import Renderer, dcgm_families
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


def _gpu_info(gpu: str, uuid: str) -> Sample:
    values = {"gpu": gpu, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{gpu}8:00.0",
              "driver_version": "590.48.01"}
    return Sample(c.GPU_INFO, tuple(values.get(label, "") for label in c.GPU_INFO.labels), 1.0)


def _xid(uuid: str, code: int, seen: float, gi: str = "") -> Sample:
    return Sample(c.XID_LAST_SEEN, ("0", uuid, str(code), gi, ""), seen)


def test_dcgm_last_xid_is_the_latest_code_of_each_gpu_whatever_its_mig_instance():
    samples = [_gpu_info("0", "GPU-a"), _gpu_info("1", "GPU-b"),
               _xid("GPU-a", 13, 100.0), _xid("GPU-a", 31, 300.0, gi="1"), _xid("GPU-a", 43, 200.0),
               _xid("GPU-gone", 79, 50.0)]  # a GPU that fell off the bus: no gpuobs_gpu_info any more
    [fam] = [f for f in dcgm_families(samples, "node-a", xid_watched=True) if f.name == "DCGM_FI_DEV_XID_ERRORS"]
    got = {s.labels["UUID"]: s for s in fam.samples}
    assert {u: s.value for u, s in got.items()} == {"GPU-a": 31, "GPU-b": 0, "GPU-gone": 79}
    assert got["GPU-a"].labels["err_code"] == "31" and got["GPU-b"].labels["err_msg"] == "No Error"
    assert "GPU_I_ID" not in got["GPU-a"].labels  # DCGM reports XIDs per physical GPU
    assert got["GPU-gone"].labels["DCGM_FI_DRIVER_VERSION"] == "590.48.01"  # node-wide
    # without the XID watcher nothing says "no XID": only the XIDs seen are served
    [fam] = [f for f in dcgm_families(samples, "node-a") if f.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert {s.labels["UUID"] for s in fam.samples} == {"GPU-a", "GPU-gone"}
    assert not [f for f in dcgm_families(samples[:2], "node-a") if f.name == "DCGM_FI_DEV_XID_ERRORS"]


def test_dcgm_aliases_serve_one_sample_under_each_name():
    mask = Sample(c.CLOCK_EVENT_REASONS_MASK, ("0", "GPU-a"), 68.0)
    fams = {f.name: f for f in dcgm_families([_gpu_info("0", "GPU-a"), mask], "node-a")}
    for name in ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", *c.DCGM_ALIASES["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]):
        [s] = fams[name].samples
        assert s.value == 68 and s.labels["UUID"] == "GPU-a" and fams[name].type == "gauge"
