"""Each implemented NVML function returns exactly the value configured in the state file."""

from __future__ import annotations

import pynvml as N
import pytest

from gpuobs.sim.state import set_val

MIB = 1024 * 1024


def handle(i=0):
    return N.nvmlDeviceGetHandleByIndex(i)


# (description, how to configure GPU slot 0, how to read it through pynvml, expected)
CASES = [
    ("power usage mW", lambda g: set_val(g.power_avg_mw, 456789), lambda h: N.nvmlDeviceGetPowerUsage(h), 456789),  # Hopper: 1 s average
    ("power limit", lambda g: set_val(g.power_limit_mw, 650000), lambda h: N.nvmlDeviceGetPowerManagementLimit(h), 650000),
    ("enforced limit", lambda g: set_val(g.enforced_limit_mw, 640000), lambda h: N.nvmlDeviceGetEnforcedPowerLimit(h), 640000),
    ("default limit", lambda g: set_val(g.default_limit_mw, 700001), lambda h: N.nvmlDeviceGetPowerManagementDefaultLimit(h), 700001),
    ("limit constraints", lambda g: (set_val(g.min_limit_mw, 123000), set_val(g.max_limit_mw, 789000)),
     lambda h: N.nvmlDeviceGetPowerManagementLimitConstraints(h), [123000, 789000]),
    ("energy", lambda g: set_val(g.energy_mj, 987654321), lambda h: N.nvmlDeviceGetTotalEnergyConsumption(h), 987654321),
    ("gpu temp", lambda g: set_val(g.temp_gpu, 71), lambda h: N.nvmlDeviceGetTemperature(h, 0), 71),
    ("gpu temp V", lambda g: set_val(g.temp_gpu, 72), lambda h: N.nvmlDeviceGetTemperatureV(h, 0), 72),
    ("slowdown threshold", lambda g: set_val(g.temp_threshold[1], 88), lambda h: N.nvmlDeviceGetTemperatureThreshold(h, 1), 88),
    ("shutdown threshold", lambda g: set_val(g.temp_threshold[0], 94), lambda h: N.nvmlDeviceGetTemperatureThreshold(h, 0), 94),
    ("margin", lambda g: set_val(g.temp_margin, -3), lambda h: N.nvmlDeviceGetMarginTemperature(h), -3),
    ("sm clock", lambda g: set_val(g.clock[1], 1755), lambda h: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM), 1755),
    ("mem clock", lambda g: set_val(g.clock[2], 2619), lambda h: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM), 2619),
    ("max sm clock", lambda g: set_val(g.max_clock[1], 1980), lambda h: N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM), 1980),
    ("clock by id", lambda g: set_val(g.clock[0], 1410), lambda h: N.nvmlDeviceGetClock(h, 0, 0), 1410),
    ("pstate", lambda g: set_val(g.pstate, 2), lambda h: N.nvmlDeviceGetPerformanceState(h), 2),
    ("fan", lambda g: (set_val(g.fan_count, 1), set_val(g.fan[0], 45)), lambda h: N.nvmlDeviceGetFanSpeed(h), 45),
    ("fan v2", lambda g: (set_val(g.fan_count, 2), set_val(g.fan[1], 46)), lambda h: N.nvmlDeviceGetFanSpeed_v2(h, 1), 46),
    ("clock events", lambda g: set_val(g.clock_events, 0x44), lambda h: N.nvmlDeviceGetCurrentClocksEventReasons(h), 0x44),
    ("supported events", lambda g: set_val(g.clock_events_supported, 0x1FF), lambda h: N.nvmlDeviceGetSupportedClocksEventReasons(h), 0x1FF),
    ("violation", lambda g: set_val(g.violation_ns[0], 5000), lambda h: N.nvmlDeviceGetViolationStatus(h, 0).violationTime, 5000),
    ("utilization", lambda g: (set_val(g.util_gpu, 93), set_val(g.util_mem, 41)),
     lambda h: (N.nvmlDeviceGetUtilizationRates(h).gpu, N.nvmlDeviceGetUtilizationRates(h).memory), (93, 41)),
    ("encoder", lambda g: set_val(g.util_enc, 12), lambda h: N.nvmlDeviceGetEncoderUtilization(h)[0], 12),
    ("decoder", lambda g: set_val(g.util_dec, 13), lambda h: N.nvmlDeviceGetDecoderUtilization(h)[0], 13),
    ("memory v2", lambda g: (set_val(g.mem_total, 1000 * MIB), set_val(g.mem_reserved, 10 * MIB), set_val(g.mem_used, 300 * MIB)),
     lambda h: (lambda m: (m.total, m.reserved, m.used, m.free))(N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)),
     (1000 * MIB, 10 * MIB, 300 * MIB, 690 * MIB)),
    ("memory v1 counts reserved as used", lambda g: (set_val(g.mem_total, 1000 * MIB), set_val(g.mem_reserved, 10 * MIB), set_val(g.mem_used, 300 * MIB)),
     lambda h: (lambda m: (m.total, m.used, m.free))(N.nvmlDeviceGetMemoryInfo(h)), (1000 * MIB, 310 * MIB, 690 * MIB)),
    ("bar1", lambda g: (set_val(g.bar1_total, 256 * MIB), set_val(g.bar1_used, 6 * MIB)),
     lambda h: (lambda b: (b.bar1Total, b.bar1Used, b.bar1Free))(N.nvmlDeviceGetBAR1MemoryInfo(h)), (256 * MIB, 6 * MIB, 250 * MIB)),
    ("pcie gen", lambda g: set_val(g.pcie_gen, 3), lambda h: N.nvmlDeviceGetCurrPcieLinkGeneration(h), 3),
    ("pcie max gen", lambda g: set_val(g.pcie_max_gen, 5), lambda h: N.nvmlDeviceGetMaxPcieLinkGeneration(h), 5),
    ("pcie gpu max gen", lambda g: set_val(g.pcie_gpu_max_gen, 5), lambda h: N.nvmlDeviceGetGpuMaxPcieLinkGeneration(h), 5),
    ("pcie width", lambda g: set_val(g.pcie_width, 8), lambda h: N.nvmlDeviceGetCurrPcieLinkWidth(h), 8),
    ("pcie max width", lambda g: set_val(g.pcie_max_width, 16), lambda h: N.nvmlDeviceGetMaxPcieLinkWidth(h), 16),
    ("pcie replay", lambda g: set_val(g.pcie_replay, 17), lambda h: N.nvmlDeviceGetPcieReplayCounter(h), 17),
    ("ecc mode", lambda g: (set_val(g.ecc_current, 1), set_val(g.ecc_pending, 0)), lambda h: N.nvmlDeviceGetEccMode(h), [1, 0]),
    ("ecc uncorrected aggregate", lambda g: set_val(g.ecc[3], 7), lambda h: N.nvmlDeviceGetTotalEccErrors(h, 1, 1), 7),
    ("ecc corrected volatile", lambda g: set_val(g.ecc[0], 5), lambda h: N.nvmlDeviceGetTotalEccErrors(h, 0, 0), 5),
    ("remapped rows", lambda g: (set_val(g.remap_cor, 1), set_val(g.remap_unc, 2), set_val(g.remap_pending, 1), set_val(g.remap_failure, 0)),
     lambda h: N.nvmlDeviceGetRemappedRows(h), (1, 2, 1, 0)),
    ("retired pages", lambda g: set_val(g.retired_dbe, 3), lambda h: len(N.nvmlDeviceGetRetiredPages(h, 1)), 3),
    ("retired pending", lambda g: set_val(g.retired_pending, 1), lambda h: N.nvmlDeviceGetRetiredPagesPendingStatus(h), 1),
    ("brand", lambda g: set_val(g.brand, 5), lambda h: N.nvmlDeviceGetBrand(h), 5),
    ("architecture", lambda g: set_val(g.arch, 7), lambda h: N.nvmlDeviceGetArchitecture(h), 7),
    ("compute capability", lambda g: (set_val(g.cc_major, 8), set_val(g.cc_minor, 6)), lambda h: N.nvmlDeviceGetCudaComputeCapability(h), (8, 6)),
    ("persistence", lambda g: set_val(g.persistence, 0), lambda h: N.nvmlDeviceGetPersistenceMode(h), 0),
    ("compute mode", lambda g: set_val(g.compute_mode, 3), lambda h: N.nvmlDeviceGetComputeMode(h), 3),
    ("minor", lambda g: set_val(g.minor, 6), lambda h: N.nvmlDeviceGetMinorNumber(h), 6),
    ("cores", lambda g: set_val(g.num_cores, 16896), lambda h: N.nvmlDeviceGetNumGpuCores(h), 16896),
    ("name", lambda g: setattr(g.name, "s", b"NVIDIA Test GPU"), lambda h: N.nvmlDeviceGetName(h), "NVIDIA Test GPU"),
    ("serial", lambda g: setattr(g.serial, "s", b"1324"), lambda h: N.nvmlDeviceGetSerial(h), "1324"),
    ("vbios", lambda g: setattr(g.vbios, "s", b"96.00.99.00.01"), lambda h: N.nvmlDeviceGetVbiosVersion(h), "96.00.99.00.01"),
    ("board part", lambda g: setattr(g.board_part, "s", b"692-XYZ"), lambda h: N.nvmlDeviceGetBoardPartNumber(h), "692-XYZ"),
    ("nvlink state", lambda g: set_val(g.links[2].state, 0), lambda h: N.nvmlDeviceGetNvLinkState(h, 2), 0),
    ("nvlink version", lambda g: set_val(g.links[1].version, 4), lambda h: N.nvmlDeviceGetNvLinkVersion(h, 1), 4),
    ("nvlink crc", lambda g: set_val(g.links[0].crc_errors, 11), lambda h: N.nvmlDeviceGetNvLinkErrorCounter(h, 0, N.NVML_NVLINK_ERROR_DL_CRC_FLIT), 11),
    ("nvlink replay", lambda g: set_val(g.links[0].replay_errors, 12), lambda h: N.nvmlDeviceGetNvLinkErrorCounter(h, 0, N.NVML_NVLINK_ERROR_DL_REPLAY), 12),
    ("nvlink remote", lambda g: setattr(g.links[3].remote_bus_id, "s", b"00000000:C5:00.0"),
     lambda h: N.nvmlDeviceGetNvLinkRemotePciInfo(h, 3).busId, "00000000:C5:00.0"),
    ("pcie throughput KB/s", lambda g: set_val(g.pcie_tx_bytes, 0, "counter", amp=2_000_000), lambda h: N.nvmlDeviceGetPcieThroughput(h, 0), 2000),
    ("mig mode", lambda g: (set_val(g.mig_current, 0), set_val(g.mig_pending, 1)), lambda h: N.nvmlDeviceGetMigMode(h), [0, 1]),
    ("encoder stats", lambda g: (set_val(g.enc_sessions, 3), set_val(g.enc_fps, 59), set_val(g.enc_latency_us, 1234)),
     lambda h: N.nvmlDeviceGetEncoderStats(h), (3, 59, 1234)),
    ("fbc stats", lambda g: (set_val(g.fbc_sessions, 2), set_val(g.fbc_fps, 30), set_val(g.fbc_latency_us, 800)),
     lambda h: (lambda f: (f.sessionsCount, f.averageFPS, f.averageLatency))(N.nvmlDeviceGetFBCStats(h)), (2, 30, 800)),
    ("sram uncorrected aggregate", lambda g: set_val(g.ecc_location[0 * 4 + 1 * 2 + 1], 5),
     lambda h: N.nvmlDeviceGetMemoryErrorCounter(h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC,
                                                 N.NVML_MEMORY_LOCATION_SRAM), 5),
    ("dram corrected volatile", lambda g: set_val(g.ecc_location[1 * 4 + 0 * 2 + 0], 6),
     lambda h: N.nvmlDeviceGetMemoryErrorCounter(h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC,
                                                 N.NVML_MEMORY_LOCATION_DRAM), 6),
    ("remap histogram", lambda g: [set_val(g.remap_histogram[i], v) for i, v in enumerate((2550, 6, 3, 1, 0))],
     lambda h: (lambda r: (r.max, r.high, r.partial, r.low, r.none))(N.nvmlDeviceGetRowRemapperHistogram(h)),
     (2550, 6, 3, 1, 0)),
]


@pytest.mark.parametrize("desc,setup,read,expected", CASES, ids=[c[0] for c in CASES])
def test_configured_value_reads_back(h100x2, desc, setup, read, expected):
    setup(h100x2.state.gpu(0))
    assert read(handle(0)) == expected
    # the other GPU keeps its own value: state is per GPU
    if desc in ("power usage mW", "gpu temp", "sm clock"):
        assert read(handle(1)) != expected


def test_field_values_each_return_configured_value(h100x2):
    g = h100x2.state.gpu(0)
    set_val(g.ecc[0], 4)
    set_val(g.ecc[3], 2)
    set_val(g.temp_mem, 61)
    set_val(g.energy_mj, 5_000_000)
    set_val(g.pcie_replay, 9)
    set_val(g.remap_pending, 1)
    set_val(g.power_mw, 250_000)
    set_val(g.links[4].tx_bytes, 1024 * 500)
    set_val(g.links[4].state, 0)
    set_val(g.pcie_rx_bytes, 123456789)
    fv = N.nvmlDeviceGetFieldValues(handle(0), [
        N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, N.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, N.NVML_FI_DEV_MEMORY_TEMP,
        N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, N.NVML_FI_DEV_REMAPPED_PENDING,
        N.NVML_FI_DEV_POWER_INSTANT, (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 4),
        (N.NVML_FI_DEV_NVLINK_GET_STATE, 4), N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, N.NVML_FI_DEV_NVLINK_LINK_COUNT])
    got = []
    for f in fv:
        assert f.nvmlReturn == N.NVML_SUCCESS, f.fieldId
        assert f.timestamp > 0
        got.append(f.value.ullVal if f.valueType == N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG else f.value.uiVal)
    assert got == [4, 2, 61, 5_000_000, 9, 1, 250_000, 500, 0, 123456789, 18]
    assert fv[7].scopeId == 4


def test_counter_shape_grows_at_its_rate(h100x2):
    g = h100x2.state.gpu(0)
    set_val(g.energy_mj, 1000.0, "counter", amp=1_000_000.0)  # 1 kJ/s
    a = N.nvmlDeviceGetTotalEnergyConsumption(handle(0))
    import time
    time.sleep(0.2)
    b = N.nvmlDeviceGetTotalEnergyConsumption(handle(0))
    assert 150_000 < b - a < 400_000


def test_moving_shapes_stay_in_their_band(h100x2):
    import time

    g = h100x2.state.gpu(0)
    set_val(g.util_gpu, 50, "noise", amp=10, period=0.01)
    set_val(g.temp_gpu, 40, "ramp", amp=40, period=1000)
    seen = set()
    for _ in range(60):
        seen.add(N.nvmlDeviceGetUtilizationRates(handle(0)).gpu)
        time.sleep(0.003)
    assert all(40 <= v <= 60 for v in seen) and len(seen) > 3
    assert 40 <= N.nvmlDeviceGetTemperature(handle(0), 0) <= 41


def test_processes_mig_and_names(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]},
                             {"profile": "h100-sxm-80gb"}],
                    "processes": [{"gpu": 0, "pid": 10, "gi_id": 3, "ci_id": 0, "used_mib": 100, "name": "a"},
                                  {"gpu": 0, "pid": 11, "gi_id": 1, "ci_id": 0, "used_mib": 200, "name": "b"},
                                  {"gpu": 1, "pid": 12, "used_mib": 300, "type": "G", "name": "x"}]})
    h = handle(0)
    assert N.nvmlDeviceGetMigMode(h) == [1, 1]
    assert N.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)
    assert [N.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [1, 3, 7]
    assert [N.nvmlDeviceGetComputeInstanceId(m) for m in migs] == [0, 0, 0]
    assert N.nvmlDeviceGetName(migs[1]) == "NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    assert N.nvmlDeviceGetUUID(migs[0]).startswith("MIG-")
    assert N.nvmlDeviceIsMigDeviceHandle(migs[0]).value == 1
    assert N.nvmlDeviceIsMigDeviceHandle(h).value == 0
    parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[2])
    assert N.nvmlDeviceGetUUID(parent) == N.nvmlDeviceGetUUID(h)
    assert N.nvmlDeviceGetAttributes_v2(migs[0]).multiprocessorCount == 60
    mem = N.nvmlDeviceGetMemoryInfo(migs[0], version=N.nvmlMemory_v2)
    assert mem.total == sim.state.gpu(0).migs[0].mem_total.base
    assert N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(migs[1])).contents is not None
    # processes: whole GPU sees both, a MIG device only its own
    assert sorted(p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)) == [10, 11]
    assert [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(migs[1])] == [10]
    assert [p.usedGpuMemory for p in N.nvmlDeviceGetComputeRunningProcesses(migs[0])] == [200 * MIB]
    assert N.nvmlDeviceGetComputeRunningProcesses(handle(1)) == []
    graphics = N.nvmlDeviceGetGraphicsRunningProcesses(handle(1))
    assert [(p.pid, p.gpuInstanceId) for p in graphics] == [(12, 0xFFFFFFFF)]
    assert N.nvmlSystemGetProcessName(12) == "x"
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlSystemGetProcessName(99999)
    # device-level queries on a MIG handle are not supported, as on real MIG devices
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetPowerUsage(migs[0])


def test_gpm_per_gpu_and_per_mig(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb"]}, {"profile": "a100-40gb"}]})
    g = sim.state.gpu(0)
    set_val(g.gpm[1], 77.5)  # slot 1 = NVML_GPM_METRIC_SM_UTIL
    set_val(g.migs[0].gpm[1], 33.25)
    h = handle(0)
    assert N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    assert N.nvmlGpmQueryDeviceSupport(handle(1)).isSupportedDevice == 0

    def metric(take):
        s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        take(s1)
        take(s2)
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics, mg.sample1, mg.sample2 = N.NVML_GPM_METRICS_GET_VERSION, 2, s1, s2
        mg.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
        mg.metrics[1].metricId = 400  # not simulated
        N.nvmlGpmMetricsGet(mg)
        N.nvmlGpmSampleFree(s1)
        N.nvmlGpmSampleFree(s2)
        return mg.metrics[0].nvmlReturn, mg.metrics[0].value, mg.metrics[1].nvmlReturn

    assert metric(lambda s: N.nvmlGpmSampleGet(h, s)) == (0, 77.5, N.NVML_ERROR_NOT_SUPPORTED)
    assert metric(lambda s: N.nvmlGpmMigSampleGet(h, 1, s)) == (0, 33.25, N.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmSampleGet(handle(1), N.nvmlGpmSampleAlloc())


def test_lookup_by_uuid_serial_and_bus_id(h100x2):
    h1 = handle(1)
    uuid, bus = N.nvmlDeviceGetUUID(h1), N.nvmlDeviceGetPciInfo(h1).busId
    for found in (N.nvmlDeviceGetHandleByUUID(uuid), N.nvmlDeviceGetHandleByPciBusId(bus),
                  N.nvmlDeviceGetHandleBySerial(N.nvmlDeviceGetSerial(h1))):
        assert N.nvmlDeviceGetIndex(found) == 1
    assert N.nvmlDeviceGetUUID(handle(0)) != uuid
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetHandleByUUID("GPU-does-not-exist")


def test_process_utilization_samples(h100x2):
    samples = N.nvmlDeviceGetProcessUtilization(handle(0), 0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [(1111, 77, 33)]


def test_tlimit_fields_are_relative_to_the_max_operating_temperature(h100x2):
    g = h100x2.state.gpu(0)
    set_val(g.temp_threshold[3], 85)  # GPU max operating (T.Limit)
    set_val(g.temp_threshold[1], 87)
    set_val(g.temp_threshold[0], 93)
    fv = N.nvmlDeviceGetFieldValues(handle(0), [N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
                                                N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
                                                N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT])
    assert [f.value.siVal for f in fv] == [-2, -8, 0]  # as nvidia-smi prints "Slowdown T.Limit Temp: -2 C"


def test_field_values_reader_decodes_as_pynvml_does(h100x2):
    """gpuobs.nvml.fields.FieldValues (reused array, struct decoding) gives what pynvml's wrapper
    gives, per value type, for the values it supports and the ones it does not, call after call."""
    from gpuobs.nvml.fields import FieldValues

    g = h100x2.state.gpu(0)
    set_val(g.temp_mem, 61)
    set_val(g.energy_mj, 5_000_000)
    set_val(g.links[3].rx_bytes, 1024 * 777)
    ids = [(N.NVML_FI_DEV_MEMORY_TEMP, 0), (N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0),
           (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 3), (N.NVML_FI_DEV_NVLINK_LINK_COUNT, 0),
           (N.NVML_FI_DEV_POWER_INSTANT, 0), (9999, 0)]  # 9999: no such field
    members = {N.NVML_VALUE_TYPE_DOUBLE: "dVal", N.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
               N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal", N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
               N.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}
    reader = FieldValues(ids)
    for round_ in range(2):
        set_val(g.temp_mem, 61 + round_)
        expected = [(f.nvmlReturn, getattr(f.value, members[f.valueType]) if f.nvmlReturn == 0 else None)
                    for f in N.nvmlDeviceGetFieldValues(handle(0), ids)]
        got = list(zip(*reader.read(handle(0))))
        assert got == expected
        assert got[0] == (N.NVML_SUCCESS, 61 + round_) and got[2] == (N.NVML_SUCCESS, 777)
        assert got[-1][0] != N.NVML_SUCCESS and got[-1][1] is None
    # one value type throughout (one typed column, no gather), and a single field
    same = [(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in range(4)]
    for link in range(3):
        set_val(g.links[link].rx_bytes, 1024 * (100 + link))  # fixed: a loaded link's counter moves
    expected = [(f.nvmlReturn, f.value.ullVal) for f in N.nvmlDeviceGetFieldValues(handle(0), same)]
    assert list(zip(*FieldValues(same).read(handle(0)))) == expected and expected[3] == (N.NVML_SUCCESS, 777)
    assert list(zip(*FieldValues(same[3:]).read(handle(0)))) == expected[3:]


def _fabric(h, cls, fn):
    info = cls()
    fn(h, N.byref(info))
    return info


def test_fabric_info_v1_and_versioned(h100x2):
    g = h100x2.state.gpu(0)
    set_val(g.fabric_state, N.NVML_GPU_FABRIC_STATE_COMPLETED)
    set_val(g.fabric_status, 0)
    set_val(g.fabric_clique, 32766)
    v1 = _fabric(handle(0), N.c_nvmlGpuFabricInfo_t, N.nvmlDeviceGetGpuFabricInfo)
    assert (v1.state, v1.status, v1.cliqueId) == (3, 0, 32766)
    with pytest.raises(N.NVMLError_NotSupported):  # the profile's driver reports no health: V unsupported
        _fabric(handle(0), N.c_nvmlGpuFabricInfo_v2_t, N.nvmlDeviceGetGpuFabricInfoV)
    set_val(g.fabric_health, 0x2 | (0x2 << 2))
    for cls in (N.c_nvmlGpuFabricInfo_v2_t, N.c_nvmlGpuFabricInfo_v3_t):
        v = _fabric(handle(0), cls, N.nvmlDeviceGetGpuFabricInfoV)
        assert (v.state, v.status, v.cliqueId, v.healthMask) == (3, 0, 32766, 0xA)
    bad = N.c_nvmlGpuFabricInfo_v2_t()
    bad.version = 0x01000020
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        N.nvmlDeviceGetGpuFabricInfoV(handle(0), N.byref(bad))
    set_val(g.fabric_state, None)
    with pytest.raises(N.NVMLError_NotSupported):
        _fabric(handle(0), N.c_nvmlGpuFabricInfo_t, N.nvmlDeviceGetGpuFabricInfo)


def test_power_fields_by_scope(h100x2):
    """NVML_FI_DEV_POWER_AVERAGE's scopeId is the power scope: GPU (0) or its memory (2); the requested
    limit is the power management limit."""
    g = h100x2.state.gpu(0)
    set_val(g.power_avg_mw, 71_300)
    set_val(g.power_mem_mw, 43_190)
    set_val(g.power_limit_mw, 650_000)
    fv = N.nvmlDeviceGetFieldValues(handle(0), [(N.NVML_FI_DEV_POWER_AVERAGE, 0), (N.NVML_FI_DEV_POWER_AVERAGE, 2),
                                                (N.NVML_FI_DEV_POWER_INSTANT, 2), (N.NVML_FI_DEV_POWER_AVERAGE, 1),
                                                N.NVML_FI_DEV_POWER_REQUESTED_LIMIT])
    assert [f.nvmlReturn for f in fv] == [0, 0, N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_NOT_SUPPORTED, 0]
    assert [fv[i].value.uiVal for i in (0, 1, 4)] == [71_300, 43_190, 650_000]


def test_memory_error_counter_other_locations_and_unsupported(h100x2):
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMemoryErrorCounter(handle(0), 0, 0, N.NVML_MEMORY_LOCATION_L1_CACHE)
    set_val(h100x2.state.gpu(0).ecc_location[4], None)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMemoryErrorCounter(handle(0), 0, 0, N.NVML_MEMORY_LOCATION_DRAM)
    set_val(h100x2.state.gpu(0).enc_sessions, None)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetEncoderStats(handle(0))
