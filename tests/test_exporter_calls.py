"""How many NVML calls a sampling pass makes, counted by the simulator: within the budget (12 per
physical GPU, 3 more per MIG instance), and what the cheaper reads must not lose: a MIG
reconfiguration is still seen with the new instance's ids and profile, the memory clock follows
the P-state, the ECC breakdown follows its totals. And the process settings the exporter runs under."""

from __future__ import annotations

import pytest

from gpuobs.collect import Sampler, Session, build_families, default_families
from gpuobs.sim.state import set_val

PASSES = 20  # two slow passes (every 10th) among them, as in any 20 s of a 1 s interval


def _sampler() -> tuple[Session, Sampler]:
    session = Session()
    return session, Sampler(session, build_families(default_families(), process_cap=8), interval=1)


def _values(snap, name: str, **match) -> dict[tuple, float]:
    return {s.labels: s.value for s in snap.samples if s.metric.name == name
            and all(dict(zip(s.metric.labels, s.labels)).get(k) == v for k, v in match.items())}


@pytest.mark.parametrize(("gpus", "mig", "budget"), [(8, None, 12), (2, ["1g.10gb"] * 7, 12 + 3 * 7)])
def test_calls_per_physical_gpu_per_sample_within_the_budget(make_sim, gpus, mig, budget):
    g = {"profile": "h100-sxm-80gb", "count": gpus, "behaviour": "steady"}
    if mig:
        g["mig"] = mig
    sim = make_sim({"gpus": [g]})
    session, sampler = _sampler()
    for _ in range(3):  # probes and first reads
        sampler.sample_once()
    sim.state.reset_calls()
    for _ in range(PASSES):
        sampler.sample_once()
    per_gpu = sum(sim.state.calls().values()) / PASSES / gpus
    assert per_gpu <= budget, sorted(sim.state.calls().items(), key=lambda kv: -kv[1])
    assert per_gpu > budget / 3  # it did read: a broken count would pass the first assertion
    session.shutdown()


def test_mig_reconfiguration_is_seen_with_the_new_instance_ids_and_profile(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 1, "mig": ["1g.10gb"] * 3}]})
    session, sampler = _sampler()
    for _ in range(11):
        snap = sampler.sample_once()
    before = _values(snap, "gpuobs_mig")
    assert len(before) == 3
    g = sim.state.gpu(0)
    old_uuid = g.migs[0].uuid.s.decode()
    # instance 0 destroyed and a 2g.20gb one made in its place (new UUID, new GPU instance id);
    # the last one destroyed
    m = g.migs[0]
    m.gi_id, m.ci_id = 9, 0
    m.uuid.s = b"MIG-00000000-0000-0000-0000-000000000009"
    m.profile.s = b"2g.20gb"
    g.mig_count = 2
    for _ in range(10):  # up to the next slow pass
        snap = sampler.sample_once()
    after = {(labels[2], labels[4], labels[5]) for labels in _values(snap, "gpuobs_mig")}
    assert ("9", "MIG-00000000-0000-0000-0000-000000000009", "2g.20gb") in after and len(after) == 2
    assert old_uuid not in {u for _, u, _ in after}
    session.shutdown()


def test_memory_clock_follows_the_p_state_between_slow_passes(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]})
    session, sampler = _sampler()
    for _ in range(12):
        sampler.sample_once()
    g = sim.state.gpu(0)
    set_val(g.clock[2], 810)  # memory clock (MHz), NVML_CLOCK_MEM
    snap = sampler.sample_once()
    assert list(_values(snap, "gpuobs_gpu_clock_hertz", clock="memory").values()) != [810e6]  # not re-read yet
    set_val(g.pstate, 8)
    snap = sampler.sample_once()
    assert list(_values(snap, "gpuobs_gpu_clock_hertz", clock="memory").values()) == [810e6]
    session.shutdown()


def test_ecc_breakdown_is_read_again_when_its_totals_move(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]})
    session, sampler = _sampler()
    for _ in range(12):
        sampler.sample_once()
    g = sim.state.gpu(0)
    set_val(g.ecc_location[4], 5)  # dram corrected volatile
    snap = sampler.sample_once()
    stale = _values(snap, "gpuobs_gpu_ecc_location_errors", location="dram", error_type="corrected",
                    counter_type="volatile")
    assert len(stale) == 1 and list(stale.values()) != [5]  # its total did not move: not asked again
    set_val(g.ecc[0], 5)  # the corrected volatile total moves with it, as on a GPU
    snap = sampler.sample_once()
    assert list(_values(snap, "gpuobs_gpu_ecc_location_errors", location="dram", error_type="corrected",
                        counter_type="volatile").values()) == [5]
    session.shutdown()


def test_tune_process_sets_what_the_exporter_runs_under():
    import gc
    import sys

    from gpuobs.exporter import tune_process

    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        tune_process()
        assert gc.get_threshold() == (20_000, 20, 20) and gc.get_freeze_count() > 0
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:  # this test process keeps its own settings
        gc.unfreeze()
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)
