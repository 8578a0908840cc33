"""The fields of real nvidia-smi captures the exporter used to miss (modes, averaged and memory power,
requested and pending settings, encoder and FBC sessions, ECC per memory location, the remapped-row
bank histogram, MIG BAR1 and SMs, process types, NVSwitch fabric): each series carries the value the
simulated GPU holds, and is absent where the GPU answers NOT_SUPPORTED."""

from __future__ import annotations

from gpuobs.sim.state import set_val

MIB = 1024 * 1024
H100 = {"gpus": [{"profile": "h100-sxm-80gb"}, {"profile": "rtx-4080-super"}]}


def by_labels(run, name: str, uuid: str, *keys: str) -> dict:
    """{label values (keys) -> value} of one GPU's series of a metric."""
    return {tuple(labels[k] for k in keys): value for n, labels, value in run.scrape()
            if n == name and labels.get("uuid") == uuid}


def _configure(g) -> None:
    set_val(g.persistence, 0)
    set_val(g.compute_mode, 3)
    set_val(g.power_avg_mw, 71_300)
    set_val(g.power_mem_mw, 43_190)
    set_val(g.power_limit_mw, 650_000)
    set_val(g.ecc_pending, 0)
    set_val(g.mig_pending, 1)
    for v, x in ((g.enc_sessions, 2), (g.enc_fps, 60), (g.enc_latency_us, 2500),
                 (g.fbc_sessions, 1), (g.fbc_fps, 30), (g.fbc_latency_us, 500)):
        set_val(v, x)
    for i in range(8):  # [location (sram, dram) * 4 + error type (corrected, uncorrected) * 2 + counter]
        set_val(g.ecc_location[i], 10 + i)
    for i in range(4):  # the totals are the sum over locations, as on a GPU (the exporter reads the
        set_val(g.ecc[i], (10 + i) + (14 + i))  # breakdown when they move)
    for i, x in enumerate((2550, 6, 3, 1, 0)):
        set_val(g.remap_histogram[i], x)
    set_val(g.remap_cor, 9)  # the banks with fewer spare rows hold the rows remapped


def test_new_series_carry_the_simulated_values(exporter):
    # the health mask from the start: a V call answered NOT_SUPPORTED is remembered until re-probed
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb",
                              "overrides": {"fabric": {"health_mask": 0xA, "clique_id": 32766}}}]})
    g = run.sim.state.gpu(0)
    _configure(g)
    uuid = g.uuid.s.decode()
    run.next_snapshot(11)  # a slow sample (every 10th) re-reads the rarely changing values
    v = lambda name, **m: run.values(name, **m)[uuid]  # noqa: E731
    assert v("gpuobs_gpu_persistence_mode_enabled") == 0
    assert by_labels(run, "gpuobs_gpu_compute_mode", uuid, "mode") == {
        ("default",): 0, ("exclusive_thread",): 0, ("prohibited",): 0, ("exclusive_process",): 1}
    assert v("gpuobs_gpu_power_average_watts") == 71.3
    assert v("gpuobs_gpu_memory_power_average_watts") == 43.19
    assert v("gpuobs_gpu_power_requested_limit_watts") == 650
    assert v("gpuobs_gpu_ecc_pending_enabled") == 0 and v("gpuobs_gpu_ecc_enabled") == 1
    assert v("gpuobs_gpu_mig_pending_enabled") == 1 and v("gpuobs_gpu_mig_enabled") == 0
    assert (v("gpuobs_gpu_encoder_sessions"), v("gpuobs_gpu_encoder_frames_per_second"),
            v("gpuobs_gpu_encoder_average_latency_seconds")) == (2, 60, 0.0025)
    assert (v("gpuobs_gpu_fbc_sessions"), v("gpuobs_gpu_fbc_frames_per_second"),
            v("gpuobs_gpu_fbc_average_latency_seconds")) == (1, 30, 0.0005)
    errors = by_labels(run, "gpuobs_gpu_ecc_location_errors_total", uuid, "location", "error_type", "counter_type")
    assert errors[("sram", "corrected", "volatile")] == 10 and errors[("sram", "uncorrected", "aggregate")] == 13
    assert errors[("dram", "corrected", "volatile")] == 14 and errors[("dram", "uncorrected", "aggregate")] == 17
    assert len(errors) == 8
    assert by_labels(run, "gpuobs_gpu_row_remap_banks", uuid, "availability") == {
        ("max",): 2550, ("high",): 6, ("partial",): 3, ("low",): 1, ("none",): 0}
    assert by_labels(run, "gpuobs_gpu_fabric_state", uuid, "state") == {
        ("not_supported",): 0, ("not_started",): 0, ("in_progress",): 0, ("completed",): 1}
    assert v("gpuobs_gpu_fabric_status") == 0 and v("gpuobs_gpu_fabric_clique_id") == 32766
    assert v("gpuobs_gpu_fabric_health_mask") == 0xA


def test_series_absent_where_the_gpu_does_not_answer(exporter):
    """The RTX profile (no ECC, no row remapping, no fabric, no memory power, no MIG) and NOT_SUPPORTED
    set on the H100: the series are absent, and the answers are remembered (not re-asked)."""
    run = exporter(H100)
    g = run.sim.state.gpu(0)
    for v in (g.persistence, g.compute_mode, g.power_mw, g.power_avg_mw, g.power_mem_mw, g.power_limit_mw, g.enc_sessions,
              g.fbc_sessions, g.fabric_state, *g.remap_histogram, *g.ecc_location):
        set_val(v, None)
    set_val(g.ecc[0], 1)  # an error: the breakdown of the totals (per location, bank histogram) is read again
    run.sim.state.unsupported(0, "nvmlDeviceGetEccMode")
    run.next_snapshot(11)
    scrape = run.scrape()
    names = {"gpuobs_gpu_persistence_mode_enabled", "gpuobs_gpu_compute_mode", "gpuobs_gpu_power_average_watts",
             "gpuobs_gpu_memory_power_average_watts", "gpuobs_gpu_power_requested_limit_watts",
             "gpuobs_gpu_ecc_pending_enabled", "gpuobs_gpu_mig_pending_enabled", "gpuobs_gpu_encoder_sessions",
             "gpuobs_gpu_fbc_sessions", "gpuobs_gpu_ecc_location_errors_total", "gpuobs_gpu_row_remap_banks",
             "gpuobs_gpu_fabric_state", "gpuobs_gpu_fabric_clique_id", "gpuobs_gpu_fabric_health_mask"}
    uuid = g.uuid.s.decode()
    rtx = run.sim.state.gpu(1).uuid.s.decode()
    # the H100 keeps MIG mode (a MIG mode change makes the session forget its capability answers)
    assert {n for n, labels, _ in scrape if n in names and labels.get("uuid") == uuid} == {
        "gpuobs_gpu_mig_pending_enabled"}
    rtx_has = {n for n, labels, _ in scrape if n in names and labels.get("uuid") == rtx}
    assert rtx_has == {"gpuobs_gpu_persistence_mode_enabled", "gpuobs_gpu_compute_mode",
                       "gpuobs_gpu_power_average_watts", "gpuobs_gpu_power_requested_limit_watts",
                       "gpuobs_gpu_encoder_sessions", "gpuobs_gpu_fbc_sessions"}
    unavailable = {(l["call"], l["reason"]) for n, l, _ in scrape if n == "gpuobs_exporter_nvml_unavailable_calls"}
    for call in ("nvmlDeviceGetEncoderStats", "nvmlDeviceGetRowRemapperHistogram", "nvmlDeviceGetGpuFabricInfo",
                 "nvmlDeviceGetMemoryErrorCounter:sram", "nvmlDeviceGetMemoryErrorCounter:dram"):
        assert (call, "not_supported") in unavailable, call
    run.sim.state.reset_calls()
    run.next_snapshot(11)
    calls = run.sim.state.calls()
    for call in ("nvmlDeviceGetEncoderStats", "nvmlDeviceGetRowRemapperHistogram", "nvmlDeviceGetMemoryErrorCounter",
                 "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetPersistenceMode"):
        assert calls.get(call, 0) <= 2, (call, calls.get(call))  # RTX answers once per slow pass, H100 never


def test_fabric_without_health_falls_back_to_v1(exporter):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb"}]})  # profile: health N/A, so the V call is unsupported
    uuid = run.sim.state.gpu(0).uuid.s.decode()
    run.next_snapshot(2)
    assert run.values("gpuobs_gpu_fabric_state", state="completed") == {uuid: 1}
    assert run.values("gpuobs_gpu_fabric_clique_id") == {uuid: 0}
    assert "gpuobs_gpu_fabric_health_mask" not in {n for n, _, _ in run.scrape()}


def test_mig_bar1_sms_and_process_types(exporter):
    import os

    from gpuobs.collect.processes import pid_max

    # possible pids (below pid_max) no host runs: the exporter serves them (it cannot tell it sees the host's pids)
    a, b, d = [pid for pid in range(pid_max() - 1, 1, -1) if not os.path.exists(f"/proc/{pid}")][:3]
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["3g.40gb", "1g.10gb"]},
                             {"profile": "h100-sxm-80gb"}],
                    "processes": [{"gpu": 0, "pid": a, "gi_id": 1, "ci_id": 0, "used_mib": 100, "name": "a"},
                                  {"gpu": 1, "pid": b, "used_mib": 200, "type": "C+G", "name": "b"},
                                  {"gpu": 1, "pid": d, "used_mib": 300, "type": "G", "name": "c"}]})
    m = run.sim.state.gpu(0).migs[0]
    set_val(m.bar1_used, 3 * MIB)
    run.next_snapshot(11)
    scrape = run.scrape()
    bar1 = {(l["gpu_instance_id"], n): v for n, l, v in scrape if n.startswith("gpuobs_mig_bar1_")}
    assert bar1[("1", "gpuobs_mig_bar1_total_bytes")] == m.bar1_total.base
    assert bar1[("1", "gpuobs_mig_bar1_used_bytes")] == 3 * MIB
    sms = {l["gpu_instance_id"]: v for n, l, v in scrape if n == "gpuobs_mig_multiprocessors"}
    assert sms == {"1": 60, "7": 16}
    types = {l["pid"]: (l["process_type"], l["gpu_instance_id"]) for n, l, _ in scrape
             if n == "gpuobs_gpu_process_memory_used_bytes"}
    assert types == {str(a): ("compute", "1"), str(b): ("compute_graphics", ""), str(d): ("graphics", "")}


def test_a_driver_without_the_calls_degrades_to_absent_series(exporter):
    """FUNCTION_NOT_FOUND (an older driver): the series of the missing calls are absent, remembered as
    function_not_found; the fabric falls back to nvmlDeviceGetGpuFabricInfo (no health mask)."""
    from gpuobs.sim import binding

    missing = ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetRowRemapperHistogram", "nvmlDeviceGetEncoderStats",
               "nvmlDeviceGetFBCStats", "nvmlDeviceGetMemoryErrorCounter")
    with binding.hidden_symbols(missing):
        run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "overrides": {"fabric": {"health_mask": 0}}}]})
        run.next_snapshot(2)
        scrape = run.scrape()
    names = {n for n, _, _ in scrape}
    assert not names & {"gpuobs_gpu_fabric_health_mask", "gpuobs_gpu_row_remap_banks", "gpuobs_gpu_encoder_sessions",
                        "gpuobs_gpu_fbc_sessions", "gpuobs_gpu_ecc_location_errors_total"}
    assert run.values("gpuobs_gpu_fabric_state", state="completed") == {run.sim.state.gpu(0).uuid.s.decode(): 1}
    unavailable = {(l["call"], l["reason"]) for n, l, _ in scrape if n == "gpuobs_exporter_nvml_unavailable_calls"}
    expected = {(call, "function_not_found") for call in missing if "ErrorCounter" not in call}
    assert expected | {(f"nvmlDeviceGetMemoryErrorCounter:{loc}", "function_not_found") for loc in ("sram", "dram")} \
        <= unavailable
