"""The exporter across binding and driver drift (issue 13): pynvml releases that return bytes (a
patched live pynvml, and the real pynvml 11.4.1), drivers that lack newer calls (the simulator
built without them, as R470 and R525 are), and a pynvml without the private names of the
field-values fast path. The exporter runs as users run it, `gpuobs exporter`, in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pynvml as N
import pytest
from conftest import REPO, free_port, stop
from legacy_binding import legacy_pynvml_path
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_faults import TWO, UP, one, uuid

from gpuobs.nvml import fields
from gpuobs.sim import Simulator, binding

H100 = "h100-sxm-80gb"
NODE = {"gpus": [{"profile": H100, "count": 2}],
        "processes": [{"gpu": 0, "pid": os.getpid(), "name": "python train.py", "used_mib": 1024}]}
ERRORS = "gpuobs_exporter_nvml_errors_total"
UNAVAILABLE = "gpuobs_exporter_nvml_unavailable_calls"
MEM_USED = "gpuobs_gpu_memory_used_bytes"
REASON = "gpuobs_gpu_clock_event_reason_active"
PROC_MEM = "gpuobs_gpu_process_memory_used_bytes"


def label_values(scrape) -> list[str]:
    return [v for _, labels, _ in scrape for v in labels.values()]


def test_bytes_from_an_older_binding_are_served_as_text(exporter):
    with binding.bytes_strings():
        run = exporter(NODE, families={"identity", "memory", "processes", "mig"}, interval=0.1)
        run.next_snapshot(2)
        scrape = run.scrape()
    u0, u1 = uuid(run, 0), uuid(run, 1)
    assert one(scrape, UP) == {u0: 1.0, u1: 1.0}
    assert not [v for v in label_values(scrape) if v.startswith(("b'", 'b"'))], "a bytes repr in a label"
    info = [labels for n, labels, _ in scrape if n == "gpuobs_gpu_info"]
    assert {i["name"] for i in info} == {"NVIDIA H100 80GB HBM3"} and all(i["pci_bus_id"] for i in info)
    nvml = [labels for n, labels, _ in scrape if n == "gpuobs_nvml_info"]
    assert nvml and nvml[0]["driver_version"][0].isdigit()
    assert [labels["process_name"] for n, labels, _ in scrape if n == PROC_MEM] == ["python train.py"]
    assert not [labels for n, labels, _ in scrape if n == ERRORS]


class Child:
    """`gpuobs exporter` in a child process on a simulated node (an older driver, a binding)."""

    def __init__(self, sim: Simulator, pythonpath: str | None = None, *args: str):
        self.port = free_port()
        env = sim.env()
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([pythonpath, str(REPO)])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuobs.cli", "exporter", "--listen-address", "127.0.0.1", "--port",
             str(self.port), "--interval", "0.2", "--processes", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def scrape_when(self, predicate, timeout: float = 30.0):
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1][-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            last = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
            if predicate(last):
                return last
            time.sleep(0.2)
        pytest.fail(f"condition not met; last scrape: {sorted({n for n, _, _ in last or []})}")

    def stop(self) -> str:
        stop(self.proc)
        return self.proc.communicate()[1]


def check_old_node(child: Child, sim: Simulator, fallbacks: set[str]) -> str:
    """The common checks: every GPU up, text labels, memory, clock-event reasons and processes
    served through the older calls, no NVML error for a missing call, each logged at most once."""
    u0, u1 = (sim.state.gpu(i).uuid.s.decode() for i in range(2))
    try:
        scrape = child.scrape_when(lambda s: one(s, UP) == {u0: 1.0, u1: 1.0} and PROC_MEM in {n for n, _, _ in s}
                                   and len(one(s, MEM_USED)) == 2)
        time.sleep(1.0)  # five more passes: nothing may be logged again
        scrape = child.scrape_when(lambda s: True)
    finally:
        stderr = child.stop()
    assert not [v for v in label_values(scrape) if v.startswith(("b'", 'b"'))]
    assert set(one(scrape, MEM_USED)) == {u0, u1}
    assert {labels["uuid"] for n, labels, _ in scrape if n == REASON} == {u0, u1}
    assert [labels["pid"] for n, labels, _ in scrape if n == PROC_MEM] == [str(os.getpid())]
    unavailable = {labels["call"] for n, labels, _ in scrape if n == UNAVAILABLE
                   and labels["reason"] == "function_not_found"}
    assert fallbacks <= unavailable, unavailable
    errors = {labels["call"] for n, labels, _ in scrape if n == ERRORS}
    assert not errors & fallbacks, f"a missing call counted as an error: {errors}"
    assert "Traceback" not in stderr
    for call in fallbacks:
        assert stderr.count(f'"call": "{call}"') <= 1, f"{call} logged more than once"
    return stderr


def test_exporter_on_an_r470_driver_falls_back_to_the_older_calls(tmp_path):
    old = Simulator(NODE, base=REPO, directory=tmp_path, driver="r470")
    try:
        check_old_node(Child(old), old, {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons",
                                         "nvmlDeviceGetComputeRunningProcesses_v3"})
    finally:
        old.close()


def test_exporter_with_the_real_pynvml_11_4_1(tmp_path):
    legacy = legacy_pynvml_path()
    sim = Simulator(NODE, base=REPO, directory=tmp_path)
    try:
        check_old_node(Child(sim, str(legacy)), sim, {"nvmlDeviceGetMemoryInfo_v2",
                                                      "nvmlDeviceGetCurrentClocksEventReasons"})
    finally:
        sim.close()


def test_field_values_without_the_private_fast_path_names(make_sim, monkeypatch):
    make_sim(TWO)
    ids = [(N.NVML_FI_DEV_POWER_INSTANT, 0), (N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0), (N.NVML_FI_DEV_MEMORY_TEMP, 0)]
    handle = N.nvmlDeviceGetHandleByIndex(0)
    fast = list(zip(*fields.FieldValues(ids).read(handle)))
    public = list(zip(*fields.FieldValues(ids, fast=False).read(handle)))
    assert fields.FAST and [r for r, _ in fast] == [r for r, _ in public] == [N.NVML_SUCCESS] * 3
    assert [v for _, v in public][1:] == [v for _, v in fast][1:] and public[0][1] == pytest.approx(fast[0][1], rel=0.2)
    monkeypatch.delattr(N, "_nvmlCheckReturn")  # a pynvml release that renamed a private helper
    assert not fields._fast_path_ok()
