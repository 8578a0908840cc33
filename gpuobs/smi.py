"""`gpuobs smi`: one line per GPU read through NVML, on the real driver or the simulator.

It is the smallest end-to-end use of the stack: pynvml -> libnvidia-ml.so.1 (driver or
simulator) -> values, and shows which of the two answered. `exported_samples` runs the whole
exporter on a simulated node, for the capture-fidelity report (gpuobs.sim.fidelity).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SCENARIO = Path(__file__).resolve().parents[1] / "examples" / "scenarios" / "8xh100.yaml"


def driver_present() -> bool:
    """True when a real NVIDIA driver answers nvmlInit (checked in a child, so that this
    process can still load the simulator if it does not)."""
    probe = "import pynvml; pynvml.nvmlInit()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30).returncode == 0


def _get(fn, *args, fmt="{}"):
    import pynvml

    try:
        return fmt.format(fn(*args))
    except pynvml.NVMLError as e:
        return "N/A" if isinstance(e, pynvml.NVMLError_NotSupported) else f"ERR({e})"
    except UnicodeDecodeError:
        return "ERR(invalid UTF-8)"


def rows() -> list[str]:
    """One formatted line per GPU; NVML must be reachable (raises pynvml.NVMLError otherwise)."""
    import pynvml as N

    N.nvmlInit()
    try:
        out = [f"driver {N.nvmlSystemGetDriverVersion()}, {N.nvmlDeviceGetCount()} GPU(s)",
               f"{'idx':>3}  {'name':<26} {'uuid':<17} {'util':>5} {'mem used/total MiB':>19} "
               f"{'power W':>8} {'temp C':>6} {'sm MHz':>6}  pstate"]
        for i in range(N.nvmlDeviceGetCount()):
            try:
                h = N.nvmlDeviceGetHandleByIndex(i)
            except N.NVMLError as e:
                out.append(f"{i:>3}  unavailable: {e}")
                continue
            mem = _get(lambda h=h: (lambda m: f"{m.used >> 20}/{m.total >> 20}")(
                N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)))
            out.append(
                f"{i:>3}  {_get(N.nvmlDeviceGetName, h):<26.26} {_get(N.nvmlDeviceGetUUID, h):<17.17} "
                f"{_get(lambda h=h: N.nvmlDeviceGetUtilizationRates(h).gpu, fmt='{}%'):>5} {mem:>19} "
                f"{_get(lambda h=h: N.nvmlDeviceGetPowerUsage(h) / 1000, fmt='{:.1f}'):>8} "
                f"{_get(N.nvmlDeviceGetTemperature, h, 0):>6} {_get(N.nvmlDeviceGetClockInfo, h, 1):>6}  "
                f"P{_get(N.nvmlDeviceGetPerformanceState, h)}")
        return out
    finally:
        N.nvmlShutdown()


def exported_samples(spec: dict, wait_s: float = 10.0) -> list[tuple[str, dict[str, str], float]]:
    """[(sample name, labels, value)] of the /metrics body the real exporter serves on a simulated node
    seeded from `spec` (a scenario mapping), with every collector family on and every series (the full
profile: a capture's every field is compared), after two sampling passes.

    Runs in this process: the simulator is activated (this process's pynvml answers from it) and
    NVML is shut down again before returning. The simulated processes' PIDs (a capture's) are not
    this host's, so the processes family's host-PID check is off meanwhile: otherwise a PID that
    happens to exist here makes it drop the others as ended. Raises ScenarioError for a spec it
    cannot apply, RuntimeError when the exporter takes no snapshot within `wait_s`."""
    from unittest import mock

    import pynvml
    from prometheus_client.parser import text_string_to_metric_families

    from .collect import REGISTRY, processes
    from .exporter import Exporter, ExporterConfig
    from .sim import Simulator

    with Simulator(spec), mock.patch.object(processes, "host_view", lambda pids: False):
        exp = Exporter(ExporterConfig(listen_address="127.0.0.1", port=0, interval=0.1, families=set(REGISTRY),
                                      profile="full", kubelet_socket=None, kernel_log="off")).start()
        try:
            deadline = time.monotonic() + wait_s
            while exp.sampler.samples < 2 or exp.renderer.snapshot is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the exporter took no snapshot of the simulated GPU")
                time.sleep(0.02)
            body = exp.metrics().body.decode()
        finally:
            exp.stop()
            while True:  # drop this process's NVML references, so a later simulator maps its own state
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    break
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(body) for s in fam.samples]
