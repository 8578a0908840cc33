"""The NVML layer under the collectors: calls named once (by the function's __name__, which error
counts and capability answers are keyed by, and which metric labels show), the session as the only
writer of its counters and capability answers, and the per-GPU probe step and family state."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml as N
import pytest

import gpuobs.collect
from gpuobs.collect import REGISTRY, Sampler, Session, build_families
from gpuobs.collect.base import GpuCtx
from gpuobs.collect.gpm import metrics_get
from gpuobs.collect.memory import memory_v2
from gpuobs.nvml import ABI_FUNCTIONS, _missing, call_name
from gpuobs.sim import binding

COLLECT = Path(gpuobs.collect.__file__).parent


def _nvml_functions() -> set[str]:
    names = set()
    for path in COLLECT.glob("*.py"):
        names |= set(re.findall(r"\bN\.(nvml[A-Z]\w+)\b", path.read_text()))
    return {n for n in names if callable(getattr(N, n))}


def test_every_called_function_is_named_as_its_nvml_symbol():
    names = _nvml_functions()
    assert {"nvmlDeviceGetTemperature", "nvmlGpmQueryDeviceSupport", "nvmlDeviceGetMigMode"} <= names
    for name in names:
        assert call_name(getattr(N, name)) == name
    with binding.bytes_strings():  # an older binding's undecorated functions keep their names too
        for name in names:
            assert call_name(getattr(N, name)) == name
    for name in ABI_FUNCTIONS:
        assert call_name(_missing(name)) == name
    assert call_name(memory_v2) == "nvmlDeviceGetMemoryInfo_v2"
    assert call_name(metrics_get) == "nvmlGpmMetricsGet"


def test_errors_are_counted_under_the_call_name():
    session = Session()

    def nvmlDeviceGetThing(handle):  # noqa: N802 - named as the NVML symbol it stands for
        raise N.NVMLError(N.NVML_ERROR_INVALID_ARGUMENT)

    for name in (None, "nvmlDeviceGetThing_v2"):
        with pytest.raises(N.NVMLError):
            session.call(nvmlDeviceGetThing, object(), name=name)
    assert session.error_counts() == [(("nvmlDeviceGetThing", "INVALID_ARGUMENT"), 1),
                                      (("nvmlDeviceGetThing_v2", "INVALID_ARGUMENT"), 1)]
    assert session.calls == 2


def test_only_the_session_writes_its_counters_and_answers():
    session = Session()
    for attr in ("calls", "capability_version"):
        with pytest.raises(AttributeError):
            setattr(session, attr, 0)
    version = session.capability_version
    session.field_answer("GPU-a", 82, 0, N.NVML_ERROR_NOT_SUPPORTED)
    session.field_answer("GPU-a", 83, 0, N.NVML_ERROR_UNKNOWN)
    assert session.field_unavailable("GPU-a", 82, 0) and not session.field_unavailable("GPU-a", 83, 0)
    assert not session.field_unavailable("GPU-b", 82, 0)
    assert session.capability_version > version
    assert session.unavailable_counts() == {("nvmlDeviceGetFieldValues:82", "not_supported"): 1}
    assert session.error_counts() == [(("nvmlDeviceGetFieldValues:83", "UNKNOWN"), 1)]


def test_gpu_get_remembers_a_capability_answer_by_call_name(h100x2):
    session = Session()
    assert session.ensure()
    handle = N.nvmlDeviceGetHandleByIndex(0)
    gpu = GpuCtx(session, handle, 0, "GPU-x", 0, [], lambda *_: None)
    asked = []

    def nvmlDeviceGetMissing(h):  # noqa: N802
        asked.append(h)
        raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)

    assert gpu.get(nvmlDeviceGetMissing) is None and gpu.get(nvmlDeviceGetMissing) is None
    assert len(asked) == 1 and session.is_unavailable("GPU-x", "nvmlDeviceGetMissing:")
    assert session.unavailable_counts() == {("nvmlDeviceGetMissing", "not_supported"): 1}
    # first(): the older call answers once the newer one is known to be missing
    assert gpu.first(nvmlDeviceGetMissing, N.nvmlDeviceGetName) == N.nvmlDeviceGetName(handle)
    session.shutdown()


def _calls(sim, name: str) -> int:
    return sim.state.calls().get(name, 0)


def _every_family():
    """A session, every family but xid (no watcher) and a sampler over them, on the current simulator."""
    session = Session()
    families = build_families(set(REGISTRY) - {"xid"}, process_cap=4)
    return session, families, Sampler(session, families, interval=1)


def test_probe_runs_for_new_gpus_after_reinit_and_on_the_reprobe_cadence(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, init=False)
    session, _, sampler = _every_family()
    sampler.sample_once()
    assert _calls(sim, "nvmlGpmQueryDeviceSupport") == 2  # one probe per new GPU
    links = _calls(sim, "nvmlDeviceGetFieldValues")
    for _ in range(3):
        sampler.sample_once()
    assert _calls(sim, "nvmlGpmQueryDeviceSupport") == 2  # not again before reprobe_after
    assert _calls(sim, "nvmlDeviceGetFieldValues") == links + 3 * 2  # the batch only: no link-count read
    session.reprobe_after = 0.0
    sampler.sample_once()
    assert _calls(sim, "nvmlGpmQueryDeviceSupport") == 4
    session.reprobe_after = 3600.0
    session.shutdown()  # as after repeated driver-level errors: the next pass re-initialises
    sampler.sample_once()
    assert _calls(sim, "nvmlGpmQueryDeviceSupport") == 6
    session.shutdown()


def test_fields_do_no_io(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]}, init=False)
    session, families, sampler = _every_family()
    sampler.sample_once()
    nvlink = next(f for f in families if f.name == "nvlink")
    uuid = next(iter(sampler._known))
    assert len(nvlink.state(uuid).fields) == 6 * 18  # probed: 18 links on an H100 SXM
    sim.state.reset_calls()
    gpu = GpuCtx(session, None, 0, uuid, 1, [], lambda *_: None)
    wanted = [spec for fam in families for spec in fam.fields(gpu)]
    assert len(wanted) > 6 * 18 and sim.state.calls() == {}
    session.shutdown()


def test_family_state_released_when_a_gpu_goes_and_on_reinit(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, init=False)
    session, families, sampler = _every_family()
    sampler.sample_once()
    sampler.sample_once()  # GPM: two samples, buffers allocated
    gpm = next(f for f in families if f.name == "gpm")
    uuids = set(sampler._known)
    assert set(gpm._states) == uuids and all(st.samples for st in gpm._states.values())
    lost = sim.state.gpu(1).uuid.s.decode()
    sim.state.lose_gpu(1)  # GPU_IS_LOST: still counted by the driver, its state kept (it may come back)
    sampler.sample_once()
    assert lost in gpm._states
    sim.state.remove_gpu(1)  # off the bus: no longer counted
    sampler.sample_once()
    for fam in families:
        assert lost not in fam._states, fam.name
    assert set(gpm._states) == uuids - {lost}
    freed = _calls(sim, "nvmlGpmSampleFree")
    session.shutdown()
    sampler.sample_once()  # re-initialised: every GPU's state is void (its buffers freed) and made anew
    assert _calls(sim, "nvmlGpmSampleFree") >= freed + 2
    session.shutdown()


def test_a_failing_probe_is_counted_and_run_again(make_sim, monkeypatch):
    from gpuobs.collect.thermal import Thermal

    make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]}, init=False)
    runs = []

    def broken(self, gpu):
        runs.append(gpu.uuid)
        raise RuntimeError("probe failed")

    monkeypatch.setattr(Thermal, "probe", broken)
    session = Session()
    sampler = Sampler(session, build_families({"thermal", "power"}, process_cap=1), interval=1)
    snap = sampler.sample_once()
    sampler.sample_once()
    assert len(runs) == 2  # not trusted as probed: again on the next pass
    assert sampler.collector_errors["thermal"] == 2 and "power" not in sampler.collector_errors
    assert any(s.metric.name == "gpuobs_gpu_power_usage_watts" for s in snap.samples)  # the others go on
    session.shutdown()


def test_every_called_function_exists_in_the_oldest_binding_or_is_backfilled():
    """ARCHITECTURE.md's ABI rule: an NVML function a collector calls that pynvml 11.4.1 lacks is
    listed in gpuobs.nvml.ABI_FUNCTIONS (backfilled with a FUNCTION_NOT_FOUND stub), so that an
    older binding makes it an unavailable value, never an AttributeError in a family."""
    import json
    import os
    import subprocess
    import sys

    from legacy_binding import legacy_pynvml_path

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(legacy_pynvml_path()), str(COLLECT.parents[1])]))
    code = ("import json, sys, gpuobs.nvml, pynvml; "
            "print(json.dumps([n for n in json.loads(sys.argv[1]) if not hasattr(pynvml, n)]))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(sorted(_nvml_functions()))], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], "add these to gpuobs.nvml.ABI_FUNCTIONS"
    assert "nvmlDeviceGetMarginTemperature" in ABI_FUNCTIONS  # newer than 11.4.1: the check has work to do
