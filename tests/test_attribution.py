"""Pod and Slurm job attribution: a real gRPC server on a unix socket (tests/kubelet_server.py) implements
the kubelet's PodResourcesLister from the same generated code the exporter uses."""

from __future__ import annotations

import shutil
import time

import pytest
from kubelet_server import serve_kubelet

from gpuobs.attribution import PodResourcesWatcher, SlurmJobMap
from gpuobs.attribution import podresources_v1_pb2 as pb
from gpuobs.attribution.podresources import build_mapping

H100 = "h100-sxm-80gb"
FAST = dict(interval=0.1, attribution_refresh=0.2, attribution_timeout=0.3)
POD_KEYS = ("k8s_pod", "k8s_namespace", "k8s_container")


@pytest.fixture
def kubelet():
    """(servicer, socket path, stop()) of a kubelet PodResources server (kubelet_server.serve_kubelet)."""
    servicer, path, stop = serve_kubelet()
    yield servicer, path, stop
    stop()


# What pod_of gives for a series missing from a scrape: a busy machine's pass may withhold a GPU
# past its deadline, so a wait keeps scraping rather than failing on one such scrape.
ABSENT = ("<series absent>",) * len(POD_KEYS)


def uuids(run, count: int = 2) -> list[str]:
    """UUIDs of the node's GPUs in index order, once a scrape serves all count of them."""
    scrape = run.wait_for(lambda s: sum(n == "gpuobs_gpu_info" for n, _, _ in s) == count, 5, "every GPU served")
    info = [l for n, l, _ in scrape if n == "gpuobs_gpu_info"]
    return [l["uuid"] for l in sorted(info, key=lambda l: int(l["gpu"]))]


def pod_of(scrape, uuid: str, name: str = "gpuobs_gpu_info", key: str = "uuid"):
    """(k8s_pod, k8s_namespace, k8s_container) of one series: None values when the labels are absent,
    ABSENT when the series itself is."""
    for n, l, _ in scrape:
        if n == name and l.get(key) == uuid:
            return tuple(l.get(k) for k in POD_KEYS)
    return ABSENT


def per_gpu(scrape, uuid: str):
    """Labels of one GPU's series, the exporter's own health (its per-GPU timeouts) aside."""
    return [l for n, l, _ in scrape if l.get("uuid") == uuid and not n.startswith("gpuobs_exporter_")]


def attribution_up(scrape) -> dict[str, float]:
    return {l["source"]: v for n, l, v in scrape if n == "gpuobs_exporter_attribution_up"}


def test_labels_appear_follow_churn_and_vanish_with_no_rpc_per_scrape(exporter, kubelet):
    server, path, stop = kubelet
    run = exporter({"gpus": [{"profile": H100, "count": 2}]}, kubelet_socket=path, **FAST)
    u0, u1 = uuids(run)
    server.pods = [("train-0", "ml", "trainer", "nvidia.com/gpu", [u0])]
    scrape = run.wait_for(lambda s: pod_of(s, u0) == ("train-0", "ml", "trainer"), 5, "pod labels")
    assert attribution_up(scrape) == {"podresources": 1.0}
    series = per_gpu(scrape, u0)
    assert len(series) > 10 and all(l["k8s_pod"] == "train-0" and l["k8s_namespace"] == "ml" for l in series)
    assert not any("k8s_pod" in l for l in per_gpu(scrape, u1))
    assert not any("pod" in l or "namespace" in l for _, l, _ in scrape)  # clear of Kubernetes SD target labels

    # No RPC per scrape: List() follows the refresh period, not the scrape rate.
    calls, t0 = server.calls, time.monotonic()
    for _ in range(60):
        run.get()
    elapsed = time.monotonic() - t0
    assert server.calls - calls <= elapsed / 0.2 + 2

    # Churn: the pod moves, a second one arrives (time-slicing replica id), then both go.
    server.pods = [("train-1", "ml", "trainer", "nvidia.com/gpu", [u1]),
                   ("infer-7", "serve", "vllm", "nvidia.com/gpu", [f"{u0}::2"])]
    run.wait_for(lambda s: pod_of(s, u1) == ("train-1", "ml", "trainer")
                 and pod_of(s, u0) == ("infer-7", "serve", "vllm"), 3, "churn")
    server.pods = [("infer-7", "serve", "vllm", "nvidia.com/gpu", [u0])]
    run.wait_for(lambda s: pod_of(s, u1) == (None, None, None), 3, "removed pod's labels to vanish")

    # The socket goes away (kubelet stopped): labels vanish, metrics keep flowing.
    stop()
    scrape = run.wait_for(lambda s: pod_of(s, u0) == (None, None, None), 3, "labels to vanish with the socket")
    assert not any(k in l for _, l, _ in scrape for k in POD_KEYS)
    assert attribution_up(run.wait_for(lambda s: attribution_up(s) == {"podresources": 0.0}, 3,
                                       "attribution_up 0 without the socket")) == {"podresources": 0.0}
    # metrics keep flowing for both GPUs (a pass on a busy machine may withhold one past its deadline)
    run.wait_for(lambda s: {l["uuid"] for n, l, _ in s if n == "gpuobs_gpu_info"} == {u0, u1}, 3, "both GPUs")


def test_missing_socket_is_quiet_and_scrapes_stay_fast(exporter, tmp_path):
    run = exporter({"gpus": [{"profile": H100, "count": 1}]}, kubelet_socket=str(tmp_path / "none.sock"), **FAST)
    time.sleep(0.5)
    t0 = time.monotonic()
    for _ in range(10):
        scrape = run.scrape()
    assert (time.monotonic() - t0) / 10 < 0.2
    assert not any(k in l for _, l, _ in scrape for k in POD_KEYS)
    assert attribution_up(scrape) == {"podresources": 0.0}  # said, not silent
    watcher = run.exp.attribution[0]
    assert watcher.calls == 0 and watcher.refreshes >= 2  # checked every refresh, never called
    assert run.get("/readyz")[0] == 200


def test_stalled_kubelet_times_out_keeps_then_drops_mapping(exporter, kubelet):
    server, path, _ = kubelet
    run = exporter({"gpus": [{"profile": H100, "count": 1}]}, kubelet_socket=path, **FAST)
    (u0,) = uuids(run, 1)
    server.pods = [("train-0", "ml", "trainer", "nvidia.com/gpu", [u0])]
    run.wait_for(lambda s: pod_of(s, u0)[0] == "train-0", 3, "pod labels")
    server.delay = 5.0  # far beyond the 0.3 s deadline
    watcher = run.exp.attribution[0]
    errors = watcher.errors
    slowest, t_stall = 0.0, time.monotonic()
    dropped_after = None
    while time.monotonic() - t_stall < 6:
        t0 = time.monotonic()
        scrape = run.scrape()
        slowest = max(slowest, time.monotonic() - t0)
        assert any(n == "gpuobs_gpu_info" for n, _, _ in scrape)
        if pod_of(scrape, u0)[0] is None:
            dropped_after = time.monotonic() - t_stall
            break
        time.sleep(0.05)
    assert slowest < 0.5, f"a scrape took {slowest:.2f} s while the kubelet stalled"
    assert watcher.errors > errors
    assert attribution_up(run.scrape()) == {"podresources": 0.0}  # the kubelet did not answer
    # kept through the first timeouts (3 refreshes' grace), then dropped: never stale for long
    assert dropped_after is not None and 0.4 < dropped_after < 5, dropped_after
    assert run.get("/readyz")[0] == 200


def mig_pod_on_first_instance(exporter, kubelet):
    """An exporter on an H100 split 3g.40gb + 1g.10gb whose kubelet gives the first GPU instance's MIG
    device to pod small-job: (the running exporter, that instance's id, its MIG UUID, the other
    instance's id, the first scrape with the pod's labels)."""
    server, path, _ = kubelet
    run = exporter({"gpus": [{"profile": H100, "mig": ["3g.40gb", "1g.10gb"]}]}, kubelet_socket=path, **FAST)
    scrape = run.wait_for(lambda s: sum(n == "gpuobs_mig_info" for n, _, _ in s) == 2, 5, "MIG devices")
    migs = {l["gpu_instance_id"]: l["mig_uuid"] for n, l, _ in scrape if n == "gpuobs_mig_info"}
    (gi_a, mig_a), (gi_b, _) = sorted(migs.items())
    server.pods = [("small-job", "research", "main", "nvidia.com/mig-3g.40gb", [mig_a])]
    scrape = run.wait_for(lambda s: pod_of(s, gi_a, "gpuobs_mig_info", "gpu_instance_id")[0] == "small-job",
                          5, "MIG pod labels")
    return run, gi_a, mig_a, gi_b, scrape


def test_mig_devices_are_attributed_by_mig_uuid(exporter, kubelet):
    run, gi_a, _, gi_b, scrape = mig_pod_on_first_instance(exporter, kubelet)
    assert pod_of(scrape, gi_b, "gpuobs_mig_info", "gpu_instance_id") == (None, None, None)
    mig_series = [l for n, l, _ in scrape if n.startswith("gpuobs_mig_") and l["gpu_instance_id"] == gi_a]
    assert len(mig_series) >= 2 and all(l.get("k8s_pod") == "small-job" for l in mig_series)
    parent = [l for n, l, _ in scrape if n == "gpuobs_gpu_info"]
    assert parent and all("k8s_pod" not in l for l in parent)  # the pod holds a MIG slice, not the GPU


def test_xids_of_a_mig_device_carry_the_pod_holding_it(exporter, kubelet):
    run, gi_a, _, gi_b, _ = mig_pod_on_first_instance(exporter, kubelet)
    deadline = time.monotonic() + 10
    while run.sim.state.calls().get("nvmlDeviceRegisterEvents", 0) < 1:  # events before it are not delivered
        assert time.monotonic() < deadline, "the XID watcher registered no GPU"
        time.sleep(0.05)
    time.sleep(0.1)
    for gi, xid in ((gi_a, 43), (gi_b, 31)):
        run.sim.state.xid(0, xid, gi=int(gi), ci=0)
    run.sim.state.xid(0, 79)
    scrape = run.wait_for(lambda s: sum(n == "gpuobs_gpu_xid_errors_total" for n, _, _ in s) == 3, 5, "the XIDs")
    assert pod_of(scrape, "43", "gpuobs_gpu_xid_errors_total", "xid") == ("small-job", "research", "main")
    assert pod_of(scrape, "43", "gpuobs_gpu_xid_last_seen_timestamp_seconds", "xid")[0] == "small-job"
    assert pod_of(scrape, "31", "gpuobs_gpu_xid_errors_total", "xid") == (None, None, None)  # nobody holds it
    assert pod_of(scrape, "79", "gpuobs_gpu_xid_errors_total", "xid") == (None, None, None)  # the whole GPU


def test_dcgm_naming_uses_dcgm_exporter_label_names(exporter, kubelet):
    server, path, _ = kubelet
    run = exporter({"gpus": [{"profile": H100, "count": 2}]}, kubelet_socket=path, naming="dcgm", **FAST)
    time.sleep(0.3)
    u0 = next(l["UUID"] for n, l, _ in run.scrape() if n.startswith("DCGM_FI_") and l["gpu"] == "0")
    server.pods = [("train-0", "ml", "trainer", "nvidia.com/gpu", [u0])]
    scrape = run.wait_for(lambda s: any(l.get("pod") == "train-0" for _, l, _ in s), 5, "dcgm pod labels")
    dcgm = [l for n, l, _ in scrape if n.startswith("DCGM_FI_")]
    assert all((l.get("pod"), l.get("namespace"), l.get("container")) == ("train-0", "ml", "trainer")
               for l in dcgm if l["UUID"] == u0)
    assert all("pod" not in l for l in dcgm if l["UUID"] != u0)
    assert not any("k8s_pod" in l for _, l, _ in scrape)


def test_slurm_job_mapping_directory(exporter, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("1234\n")
    (jobs / "1").write_text("56\n55\n")
    run = exporter({"gpus": [{"profile": H100, "count": 2}, {"profile": H100, "mig": ["3g.40gb", "2g.20gb"]}]},
                   slurm_job_dir=str(jobs), **FAST)
    scrape = run.wait_for(lambda s: sum(n == "gpuobs_mig_info" for n, _, _ in s) == 2, 5, "MIG devices")
    gi = sorted(l["gpu_instance_id"] for n, l, _ in scrape if n == "gpuobs_mig_info")[0]
    (jobs / f"2.{gi}").write_text("777\n")

    def jobs_of(s):
        gpu = {l["gpu"]: l.get("hpc_job") for n, l, _ in s if n == "gpuobs_gpu_info"}
        mig = {l["gpu_instance_id"]: l.get("hpc_job") for n, l, _ in s if n == "gpuobs_mig_info"}
        return gpu, mig

    scrape = run.wait_for(lambda s: jobs_of(s)[1].get(gi) == "777", 5, "slurm labels")
    assert attribution_up(scrape) == {"slurm": 1.0}
    gpu, mig = jobs_of(scrape)
    assert gpu == {"0": "1234", "1": "55,56", "2": None}
    assert sorted(mig.values(), key=str) == ["777", None], mig
    (jobs / "0").unlink()  # the epilog removes the file when the job ends
    # a body served stale (a pass late under load) has no GPU series: wait past it
    run.wait_for(lambda s: jobs_of(s)[0].get("0", "stale") is None, 3, "ended job's label to vanish")
    shutil.rmtree(jobs)  # files first, then the directory: a refresh may see it empty but there
    scrape = run.wait_for(lambda s: attribution_up(s) == {"slurm": 0.0}, 3, "no directory: attribution down")
    assert not any("hpc_job" in l for _, l, _ in scrape)


def test_mapping_and_lookup_units(tmp_path):
    resp = pb.ListPodResourcesResponse()
    pod = resp.pod_resources.add(name="p", namespace="n")
    for cname in ("b", "a"):
        c = pod.containers.add(name=cname)
        c.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-1::0", "GPU-1::1", "weird"])
    pod.containers.add(name="cpu-only")
    assert build_mapping(resp) == {"GPU-1": {"pod": "p", "namespace": "n", "container": "a,b"}}
    w = PodResourcesWatcher(str(tmp_path / "nothing"), refresh_s=1)
    w.refresh()
    assert w.lookup("GPU-1") is None and w.calls == 0
    (tmp_path / "3").write_text("9\n")
    s = SlurmJobMap(str(tmp_path))
    s.refresh()
    assert s.lookup("GPU-x", "3") == {"hpc_job": "9"} and s.lookup("GPU-x", "4") is None
