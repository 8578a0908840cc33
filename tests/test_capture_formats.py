"""Real nvidia-smi -q outputs of other cards and driver families (tests/data/r4*/r5*: hand-written
fixtures of public outputs, each citing its source), the formats they come in (bare -q text, no
banner), and what the importer must not do: drop a layout's values, lose a WDDM process, or invent a
value nvidia-smi does not print.

Expected values are read from the fixture text with regular expressions, independently of the
importer, and compared with what the real exporter serves on a GPU seeded from the fixture.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuobs import catalog as c
from gpuobs.cli import main
from gpuobs.sim import fidelity
from gpuobs.sim.capture import load_capture
from gpuobs.smi import exported_samples

DATA = Path(__file__).resolve().parent / "data"
PUBLIC = {  # fixture -> what it is
    "r470-v100-pcie.txt": "Tesla V100 PCIe, Linux R470 (Ecc Mode, per-unit ECC, Power Readings)",
    "r530-tesla-t4.txt": "Tesla T4, Linux R530 (Utilization/Gpu, Power Readings, a process)",
    "r550-v100-sxm2.txt": "Tesla V100 SXM2, Linux R550 (GPU Power Readings/Power Draw)",
    "r555-a100-sxm4.txt": "A100 SXM4, Linux R555 (SRAM parity split, remapped rows)",
    "r566-windows-rtx4070-laptop.txt": "RTX 4070 Laptop, Windows WDDM R566 (T.Limit thresholds)",
}
FIXTURES = [DATA / name for name in PUBLIC]
MIB = 1024 * 1024


def grab(text: str, pattern: str) -> float | None:
    """The first group of `pattern` in the text as a number; None when absent or not a number (N/A)."""
    m = re.search(pattern, text)
    return float(m[1]) if m and re.fullmatch(r"-?\d+(\.\d+)?", m[1]) else None


def served(samples: list, metric: c.Metric, **labels: str) -> float | None:
    """GPU 0's value of `metric` with these labels in the exporter's samples; None when not served."""
    found = [v for n, lab, v in samples if n == metric.exposed_name and lab.get("gpu", "0") == "0"
             and all(lab.get(k) == v2 for k, v2 in labels.items())]
    return found[0] if found else None


def block(text: str, name: str) -> str:
    """The lines of the GPU block's `name` sub-block (4-space indent), up to the next 4-space line."""
    m = re.search(rf"\n    {re.escape(name)}\s*\n((?:        .*\n)+)", text)
    return m[1] if m else ""


# (what, expected from the text, exported metric and labels, factor from the text's unit to the metric's)
def expectations(text: str) -> list[tuple[str, float | None, c.Metric, dict, float]]:
    power = block(text, "GPU Power Readings") or block(text, "Power Readings")
    clocks, maxc, util = block(text, "Clocks"), block(text, "Max Clocks"), block(text, "Utilization")
    return [
        ("memory total", grab(block(text, "FB Memory Usage"), r"Total\s+: (\S+) MiB"), c.MEMORY_TOTAL, {}, MIB),
        ("memory used", grab(block(text, "FB Memory Usage"), r"Used\s+: (\S+) MiB"), c.MEMORY_USED, {}, MIB),
        ("enforced limit", grab(power, r"(?:Current|Enforced) Power Limit\s+: (\S+)"), c.POWER_LIMIT, {}, 1),
        ("default limit", grab(power, r"Default Power Limit\s+: (\S+)"), c.POWER_DEFAULT_LIMIT, {}, 1),
        ("min limit", grab(power, r"Min Power Limit\s+: (\S+)"), c.POWER_MIN_LIMIT, {}, 1),
        ("max limit", grab(power, r"Max Power Limit\s+: (\S+)"), c.POWER_MAX_LIMIT, {}, 1),
        ("gpu utilization", grab(util, r"(?i)gpu\s+: (\S+) %"), c.UTILIZATION, {}, 0.01),
        ("memory utilization", grab(util, r"Memory\s+: (\S+) %"), c.MEMORY_UTILIZATION, {}, 0.01),
        ("sm clock", grab(clocks, r"SM\s+: (\d+) MHz"), c.CLOCK, {"clock": "sm"}, 1e6),
        ("max graphics clock", grab(maxc, r"Graphics\s+: (\d+) MHz"), c.MAX_CLOCK, {"clock": "graphics"}, 1e6),
        ("temperature", grab(text, r"GPU Current Temp\s+: (\d+) C"), c.TEMPERATURE, {}, 1),
        ("aggregate corrected ECC", grab(text, r"Aggregate\n(?:.*\n)*?\s+(?:DRAM Correctable|Single Bit\s*\n"
                                               r"\s+Device Memory)\s+: (\S+)"),
         c.ECC_ERRORS, {"error_type": "corrected", "counter_type": "aggregate"}, 1),
        ("retired single-bit pages", grab(text, r"Single Bit ECC\s+: (\S+)"),
         c.RETIRED_PAGES, {"cause": "single_bit_ecc"}, 1),
    ]


@pytest.fixture(scope="module")
def samples() -> dict[str, list]:
    """The exporter's samples on a GPU seeded from each public fixture (one exporter run each)."""
    return {path.name: exported_samples({"gpus": [{"capture": str(path), "phase": "load"}]}) for path in FIXTURES}


@pytest.mark.parametrize("path", FIXTURES, ids=list(PUBLIC))
def test_check_capture_exits_0_on_each_public_output(path):
    r = CliRunner().invoke(main, ["sim", "check-capture", "--failures-only", str(path)])
    assert r.exit_code == 0, r.output
    summary = r.output.strip().splitlines()[-1]
    assert int(summary.split(" match")[0]) >= 50, summary  # the lines are compared, not skipped


@pytest.mark.parametrize("path", FIXTURES, ids=list(PUBLIC))
def test_the_exporter_serves_what_the_output_says(path, samples):
    text = path.read_text()
    compared = 0
    for what, expected, metric, labels, factor in expectations(text):
        got = served(samples[path.name], metric, **labels)
        want = None if expected is None else expected * factor
        assert got == pytest.approx(want), f"{path.name}: {what}: served {got!r}, the output says {want!r}"
        compared += want is not None
    assert compared >= 10, f"only {compared} values with a value in {path.name}"


def test_processes_of_a_public_output_are_served(samples):
    text = (DATA / "r530-tesla-t4.txt").read_text()
    pid, mib = re.search(r"Process ID\s+: (\d+)\n(?:.*\n)*?\s+Used GPU Memory\s+: (\d+) MiB", text).groups()
    got = samples["r530-tesla-t4.txt"]
    assert served(got, c.PROCESS_MEMORY, pid=pid) == int(mib) * MIB
    assert served(got, c.PROCESS_INFO, pid=pid, process_name="nvidia-cuda-mps-server", process_type="compute") == 1


def test_the_older_names_keep_their_values():
    [v100] = load_capture(DATA / "r470-v100-pcie.txt")  # "Ecc Mode", per-unit ECC, R470 Power Readings
    assert v100["ecc"]["mode"] == 1 and v100["ecc"]["corrected_aggregate"] == 3
    assert (v100["power_w"]["limit"], v100["power_w"]["enforced_limit"]) == (250.0, 250.0)
    [laptop] = load_capture(DATA / "r566-windows-rtx4070-laptop.txt")  # Requested N/A beside Current
    assert (laptop["power_w"]["limit"], laptop["power_w"]["enforced_limit"]) == (None, 61.24)


@pytest.mark.parametrize("spelling", ["Gpu", "GPU", "gpu"])
def test_utilization_is_read_whatever_the_driver_spells_it(tmp_path, spelling):
    text = (DATA / "r530-tesla-t4.txt").read_text()
    path = tmp_path / "t4.txt"
    path.write_text(text.replace("        Gpu                               : 0 %",
                                 f"        {spelling:<34}: 37 %").replace("Memory                            : 0 %",
                                                                          "Memory                            : 12 %"))
    [p] = load_capture(path)
    assert (p["utilization_pct"]["gpu"], p["utilization_pct"]["memory"]) == (37, 12)
    assert not p["unplaced"]


def test_r610_limits_beside_and_inside_the_ceiling_block_are_all_read(tmp_path):
    """R610 may print Min/Max in the readings block and the others in its ceiling block."""
    text = (DATA / "r610-hopper-mig.txt").read_text()
    moved = text.replace("            Min Power Limit               : 200.00 W\n"
                         "            Max Power Limit               : 700.00 W\n", "")
    moved = moved.replace("        GPU Ceiling Power Limit\n",
                          "        Min Power Limit                   : 200.00 W\n"
                          "        Max Power Limit                   : 700.00 W\n        GPU Ceiling Power Limit\n")
    assert moved.count("        Min Power Limit                   : 200.00 W\n") == 2
    path = tmp_path / "r610.txt"
    path.write_text(moved)
    [p] = load_capture(path, warn=False)
    assert {k: p["power_w"][k] for k in ("limit", "enforced_limit", "default_limit", "min_limit", "max_limit")} \
        == {"limit": 700.0, "enforced_limit": 700.0, "default_limit": 700.0, "min_limit": 200.0, "max_limit": 700.0}


def test_inactive_remapped_rows_are_read_and_placed(tmp_path):
    text = (DATA / "r555-a100-sxm4.txt").read_text()
    path = tmp_path / "l40s.txt"
    path.write_text(text.replace("        Uncorrectable Error               : 0\n",
                                 "        Uncorrectable Error               : 0\n"
                                 "        Inactive Correctable Error        : 2\n"
                                 "        Inactive Uncorrectable Error      : 1\n"))
    [p] = load_capture(path)
    assert (p["remapped_rows"]["inactive_correctable"], p["remapped_rows"]["inactive_uncorrectable"]) == (2, 1)
    assert not p["unplaced"]
    rows = {r.field: r for r in fidelity.check(path, "load", exported_samples)}
    assert rows["Remapped Rows/Inactive Correctable Error"].verdict.startswith("not exported")
    assert not [r for r in rows.values() if r.failed]


def test_xml_is_refused_by_name(tmp_path):
    path = tmp_path / "q.xml"
    path.write_text('<?xml version="1.0" ?>\n<nvidia_smi_log><attached_gpus>1</attached_gpus></nvidia_smi_log>\n')
    with pytest.raises(ValueError, match="-q -x XML is not read"):
        load_capture(path)


def test_a_lost_wddm_process_fails_the_check():
    wddm = DATA / "r610-windows-wddm.txt"
    rows = fidelity.check(wddm, "load", exported_samples)
    assert not [r for r in rows if r.failed]
    assert {r.field for r in rows if r.verdict == "match" and r.field.startswith("Processes/Process ID[")} \
        == {"Processes/Process ID[pid=7720]", "Processes/Process ID[pid=9012]"}

    def losing(spec):  # an exporter that serves no process whose memory WDDM cannot tell
        return [s for s in exported_samples(spec) if s[0] != c.PROCESS_INFO.exposed_name]
    failed = {r.field for r in fidelity.check(wddm, "load", losing) if r.failed}
    assert {"Processes/Process ID[pid=7720]", "Processes/Process ID[pid=9012]"} <= failed


def test_energy_and_nvlink_counters_are_never_invented():
    path = DATA / "r555-a100-sxm4.txt"
    rows = fidelity.check(path, "load", exported_samples)
    invented = [r for r in rows if r.field.startswith("(not in the capture)")]
    assert invented and all(r.exported is None and r.verdict == "match" for r in invented)

    def inventing(spec):  # an exporter on a simulator that made an energy counter up
        return exported_samples(spec) + [(c.ENERGY.exposed_name, {"gpu": "0"}, 1.0)]
    failed = [r for r in fidelity.check(path, "load", inventing) if r.failed]
    assert [r.field for r in failed] == [f"(not in the capture)/{c.ENERGY.exposed_name}"]


def test_synthesized_energy_is_served_and_labelled_so():
    rows = fidelity.check(DATA / "r555-a100-sxm4.txt", "load", exported_samples, ("energy",))
    [energy] = [r for r in rows if r.field.endswith(c.ENERGY.exposed_name)]
    assert energy.exported and energy.exported > 0 and energy.verdict.startswith("synthesized")
    assert not [r for r in rows if r.failed]
