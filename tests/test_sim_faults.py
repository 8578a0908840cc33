"""Each injected fault behaves as NVML documents it, seen through pynvml."""

from __future__ import annotations

import ctypes
import threading
import time

import pynvml as N
import pytest

from gpuobs.sim.state import EVENT_XID, add_to_counter, set_val

H100 = {"gpus": [{"profile": "h100-sxm-80gb", "count": 3}]}


def handle(i=0):
    return N.nvmlDeviceGetHandleByIndex(i)


@pytest.mark.parametrize("code,cls", [
    (N.NVML_ERROR_NOT_SUPPORTED, N.NVMLError_NotSupported),
    (N.NVML_ERROR_NO_PERMISSION, N.NVMLError_NoPermission),
    (N.NVML_ERROR_UNKNOWN, N.NVMLError_Unknown),
    (N.NVML_ERROR_GPU_IS_LOST, N.NVMLError_GpuIsLost),
    (N.NVML_ERROR_TIMEOUT, N.NVMLError_Timeout),
])
def test_error_codes_raise_their_subclass(make_sim, code, cls):
    sim = make_sim(H100)
    sim.state.fail("nvmlDeviceGetPowerUsage", code, gpu=0)
    with pytest.raises(cls):
        N.nvmlDeviceGetPowerUsage(handle(0))
    assert N.nvmlDeviceGetPowerUsage(handle(1)) > 0  # other GPUs unaffected


def test_fail_n_times_then_recover(make_sim):
    sim = make_sim(H100)
    sim.state.fail("nvmlDeviceGetTemperature", N.NVML_ERROR_UNKNOWN, times=2)
    for _ in range(2):
        with pytest.raises(N.NVMLError_Unknown):
            N.nvmlDeviceGetTemperature(handle(0), 0)
    assert N.nvmlDeviceGetTemperature(handle(0), 0) == 33


def test_fail_forever_until_cleared(make_sim):
    sim = make_sim(H100)
    h2 = handle(2)
    idx = sim.state.fail(None, N.NVML_ERROR_UNKNOWN, gpu=2)  # every function, GPU 2 only
    with pytest.raises(N.NVMLError_Unknown):
        handle(2)
    for _ in range(5):
        with pytest.raises(N.NVMLError_Unknown):
            N.nvmlDeviceGetName(h2)
    assert N.nvmlDeviceGetName(handle(0)) == "NVIDIA H100 80GB HBM3"
    sim.state.clear_fault(idx)
    assert N.nvmlDeviceGetName(h2) == "NVIDIA H100 80GB HBM3"


LOST_CALLS = [
    lambda h: N.nvmlDeviceGetName(h), lambda h: N.nvmlDeviceGetUUID(h), lambda h: N.nvmlDeviceGetPowerUsage(h),
    lambda h: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2), lambda h: N.nvmlDeviceGetTemperature(h, 0),
    lambda h: N.nvmlDeviceGetClockInfo(h, 0), lambda h: N.nvmlDeviceGetFieldValues(h, [82]),
    lambda h: N.nvmlDeviceGetComputeRunningProcesses(h), lambda h: N.nvmlDeviceGetNvLinkState(h, 0),
    lambda h: N.nvmlDeviceGetMigMode(h), lambda h: N.nvmlDeviceGetUtilizationRates(h),
    lambda h: N.nvmlDeviceGetPciInfo(h), lambda h: N.nvmlDeviceGetTotalEccErrors(h, 1, 1),
    lambda h: N.nvmlGpmSampleGet(h, N.nvmlGpmSampleAlloc()), lambda h: N.nvmlDeviceGetIndex(h),
]


def test_lost_gpu_answers_gpu_is_lost_on_every_call(make_sim):
    sim = make_sim(H100)
    h1 = handle(1)
    sim.state.lose_gpu(1)
    for call in LOST_CALLS:
        with pytest.raises(N.NVMLError_GpuIsLost):
            call(h1)
    with pytest.raises(N.NVMLError_GpuIsLost):
        handle(1)
    assert N.nvmlDeviceGetCount() == 3  # a lost GPU still counts until it is removed
    assert N.nvmlDeviceGetName(handle(2)) == "NVIDIA H100 80GB HBM3"


def test_removed_gpu_shifts_indexes(make_sim):
    sim = make_sim(H100)
    uuids = [N.nvmlDeviceGetUUID(handle(i)) for i in range(3)]
    sim.state.remove_gpu(0)
    assert N.nvmlDeviceGetCount() == 2
    assert [N.nvmlDeviceGetUUID(handle(i)) for i in range(2)] == uuids[1:]
    assert N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuids[2])) == 1
    with pytest.raises(N.NVMLError_InvalidArgument):
        handle(2)
    sim.state.remove_gpu(0, present=True)
    assert N.nvmlDeviceGetUUID(handle(0)) == uuids[0]


def test_all_gpus_gone(make_sim):
    sim = make_sim(H100)
    for s in range(3):
        sim.state.remove_gpu(s)
    assert N.nvmlDeviceGetCount() == 0


def test_field_value_per_value_not_supported(make_sim):
    sim = make_sim(H100)
    sim.state.fail("nvmlDeviceGetFieldValues", N.NVML_ERROR_NOT_SUPPORTED, field=N.NVML_FI_DEV_MEMORY_TEMP)
    set_val(sim.state.gpu(0).temp_mem, None)  # and one value unsupported by the GPU itself
    fv = N.nvmlDeviceGetFieldValues(handle(1), [N.NVML_FI_DEV_MEMORY_TEMP, N.NVML_FI_DEV_POWER_INSTANT])
    assert [f.nvmlReturn for f in fv] == [N.NVML_ERROR_NOT_SUPPORTED, N.NVML_SUCCESS]
    fv = N.nvmlDeviceGetFieldValues(handle(0), [N.NVML_FI_DEV_POWER_INSTANT, N.NVML_FI_DEV_MEMORY_TEMP, 999])
    assert [f.nvmlReturn for f in fv] == [N.NVML_SUCCESS, N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_NOT_SUPPORTED]
    assert fv[0].value.uiVal > 0


@pytest.mark.parametrize("code,cls", [
    (N.NVML_ERROR_DRIVER_NOT_LOADED, N.NVMLError_DriverNotLoaded),
    (N.NVML_ERROR_LIB_RM_VERSION_MISMATCH, N.NVMLError_LibRmVersionMismatch),
    (N.NVML_ERROR_UNKNOWN, N.NVMLError_Unknown),
])
def test_init_failure_then_recovery(make_sim, code, cls):
    sim = make_sim(H100, init=False)
    sim.state.fail_init(code)
    for _ in range(2):
        with pytest.raises(cls):
            N.nvmlInit()
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetCount()
    sim.state.clear_init_error()
    N.nvmlInit()
    assert N.nvmlDeviceGetCount() == 3


def test_init_fails_n_times(make_sim):
    sim = make_sim(H100, init=False)
    sim.state.fail_init(N.NVML_ERROR_DRIVER_NOT_LOADED, times=1)
    with pytest.raises(N.NVMLError_DriverNotLoaded):
        N.nvmlInit()
    N.nvmlInit()
    assert N.nvmlDeviceGetCount() == 3


def test_slow_call(make_sim):
    sim = make_sim(H100)
    sim.state.fail("nvmlDeviceGetPowerUsage", 0, delay_ms=150, times=1)
    t = time.monotonic()
    assert N.nvmlDeviceGetPowerUsage(handle(0)) > 0
    assert time.monotonic() - t >= 0.15
    t = time.monotonic()
    N.nvmlDeviceGetPowerUsage(handle(0))
    assert time.monotonic() - t < 0.1


def test_hung_call_blocks_until_cleared(make_sim):
    sim = make_sim(H100)
    idx = sim.state.fail("nvmlDeviceGetUtilizationRates", N.NVML_ERROR_TIMEOUT, hang=True)
    result = {}

    def caller():
        try:
            N.nvmlDeviceGetUtilizationRates(handle(0))
        except N.NVMLError as e:
            result["error"] = e

    t = threading.Thread(target=caller, daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive()  # still hanging
    assert N.nvmlDeviceGetPowerUsage(handle(0)) > 0  # other calls still answer meanwhile
    sim.state.clear_fault(idx)
    t.join(2)
    assert not t.is_alive() and isinstance(result["error"], N.NVMLError_Timeout)


def test_xid_events_are_delivered_once_each(make_sim):
    sim = make_sim(H100)
    es = N.nvmlEventSetCreate()
    for i in range(3):
        N.nvmlDeviceRegisterEvents(handle(i), N.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(es, 20)
    sim.state.xid(1, 79)
    sim.state.xid(2, 48)
    got = []
    for _ in range(2):
        d = N.nvmlEventSetWait(es, 500)
        got.append((N.nvmlDeviceGetIndex(d.device), d.eventType, d.eventData))
    assert got == [(1, EVENT_XID, 79), (2, EVENT_XID, 48)]
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(es, 20)
    N.nvmlEventSetFree(es)


def test_events_only_for_registered_gpus_and_types(make_sim):
    sim = make_sim(H100)
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(handle(0), N.nvmlEventTypeXidCriticalError, es)
    sim.state.xid(1, 79)  # not registered
    sim.state.queue_event(0, N.nvmlEventTypePState, 2)  # type not registered
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(es, 30)
    with pytest.raises(N.NVMLError_NotSupported):  # unsupported type for this GPU
        N.nvmlDeviceRegisterEvents(handle(0), N.nvmlEventTypeGpuUnavailableError, es)


def test_waiting_thread_receives_event_queued_later(make_sim):
    sim = make_sim(H100)
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(handle(0), N.nvmlEventTypeXidCriticalError, es)
    threading.Timer(0.1, lambda: sim.state.xid(0, 94)).start()
    assert N.nvmlEventSetWait(es, 2000).eventData == 94


def test_ecc_and_remap_counters_rise(make_sim):
    sim = make_sim(H100)
    g = sim.state.gpu(0)
    before = N.nvmlDeviceGetTotalEccErrors(handle(0), 1, 1)
    add_to_counter(g.ecc[3], 2)
    set_val(g.remap_unc, 1)
    set_val(g.remap_pending, 1)
    assert N.nvmlDeviceGetTotalEccErrors(handle(0), 1, 1) == before + 2
    assert N.nvmlDeviceGetRemappedRows(handle(0)) == (0, 1, 1, 0)


def test_clock_event_bits_and_nvlink_down(make_sim):
    sim = make_sim(H100)
    g = sim.state.gpu(0)
    set_val(g.clock_events, N.nvmlClocksEventReasonHwThermalSlowdown | N.nvmlClocksEventReasonSwPowerCap)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(handle(0)) == 0x44
    set_val(g.links[5].state, 0)
    assert N.nvmlDeviceGetNvLinkState(handle(0), 5) == N.NVML_FEATURE_DISABLED
    assert N.nvmlDeviceGetNvLinkState(handle(0), 4) == N.NVML_FEATURE_ENABLED


def test_invalid_utf8_name_reaches_the_caller_as_raw_bytes(make_sim):
    sim = make_sim(H100)
    sim.state.set_name(0, b"NVIDIA \xff\xfe H100")
    with pytest.raises(UnicodeDecodeError):
        N.nvmlDeviceGetName(handle(0))  # what pynvml does with such a name: the exporter must cope
    buf = ctypes.create_string_buffer(96)
    assert N.nvmlLib.nvmlDeviceGetName(handle(0), buf, 96) == 0
    assert buf.value == b"NVIDIA \xff\xfe H100"


def test_unissued_handles_are_rejected(make_sim):
    make_sim(H100)
    fake = ctypes.cast(ctypes.create_string_buffer(64), N.c_nvmlDevice_t)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetName(fake)
    # an address just past a real handle, and a wild pointer, are rejected without a crash
    real = ctypes.cast(handle(0), ctypes.c_void_p).value
    for addr in (real + 4, 0x10, 0xDEADBEEF000):
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetPowerUsage(ctypes.cast(addr, N.c_nvmlDevice_t))
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlEventSetWait(ctypes.cast(ctypes.c_void_p(0x1234), N.c_nvmlEventSet_t), 1)


def test_calls_before_init_are_uninitialized(make_sim):
    make_sim(H100, init=False)
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetCount()


def test_not_supported_function_per_gpu_is_remembered_by_state(make_sim):
    make_sim({"gpus": [{"profile": "rtx-4080-super"}, {"profile": "h100-sxm-80gb"}]})
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetTotalEnergyConsumption(handle(0))
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetEccMode(handle(0))
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetNvLinkState(handle(0), 0)
    assert N.nvmlDeviceGetTotalEnergyConsumption(handle(1)) > 0


def test_thread_safety_under_concurrent_callers(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 8, "behaviour": "noise"}]})
    sim.state.reset_calls()
    errors = []
    es = N.nvmlEventSetCreate()
    for i in range(8):
        N.nvmlDeviceRegisterEvents(handle(i), N.nvmlEventTypeXidCriticalError, es)
    seen = []

    def sampler():
        try:
            for _ in range(200):
                for i in range(8):
                    h = handle(i)
                    N.nvmlDeviceGetPowerUsage(h)
                    N.nvmlDeviceGetFieldValues(h, [82, 83, 94])
                    s = N.nvmlGpmSampleAlloc()
                    N.nvmlGpmSampleGet(h, s)
                    N.nvmlGpmSampleFree(s)
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)

    def events():
        while len(seen) < 50:
            try:
                seen.append(N.nvmlEventSetWait(es, 1000).eventData)
            except N.NVMLError_Timeout:
                break

    threads = [threading.Thread(target=sampler) for _ in range(3)] + [threading.Thread(target=events)]
    for t in threads:
        t.start()
    for k in range(50):
        sim.state.xid(k % 8, 1000 + k)
    for t in threads:
        t.join(60)
    assert not errors
    assert seen == [1000 + k for k in range(50)]
    calls = sim.state.calls()
    assert calls["nvmlDeviceGetPowerUsage"] == 3 * 200 * 8  # exact: atomic accounting
    assert calls["nvmlGpmSampleAlloc"] == calls["nvmlGpmSampleFree"] == 3 * 200 * 8


def test_gpm_metrics_get_rejects_more_metrics_than_the_struct_holds(make_sim):
    make_sim(H100)
    h = handle(0)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, s1)
    N.nvmlGpmSampleGet(h, s2)
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, N.NVML_GPM_METRIC_MAX + 1, s1, s2
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmMetricsGet(mg)


def test_hang_for_one_call_blocks_that_call_until_cleared(make_sim):
    sim = make_sim(H100)
    idx = sim.state.fail("nvmlDeviceGetPowerUsage", 0, hang=True, times=1)
    done = threading.Event()
    t = threading.Thread(target=lambda: (N.nvmlDeviceGetPowerUsage(handle(0)), done.set()), daemon=True)
    t.start()
    assert not done.wait(0.3)
    sim.state.clear_fault(idx)
    assert done.wait(2)
    assert N.nvmlDeviceGetPowerUsage(handle(0)) > 0  # used up: later calls answer at once


def test_hung_init_blocks_only_its_caller(make_sim):
    sim = make_sim(H100)
    idx = sim.state.fail("nvmlInitWithFlags", 0, hang=True)
    t = threading.Thread(target=N.nvmlInit, daemon=True)
    t.start()
    time.sleep(0.1)
    start = time.monotonic()
    assert N.nvmlSystemGetCudaDriverVersion() == 13010
    assert N.nvmlDeviceGetCount() == 3
    assert time.monotonic() - start < 0.5
    sim.state.clear_fault(idx)
    t.join(2)
    assert not t.is_alive()


def test_non_finite_values_clamp_instead_of_undefined_casts(make_sim):
    sim = make_sim(H100)
    g = sim.state.gpu(0)
    set_val(g.temp_gpu, float("nan"))
    set_val(g.temp_margin, -1e30)
    set_val(g.energy_mj, 1e30)
    assert N.nvmlDeviceGetTemperature(handle(0), 0) == 0
    assert N.nvmlDeviceGetMarginTemperature(handle(0)) == -(2 ** 31)
    assert N.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == 2 ** 64 - 1
    assert N.nvmlDeviceGetFieldValues(handle(0), [N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])[0].value.ullVal == 2 ** 64 - 1


def test_process_utilization_never_writes_past_the_callers_array(make_sim):
    make_sim({"gpus": [{"profile": "h100-sxm-80gb"}],
              "processes": [{"gpu": 0, "pid": 100 + i, "used_mib": 1} for i in range(3)]})
    samples = (N.c_nvmlProcessUtilizationSample_t * 4)()
    n = ctypes.c_uint(1)
    ret = N.nvmlLib.nvmlDeviceGetProcessUtilization(handle(0), samples, ctypes.byref(n), ctypes.c_ulonglong(0))
    assert ret == N.NVML_ERROR_INSUFFICIENT_SIZE and n.value == 3
    assert samples[1].pid == 0  # untouched


def test_many_gpus_get_distinct_bus_ids_and_mig_memory_follows_profiles(make_sim):
    make_sim({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]},
                       {"profile": "h100-sxm-80gb", "count": 40}],
              "processes": [{"gpu": 0, "pid": 7, "gi_id": 1, "ci_id": 0, "used_mib": 2000}]})
    buses = [N.nvmlDeviceGetPciInfo(handle(i)).busId for i in range(41)]
    assert len(set(buses)) == 41
    assert all(N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(b)) == i for i, b in enumerate(buses))
    h = handle(0)
    migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    mem = [N.nvmlDeviceGetMemoryInfo(m, version=N.nvmlMemory_v2) for m in migs]
    assert [m.total // (1024 * 1024) for m in mem] == [40448, 20096, 9984]
    assert mem[0].used == 2000 * 1024 * 1024 and mem[1].used == 0
    assert N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).used >= 2000 * 1024 * 1024


def test_call_latency_delays_every_call_until_set_back(make_sim):
    sim = make_sim(H100)
    N.nvmlInit()
    handle = N.nvmlDeviceGetHandleByIndex(0)

    def took(calls: int = 5) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            N.nvmlDeviceGetPowerUsage(handle)
            N.nvmlDeviceGetFieldValues(handle, [N.NVML_FI_DEV_POWER_INSTANT])
        return (time.perf_counter() - t) / (2 * calls)

    assert took() < 0.002
    sim.state.set_call_latency(5000)
    assert took() >= 0.005  # each call answers after 5 ms
    sim.state.set_call_latency(0)
    assert took() < 0.002
    with pytest.raises(ValueError):
        sim.state.set_call_latency(-1)
