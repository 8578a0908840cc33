"""The topology family on the simulator's DGX/HGX (NVSwitch), NVLink-bridged and PCIe-only nodes, and
the placement alert end to end: an in-process exporter with pod attribution from a fake kubelet,
scraped by a real Prometheus evaluating the fast rule profile."""

from __future__ import annotations

import time

import pytest
from conftest import require_tool
from test_attribution import FAST, kubelet  # noqa: F401 - kubelet is a fixture

from gpuobs import records
from gpuobs.alerts.build import write_fast_rules
from gpuobs.collect.topology import cpu_list
from gpuobs.sim import scenario
from gpuobs.sim.state import set_val

LINKS = "gpuobs_gpu_topology_nvlink_links"
DOMAIN = "gpuobs_gpu_topology_nvlink_domain"
ALERT = "GpuPodPlacementWithoutNvlink"


def pairs(run, expect: int = 0) -> dict[tuple[str, str], tuple[float, str, str]]:
    """{(gpu, peer_gpu): (NVLink links, link_type, pcie_path)} of a scrape with `expect` pair series at
    least (a GPU whose read missed a loaded machine's pass deadline is absent from that snapshot)."""
    scrape = run.wait_for(lambda s: sum(n == LINKS for n, _, _ in s) >= expect, 10, f"{expect} pair series")
    return {(l["gpu"], l["peer_gpu"]): (v, l["link_type"], l["pcie_path"]) for n, l, v in scrape if n == LINKS}


def by_gpu(run, name: str, expect: int, label: str | None = None) -> dict[str, object]:
    """{gpu: value, or the label's value} of one per-GPU metric, from a scrape with all `expect` GPUs."""
    scrape = run.wait_for(lambda s: sum(n == name for n, _, _ in s) >= expect, 10, f"{name} of {expect} GPUs")
    return {l["gpu"]: (l[label] if label else v) for n, l, v in scrape if n == name}


def test_nvswitch_board_every_pair_over_nvswitch_with_sockets_and_affinity(exporter):
    """DGX H100: 8 GPUs, every pair NV18 through the NVSwitches; PXB within a board pair, NODE on a
    socket, SYS across; GPUs 0-3 on NUMA node 0 (cores 0-55 and their threads 112-167), 4-7 on 1."""
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 8}], "topology": "nvswitch"})
    got = pairs(run, 8 * 7)
    assert len(got) == 8 * 7
    assert all(links == 18 and kind == "nvswitch" for links, kind, _ in got.values())
    assert got[("0", "1")][2] == "pcie_switches" and got[("0", "2")][2] == "numa_node"
    assert got[("0", "4")][2] == "system" and got[("7", "6")][2] == "pcie_switches"
    assert by_gpu(run, "gpuobs_gpu_numa_node", 8) == {str(i): float(i // 4) for i in range(8)}
    assert by_gpu(run, DOMAIN, 8) == {str(i): 0.0 for i in range(8)}  # one NVLink domain: the NVSwitches
    cpus = by_gpu(run, "gpuobs_gpu_cpu_affinity_info", 8, "cpus")
    assert cpus["0"] == "0-55,112-167" and cpus["7"] == "56-111,168-223"


def test_nvlink_bridged_pairs_and_a_link_going_down(make_sim, start):
    """H100 NVL-style cards bridged two by two: only 0-1 and 2-3 have NVLink (NV18 straight to the peer,
    PIX), the rest PCIe; when a bridge's links go down its pair falls back to PCIe on a slow pass."""
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 4}],
                    "topology": {"kind": "nvlink-pairs", "sockets": 1, "cores_per_socket": 32}}, init=False)
    run = start(sim, interval=0.1)
    got = pairs(run, 12)
    assert got[("0", "1")] == (18.0, "nvlink", "pcie_switch") and got[("3", "2")] == (18.0, "nvlink", "pcie_switch")
    assert got[("0", "2")] == (0.0, "numa_node", "numa_node") and got[("1", "3")] == (0.0, "numa_node", "numa_node")
    assert set(by_gpu(run, "gpuobs_gpu_cpu_affinity_info", 4, "cpus").values()) == {"0-63"}
    assert by_gpu(run, DOMAIN, 4) == {"0": 0.0, "1": 0.0, "2": 2.0, "3": 2.0}  # a domain per bridge
    for slot in (2, 3):
        g = sim.state.gpu(slot)
        for link in g.links[: g.link_count]:
            set_val(link.state, 0)
    run.wait_for(lambda s: any(n == LINKS and l["gpu"] == "2" and l["peer_gpu"] == "3" and v == 0
                               for n, l, v in s), 10, "the downed bridge's pair to lose NVLink")
    assert pairs(run, 12)[("2", "3")] == (0.0, "pcie_switch", "pcie_switch")
    assert pairs(run, 12)[("0", "1")][0] == 18.0
    assert by_gpu(run, DOMAIN, 4) == {"0": 0.0, "1": 0.0, "2": 2.0, "3": 3.0}  # the bridge's GPUs apart now


def test_pcie_only_node_has_no_nvlink_pairs(exporter):
    run = exporter({"gpus": [{"profile": "l40s-pcie", "count": 4}]})  # no NVLink: the default is pcie
    got = pairs(run, 12)
    assert len(got) == 12 and all(links == 0 for links, _, _ in got.values())
    assert by_gpu(run, DOMAIN, 4) == {str(i): float(i) for i in range(4)}  # no NVLink: a domain each
    assert got[("0", "1")][1] == "pcie_switch" and got[("1", "2")][1] == "system"


def test_single_gpu_has_no_pairs_and_a_bad_topology_is_refused(exporter):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb"}]})
    assert pairs(run) == {} and by_gpu(run, "gpuobs_gpu_numa_node", 1) == {"0": 0.0}
    for bad in ("torus", {"kind": "pcie", "sockets": 0}, ["pcie"]):
        with pytest.raises(scenario.ScenarioError, match="topology"):
            scenario.apply(run.sim.state, {"gpus": [{"profile": "h100-sxm-80gb"}], "topology": bad})


def test_cpu_list():
    assert cpu_list([0b1011, 0]) == "0-1,3"
    assert cpu_list([1 << 63, 1]) == "63-64"
    assert cpu_list([0]) == ""


def _alerts(query) -> dict[str, str]:
    """{k8s_pod: state} of the placement alert in Prometheus's ALERTS."""
    return {r["metric"]["k8s_pod"]: r["metric"]["alertstate"] for r in query(f'ALERTS{{alertname="{ALERT}"}}')}


def test_pod_without_nvlink_fires_and_nvlink_pair_stays_quiet(make_sim, start, kubelet, prometheus, tmp_path):
    """HGX H100 board whose GPU 7 lost its NVLinks (fabric down): a pod given GPUs 0 and 7 has no NVLink
    between them and fires the alert; one given 1 and 2 (NVSwitch) does not; a 1-GPU pod neither. The
    exporter serves the default profile: no GPU pairs, only each GPU's NVLink domain."""
    require_tool("prometheus")
    server, path, _ = kubelet
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 8}], "topology": "nvswitch"}, init=False)
    g = sim.state.gpu(7)
    for link in g.links[: g.link_count]:
        set_val(link.state, 0)
    run = start(sim, kubelet_socket=path, profile="default", **FAST)
    info = run.wait_for(lambda s: sum(n == "gpuobs_gpu_info" for n, _, _ in s) == 8, 10, "8 GPUs")
    u = [l["uuid"] for l in sorted((l for n, l, _ in info if n == "gpuobs_gpu_info"), key=lambda l: int(l["gpu"]))]
    server.pods = [("split", "ml", "trainer", "nvidia.com/gpu", [u[0], u[7]]),
                   ("packed", "ml", "trainer", "nvidia.com/gpu", [u[1], u[2]]),
                   ("single", "ml", "trainer", "nvidia.com/gpu", [u[3]])]
    run.wait_for(lambda s: any(n == DOMAIN and l.get("k8s_pod") == "split" for n, l, _ in s), 5, "pod labels")
    assert not any(n == LINKS for n, _, _ in run.scrape())
    query = prometheus([f"127.0.0.1:{run.exp.http.port}"], rule_files=(str(write_fast_rules(tmp_path)),))
    assert eventually(lambda: _alerts(query), {"split": "firing"}) == {"split": "firing"}
    for record, want in ((records.POD_NVLINK_DOMAINS, {"split": 2, "packed": 1, "single": 1}),
                         (records.POD_NUMA_NODES, {"split": 2, "packed": 1, "single": 1})):
        assert eventually(lambda record=record: per_pod(query, record), want) == want, record.name


def per_pod(query, record) -> dict[str, float]:
    return {r["metric"]["k8s_pod"]: float(r["value"][1]) for r in query(record.name)}


def eventually(read, want, timeout: float = 40.0):
    """read() once it equals want, else its last value after timeout s (for the assertion to show)."""
    deadline = time.monotonic() + timeout
    got = read()
    while got != want and time.monotonic() < deadline:
        time.sleep(1)
        got = read()
    return got


def test_a_lost_peer_does_not_make_the_other_gpus_unusable(exporter):
    """A pair call (P2P status, common ancestor) to a GPU that fell off the bus fails with the lost
    GPU's code: the asking GPU stays up through the slow passes that ask again, only the lost one is
    down, and the pairs between the GPUs still there are still served."""
    from gpuobs.collect.base import Family

    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 4}], "topology": "nvswitch"}, interval=0.2)
    pairs(run, 4 * 3)
    run.sim.state.lose_gpu(1)
    run.next_snapshot(2 * Family.slow_every + 2)  # two slow passes: each asks every pair again
    up = {l["gpu"]: v for n, l, v in run.scrape() if n == "gpuobs_gpu_up"}
    assert up == {"0": 1.0, "1": 0.0, "2": 1.0, "3": 1.0}, up
    unhealthy = {l["gpu"] for n, l, v in run.scrape() if n == "gpuobs_gpu_unhealthy" and v == 1}
    assert unhealthy == {"1"}, unhealthy
    peers = {(l["gpu"], l["peer_gpu"]) for n, l, _ in run.scrape() if n == "gpuobs_gpu_topology_nvlink_links"}
    assert {(a, b) for a in "023" for b in "023" if a != b} <= peers, peers


def _down(scrape, gpu: str) -> str | None:
    """The gpuobs_gpu_unhealthy reason of a GPU in a scrape (None: it is up)."""
    return next((l["reason"] for n, l, v in scrape if n == "gpuobs_gpu_unhealthy" and l["gpu"] == gpu and v), None)


def _naming(scrape, gpu: str) -> set[tuple[str, str]]:
    """The (gpu, peer_gpu) pair series of a scrape that name `gpu`, either way."""
    return {(l["gpu"], l["peer_gpu"]) for n, l, _ in scrape if n == LINKS and gpu in (l["gpu"], l["peer_gpu"])}


def test_a_lost_peers_pairs_go_in_the_pass_that_finds_it_lost_and_come_back(exporter):
    """GPU 1 falls off the bus (GPU_IS_LOST): the first scrape that shows it down serves no pair
    naming it, either way, while the pairs of the GPUs still there stay; back, its pairs come back."""
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 4}], "topology": "nvswitch"}, interval=0.2)
    pairs(run, 4 * 3)
    run.sim.state.lose_gpu(1)
    scrape = run.wait_for(lambda s: _down(s, "1") == "lost", 10, "GPU 1 down, lost")
    assert _naming(scrape, "1") == set()
    for _ in range(3):  # and in the passes after
        run.next_snapshot()
        scrape = run.scrape()
        assert _naming(scrape, "1") == set()
        assert len(pairs(run, 3 * 2)) == 3 * 2
    run.sim.state.lose_gpu(1, False)
    back = run.wait_for(lambda s: sum(n == LINKS for n, _, _ in s) == 4 * 3, 10, "every pair again")
    assert _naming(back, "1") == {(a, b) for a in "0123" for b in "0123" if a != b and "1" in (a, b)}


def test_a_hung_peer_keeps_its_pairs(exporter):
    """A call hung on GPU 1 withholds its own series (timeout), but it is still there: the other
    GPUs' pairs to it stay, pass after pass, and its own come back with it."""
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 4}], "topology": "nvswitch"}, interval=0.2)
    pairs(run, 4 * 3)
    idx = run.sim.state.fail("nvmlDeviceGetUtilizationRates", 0, gpu=1, hang=True)
    try:
        run.wait_for(lambda s: _down(s, "1") == "timeout", 5, "GPU 1 withheld")
        for _ in range(5):
            run.next_snapshot()
            scrape = run.scrape()
            if _down(scrape, "1") == "timeout":
                assert _naming(scrape, "1") == {(a, "1") for a in "023"}
    finally:
        run.sim.state.clear_fault(idx)
    run.wait_for(lambda s: _down(s, "1") is None and len(_naming(s, "1")) == 6, 10, "GPU 1 back, its pairs whole")


def test_pairs_follow_the_index_shift_after_a_gpu_leaves_at_once(exporter):
    """GPU 1 leaves the device count: GPUs 2 and 3 become 1 and 2. Within a few passes (not at the
    next 5-minute re-probe) every pair names its peer by its new index, and none names the GPU gone."""
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 4}], "topology": "nvswitch"}, interval=0.2)
    pairs(run, 4 * 3)
    st = run.sim.state
    uuids = [st.gpu(i).uuid.s.decode() for i in range(4)]
    st.remove_gpu(1)
    t0 = time.monotonic()
    now = {uuids[0]: "0", uuids[2]: "1", uuids[3]: "2"}

    def settled(scrape) -> bool:
        got = {(l["uuid"], l["gpu"], l["peer_uuid"], l["peer_gpu"]) for n, l, _ in scrape if n == LINKS}
        want = {(a, now[a], b, now[b]) for a in now for b in now if a != b}
        return got == want
    run.wait_for(settled, 10, "pairs at the new indices, none with the GPU gone")
    assert time.monotonic() - t0 < 5, "pairs followed the shift only at a re-probe"
