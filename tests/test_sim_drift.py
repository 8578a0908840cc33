"""Binding and driver drift (issue 13), seen through pynvml itself: older drivers without newer
symbols, the older calls they still have, reset-required GPUs, MIG-attributed XIDs, and bindings
that return bytes (a patched live pynvml, and the real pynvml 11.4.1 in a child process)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pynvml as N
import pytest
from legacy_binding import legacy_pynvml_path

from gpuobs.sim import Simulator, binding, builder
from gpuobs.sim.scenario import ScenarioError
from gpuobs.sim.state import EVENT_XID

MIB = 1024 * 1024
NODE = {"gpus": [{"profile": "h100-sxm-80gb", "count": 2}],
        "processes": [{"gpu": 0, "pid": 4242, "name": "python train.py", "used_mib": 1024},
                      {"gpu": 1, "pid": 77, "name": "Xorg", "used_mib": 64, "type": "G"}]}


def handle(i=0):
    return N.nvmlDeviceGetHandleByIndex(i)


def run_child(env: dict, code: str) -> dict:
    """Run code in a child Python with env; it prints one JSON object, returned here."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- builds without symbols ----------------------------------------------------------------------

def test_build_hide_is_its_own_cached_library_without_those_symbols(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOBS_CACHE_DIR", str(tmp_path))
    full = builder.build()
    hidden = ["nvmlDeviceGetMemoryInfo_v2", "nvmlGpmSampleGet"]
    lib = builder.build(hide=hidden)
    assert lib != full and lib.parent.parent == full.parent.parent and lib.name == "libnvidia-ml.so.1"
    mtime = lib.stat().st_mtime_ns
    assert builder.build(hide=reversed(hidden)) == lib and lib.stat().st_mtime_ns == mtime  # cached
    assert builder.build(hide=()) == full
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if " T " in line}
    assert exported == set(builder.implemented_functions()) - set(hidden) | {"nvmlErrorString"}
    handle_ = ctypes.CDLL(str(lib))
    assert hasattr(handle_, "nvmlDeviceGetMemoryInfo") and not hasattr(handle_, "nvmlDeviceGetMemoryInfo_v2")
    with pytest.raises(ValueError, match="nvmlNoSuchCall"):
        builder.build(hide=["nvmlNoSuchCall"])


def test_every_driver_generation_hides_only_implemented_functions():
    implemented = set(builder.implemented_functions())
    assert builder.DRIVERS["current"] == ()
    for name, lacks in builder.DRIVERS.items():
        assert set(lacks) <= implemented, name
        assert name == "current" or name in builder.DRIVER_VERSIONS
    # each branch lacks a subset of what an older one lacks (535.98 aside: it dropped the _v3 calls)
    order = ["r470", "r510", "r525", "r535", "r550", "current"]
    for older, newer in zip(order, order[1:]):
        assert set(builder.DRIVERS[newer]) < set(builder.DRIVERS[older])
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in builder.DRIVERS["r535.98"]
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in builder.DRIVERS["r535"]


def test_fabric_calls_follow_their_first_drivers():
    """nvmlDeviceGetGpuFabricInfo is in nvml.h from 525.53, ...InfoV from 550.40.07; the row-remapper
    histogram, encoder and FBC stats and the memory error counter predate R470."""
    lacking = {name: {f for f in ("nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV") if f in lacks}
               for name, lacks in builder.DRIVERS.items()}
    assert lacking == {"r470": {"nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"},
                       "r510": {"nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"},
                       "r525": {"nvmlDeviceGetGpuFabricInfoV"}, "r535": {"nvmlDeviceGetGpuFabricInfoV"},
                       "r535.98": {"nvmlDeviceGetGpuFabricInfoV"}, "r550": set(), "current": set()}
    older = {f for lacks in builder.DRIVERS.values() for f in lacks}
    assert not older & {"nvmlDeviceGetRowRemapperHistogram", "nvmlDeviceGetEncoderStats", "nvmlDeviceGetFBCStats",
                        "nvmlDeviceGetMemoryErrorCounter"}


@pytest.mark.parametrize("driver", sorted(builder.DRIVERS))
def test_child_sees_exactly_the_drivers_symbols(tmp_path, driver):
    sim = Simulator(NODE, directory=tmp_path, driver=driver)
    try:
        assert sim.env()["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(sim.child_library.parent)
        assert (sim.child_library == sim.library) == (driver == "current")
        got = run_child(sim.env(), f"""
            import json, pynvml
            pynvml.nvmlInit()
            missing = []
            for name in {builder.implemented_functions()!r}:
                try:
                    pynvml._nvmlGetFunctionPointer(name)
                except pynvml.NVMLError as e:
                    assert e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, e
                    missing.append(name)
            print(json.dumps({{"missing": missing, "driver": pynvml.nvmlSystemGetDriverVersion()}}))
        """)
    finally:
        sim.close()
    assert sorted(got["missing"]) == sorted(builder.DRIVERS[driver])
    assert got["driver"] == builder.DRIVER_VERSIONS.get(driver, ("590.48.01",))[0]


# What test_r470_child_falls_back_to_the_older_calls runs in a child on the R470 simulator: it reports,
# then waits on stdin while the test queues a MIG-attributed XID.
R470_CHILD = """
import ctypes, json, sys, pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
out = {"nvml": N.nvmlSystemGetNVMLVersion(), "cuda": N.nvmlSystemGetCudaDriverVersion()}
def code(call):
    try:
        call()
    except N.NVMLError as e:
        return e.value
    except Exception as e:
        return type(e).__name__
    return 0
out["errors"] = {
    "mem_v2": code(lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)),
    "events": code(lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h)),
    "supported_events": code(lambda: N.nvmlDeviceGetSupportedClocksEventReasons(h)),
    "procs_v3": code(lambda: N.nvmlDeviceGetComputeRunningProcesses_v3(h)),
    "procs": code(lambda: N.nvmlDeviceGetComputeRunningProcesses(h)),
    "gpm": code(lambda: N.nvmlGpmSampleAlloc()),
    "cores": code(lambda: N.nvmlDeviceGetNumGpuCores(h)),
}
m = N.nvmlDeviceGetMemoryInfo(h)
out["mem_v1"] = [m.total, m.free, m.used]
out["throttle"] = [N.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                   N.nvmlDeviceGetSupportedClocksThrottleReasons(h)]
out["procs_v2"] = [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                   for p in N.nvmlDeviceGetComputeRunningProcesses_v2(h)]
out["graphics_v2"] = [p.pid for p in N.nvmlDeviceGetGraphicsRunningProcesses_v2(
    N.nvmlDeviceGetHandleByIndex(1))]
out["pci_v3"] = N.nvmlDeviceGetPciInfo_v3(h).busId
es = N.nvmlEventSetCreate()
N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
print("ready", flush=True)
sys.stdin.readline()  # the parent has queued an XID
d = N.nvmlEventSetWait_v2(es, 5000)
out["xid"] = [d.eventData, d.gpuInstanceId, d.computeInstanceId]
print(json.dumps(out))
"""


def test_r470_child_falls_back_to_the_older_calls(tmp_path):
    """What an exporter meets on an R470 node, through nvidia-ml-py 13: the newer calls raise
    FUNCTION_NOT_FOUND (or, for the unversioned process calls, NVMLLibraryMismatchError) and the
    older calls answer with the same values."""
    sim = Simulator(NODE, directory=tmp_path, driver="r470")
    g = sim.state.gpu(0)
    try:
        g.clock_events.base = 0x4  # any mask: both calls read the same value
        total, reserved, used = (int(v.base) for v in (g.mem_total, g.mem_reserved, g.mem_used))
        supported, bus_id = int(g.clock_events_supported.base), g.bus_id.s.decode()
        del g
        proc = subprocess.Popen([sys.executable, "-c", R470_CHILD], env=sim.env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            sim.state.xid(0, 31, gi=2, ci=0)
            stdout, stderr = proc.communicate("go\n", timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 0, stderr
        got = json.loads(stdout.strip().splitlines()[-1])
    finally:
        sim.close()
    fnf = N.NVML_ERROR_FUNCTION_NOT_FOUND
    assert got["errors"] == {"mem_v2": fnf, "events": fnf, "supported_events": fnf, "procs_v3": fnf,
                             "procs": "NVMLLibraryMismatchError", "gpm": fnf, "cores": fnf}
    assert got["nvml"] == "11.470.256.02" and got["cuda"] == 11040
    assert got["mem_v1"] == [total, total - reserved - used, used + reserved]  # v1: reserved counts as used
    assert got["throttle"] == [4, supported]
    assert got["procs_v2"] == [[4242, 1024 * MIB, 0xFFFFFFFF, 0xFFFFFFFF]]
    assert got["graphics_v2"] == [77]
    assert got["pci_v3"] == bus_id
    assert got["xid"] == [31, 2, 0]


def test_scenario_driver_key_and_errors(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("driver: r525\ngpus: [{profile: h100-sxm-80gb}]\n")
    sim = Simulator.from_file(path, directory=tmp_path / "a")
    try:
        assert sim.driver == "r525" and sim.hidden == builder.DRIVERS["r525"]
        assert sim.child_library != sim.library
        assert bytes(sim.state.s.driver_version.s) == b"525.147.05"
        assert sim.state.s.cuda_version == 12000
    finally:
        sim.close()
    # an explicit version string wins over the generation's; the keyword wins over the key
    sim = Simulator({"driver": "r525", "driver_version": "525.60.13", "gpus": [{"profile": "a100-40gb"}]},
                    directory=tmp_path / "b", driver="r510")
    try:
        assert sim.driver == "r510" and bytes(sim.state.s.driver_version.s) == b"525.60.13"
        assert sim.state.s.cuda_version == 11060
    finally:
        sim.close()
    with pytest.raises(ScenarioError, match="unknown driver 'r390'"):
        Simulator({"driver": "r390", "gpus": [{"profile": "a100-40gb"}]}, directory=tmp_path / "c")
    with pytest.raises(ScenarioError, match="unknown driver"):
        Simulator({"gpus": [{"profile": "a100-40gb"}]}, directory=tmp_path / "d", driver="nope")


# ---- the older calls, in-process (the full library has both) ---------------------------------------

class ProcV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def raw_procs(name, h, record, capacity):
    """Call a process-list symbol directly with room for `capacity` records of `record`, followed by
    guard bytes; returns (return code, count, records, the bytes after the records written)."""
    fn = N._nvmlGetFunctionPointer(name)
    size = ctypes.sizeof(record) * capacity + 64
    buf = (ctypes.c_ubyte * size)(*([0xAB] * size))
    n = ctypes.c_uint(capacity)
    ret = fn(h, ctypes.byref(n), buf)
    records = (record * capacity).from_buffer(buf)
    written = min(n.value, capacity) if ret == 0 else 0
    return ret, n.value, [records[i] for i in range(written)], bytes(buf)[ctypes.sizeof(record) * written:]


def test_v1_and_v2_process_lists_fill_their_own_structs(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb"}],
                    "processes": [{"gpu": 0, "pid": 10, "used_mib": 100}, {"gpu": 0, "pid": 11, "used_mib": 200},
                                  {"gpu": 0, "pid": 12, "used_mib": 300, "type": "G"},
                                  {"gpu": 0, "pid": 13, "used_mib": 400, "type": "CG"}]})
    sim.state.gpu(0).procs[0].kind |= 4  # pid 10 also an MPS client
    h = handle(0)
    for name, pids in [("nvmlDeviceGetComputeRunningProcesses", [10, 11, 13]),
                       ("nvmlDeviceGetGraphicsRunningProcesses", [12, 13]),
                       ("nvmlDeviceGetMPSComputeRunningProcesses", [10])]:
        # size query, then the v1 records: 16 bytes each, nothing written past the last one
        n = ctypes.c_uint(0)
        assert N._nvmlGetFunctionPointer(name)(h, ctypes.byref(n), None) == N.NVML_ERROR_INSUFFICIENT_SIZE
        assert n.value == len(pids)
        ret, count, recs, rest = raw_procs(name, h, ProcV1, len(pids))
        assert ret == 0 and count == len(pids)
        assert [(r.pid, r.usedGpuMemory) for r in recs] == [(p, (p - 9) * 100 * MIB) for p in pids]
        assert set(rest) == {0xAB}
        # too small a buffer: INSUFFICIENT_SIZE with the count
        ret, count, _, _ = raw_procs(name, h, ProcV1, len(pids) - 1)
        assert ret == N.NVML_ERROR_INSUFFICIENT_SIZE and count == len(pids)
    compute_v2 = N.nvmlDeviceGetComputeRunningProcesses_v2(h)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in compute_v2] == [
        (10, 100 * MIB, 0xFFFFFFFF, 0xFFFFFFFF), (11, 200 * MIB, 0xFFFFFFFF, 0xFFFFFFFF),
        (13, 400 * MIB, 0xFFFFFFFF, 0xFFFFFFFF)]
    assert [p.pid for p in N.nvmlDeviceGetGraphicsRunningProcesses_v2(h)] == [12, 13]
    assert [p.pid for p in N.nvmlDeviceGetMPSComputeRunningProcesses_v2(h)] == [10]
    assert [p.pid for p in N.nvmlDeviceGetMPSComputeRunningProcesses_v3(h)] == [10]
    assert sim.state.calls()["nvmlDeviceGetComputeRunningProcesses"] == 3


def test_v1_processes_on_mig_devices(make_sim):
    make_sim({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "2g.20gb"]}],
              "processes": [{"gpu": 0, "pid": 10, "gi_id": 3, "ci_id": 0, "used_mib": 100},
                            {"gpu": 0, "pid": 11, "gi_id": 1, "ci_id": 0, "used_mib": 200}]})
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 1)  # the 2g.20gb, GPU instance 3
    ret, count, recs, _ = raw_procs("nvmlDeviceGetComputeRunningProcesses", mig, ProcV1, 4)
    assert ret == 0 and [(r.pid, r.usedGpuMemory) for r in recs] == [(10, 100 * MIB)]
    assert [(p.pid, p.gpuInstanceId) for p in N.nvmlDeviceGetComputeRunningProcesses_v2(mig)] == [(10, 3)]


def test_memory_v1_and_throttle_reasons_match_the_newer_calls(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb"}]})
    g = sim.state.gpu(0)
    g.clock_events.base = 0x20  # SW thermal slowdown
    h = handle(0)
    v1, v2 = N.nvmlDeviceGetMemoryInfo(h), N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    assert v1.total == v2.total and v1.used == v2.used + v2.reserved and v1.free == v2.free
    assert N.nvmlDeviceGetCurrentClocksThrottleReasons(h) == N.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x20
    assert N.nvmlDeviceGetSupportedClocksThrottleReasons(h) == N.nvmlDeviceGetSupportedClocksEventReasons(h)
    assert N.nvmlDeviceGetPciInfo_v3(h).busId == N.nvmlDeviceGetPciInfo(h).busId


class EventV1(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong)]


def test_event_wait_v1_fills_only_the_pre_mig_struct(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb"]}]})
    h = handle(0)
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
    wait_v1 = N._nvmlGetFunctionPointer("nvmlEventSetWait")
    buf = (ctypes.c_ubyte * (ctypes.sizeof(EventV1) + 16))(*([0xCD] * (ctypes.sizeof(EventV1) + 16)))
    assert ctypes.sizeof(EventV1) == 24
    assert wait_v1(es, buf, ctypes.c_uint(20)) == N.NVML_ERROR_TIMEOUT
    sim.state.xid(0, 43, gi=1, ci=0)
    assert wait_v1(es, buf, ctypes.c_uint(2000)) == 0
    d = EventV1.from_buffer(buf)
    assert (d.eventType, d.eventData) == (EVENT_XID, 43)
    assert d.device == ctypes.cast(h, ctypes.c_void_p).value
    assert set(bytes(buf)[24:]) == {0xCD}  # no gpuInstanceId / computeInstanceId written
    assert sim.state.calls()["nvmlEventSetWait"] == 2
    N.nvmlEventSetFree(es)


# ---- reset required, no permission -------------------------------------------------------------

def test_reset_required_answers_16_on_every_call_with_the_handle(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2, "mig": ["7g.80gb"]}]})
    h0, mig = handle(0), N.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    sim.state.require_reset(0)
    calls = [lambda h: N.nvmlDeviceGetName(h), lambda h: N.nvmlDeviceGetUUID(h),
             lambda h: N.nvmlDeviceGetPowerUsage(h), lambda h: N.nvmlDeviceGetMemoryInfo(h),
             lambda h: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
             lambda h: N.nvmlDeviceGetComputeRunningProcesses(h), lambda h: N.nvmlDeviceGetFieldValues(h, [82]),
             lambda h: N.nvmlDeviceGetUtilizationRates(h), lambda h: N.nvmlDeviceGetIndex(h),
             lambda h: N.nvmlDeviceGetMigMode(h), lambda h: N.nvmlGpmSampleGet(h, N.nvmlGpmSampleAlloc())]
    for call in calls:
        with pytest.raises(N.NVMLError_ResetRequired) as e:
            call(h0)
        assert e.value.value == N.NVML_ERROR_RESET_REQUIRED == 16
    with pytest.raises(N.NVMLError_ResetRequired):
        N.nvmlDeviceGetUUID(mig)  # its MIG devices too
    assert ctypes.cast(handle(0), ctypes.c_void_p).value == ctypes.cast(h0, ctypes.c_void_p).value  # lookup works
    assert N.nvmlDeviceGetPowerUsage(handle(1)) > 0  # the other GPU answers
    sim.state.require_reset(0, False)
    assert N.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    sim.state.lose_gpu(0)  # lost wins over reset-required
    sim.state.require_reset(0)
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetName(h0)


def test_no_permission_for_one_gpu_and_function(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]})
    idx = sim.state.no_permission(0, "nvmlDeviceGetTotalEnergyConsumption")
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetTotalEnergyConsumption(handle(0))
    assert N.nvmlDeviceGetTotalEnergyConsumption(handle(1)) > 0
    assert N.nvmlDeviceGetPowerUsage(handle(0)) > 0
    sim.state.clear_fault(idx)
    assert N.nvmlDeviceGetTotalEnergyConsumption(handle(0)) > 0
    with pytest.raises(IndexError):
        sim.state.no_permission(5, "nvmlDeviceGetPowerUsage")


# ---- MIG XIDs -----------------------------------------------------------------------------------

def test_mig_xid_carries_gpu_and_compute_instance(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "2g.20gb"]}]})
    h = handle(0)
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
    sim.state.xid(0, 31, gi=3, ci=0)
    sim.state.xid(0, 43, gi=1)
    sim.state.xid(0, 79)
    got = []
    for _ in range(3):
        d = N.nvmlEventSetWait_v2(es, 1000)
        assert N.nvmlDeviceGetIndex(d.device) == 0  # the physical GPU, as NVML reports it
        got.append((d.eventData, d.gpuInstanceId, d.computeInstanceId))
    assert got == [(31, 3, 0), (43, 1, 0xFFFFFFFF), (79, 0xFFFFFFFF, 0xFFFFFFFF)]
    with pytest.raises(ValueError):
        sim.state.xid(0, 31, ci=0)
    N.nvmlEventSetFree(es)


# ---- bytes-returning bindings -------------------------------------------------------------------

def test_bytes_strings_returns_bytes_and_restores(make_sim):
    make_sim(NODE)
    h = handle(0)
    before = {"name": N.nvmlDeviceGetName(h), "uuid": N.nvmlDeviceGetUUID(h), "bus": N.nvmlDeviceGetPciInfo(h).busId}
    assert all(type(v) is str for v in before.values())
    original = N.nvmlDeviceGetName
    with binding.bytes_strings():
        values = [N.nvmlDeviceGetName(h), N.nvmlDeviceGetUUID(h), N.nvmlDeviceGetSerial(h),
                  N.nvmlDeviceGetVbiosVersion(h), N.nvmlDeviceGetBoardPartNumber(h),
                  N.nvmlDeviceGetInforomImageVersion(h), N.nvmlSystemGetDriverVersion(),
                  N.nvmlSystemGetNVMLVersion(), N.nvmlSystemGetProcessName(4242)]
        assert all(type(v) is bytes for v in values), values
        assert values[0] == before["name"].encode() and values[1] == before["uuid"].encode()
        assert values[-1] == b"python train.py"
        pci = N.nvmlDeviceGetPciInfo(h)
        assert pci.busId == before["bus"].encode() and type(pci.busIdLegacy) is bytes
        assert type(N.nvmlDeviceGetComputeRunningProcesses(h)[0].pid) is int  # numbers unchanged
        with pytest.raises(TypeError):  # old releases took bytes only
            N.nvmlDeviceGetHandleByUUID(before["uuid"])
        assert N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(before["uuid"].encode())) == 0
    assert N.nvmlDeviceGetName is original
    assert N.nvmlDeviceGetName(h) == before["name"] and N.nvmlDeviceGetPciInfo(h).busId == before["bus"]
    assert N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(before["uuid"])) == 0


def test_bytes_strings_restores_after_an_exception(make_sim):
    make_sim(NODE)
    with pytest.raises(RuntimeError), binding.bytes_strings():
        raise RuntimeError
    assert type(N.nvmlDeviceGetName(handle(0))) is str and type(N.nvmlDeviceGetPciInfo(handle(0)).busId) is str


def test_hidden_symbols_in_process(make_sim):
    make_sim(NODE)
    h = handle(0)
    with binding.hidden_symbols(builder.DRIVERS["r470"]):
        with pytest.raises(N.NVMLError_FunctionNotFound):
            N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
        with pytest.raises(N.NVMLError_FunctionNotFound):
            N.nvmlDeviceGetCurrentClocksEventReasons(h)
        assert N.nvmlDeviceGetMemoryInfo(h).total > 0
        assert [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [4242]
    assert N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).total > 0


def test_legacy_pynvml_returns_bytes_in_a_child(tmp_path):
    path = legacy_pynvml_path()
    assert legacy_pynvml_path() == path  # installed once, reused
    sim = Simulator(NODE, directory=tmp_path, driver="r470")
    env = sim.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    try:
        got = run_child(env, """
            import json, pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(h)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)  # 11.4.1: the _v2 symbol
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)                  # 11.4.1: v1 only
            print(json.dumps({
                "file": pynvml.__file__, "version": pynvml.__version__,
                "name_type": type(name).__name__, "name": name.decode(),
                "uuid_type": type(pynvml.nvmlDeviceGetUUID(h)).__name__,
                "driver": repr(pynvml.nvmlSystemGetDriverVersion()),
                "bus_type": type(pynvml.nvmlDeviceGetPciInfo(h).busId).__name__,
                "procs": [[p.pid, p.usedGpuMemory] for p in procs],
                "mem_total": mem.total,
                "has_gpm": hasattr(pynvml, "nvmlGpmSampleAlloc"), "has_mem_v2": hasattr(pynvml, "nvmlMemory_v2"),
            }))
        """)
    finally:
        sim.close()
    assert got["file"].startswith(str(path)) and got["version"] == "11.4.1"
    assert got["name_type"] == got["uuid_type"] == got["bus_type"] == "bytes"
    assert got["name"] == "NVIDIA H100 80GB HBM3" and got["driver"] == "b'470.256.02'"
    assert got["procs"] == [[4242, 1024 * MIB]] and got["mem_total"] > 0
    assert not got["has_gpm"] and not got["has_mem_v2"]
