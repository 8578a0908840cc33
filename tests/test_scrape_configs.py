"""exporters/prometheus/dcgm-*.yml against each client of dcgm-exporter's series: a real Prometheus
per example config scrapes a `--naming dcgm` exporter whose GPU 0 a pod holds (a real kubelet
PodResources gRPC server), through a static target carrying the Kubernetes service-discovery
labels of the exporter's own pod, so that each file's own relabeling runs. Each client's query is
its own text (cited below), and the test asserts whose pod it names: the workload's, the
exporter's, or nobody's (docs/scrape-configs.md says which client needs which config)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, free_port, prometheus_query, require_tool, stop
from test_attribution import FAST, kubelet  # noqa: F401 - kubelet is a fixture

from gpuobs.catalog import ALL

CONFIGS = ("dcgm-honor-labels.yml", "dcgm-exported-labels.yml", "dcgm-all-clients.yml")
WORKLOAD = ("train-0", "ml", "trainer")  # (pod, namespace, container) holding GPU 0
EXPORTER_POD = ("gpuobs-exporter-x7k2p", "gpuobs", "exporter")  # the scrape target's own pod
NODE = "gpu-node-1"

# The OpenShift console NVIDIA GPU plugin (rh-ecosystem-edge/console-plugin-nvidia-gpu):
# src/components/GPUDashboard/Cards/WorkloadsCard.tsx, the GPU workloads of the dashboard
CONSOLE_WORKLOADS = 'sum (DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_pod=~".+"}) by (exported_namespace, exported_pod, UUID)'
# src/utils/cluster-overview.ts getGPUUtilizationQuery, the cluster overview's GPUs in use
CONSOLE_IN_USE = 'count(count by (UUID,GPU_I_ID) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_pod=~".+"})) or vector(0)'
# OpenCost (opencost/opencost): pkg/costmodel/allocation.go queryFmtGPUsUsageAvg, formatted with a
# 1m window and OpenCost's default cluster label (PROM_CLUSTER_ID_LABEL unset: cluster_id)
OPENCOST_USAGE = 'avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[1m])) by (container, pod, namespace, cluster_id)'
# dcgm-exporter's dashboard (NVIDIA/dcgm-exporter): grafana/dcgm-exporter-dashboard.json, the
# "GPU Temperature" panel with its $instance and $gpu variables (label_values of instance, gpu)
GRAFANA_TEMP = 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}'


def sd_labels(job: dict) -> dict:
    """The meta labels Kubernetes service discovery (role endpoints) gives the exporter's target,
    for the job's own relabel_configs to read."""
    pod, namespace, container = EXPORTER_POD
    assert [sd["role"] for sd in job.pop("kubernetes_sd_configs")] == ["endpoints"]
    return {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_container_name": container, "__meta_kubernetes_endpoint_node_name": NODE,
            "__meta_kubernetes_service_label_app_kubernetes_io_name": "gpuobs-exporter",
            "__meta_kubernetes_endpoint_port_name": "metrics"}


def start_prometheus(name: str, target: str, directory: Path):
    """(process, query(promql) -> result list) of a Prometheus running the example config `name`
    with its discovery swapped for one static target (labels: sd_labels) scraped every 0.5 s."""
    config = yaml.safe_load((REPO / "exporters/prometheus" / name).read_text())
    config["rule_files"] = []  # the rules are promtool-checked in test_deploy; here only the labels matter
    config["global"].update(scrape_interval="500ms", evaluation_interval="500ms")
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [target], "labels": sd_labels(job)}]
    directory.mkdir()
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen([require_tool("prometheus"), f"--config.file={directory / 'prometheus.yml'}",
                             f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    return proc, prometheus_query(port)


def wait_scraped(proc: subprocess.Popen, query, promql: str) -> None:
    """Wait until `promql` has a result (Prometheus up, the target scraped with the pod attributed)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {proc.stderr.read()[-2000:]}")
        try:
            if query(promql):
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"prometheus never answered {promql}")


@pytest.fixture
def queries(exporter, kubelet, tmp_path):  # noqa: F811 - kubelet is the imported fixture
    """{config file name: query(promql)}, each Prometheus holding a few scrapes of one exporter whose
    GPU 0 is WORKLOAD's; also the UUID of GPU 0."""
    server, path, _ = kubelet
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 2}]}, kubelet_socket=path, naming="dcgm", **FAST)
    u0 = next(l["UUID"] for n, l, _ in run.scrape() if n.startswith("DCGM_FI_") and l["gpu"] == "0")
    pod, namespace, container = WORKLOAD
    server.pods = [(pod, namespace, container, "nvidia.com/gpu", [u0])]
    run.wait_for(lambda s: any(l.get("pod") == pod for _, l, _ in s), 5, "dcgm pod labels")
    target = run.url.removeprefix("http://")
    started = {name: start_prometheus(name, target, tmp_path / name) for name in CONFIGS}
    try:
        for proc, query in started.values():  # two scrapes, so that rates and windows have data
            wait_scraped(proc, query, 'count_over_time(up[1m]) >= 2')
        yield {name: query for name, (_, query) in started.items()}, u0
    finally:
        for proc, _ in started.values():
            stop(proc)


def workloads(result: list[dict], *labels: str) -> set[tuple[str, ...]]:
    """The set of `labels` values of a query's series ("" for a missing label)."""
    return {tuple(r["metric"].get(k, "") for k in labels) for r in result}


def test_clients_read_the_series_gpuobs_serves():
    """Every series the cited queries read is one the catalog maps to a dcgm-exporter name."""
    served = {name for m in ALL for name in m.dcgm.values()}
    for promql in (CONSOLE_WORKLOADS, CONSOLE_IN_USE, OPENCOST_USAGE, GRAFANA_TEMP):
        assert promql.split("DCGM_FI_")[1].split("{")[0] in {s.removeprefix("DCGM_FI_") for s in served}


def test_each_client_under_each_scrape_config(queries):
    by_config, u0 = queries
    pod, namespace, container = WORKLOAD
    own_pod, own_namespace, own_container = EXPORTER_POD
    for name, query in by_config.items():
        # dcgm-exporter's dashboard reads the target's instance and the exporter's gpu: any config
        temp = query(GRAFANA_TEMP.replace("$instance", NODE).replace("$gpu", "0|1"))
        assert workloads(temp, "instance", "gpu") == {(NODE, "0"), (NODE, "1")}, name
        console = workloads(query(CONSOLE_WORKLOADS), "exported_namespace", "exported_pod", "UUID")
        in_use = float(query(CONSOLE_IN_USE)[0]["value"][1])
        opencost = workloads(query(OPENCOST_USAGE), "container", "pod", "namespace")
        if name == "dcgm-honor-labels.yml":
            assert console == set() and in_use == 0, name  # the console plugin sees no workload
            # OpenCost: GPU 0 to its pod, but the GPU no pod holds to the exporter's own pod
            assert opencost == {(container, pod, namespace), (own_container, own_pod, own_namespace)}, name
        elif name == "dcgm-exported-labels.yml":
            assert console == {(namespace, pod, u0)} and in_use == 1, name
            assert opencost == {(own_container, own_pod, own_namespace)}, name  # both GPUs to the exporter
        else:  # dcgm-all-clients.yml: every client sees the workload and only the workload
            assert console == {(namespace, pod, u0)} and in_use == 1, name
            assert opencost == {(container, pod, namespace)}, name
            own = query(f'count by (exporter_pod, exporter_namespace) ({{exporter_pod="{own_pod}"}})')
            assert workloads(own, "exporter_pod", "exporter_namespace") == {(own_pod, own_namespace)}, name
