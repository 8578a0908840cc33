"""The faults the fleet bench injects (bench/fleet.py Node.inject; bench/fleet_sharded.py times their
pages) are the faults the exporter itself serves: on a simulated 8 x H100 node, a GPU in HW thermal
slowdown, one reporting XID 79 and one lost are put in the driver, and the series the paging alerts
read (GpuHwThermalSlowdown, GpuXidRebootRequired, GpuLost) must take the same values, GPU by GPU,
in the bench's copy of that node after Node.inject as in the real exporter's scrape.
"""

from __future__ import annotations

import math
import sys
import time

import pytest
from conftest import REPO

from gpuobs import catalog as c
from gpuobs.sim.state import set_val

sys.path.insert(0, str(REPO))
from bench import fleet  # noqa: E402

HW_THERMAL = 0x40  # NVML clocks-event reason bit of HW thermal slowdown
FAULT_GPU = {"hw_thermal": 1, "xid79": 2, "lost": 3}


def watched(samples) -> dict[tuple[str, int], float]:
    """(what, GPU index) -> value of the series the three paging alerts read."""
    out = {}
    for name, labels, value in samples:
        gpu = int(labels.get("gpu", -1))
        if name == c.GPU_UP.name:
            out["up", gpu] = value
        elif name == c.CLOCK_EVENT_ACTIVE.name and labels.get("reason") == "hw_thermal_slowdown":
            out["hw_thermal", gpu] = value
        elif name == c.XID_ERRORS.exposed_name and labels.get("xid") == "79":
            out["xid79", gpu] = value
        elif name == c.XID_LAST_SEEN.name and labels.get("xid") == "79":
            out["xid79_last_seen", gpu] = value
    return out


def parsed(body: bytes):
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(body.decode()) for s in f.samples]


@pytest.fixture
def node_and_exporter(make_sim, start):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": fleet.GPUS, "behaviour": "steady"}]})
    run = start(sim, profile="default", families={"identity", "clock_events", "xid"})
    series, fams = fleet.parse_template(run.get()[1])
    n = next(n for n in range(100) if set(fleet.Node.roles_of(n)) == {"busy"})  # no fault of its own
    return run, fleet.Node(n, series, fams, target_labels=False, attributed=False, injectable=True), fams


def test_injected_faults_serve_what_the_exporter_serves_under_them(node_and_exporter):
    run, node, fams = node_and_exporter
    healthy = watched(run.scrape())
    assert watched(parsed(node.body(time.time(), fams))) == healthy
    assert {k for k in healthy if k[0].startswith("xid79")} == set()  # no XID yet, in both

    st = run.sim.state
    set_val(st.gpu(FAULT_GPU["hw_thermal"]).clock_events, HW_THERMAL)
    at = time.time()
    st.xid(FAULT_GPU["xid79"], 79)
    st.lose_gpu(FAULT_GPU["lost"])
    real = watched(run.wait_for(lambda s: (w := watched(s)).get(("up", FAULT_GPU["lost"])) == 0
                                and ("xid79", FAULT_GPU["xid79"]) in w
                                and w.get(("hw_thermal", FAULT_GPU["hw_thermal"])) == 1, 10, "the three faults served"))
    for fault, gpu in FAULT_GPU.items():
        assert node.inject(gpu, fault, at) > 0
    bench = watched(parsed(node.body(time.time(), fams)))

    assert abs(bench.pop(("xid79_last_seen", 2)) - real.pop(("xid79_last_seen", 2))) < 5
    # a lost GPU's other series: the exporter stops serving them, the bench keeps them (no alert reads them)
    real_gpus = {k for k in real if k[1] == FAULT_GPU["lost"]}
    assert {k: v for k, v in bench.items() if k in real or k[1] != FAULT_GPU["lost"]} == real
    assert ("up", FAULT_GPU["lost"]) in real_gpus


def test_inject_refuses_an_unknown_fault_and_a_second_xid_changes_nothing(node_and_exporter):
    _, node, fams = node_and_exporter
    with pytest.raises(ValueError, match="unknown fault"):
        node.inject(0, "fire", time.time())
    assert node.inject(5, "xid79", 100.0) == 2  # its counter and its last-seen time appear
    assert node.inject(5, "xid79", 200.0) == 0  # already there: nothing new
    assert node.inject(5, "lost", math.inf) == 1
