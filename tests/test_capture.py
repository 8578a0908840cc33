"""gpuobs.sim.capture against the real nvidia-smi captures in ../shared/captures.

Expected values are read back from the raw text with independent regexes, so the tests
follow the captures; a few literal spot checks pin values read by hand.
"""

import re
from pathlib import Path

import pytest

from gpuobs.sim.capture import load_capture, parse_query, sections

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"
FILES = sorted(CAPTURES.glob("*.txt")) if CAPTURES.is_dir() else []
if not FILES:
    pytest.skip(f"no captures under {CAPTURES}", allow_module_level=True)

NA = {"N/A", "[N/A]", "Not Supported", "[Not Supported]", "Requested functionality has been deprecated"}


def cap(model: str) -> Path:
    return next(f for f in FILES if f"__{model}__" in f.name)


def raw_section(path: Path, phase: str) -> str:
    text = path.read_text()
    m = re.search(rf"# {phase} :: query \(-q\)\n# \$ nvidia-smi -q\n#+\n(.*?)(?=\n#{{20}}|\Z)", text, re.S)
    assert m, f"{path.name}: no {phase} -q section"
    return m[1]


def block(sec: str, name: str, indent: int = 4) -> str:
    """Lines indented deeper than `name`'s header, directly below it."""
    m = re.search(rf"^ {{{indent}}}{re.escape(name)} *\n((?: {{{indent + 1},}}.*\n)+)", sec, re.M)
    return m[1] if m else ""


def raw(text: str, key: str) -> str | None:
    m = re.search(rf"^\s*{re.escape(key)}\s+: (.*?)\s*$", text, re.M)
    return m[1] if m else None


def num(s: str | None, kind=int):
    """Leading number of a raw value; None for N/A-like or missing."""
    if s is None or s in NA:
        return None
    return kind(re.match(r"-?[\d.]+", s)[0])


def flag(s: str | None):
    return None if s is None or s in NA else {"Enabled": 1, "Disabled": 0, "Yes": 1, "No": 0}[s]


CASES = [(f, phase) for f in FILES for phase in ("idle", "load")]


@pytest.mark.parametrize("path,phase", CASES, ids=[f"{f.name.split('__')[1]}-{p}" for f, p in CASES])
def test_profile_matches_raw_text(path, phase):
    sec = raw_section(path, phase)
    [p] = load_capture(path, phase)
    for path_, want in _expected_values(sec).items():
        got = p
        for k in path_:
            got = got[k]
        assert got == want, f"{'.'.join(path_)}: {got!r} != {want!r}"
    _check_reasons_processes_mig_and_rows(p, sec)


def _expected_values(sec: str) -> dict[tuple[str, ...], object]:
    """Profile key path -> the value read straight from nvidia-smi's text."""
    fb, bar1, pwr = block(sec, "FB Memory Usage"), block(sec, "BAR1 Memory Usage"), block(sec, "GPU Power Readings")
    clk, maxclk, temp = block(sec, "Clocks"), block(sec, "Max Clocks"), block(sec, "Temperature")
    util, pci = block(sec, "Utilization"), block(sec, "PCI")
    return {
        ("name",): raw(sec, "Product Name"),
        ("driver_version",): raw(sec, "Driver Version"),
        ("cuda_version",): raw(sec, "CUDA Version"),
        ("persistence_mode",): flag(raw(sec, "Persistence Mode")),
        ("pstate",): int(raw(sec, "Performance State")[1:]),
        ("fan_speed_pct",): num(raw(sec, "Fan Speed")),
        ("pci", "bus_id"): raw(pci, "Bus Id"),
        ("pci", "device_id"): int(raw(pci, "Device Id"), 16),
        ("memory_mib", "total"): int(re.search(r"^    FB Memory Usage\n\s+Total\s+:\s+(\d+) MiB", sec, re.M)[1]),
        ("memory_mib", "reserved"): num(raw(fb, "Reserved")),
        ("memory_mib", "used"): num(raw(fb, "Used")),
        ("bar1_mib", "total"): num(raw(bar1, "Total")),
        ("bar1_mib", "used"): num(raw(bar1, "Used")),
        ("utilization_pct", "gpu"): num(raw(util, "GPU")),
        ("utilization_pct", "memory"): num(raw(util, "Memory")),
        ("power_w", "draw"): num(raw(pwr, "Instantaneous Power Draw"), float),
        ("power_w", "average"): num(raw(pwr, "Average Power Draw"), float),
        ("power_w", "limit"): num(raw(pwr, "Requested Power Limit"), float),
        ("power_w", "enforced_limit"): num(raw(pwr, "Current Power Limit"), float),
        ("power_w", "default_limit"): num(raw(pwr, "Default Power Limit"), float),
        ("power_w", "min_limit"): num(raw(pwr, "Min Power Limit"), float),
        ("power_w", "max_limit"): num(raw(pwr, "Max Power Limit"), float),
        ("temperature_c", "gpu"): num(raw(temp, "GPU Current Temp")),
        ("temperature_c", "memory"): num(raw(temp, "Memory Current Temp")),
        ("temperature_c", "margin"): num(raw(temp, "GPU T.Limit Temp")),
        ("temperature_c", "target"): num(raw(temp, "GPU Target Temperature")),
        ("clocks_mhz", "graphics"): num(raw(clk, "Graphics")),
        ("clocks_mhz", "sm"): num(raw(clk, "SM")),
        ("clocks_mhz", "memory"): num(raw(clk, "Memory")),
        ("clocks_mhz", "video"): num(raw(clk, "Video")),
        ("max_clocks_mhz", "graphics"): num(raw(maxclk, "Graphics")),
        ("max_clocks_mhz", "memory"): num(raw(maxclk, "Memory")),
        ("pcie", "gen"): num(re.search(r"PCIe Generation\n\s+Max\s+: .*\n\s+Current\s+: (.*)", sec)[1]),
        ("pcie", "max_gen"): num(re.search(r"PCIe Generation\n\s+Max\s+: (.*)", sec)[1]),
        ("pcie", "width"): num(re.search(r"Link Width\n\s+Max\s+: .*\n\s+Current\s+: (.*)", sec)[1]),
        ("pcie", "replay"): num(raw(pci, "Replays Since Reset")),
        ("pcie", "tx_kbps"): num(raw(pci, "Tx Throughput")),
        ("pcie", "rx_kbps"): num(raw(pci, "Rx Throughput")),
        ("violation_us", "power"): num(raw(block(sec, "Clocks Event Reasons Counters"), "SW Power Capping")),
        ("ecc", "mode"): flag(raw(block(sec, "ECC Mode"), "Current")),
        ("ecc", "corrected_volatile"): num(raw(block(sec, "Volatile", 8), "DRAM Correctable")),
        ("ecc", "uncorrected_aggregate"): num(raw(block(sec, "Aggregate", 8), "DRAM Uncorrectable")),
    }


def _check_reasons_processes_mig_and_rows(p: dict, sec: str) -> None:
    # Clock event reasons: bit per "Active" line.
    bits = {"Idle": 1, "Applications Clocks Setting": 2, "SW Power Cap": 4, "HW Slowdown": 8, "Sync Boost": 0x10,
            "SW Thermal Slowdown": 0x20, "HW Thermal Slowdown": 0x40, "HW Power Brake Slowdown": 0x80,
            "Display Clock Setting": 0x100}
    active = re.findall(r"^\s+(.+?)\s+: Active$", block(sec, "Clocks Event Reasons"), re.M)
    assert p["clock_event_reasons"] == sum(bits[a] for a in active)

    # Processes in order, MIG layout / absence, remapped rows.
    assert [q["pid"] for q in p["processes"]] == [int(x) for x in re.findall(r"Process ID\s+: (\d+)", sec)]
    assert [q["used_mib"] for q in p["processes"]] == [int(x) for x in re.findall(r"Used GPU Memory\s+: (\d+)", sec)]
    mig_raw = raw(block(sec, "MIG Mode"), "Current")
    if mig_raw in NA:
        assert p["mig"] is None
    else:
        assert p["mig"]["mode"] == flag(mig_raw)
        assert len(p["mig"]["devices"]) == len(re.findall(r"^    MIG Device\n", sec, re.M))
        assert [d["memory_mib"]["total"] for d in p["mig"]["devices"]] == [
            int(x) for x in re.findall(r"Shared FB Memory Usage\n\s+Total\s+: (\d+) MiB", sec)]
    if re.search(r"Remapped Rows\s+: N/A", sec):
        assert p["remapped_rows"] is None
    else:
        assert p["remapped_rows"]["correctable"] == num(raw(block(sec, "Remapped Rows"), "Correctable Error"))


def test_sections_split():
    secs = sections(cap("nvidia-h100-mig").read_text())
    assert {("idle", "query (-q)"), ("load", "query (-q)"), ("capabilities", "list (-L)"),
            ("capabilities", "nvml-symbols")} <= set(secs)
    assert secs[("load", "query (-q)")].startswith("==============NVSMI LOG")
    assert secs[("capabilities", "list (-L)")].splitlines()[1].startswith("  MIG 3g.40gb")


def test_parse_query_tree():
    [g] = parse_query(sections(cap("nvidia-h100-mig").read_text())[("load", "query (-q)")])
    assert g["Product Name"] == "NVIDIA H100 80GB HBM3"
    assert [d["GPU Instance ID"] for d in g["MIG Device"]] == ["2", "3", "9", "10"]
    assert g["PCI"]["GPU Link Info"]["Link Width"]["Current"] == "16x"
    pids = g["Processes"]["Process ID"]
    assert [p["_value"] for p in pids] == ["21180", "21181", "21198"] and pids[2]["Name"] == "./gpu_burn"
    assert g["Remapped Rows"] == "N/A"  # raw strings are kept
    assert parse_query("no gpus here") == []


def test_h100_mig_spot_checks():
    [p] = load_capture(cap("nvidia-h100-mig"))
    devs = p["mig"]["devices"]
    assert (p["mig"]["mode"], p["mig"]["pending"]) == (1, 1)
    assert [d["gi_id"] for d in devs] == [2, 3, 9, 10]
    assert [d["ci_id"] for d in devs] == [0, 0, 0, 0]
    assert [d["profile"] for d in devs] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [d["memory_mib"]["total"] for d in devs] == [40448, 20096, 9984, 9984]
    assert [d["sm_count"] for d in devs] == [60, 32, 16, 16]
    assert devs[0]["memory_mib"]["used"] == 11091 and devs[0]["bar1_mib"] == {"total": 24739, "used": 0}
    assert [(q["pid"], q["gi_id"], q["ci_id"], q["type"]) for q in p["processes"]] == [
        (21180, 2, 0, "C"), (21181, 2, 0, "C"), (21198, 2, 0, "C")]
    assert p["utilization_pct"] == {"gpu": None, "memory": None, "encoder": None, "decoder": None}
    assert p["remapped_rows"] is None  # "Remapped Rows : N/A" while MIG is on


def test_h100_tlimit_conversion():
    # T.Limit = 41 C + 46 C margin in the idle phase (87 C); the load phase reads 59 + 26 = 85, a
    # sample-timing artefact: both phases use the idle reading, so the thresholds agree
    t = load_capture(cap("nvidia-h100-80gb-hbm3"), "load")[0]["temperature_c"]
    assert t == {"gpu": 59, "memory": 55, "shutdown": 95, "slowdown": 89, "gpu_max": 87,
                 "memory_max": None, "target": None, "margin": 26}


@pytest.mark.parametrize("path", FILES, ids=[f.name.split("__")[1] for f in FILES])
def test_thresholds_are_the_same_in_both_phases(path):
    keys = ("shutdown", "slowdown", "gpu_max", "memory_max")
    idle, load = (load_capture(path, phase)[0]["temperature_c"] for phase in ("idle", "load"))
    assert {k: idle[k] for k in keys} == {k: load[k] for k in keys}


def test_h100_datacenter_values():
    [p] = load_capture(cap("nvidia-h100-80gb-hbm3"), "load")
    assert p["ecc"] == {"mode": 1, "pending": 1, "corrected_volatile": 0, "corrected_aggregate": 0,
                        "uncorrected_volatile": 0, "uncorrected_aggregate": 0,
                        **{f"{loc}_{kind}_{scope}": 0 for loc in ("sram", "dram") for kind in ("corrected", "uncorrected")
                           for scope in ("volatile", "aggregate")}}
    assert p["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0,
                                  "inactive_correctable": None, "inactive_uncorrectable": None,  # R595+ lines
                                  "histogram": {"max": 2560, "high": 0, "partial": 0, "low": 0, "none": 0}}
    assert (p["persistence_mode"], p["compute_mode"]) == (1, 0)
    assert p["encoder_stats"] == p["fbc_stats"] == {"sessions": 0, "average_fps": 0, "average_latency_us": 0}
    assert p["power_w"]["limit"] == 700.0 and p["power_w"]["memory_average"] is not None
    # registered with the fabric manager; the driver reports no health (every Health line N/A)
    assert p["fabric"] == {"state": 3, "status": 0, "clique_id": 0, "health_mask": None}
    assert p["retired_pages"] is None  # all three lines N/A on Hopper
    assert p["mig"] == {"mode": 0, "pending": 0, "devices": []}
    assert p["pci"] == {"bus_id": "00000000:00:09.0", "domain": 0, "bus": 0, "device": 9,
                        "device_id": 0x233010DE, "subsystem_id": 0x16C110DE}
    assert p["power_w"]["draw"] == 588.39 and p["power_w"]["average"] == 629.45
    assert p["fan_speed_pct"] is None and p["pcie"]["replay"] == 9
    assert load_capture(cap("nvidia-h100-80gb-hbm3"), "idle")[0]["processes"] == []  # "Processes : None"


def test_consumer_na_fields_are_none_not_zero():
    [p] = load_capture(cap("nvidia-geforce-rtx-4080-super"), "load")
    assert p["brand"] == "GeForce" and p["architecture"] == "Ada Lovelace"
    assert p["ecc"]["mode"] is None and p["ecc"]["corrected_volatile"] is None
    assert p["remapped_rows"] is None and p["retired_pages"] is None and p["mig"] is None
    assert p["fabric"] is None and p["power_w"]["memory_average"] is None  # Fabric State / memory power N/A
    assert all(p["ecc"][f"{loc}_{kind}_{scope}"] is None for loc in ("sram", "dram")
               for kind in ("corrected", "uncorrected") for scope in ("volatile", "aggregate"))
    assert p["encoder_stats"] == {"sessions": 2, "average_fps": 184, "average_latency_us": 62844}
    assert p["serial"] is None and p["board_part_number"] is None
    t = p["temperature_c"]
    assert (t["shutdown"], t["slowdown"], t["gpu_max"], t["target"]) == (101, 96, 90, 84)
    assert t["memory"] is None and t["memory_max"] is None and t["margin"] is None
    assert p["fan_speed_pct"] == 0  # printed as "0 %": a real zero stays zero
    assert p["power_w"]["average"] == 84.03
    assert p["processes"][0] == {"pid": 2165, "name": "/usr/bin/kwin_wayland", "type": "C+G",
                                 "used_mib": 25, "gi_id": None, "ci_id": None,
                                 "sm_util": None, "mem_util": None}  # pmon never sampled it: absent, not 0


def test_h100_pmon_utilization_is_the_mean_of_sampled_rows():
    [p] = load_capture(cap("nvidia-h100-80gb-hbm3"), "load")
    sec = sections(cap("nvidia-h100-80gb-hbm3").read_text())[("load", "pmon (per-process monitor)")]
    for q in p["processes"]:
        rows = re.findall(rf"^\s+0\s+{q['pid']}\s+\S+\s+(\S+)", sec, re.M)
        sampled = [int(x) for x in rows if x != "-"]
        assert rows, q["pid"]
        assert q["sm_util"] == (round(sum(sampled) / len(sampled)) if sampled else None)
    assert any(q["sm_util"] for q in p["processes"])  # the capture's load has a busy process


def test_rtx2080_idle():
    [p] = load_capture(cap("nvidia-geforce-rtx-2080-super"), "idle")
    assert p["clock_event_reasons"] == 0x1  # Idle : Active
    assert p["violation_us"]["power"] == 212288427
    assert p["power_w"]["average"] is None and p["power_w"]["draw"] == 37.62
    assert (p["pcie"]["gen"], p["pcie"]["max_gen"], p["pcie"]["width"]) == (1, 3, 16)
    assert p["pstate"] == 8 and p["compute_mode"] == 0 and p["persistence_mode"] == 0


def test_phase_fallback_and_errors(tmp_path):
    f = cap("nvidia-h200")
    text = f.read_text()
    idle_only = tmp_path / "idle-only.txt"  # the same capture cut before its load phase
    idle_only.write_text(text[: text.rfind("\n#####", 0, text.index("# load ::"))])
    assert load_capture(idle_only, "load") == load_capture(f, "idle")
    with pytest.raises(ValueError, match="phase must be"):
        load_capture(f, "nosuchphase")
    bad = tmp_path / "empty.txt"
    bad.write_text("nothing\n")
    with pytest.raises(ValueError):
        load_capture(bad)


OLD_FORMAT = """\
################################################################################
# idle :: query (-q)
# $ nvidia-smi -q
################################################################################
Driver Version                            : 470.82.01
CUDA Version                              : 11.4
GPU 00000000:3B:00.0
    Product Name                          : Tesla V100-PCIE-16GB
    Clocks Throttle Reasons
        Idle                              : Active
        SW Power Cap                      : Active
        HW Slowdown                       : Not Active
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 3
                Total                     : 4
            Double Bit
                Device Memory             : N/A
                Total                     : 1
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 0
        Pending Page Blacklist            : No
    Power Readings
        Power Draw                        : 25.50 W
        Power Limit                       : 250.00 W
        Enforced Power Limit              : 240.00 W
    Compute Mode                          : Exclusive_Process
"""


def test_older_format_fallbacks(tmp_path):
    f = tmp_path / "old.txt"
    f.write_text(OLD_FORMAT)
    [p] = load_capture(f)
    assert p["clock_event_reasons"] == 0x5
    assert p["ecc"]["corrected_volatile"] == 3 and p["ecc"]["uncorrected_volatile"] == 1
    assert p["ecc"]["corrected_aggregate"] is None
    assert p["retired_pages"] == {"sbe": 2, "dbe": 0, "pending": 0}
    assert (p["power_w"]["draw"], p["power_w"]["limit"], p["power_w"]["enforced_limit"]) == (25.5, 250.0, 240.0)
    assert p["compute_mode"] == 3 and p["driver_version"] == "470.82.01"
    assert p["memory_mib"] == {"total": None, "reserved": None, "used": None} and p["mig"] is None


def test_unknown_phase_is_rejected(tmp_path):
    capture = tmp_path / "c.txt"
    capture.write_text("")
    with pytest.raises(ValueError, match="phase must be one of idle, load"):
        load_capture(capture, "bogus")
