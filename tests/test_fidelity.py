"""Capture fidelity and the nvidia-smi -q formats the importer reads (R470 to R610+, Windows WDDM).

The format tests run on hand-written fixtures in tests/data/ (always present); the report over the
real captures in ../shared/captures skips when they are absent, like the other capture tests.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pynvml as N
import pytest
from conftest import CAPTURES, REPO

from gpuobs.sim import fidelity, scenario
from gpuobs.sim.capture import load_capture
from gpuobs.smi import exported_samples

DATA = Path(__file__).resolve().parent / "data"
MIG_610 = DATA / "r610-hopper-mig.txt"  # R610 annotations, ceiling block, KMD/UMD, MIG 1c.3g/2c.3g, one unknown line
WDDM_610 = DATA / "r610-windows-wddm.txt"  # Windows WDDM, "Not available" process memory, one-line ceiling, pmon
SHARED = sorted(CAPTURES.glob("*.txt")) if CAPTURES.is_dir() else []
MIB = 1024 * 1024


def variant(tmp_path: Path, edits: list[tuple[str, str]], source: Path = WDDM_610) -> Path:
    """A copy of a fixture with text replacements applied (each must apply)."""
    text = source.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / source.name
    out.write_text(text)
    return out


# ---------------------------------------------------------------- importer: formats


def test_r610_annotations_are_stripped_and_versions_kept():
    [p] = load_capture(MIG_610, "load")
    assert (p["driver_version"], p["cuda_version"]) == ("610.57.04", "13.3")


def test_kmd_and_umd_lines_stand_in_for_the_deprecated_ones(tmp_path):
    f = variant(tmp_path, [("Driver Version                            : 610.62 [Deprecated; use KMD Version]\n", ""),
                           ("CUDA Version                              : 13.3 [Deprecated; use CUDA UMD Version]\n",
                            "")])
    [p] = load_capture(f)
    assert (p["driver_version"], p["cuda_version"]) == ("610.62", "13.3")
    assert p["unplaced"] == []


def test_power_limits_inside_the_ceiling_block_are_read():
    for phase in ("idle", "load"):
        [p] = load_capture(MIG_610, phase)
        w = p["power_w"]
        assert (w["enforced_limit"], w["limit"], w["default_limit"], w["min_limit"], w["max_limit"]) == (
            700.0, 700.0, 700.0, 200.0, 700.0)


def test_a_one_line_ceiling_keeps_the_limits_beside_it():
    [p] = load_capture(WDDM_610)
    assert p["power_w"]["enforced_limit"] == 200.0 and p["power_w"]["max_limit"] == 220.0
    assert p["power_w"]["ceiling_limit"] == 220.0
    assert p["unplaced"] == []


def test_wddm_not_available_memory_is_none_and_pmon_utilization_is_read():
    [p] = load_capture(WDDM_610)
    procs = {q["pid"]: q for q in p["processes"]}
    assert procs[7720]["used_mib"] is None and procs[9012]["used_mib"] is None  # never 0
    assert procs[9012]["sm_util"] == 63 and procs[9012]["mem_util"] == 21  # means of 60/66 and 20/22
    assert procs[7720]["sm_util"] is None  # pmon printed "-" only: not sampled, not 0


def test_an_unknown_line_is_named_once_and_nothing_raises(caplog):
    with caplog.at_level(logging.WARNING, logger="gpuobs.sim.capture"):
        [p] = load_capture(MIG_610, "load")
    named = [r for r in caplog.records if "Frobnication Level" in r.getMessage()]
    assert len(named) == 1 and p["unplaced"] == ["Frobnication Level"]


@pytest.mark.parametrize("value", ["N/A", "[N/A]", "Not available", "[Not Supported]", "N/A [Deprecated; gone]"])
def test_unavailable_values_stay_absent(tmp_path, value):
    f = variant(tmp_path, [("Fan Speed                             : 31 %", f"Fan Speed                             : {value}"),
                           ("Current Power Limit               : 200.00 W", f"Current Power Limit               : {value}")])
    [p] = load_capture(f)
    assert p["fan_speed_pct"] is None and p["power_w"]["enforced_limit"] is None


def test_thresholds_agree_between_phases_of_one_gpu():
    idle, load = (load_capture(MIG_610, phase)[0]["temperature_c"] for phase in ("idle", "load"))
    # idle: 30 + 57 = 87 C T.Limit; load reads 51 + 34 = 85: the idle reading is used for both
    for t in (idle, load):
        assert (t["shutdown"], t["slowdown"], t["gpu_max"]) == (95, 89, 87)


def test_mig_slices_are_the_ng_part():
    assert [scenario.mig_slices(n) for n in ("1c.3g.71gb", "2c.3g.71gb", "3g.40gb", "7g.80gb", "1g.10gb+me")] == [
        3, 3, 3, 7, 1]
    with pytest.raises(ValueError):
        scenario.mig_slices("big")
    layout = scenario.mig_layout({"memory_mib": {"total": 143771}}, ["1c.3g.71gb", "3g.71gb"])
    assert len(layout["devices"]) == 2
    with pytest.raises(scenario.ScenarioError, match="does not fit"):
        scenario.mig_layout({}, ["1c.3g.71gb", "2c.3g.71gb", "3g.71gb"])  # 9 of 7 slices


# ---------------------------------------------------------------- simulator: what NVML answers


def test_capture_mig_profiles_get_their_slices_and_the_capture_bus_id(make_sim):
    sim = make_sim({"gpus": [{"capture": str(MIG_610), "phase": "load", "count": 2}]})
    g = sim.state.gpu(0)
    assert [(m.gi_slices, m.profile.s.decode()) for m in g.migs[: g.mig_count]] == [
        (3, "1c.3g.71gb"), (3, "2c.3g.71gb")]
    buses = [N.nvmlDeviceGetPciInfo(N.nvmlDeviceGetHandleByIndex(i)).busId for i in range(2)]
    assert buses[0] == "00000000:9A:00.0"  # the capture's
    assert buses[1] != buses[0]  # a copy of the same GPU moves to a free bus


def test_wddm_process_memory_is_not_available_through_nvml(make_sim):
    make_sim({"gpus": [{"capture": str(WDDM_610)}]})
    h = N.nvmlDeviceGetHandleByIndex(0)
    procs = {p.pid: p.usedGpuMemory for p in N.nvmlDeviceGetComputeRunningProcesses(h)}
    assert procs == {7720: None, 9012: None}  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None
    assert N.nvmlDeviceGetPciInfo(h).busId == "00000000:2B:00.0"
    samples = {s.pid: s.smUtil for s in N.nvmlDeviceGetProcessUtilization(h, 0)}
    assert samples == {9012: 63}  # the unsampled process has no sample, rather than 0


def test_power_usage_is_the_one_second_average_on_ampere_and_newer(make_sim):
    make_sim({"gpus": [{"capture": str(MIG_610), "phase": "load"}, {"capture": str(WDDM_610)}]})
    hopper, ada = (N.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert N.nvmlDeviceGetPowerUsage(hopper) == 292400  # Average Power Draw
    assert N.nvmlDeviceGetFieldValues(hopper, [N.NVML_FI_DEV_POWER_INSTANT])[0].value.uiVal == 301100
    assert N.nvmlDeviceGetPowerUsage(ada) == 148200


def test_power_usage_is_instant_before_ampere(make_sim):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb"}]})
    from gpuobs.sim.state import set_val

    g = sim.state.gpu(0)
    set_val(g.arch, 5)  # Volta
    set_val(g.power_mw, 123000)
    assert N.nvmlDeviceGetPowerUsage(N.nvmlDeviceGetHandleByIndex(0)) == 123000


# ---------------------------------------------------------------- the report


@pytest.mark.parametrize("path,phase", [(WDDM_610, "load"), (MIG_610, "idle"), (MIG_610, "load")])
def test_report_on_the_format_fixtures(path, phase):
    rows = fidelity.check(path, phase, exported_samples)
    failed = [r for r in rows if r.failed]
    unknown = ["Frobnication Level"] if path == MIG_610 else []
    assert [r.field for r in failed] == unknown and all(r.verdict == "unknown" for r in failed)
    verdicts = {r.field: r.verdict for r in rows}
    assert sum(v == "match" for v in verdicts.values()) >= 35
    if path == WDDM_610:  # "Not available" memory: absent, never 0 bytes
        mem = [r for r in rows if r.field.startswith("Processes/Process ID/Used GPU Memory")]
        assert len(mem) == 2 and all(r.exported is None and r.verdict == "match" for r in mem)
        assert verdicts["pmon/sm[pid=9012]"] == "match"


def test_a_mismatch_fails_the_report(monkeypatch):
    spec = fidelity.EXPORTED["Fan Speed"]
    monkeypatch.setitem(fidelity.EXPORTED, "Fan Speed", fidelity.Export(spec.metric, convert=lambda raw, p: 0.99))
    rows = fidelity.check(WDDM_610, "load", exported_samples)
    [bad] = [r for r in rows if r.failed]
    assert bad.field == "Fan Speed" and bad.verdict.startswith("mismatch") and bad.exported == pytest.approx(0.31)


# Every line the newer fields come from, with values no real capture shows yet (errors, sessions,
# a fabric with health), spliced into the WDDM fixture.
NEW_FIELDS = [
    ("    Product Architecture                  : Ada Lovelace\n",
     "    Product Architecture                  : Ada Lovelace\n"
     "    Persistence Mode                      : Enabled\n"
     "    Compute Mode                          : Exclusive_Process\n"),
    ("        Decoder                           : 0 %\n",
     "        Decoder                           : 0 %\n"
     "    Encoder Stats\n        Active Sessions                   : 2\n"
     "        Average FPS                       : 107\n        Average Latency                   : 99454\n"
     "    FBC Stats\n        Active Sessions                   : 1\n"
     "        Average FPS                       : 30\n        Average Latency                   : 1500\n"),
    ("        Current                           : N/A\n        Pending                           : N/A\n"
     "    Temperature\n",
     "        Current                           : Enabled\n        Pending                           : Disabled\n"
     "    ECC Errors\n        Volatile\n"
     "            SRAM Correctable              : 5\n            SRAM Uncorrectable Parity     : 1\n"
     "            SRAM Uncorrectable SEC-DED    : 2\n            DRAM Correctable              : 7\n"
     "            DRAM Uncorrectable            : 0\n        Aggregate\n"
     "            SRAM Correctable              : 9\n            SRAM Uncorrectable Parity     : N/A\n"
     "            SRAM Uncorrectable SEC-DED    : 4\n            DRAM Correctable              : 11\n"
     "            DRAM Uncorrectable            : 1\n"
     "    Remapped Rows\n        Correctable Error                 : 1\n        Uncorrectable Error               : 0\n"
     "        Pending                           : No\n        Remapping Failure Occurred        : No\n"
     "        Bank Remap Availability Histogram\n            Max                           : 2550 bank(s)\n"
     "            High                          : 8 bank(s)\n            Partial                       : 2 bank(s)\n"
     "            Low                           : 0 bank(s)\n            None                          : 0 bank(s)\n"
     "    Temperature\n"),
    ("        GPU Ceiling Power Limit           : 220.00 W\n",
     "        GPU Ceiling Power Limit           : 220.00 W\n"
     "    GPU Memory Power Readings \n        Average Power Draw                : 21.50 W\n"
     "        Instantaneous Power Draw          : N/A\n"),
    ("    Processes\n",
     "    Fabric\n        State                             : Completed\n        Status                            : Success\n"
     "        CliqueId                          : 32766\n        ClusterUUID                       : N/A\n"
     "        Health\n            Summary                       : N/A\n            Bandwidth                     : Full\n"
     "            Route Recovery in progress    : False\n            Route Unhealthy               : True\n"
     "            Access Timeout Recovery       : N/A\n            Incorrect Configuration       : None\n"
     "    Processes\n"),
    ("            Used GPU Memory               : Not available\n", "            Used GPU Memory               : 512 MiB\n"),
]
HEALTH = 2 | 2 << 2 | 1 << 4 | 0 << 6 | 1 << 8  # full bandwidth, no recovery, route unhealthy, N/A, configured


def test_the_newer_fields_are_imported_from_their_lines(tmp_path):
    [p] = load_capture(variant(tmp_path, NEW_FIELDS), "load")
    assert (p["persistence_mode"], p["compute_mode"]) == (1, 3)
    assert p["encoder_stats"] == {"sessions": 2, "average_fps": 107, "average_latency_us": 99454}
    assert p["fbc_stats"] == {"sessions": 1, "average_fps": 30, "average_latency_us": 1500}
    assert p["power_w"]["memory_average"] == 21.5 and p["power_w"]["limit"] == 200.0
    assert (p["ecc"]["mode"], p["ecc"]["pending"]) == (1, 0)
    assert {k: v for k, v in p["ecc"].items() if k.startswith(("sram", "dram"))} == {
        "sram_corrected_volatile": 5, "sram_uncorrected_volatile": 3, "dram_corrected_volatile": 7,
        "dram_uncorrected_volatile": 0, "sram_corrected_aggregate": 9,
        "sram_uncorrected_aggregate": None,  # Parity N/A: the sum is unknown, never SEC-DED alone
        "dram_corrected_aggregate": 11, "dram_uncorrected_aggregate": 1}
    assert p["remapped_rows"]["histogram"] == {"max": 2550, "high": 8, "partial": 2, "low": 0, "none": 0}
    assert p["fabric"] == {"state": 3, "status": 0, "clique_id": 32766, "health_mask": HEALTH}
    assert [q["type"] for q in p["processes"]] == ["C+G", "C"]


def test_a_capture_without_the_newer_lines_leaves_them_absent():
    [p] = load_capture(WDDM_610, "load")  # no Encoder/FBC Stats, ECC errors, Remapped Rows or Fabric block
    assert p["encoder_stats"] is None and p["fbc_stats"] is None and p["fabric"] is None
    assert p["remapped_rows"] is None and p["power_w"]["memory_average"] is None
    assert all(v is None for k, v in p["ecc"].items())


@pytest.mark.parametrize("health,mask", [
    ({"Bandwidth": "N/A", "Route Unhealthy": "N/A"}, None),  # the driver reports no health
    ({"Bandwidth": "Degraded", "Route Unhealthy": "Sideways"}, None),  # a text the importer does not know
    ({"Bandwidth": "Degraded", "Partition Assigned": "Yes"}, None),  # a field whose bits gpuobs does not know
    ({"Bandwidth": "Degraded", "Route Unhealthy": "False"}, 1 | 2 << 4)])  # lines an older driver lacks: 0
def test_fabric_health_mask_is_never_guessed(health, mask):
    from gpuobs.sim.capture import health_mask
    assert health_mask(health) == mask


def test_the_newer_fields_are_compared_with_what_is_exported(tmp_path):
    rows = {r.field: r for r in fidelity.check(variant(tmp_path, NEW_FIELDS), "load", exported_samples)}
    assert not [r for r in rows.values() if r.failed], "\n".join(fidelity.report([r for r in rows.values() if r.failed]))
    exported = {
        "Persistence Mode": 1, "Compute Mode": "exclusive_process", "ECC Mode/Pending": 0,
        "Encoder Stats/Average Latency": pytest.approx(0.099454), "FBC Stats/Active Sessions": 1,
        "GPU Power Readings/Average Power Draw": 148.2, "GPU Power Readings/Requested Power Limit": 200,
        "GPU Memory Power Readings/Average Power Draw": 21.5,
        "ECC Errors/Volatile/SRAM Correctable": 5, "ECC Errors/Volatile/SRAM Uncorrectable SEC-DED": 3,
        "ECC Errors/Aggregate/SRAM Uncorrectable SEC-DED": None, "ECC Errors/Aggregate/DRAM Uncorrectable": 1,
        "Remapped Rows/Bank Remap Availability Histogram/High": 8,
        "Fabric/State": "completed", "Fabric/Status": 0, "Fabric/CliqueId": 32766,
        "Fabric/Health/Route Unhealthy": HEALTH, "Fabric/Health/Access Timeout Recovery": HEALTH,
        "Processes/Process ID/Type[pid=9012]": "compute",
        # its memory is not available (WDDM), yet the process is served: gpu_process_info carries its type
        "Processes/Process ID/Type[pid=7720]": "compute_graphics", "Processes/Process ID[pid=7720]": 1,
    }
    assert {k: rows[k].exported for k in exported} == exported
    assert all(rows[k].verdict == "match" for k in exported)


def test_formerly_pending_fields_are_compared():
    for path in ("Persistence Mode", "Compute Mode", "ECC Mode/Pending", "MIG Mode/Pending",
                 "Power Readings/Power Limit", "GPU Memory Power Readings/Average Power Draw",
                 "Encoder Stats/Average FPS", "FBC Stats/Average Latency", "ECC Errors/Volatile/SRAM Correctable",
                 "Remapped Rows/Bank Remap Availability Histogram/None", "MIG Device/Shared BAR1 Memory/Total",
                 "MIG Device/Device Attributes/Shared/Multiprocessor count", "Processes/Process ID/Type",
                 "Fabric/State", "Fabric/Health/Bandwidth"):
        assert isinstance(fidelity.classify(path), fidelity.Export), path
    assert not [r for r in fidelity.NOT_EXPORTED.values() if "pending" in r]
    assert fidelity.classify("Frobnication Level") is None


def test_docs_list_every_field_not_exported_with_its_reason():
    doc = (REPO / "docs" / "simulator.md").read_text()
    missing = [p for p, reason in fidelity.NOT_EXPORTED.items() if f"`{p}`" not in doc or reason not in doc]
    assert not missing, f"docs/simulator.md lacks: {missing}"


def gpuobs(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuobs.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_check_capture_cli_exits_1_on_an_unknown_field_and_names_it():
    r = gpuobs("sim", "check-capture", "--failures-only", str(MIG_610))
    assert r.returncode == 1, r.stderr
    assert "Frobnication Level" in r.stdout and "unknown" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", [["smi"], ["exporter", "--port", "0"]])
def test_a_scenario_that_cannot_load_is_one_line_and_exit_2(tmp_path, command):
    bad = tmp_path / "bad.txt"  # a capture whose GPU block has no Product Name (and no unknown line to warn of)
    bad.write_text(MIG_610.read_text().replace("    Product Name                          : NVIDIA H200\n", "")
                   .replace("    Frobnication Level                    : 3\n", ""))
    r = gpuobs(*command, "--simulate", str(bad))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "Product Name" in lines[0] and str(bad) in lines[0], lines


# ---------------------------------------------------------------- the real captures


@pytest.mark.skipif(not SHARED, reason="shared/captures not present")
@pytest.mark.parametrize("path,phase", [(f, p) for f in SHARED for p in ("idle", "load")],
                         ids=[f"{f.name.split('__')[1]}-{p}" for f in SHARED for p in ("idle", "load")])
def test_report_passes_on_every_real_capture(path, phase):
    rows = fidelity.check(path, phase, exported_samples)
    assert not [r for r in rows if r.failed], "\n".join(fidelity.report([r for r in rows if r.failed]))
    assert sum(r.verdict == "match" for r in rows) >= 60


@pytest.mark.skipif(not SHARED, reason="shared/captures not present")
def test_hopper_profiling_under_load_follows_the_capture():
    path = next(f for f in SHARED if "__nvidia-h200__" in f.name)
    [p] = load_capture(path, "load")
    got = {n: v for n, lab, v in exported_samples({"gpus": [{"capture": str(path), "phase": "load"}]})
           if lab.get("gpu") == "0"}
    assert got["gpuobs_gpu_graphics_active_ratio"] == pytest.approx(p["utilization_pct"]["gpu"] / 100)
    assert got["gpuobs_gpu_graphics_active_ratio"] > 0.5  # a 600 W load is not idle
    assert "gpuobs_gpu_sm_active_ratio" not in got  # nvidia-smi shows no SM activity: absent, not 0


def test_the_docs_table_of_fields_not_exported_is_generated_from_the_table():
    """docs/simulator.md's table is NOT_EXPORTED itself (gpuobs generate writes it), so a reason that
    names a metric follows a rename; one more entry is one more row."""
    from gpuobs import docs

    table = docs.not_exported_table()
    assert table in (REPO / "docs" / "simulator.md").read_text()
    rows = table.splitlines()[2:]
    assert len(rows) == len(set(fidelity.NOT_EXPORTED.values()))
    extra = {**fidelity.NOT_EXPORTED, "Frobnication Level": "a made-up field"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpuobs.sim.smi_fields.NOT_EXPORTED", extra)
        assert docs.not_exported_table().splitlines()[-1] == "| `Frobnication Level` | a made-up field |"
