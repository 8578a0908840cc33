"""MIG right-sizing: the profile table (gpuobs.mig), the recording rule
uuid:gpuobs_gpu_mig_profile:smallest_fit under promtool with known answers, and `gpuobs mig-advice`
against a real Prometheus holding the same week, each answer worked out from the table here.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import free_port, require_tool, stop
from test_reliability_rules import STEPS, gpu, promtool, s, week

from gpuobs import mig
from gpuobs import records as r
from gpuobs.alerts.rules import DEFAULT

GIB = 1024 ** 3
H100, H200, A100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S"
# (model, peak memory used, peak SM activity or None (no GPM: utilization instead), MIG mode on)
FLEET = {
    0: (H100, 9 * GIB, 0.30, False),  # 9 GiB and 30 % SM: 10.8 GiB > 10 GB, 36 % > 2/7 of the SMs
    1: (H100, 5 * GIB, 0.10, False),  # small: 1g.10gb
    2: (H100, 5 * GIB, 0.10, True),  # the same in MIG mode: no advice
    3: (L40S, 5 * GIB, 0.10, False),  # a model without MIG: no advice
    4: (H100, 70 * GIB, 0.95, False),  # too busy for any profile
    5: (A100, 15 * GIB, None, False),  # no GPM: its utilization stands in for SM activity
    6: (H200, 20 * GIB, 0.10, False),
}
LOW = 0.5  # the rest of the review window, below every peak


def peak_week(peak: float) -> str:
    """Low all the review window but one step at the peak."""
    return week((peak * LOW, 100), (peak, 1), (peak * LOW, STEPS - 101))


def fleet_series() -> list[dict]:
    series = [s("gpuobs_gpu_info", {**gpu("c1", "n1", 7), "name": H100}, week((1, STEPS)))]  # a GPU without data
    for i, (name, memory, sm, in_mig) in FLEET.items():
        g = gpu("c1", "n1", i)
        series += [s("gpuobs_gpu_info", {**g, "name": name}, week((1, STEPS))),
                   s("gpuobs_gpu_memory_used_bytes", g, peak_week(memory)),
                   s("gpuobs_gpu_utilization_ratio", g, peak_week(sm if sm is not None else 0.2)),
                   s("gpuobs_gpu_mig_enabled", g, week((int(in_mig), STEPS)))]
        if sm is not None:
            series.append(s("gpuobs_gpu_sm_active_ratio", g, peak_week(sm)))
    return series


def expected() -> dict[int, mig.Profile]:
    """The advice per GPU index, from the table: no entry, no advice."""
    out = {}
    for i, (name, memory, sm, in_mig) in FLEET.items():
        profile = mig.recommend(name, memory, 0.2 if sm is None else sm, DEFAULT.mig_headroom)
        if profile and not in_mig:
            out[i] = profile
    return out


def test_the_table_knows_the_profiles():
    h100 = mig.model_for(H100)
    assert [p.name for p in h100.profiles] == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert mig.model_for("NVIDIA H200").profiles[-1].name == "7g.141gb"
    assert mig.model_for(L40S) is None
    # 9 GiB * 1.2 = 10.8 GiB > 10 GB; 30 % * 1.2 = 36 % > 2/7: three compute slices, 40 GB
    assert mig.recommend(H100, 9 * GIB, 0.30, 0.2).name == "3g.40gb"
    assert mig.recommend(H100, 9 * GIB, 0.10, 0.2).name == "1g.20gb"
    assert mig.recommend(H100, 7 * GIB, 0.10, 0.2).name == "1g.10gb"
    assert mig.recommend(H100, 70 * GIB, 0.50, 0.2) is None  # 84 GiB: not even the whole GPU's 80 GB


def test_mig_advice_rule_known_answers(tmp_path):
    want = expected()
    assert set(want) == {0, 1, 5, 6}, want  # the quiet cases give none: MIG mode, L40S, too busy, no data
    rows = [({**gpu("c1", "n1", i), "profile": p.name}, p.compute_slices) for i, p in sorted(want.items())]
    def series(name: str, labels: dict) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    tests = [
        {"expr": r.GPU_MIG_ADVICE.name,
         "exp_samples": [{"labels": series(r.GPU_MIG_ADVICE.name, lb), "value": v} for lb, v in rows]},
        {"expr": f'{r.GPU_MEMORY_PEAK.name}{{gpu="0"}}',
         "exp_samples": [{"labels": series(r.GPU_MEMORY_PEAK.name, gpu("c1", "n1", 0)), "value": 9 * GIB}]},
    ]
    promtool(tmp_path, fleet_series(), tests)


OPENMETRICS_STEP = 300


def _openmetrics(now: float) -> str:
    """The same fleet as OpenMetrics samples, one every 5 minutes for the last day (peaks in its middle)."""
    n = 24 * 3600 // OPENMETRICS_STEP
    start = now - n * OPENMETRICS_STEP
    lines = []
    for metric in ("gpuobs_gpu_info", "gpuobs_gpu_memory_used_bytes", "gpuobs_gpu_utilization_ratio",
                   "gpuobs_gpu_sm_active_ratio", "gpuobs_gpu_mig_enabled"):
        lines.append(f"# TYPE {metric} gauge")
        for i, (name, memory, sm, in_mig) in FLEET.items():
            labels = ",".join(f'{k}="{v}"' for k, v in gpu("c1", "n1", i).items())
            value = {"gpuobs_gpu_info": 1, "gpuobs_gpu_memory_used_bytes": memory,
                     "gpuobs_gpu_utilization_ratio": 0.2 if sm is None else sm,
                     "gpuobs_gpu_sm_active_ratio": sm, "gpuobs_gpu_mig_enabled": int(in_mig)}[metric]
            if value is None:
                continue
            extra = f',name="{name}"' if metric == "gpuobs_gpu_info" else ""
            for k in range(n + 1):
                v = value if k == n // 2 or metric in ("gpuobs_gpu_info", "gpuobs_gpu_mig_enabled") else value * LOW
                lines.append(f"{metric}{{{labels}{extra}}} {v} {start + k * OPENMETRICS_STEP:.0f}")
    return "\n".join(lines) + "\n# EOF\n"


def test_mig_advice_command_on_a_real_prometheus(tmp_path):
    """`gpuobs mig-advice` reads the peaks from Prometheus and prints each GPU's advice from the table."""
    promtool_bin, prometheus_bin = require_tool("promtool"), require_tool("prometheus")
    now = time.time() - 60
    (tmp_path / "data.om").write_text(_openmetrics(now))
    subprocess.run([promtool_bin, "tsdb", "create-blocks-from", "openmetrics", "data.om", "prom"], cwd=tmp_path,
                   check=True, capture_output=True)
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    proc = subprocess.Popen([prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'prom'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = _advice_when_ready(port)
    finally:
        stop(proc)
    lines = {int(line.split()[1]): line for line in out.splitlines()[1:]}
    want = expected()
    assert sorted(lines) == sorted(FLEET), out
    for i, line in lines.items():
        name, memory, sm, in_mig = FLEET[i]
        if i in want:
            assert line.endswith(f"  {want[i].name}"), line
        elif in_mig:
            assert line.endswith("already in MIG mode"), line
        elif mig.model_for(name) is None:
            assert line.endswith("no MIG on this model"), line
        else:
            assert line.endswith("needs the whole GPU"), line
    assert f"{9.0:>8.1f} GiB" in lines[0] and " 30%" in lines[0], lines[0]


def _advice_when_ready(port: int) -> str:
    deadline = time.monotonic() + 30
    while True:
        run = subprocess.run([sys.executable, "-m", "gpuobs.cli", "mig-advice", "--prometheus",
                              f"http://127.0.0.1:{port}", "--range", "2d"], capture_output=True, text=True)
        if run.returncode == 0 and len(run.stdout.splitlines()) > 1:
            return run.stdout
        if time.monotonic() > deadline:
            pytest.fail(f"mig-advice never answered: {run.stdout}{run.stderr}")
        time.sleep(0.5)
