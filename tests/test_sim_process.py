"""The simulator across processes: `gpuobs sim exec`, live changes, call accounting, the build."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from gpuobs.sim import Simulator, build, layout
from gpuobs.sim.builder import implemented_functions
from gpuobs.sim.state import set_val

GPUOBS = [sys.executable, "-m", "gpuobs.cli"]
SCENARIO = REPO / "examples" / "scenarios" / "8xh100.yaml"

CHILD = r"""
import sys, pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
print("ready", N.nvmlDeviceGetPowerUsage(h), flush=True)
for line in sys.stdin:                      # one call per line the parent sends
    try:
        print(N.nvmlDeviceGetPowerUsage(h), flush=True)
    except N.NVMLError as e:
        print(type(e).__name__, flush=True)
"""


def test_sim_exec_prints_device_count():
    out = subprocess.run([*GPUOBS, "sim", "exec", "--scenario", str(SCENARIO), "--", sys.executable, "-c",
                          "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "8"
    assert "simulated GPUs" in out.stderr


def test_sim_exec_passes_exit_code_and_rejects_bad_scenario(tmp_path):
    out = subprocess.run([*GPUOBS, "sim", "exec", "--scenario", str(SCENARIO), "--", sys.executable, "-c",
                          "raise SystemExit(7)"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 7
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [{profile: nonexistent-gpu}]\n")
    out = subprocess.run([*GPUOBS, "sim", "exec", "--scenario", str(bad), "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "unknown GPU profile 'nonexistent-gpu'" in out.stderr


def test_state_change_seen_by_other_process_within_one_call(tmp_path):
    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb"}]}, directory=tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=sim.env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        # nvmlDeviceGetPowerUsage on Hopper: the 1 s average (power_avg_mw), not the instant draw
        assert child.stdout.readline().split() == ["ready", "71300"]
        set_val(sim.state.gpu(0).power_avg_mw, 123456)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "123456"
        sim.state.lose_gpu(0)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "NVMLError_GpuIsLost"
    finally:
        child.kill()
        child.wait()
        sim.close()


def test_call_accounting_counts_another_process_calls(tmp_path):
    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, directory=tmp_path)
    sim.state.reset_calls()
    code = ("import pynvml as N; N.nvmlInit(); "
            "[N.nvmlDeviceGetTemperature(N.nvmlDeviceGetHandleByIndex(i), 0) for i in range(2) for _ in range(5)]")
    subprocess.run([sys.executable, "-c", code], env=sim.env(), check=True, timeout=60)
    calls = sim.state.calls()
    assert calls["nvmlDeviceGetTemperature"] == 10
    assert calls["nvmlDeviceGetHandleByIndex_v2"] == 10
    assert calls["nvmlInitWithFlags"] == 1
    out = subprocess.run([*GPUOBS, "sim", "calls", "--state", str(sim.state_path), "--reset"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert "        10  nvmlDeviceGetTemperature" in out.stdout
    assert sim.state.calls() == {}
    sim.close()


def test_inject_command_changes_running_node(tmp_path):
    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, directory=tmp_path)
    subprocess.run([*GPUOBS, "sim", "inject", "--state", str(sim.state_path), "--gpu", "1", "--xid", "79",
                    "--lose"], check=True, timeout=60)
    assert sim.state.gpu(1).lost == 1 and sim.state.gpu(0).lost == 0
    assert sim.state.s.event_head == 1 and sim.state.s.events[0].data == 79
    out = subprocess.run([*GPUOBS, "sim", "inject", "--state", str(sim.state_path), "--fail", "nvmlNoSuchCall"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "does not implement nvmlNoSuchCall" in out.stderr
    sim.close()


def test_no_state_means_driver_not_loaded(tmp_path):
    lib = build()
    code = ("import pynvml as N\ntry:\n    N.nvmlInit()\nexcept N.NVMLError as e:\n    print(type(e).__name__)")
    env = {"LD_LIBRARY_PATH": str(lib.parent), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "NVMLError_DriverNotLoaded"
    stale = tmp_path / "old.bin"
    stale.write_bytes(b"\0" * ctypes.sizeof(layout.State))  # wrong magic: another layout
    out = subprocess.run([sys.executable, "-c", code], env={**env, "GPUOBS_SIM_STATE": str(stale)},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "NVMLError_LibRmVersionMismatch"


def test_library_exports_every_implemented_function_with_soname():
    lib_path = build()
    lib = ctypes.CDLL(str(lib_path))
    names = implemented_functions()
    assert len(names) > 90
    for name in names + ["nvmlErrorString"]:
        assert hasattr(lib, name), name
    dyn = subprocess.run(["readelf", "-d", str(lib_path)], capture_output=True, text=True).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in dyn
    # hidden helpers stay hidden: only NVML names are exported
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib_path)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if " T " in line}
    assert exported and all(n.startswith("nvml") for n in exported)


def test_build_is_cached_and_rebuilt_when_source_changes(tmp_path, monkeypatch):
    from gpuobs.sim import builder as build_mod

    monkeypatch.setenv("GPUOBS_CACHE_DIR", str(tmp_path))
    first = build_mod.build()
    mtime = first.stat().st_mtime_ns
    assert build_mod.build() == first and first.stat().st_mtime_ns == mtime
    changed = tmp_path / "nvml_sim.c"
    changed.write_text(build_mod.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(build_mod, "SOURCE", changed)
    second = build_mod.build()
    assert second != first and second.exists()


def test_build_reports_compiler_errors(tmp_path, monkeypatch):
    from gpuobs.sim import builder as build_mod

    monkeypatch.setenv("GPUOBS_CACHE_DIR", str(tmp_path))
    broken = tmp_path / "nvml_sim.c"
    broken.write_text(build_mod.SOURCE.read_text() + "\nthis is not C;\n")
    monkeypatch.setattr(build_mod, "SOURCE", broken)
    with pytest.raises(build_mod.BuildError, match="compiling nvml_sim.c failed"):
        build_mod.build()


def test_sim_build_command_prints_library_path():
    out = subprocess.run([*GPUOBS, "sim", "build"], capture_output=True, text=True, check=True, timeout=120)
    path = Path(out.stdout.strip())
    assert path.name == "libnvidia-ml.so.1" and path.exists()


@pytest.mark.parametrize("scenario", sorted((REPO / "examples" / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_example_scenarios_apply(tmp_path, scenario):
    from gpuobs.sim import scenario as sc

    spec = sc.load(scenario)
    sim = Simulator.from_file(scenario, directory=tmp_path)
    assert sim.state.s.gpu_slots == sum(int(g.get("count", 1)) for g in spec["gpus"])
    sim.close()


def test_smi_command_lists_simulated_gpus():
    out = subprocess.run([*GPUOBS, "smi", "--simulate", str(SCENARIO)], capture_output=True, text=True,
                         check=True, timeout=60)
    lines = out.stdout.splitlines()
    assert lines[0] == f"using simulated GPUs from {SCENARIO}"
    assert lines[1] == "driver 590.48.01, 8 GPU(s)"
    gpus = [line for line in lines if "NVIDIA H100 80GB HBM3" in line]
    assert len(gpus) == 8 and all("61440/81559" in line for line in gpus)


def test_scenario_errors_name_the_problem(tmp_path):
    from gpuobs.sim.scenario import ScenarioError

    for spec, message in [({}, "needs a 'gpus' list"),
                          ({"gpus": [{"count": 2}]}, "needs 'profile' or 'capture'"),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "count": 65}]}, "count must be an integer from 1 to 64"),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "count": 10**8}]}, "count must be"),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "count": "x"}]}, "count must be"),
                          ({"gpus": []}, "at least one GPU"),
                          ({"gpus": [5]}, "must be a mapping"),
                          ({"gpus": [{"profile": "h100-sxm-80gb"}], "processes": [{"gpu": 0}]}, "needs at least a pid"),
                          ({"gpus": [{"profile": "h100-sxm-80gb"}], "processes": [{"gpu": 0, "pid": -5}]},
                           "pid must be a number >= 0"),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "overrides": "nope"}]}, "invalid scenario"),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["7g.80gb", "1g.10gb"]}]},
                           "does not fit"),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["7g.80gb"]}]}, None),
                          ({"gpus": [{"profile": "h100-sxm-80gb", "mig": ["4g.40gb", "4g.40gb"]}]},
                           "does not fit"),
                          ({"gpus": [{"profile": "h100-sxm-80gb"}], "processes": [{"gpu": 3, "pid": 1}]},
                           "names GPU 3"),
                          ({"gpus": [{"capture": "nope.txt"}]}, "not found")]:
        if message is None:
            Simulator(spec, directory=tmp_path).close()
            continue
        with pytest.raises(ScenarioError, match=message):
            Simulator(spec, directory=tmp_path)


def test_inject_rejects_what_would_do_nothing(tmp_path):
    sim = Simulator({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, directory=tmp_path)
    state = str(sim.state_path)
    for args, message in [([], "nothing to do"), (["--gpu", "9", "--xid", "79"], "GPU slots 0-1"),
                          (["--fail", "nvmlDeviceGetPowerUsage", "--times", "0"], "must be at least 1")]:
        out = subprocess.run([*GPUOBS, "sim", "inject", "--state", state, *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"x" * 10)
    out = subprocess.run([*GPUOBS, "sim", "calls", "--state", str(junk)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "is not a simulator state file" in out.stderr
    sim.close()


def test_activate_inside_a_process_started_by_sim_exec(tmp_path):
    code = ("import pynvml as N; N.nvmlInit(); N.nvmlShutdown()\n"
            "from gpuobs.sim import Simulator\n"
            "with Simulator({'gpus': [{'profile': 'h200', 'count': 3}]}):\n"
            "    N.nvmlInit(); print(N.nvmlDeviceGetCount(), N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(0)))")
    out = subprocess.run([*GPUOBS, "sim", "exec", "--scenario", str(SCENARIO), "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3 NVIDIA H200"
