"""exporters/ and docker-compose.yml: every deployment file parses and says what it must, checked
with the real tools where they exist (docker compose / docker-compose, promtool, amtool, and
kubectl's kustomize, which renders exporters/kubernetes/ as `kubectl apply -k` deploys it)."""

from __future__ import annotations

import configparser
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import require_tool

REPO = Path(__file__).resolve().parents[1]
EXPORTERS = REPO / "exporters"
K8S = EXPORTERS / "kubernetes"
COMPOSE = REPO / "docker-compose.yml"


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@functools.lru_cache(maxsize=1)
def kustomize_build() -> str:
    """exporters/kubernetes/ rendered by the real kustomize (`kubectl kustomize`, default load
    restrictor), with the dashboards' ConfigMaps it generates from dashboards/*.json."""
    # not require_tool: kubectl cannot come from Debian in a usable version (kubernetes-client 1.20
    # predates the kustomization's `labels`), so a machine without it skips rather than fails
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: exporters/kubernetes/ is rendered with `kubectl kustomize`")
    result = run([kubectl, "kustomize", str(K8S)])
    assert result.returncode == 0, result.stderr
    return result.stdout


def k8s_docs() -> dict[str, list[dict]]:
    """{kind: [documents]} of everything exporters/kubernetes/ deploys."""
    docs: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all(kustomize_build()):
        if doc:
            docs.setdefault(doc["kind"], []).append(doc)
    return docs


# --- docker-compose.yml -----------------------------------------------------------------------

def compose_checker() -> list[str]:
    """The compose CLI: `docker compose` when the plugin is there, else Debian's docker-compose
    (whose `config` validates against its bundled compose-spec schema, no engine needed)."""
    docker = shutil.which("docker")
    if docker and run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    return [require_tool("docker-compose")]


def test_compose_file_is_valid_against_the_compose_specification(tmp_path):
    cli = compose_checker()
    result = run([*cli, "-f", str(COMPOSE), "config", "-q"], cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    # the checker does reject what the specification does not allow
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  a:\n    image: busybox\n    imagee: typo\n")
    assert run([*cli, "-f", str(bad), "config", "-q"], cwd=tmp_path).returncode != 0


def test_compose_services_and_profiles():
    services = compose()["services"]
    assert {"exporter", "exporter-gpu", "trainer", "prometheus", "alertmanager", "webhook", "grafana",
            "otel-collector", "jaeger", "fluent-bit"} <= set(services)
    exporter = services["exporter"]
    assert exporter["build"]["dockerfile"] == "exporters/Dockerfile" and exporter["build"]["target"] == "sim"
    assert exporter["command"][:2] == ["--simulate", "/app/examples/scenarios/8xh100.yaml"]
    assert (REPO / "examples/scenarios/8xh100.yaml").is_file()
    assert "profiles" not in exporter  # simulated GPUs by default
    gpu = services["exporter-gpu"]
    assert gpu["profiles"] == ["gpu"] and "--simulate" not in gpu.get("command", [])
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    trainer = services["trainer"]
    assert trainer["entrypoint"][-1] == "/app/examples/train.py"
    assert trainer["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert trainer["environment"]["GPUOBS_FLUENTD"] == "fluent-bit:24224"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib")


def mounts() -> list[tuple[str, Path, str]]:
    """(service, host path, container path) of every bind mount in docker-compose.yml."""
    out = []
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                out.append((name, (REPO / source).resolve(), target))
    return out


def test_every_mounted_file_is_in_the_repository():
    found = mounts()
    assert len(found) >= 8
    for service, path, _ in found:
        assert path.exists(), f"{service} mounts {path}, which is missing"
        assert REPO in path.parents, f"{service} mounts {path} from outside the repository"
    targets = {(s, t): p for s, p, t in found}
    assert targets["prometheus", "/etc/prometheus/rules"] == REPO / "alerts"
    assert targets["alertmanager", "/etc/alertmanager/alertmanager.yml"] == REPO / "alerts/alertmanager.yml"
    assert targets["grafana", "/var/lib/grafana/dashboards/gpuobs"] == REPO / "dashboards"
    provider = yaml.safe_load((REPO / "dashboards/provisioning/dashboards.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/gpuobs"
    # the build context holds what the Dockerfile copies
    for copied in ("pyproject.toml", "README.md", "gpuobs", "examples"):
        assert (REPO / copied).exists()


def test_compose_prometheus_config_checks_with_promtool(tmp_path):
    promtool = require_tool("promtool")
    # lay the files out as the container sees them: prometheus.yml beside rules/ (= ./alerts)
    shutil.copy(REPO / "deploy/prometheus/prometheus.yml", tmp_path / "prometheus.yml")
    (tmp_path / "rules").symlink_to(REPO / "alerts")
    result = run([promtool, "check", "config", str(tmp_path / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "rules found" in result.stdout
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    assert {"exporter:9445", "trainer:9464", "otel-collector:8889"} <= targets
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # Grafana's $__rate_interval assumes timeInterval == the scrape interval
    datasource = yaml.safe_load((REPO / "dashboards/provisioning/datasources.yaml").read_text())["datasources"][0]
    assert datasource["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]
    assert datasource["url"] == "http://prometheus:9090"


def test_compose_traces_from_exemplars_to_jaeger():
    """Prometheus keeps exemplars; Grafana provisions the generated datasources, whose Jaeger entry
    is the compose jaeger service's UI port and whose exemplar trace ids open there; the trainer
    serves the endpoint Prometheus scrapes (exemplars are on by default)."""
    services = compose()["services"]
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    found = {(s, t): p for s, p, t in mounts()}
    assert found["grafana", "/etc/grafana/provisioning/datasources/gpuobs.yaml"] == \
        REPO / "dashboards/provisioning/datasources.yaml"
    by_uid = {d["uid"]: d for d in yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources.yaml").read_text())["datasources"]}
    destinations = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert [d["name"] for d in destinations] == ["trace_id"]
    jaeger = by_uid[destinations[0]["datasourceUid"]]
    host, port = jaeger["url"].removeprefix("http://").split(":")
    assert jaeger["type"] == "jaeger" and host in services and "16686:16686" in services[host]["ports"]
    assert "jaeger" in services["grafana"]["depends_on"]
    assert "GPUOBS_EXEMPLARS" not in services["trainer"]["environment"]


def test_compose_alertmanager_runs_the_generated_config_pointed_at_the_webhook():
    """No hand-made copy: compose mounts alerts/alertmanager.yml, whose receivers are the compose
    stack's webhook service."""
    amtool = require_tool("amtool")
    (config,) = [volume.split(":")[0] for volume in compose()["services"]["alertmanager"]["volumes"]
                 if volume.split(":")[1] == "/etc/alertmanager/alertmanager.yml"]
    assert config == "./alerts/alertmanager.yml"
    result = run([amtool, "check-config", str(REPO / config)])
    assert result.returncode == 0, result.stdout + result.stderr
    ours = yaml.safe_load((REPO / config).read_text())
    urls = [w["url"] for r in ours["receivers"] for w in r.get("webhook_configs", [])]
    assert urls and all(u.startswith("http://webhook:5001/") for u in urls)
    assert compose()["services"]["webhook"]["command"][-1] == "5001"
    assert not (REPO / "deploy/alertmanager").exists()


def test_webhook_receiver_prints_alerts():
    import http.client
    import threading

    namespace: dict = {}
    exec(compile((REPO / "deploy/webhook/receiver.py").read_text(), "receiver.py", "exec"), namespace)
    import contextlib
    import io
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), namespace["Handler"])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=5)
            body = json.dumps({"alerts": [{"status": "firing", "labels": {"alertname": "GpuXid79", "severity":
                                          "critical", "node": "n1", "gpu": "3"}, "annotations": {"summary": "fell off"}}]})
            conn.request("POST", "/pager", body, {"Content-Type": "application/json"})
            assert conn.getresponse().status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert re.search(r"pager FIRING\s+GpuXid79 severity=critical node=n1 gpu=3 fell off", out.getvalue()), out.getvalue()


def test_otel_collector_and_fluent_bit_configs():
    otel = yaml.safe_load((REPO / "deploy/otel-collector/config.yaml").read_text())
    pipelines = otel["service"]["pipelines"]
    assert pipelines["metrics"]["receivers"] == ["otlp"] and "prometheus" in pipelines["metrics"]["exporters"]
    assert pipelines["traces"]["exporters"] == ["otlp/jaeger"]
    assert otel["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert otel["exporters"]["prometheus"]["endpoint"].endswith(":8889")
    for pipeline in pipelines.values():  # every component a pipeline names is defined
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(otel.get(kind) or {}), (kind, pipeline)
    assert {"4317:4317", "4318:4318"} <= set(compose()["services"]["otel-collector"]["ports"])
    conf = (REPO / "deploy/fluent-bit/fluent-bit.conf").read_text()
    assert re.search(r"\[INPUT\]\s+Name\s+forward\s+Listen\s+\S+\s+Port\s+24224", conf)
    assert re.search(r"\[OUTPUT\]\s+Name\s+stdout", conf)


# --- Prometheus scrape configs ----------------------------------------------------------------

PROMETHEUS_CONFIGS = sorted((EXPORTERS / "prometheus").glob("*.yml"))


def promtool_supports_kubernetes_sd(promtool: str, tmp_path: Path) -> bool:
    """Debian's Prometheus is built without Kubernetes service discovery."""
    probe = tmp_path / "probe.yml"
    probe.write_text("scrape_configs:\n- job_name: p\n  kubernetes_sd_configs:\n  - role: pod\n")
    return run([promtool, "check", "config", str(probe)]).returncode == 0


@pytest.mark.parametrize("path", PROMETHEUS_CONFIGS, ids=lambda p: p.name)
def test_scrape_config_checks_with_promtool(path, tmp_path):
    promtool = require_tool("promtool")
    config = yaml.safe_load(path.read_text())
    uses_k8s = any("kubernetes_sd_configs" in job for job in config["scrape_configs"])
    if uses_k8s:
        for job in config["scrape_configs"]:
            for sd in job.get("kubernetes_sd_configs", []):
                assert sd["role"] in {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
    checked = path
    if uses_k8s and not promtool_supports_kubernetes_sd(promtool, tmp_path):
        # check everything else (relabeling included) with the discovery swapped for static targets
        for job in config["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["gpu-node:9445"]}]
        config["rule_files"] = [str((path.parent / f).resolve()) for f in config.get("rule_files", [])]
        checked = tmp_path / path.name
        checked.write_text(yaml.safe_dump(config))
    result = run([promtool, "check", "config", str(checked)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules found" in result.stdout  # the relative rule_files path resolved


def scrape_configs(name: str) -> list[dict]:
    return yaml.safe_load((EXPORTERS / "prometheus" / name).read_text())["scrape_configs"]


def test_prometheus_configs_cover_each_deployment():
    assert {p.name for p in PROMETHEUS_CONFIGS} == {"static.yml", "kubernetes.yml", "sharded.yml", "remote-write.yml",
                                                    # --naming dcgm per client (tests/test_scrape_configs.py)
                                                    "dcgm-honor-labels.yml", "dcgm-exported-labels.yml",
                                                    "dcgm-all-clients.yml"}
    assert all(sc["targets"][0].endswith(":9445") for sc in scrape_configs("static.yml")[0]["static_configs"])
    job = scrape_configs("kubernetes.yml")[0]
    assert job["kubernetes_sd_configs"][0]["role"] == "endpoints" and job["honor_labels"] is False
    assert {"source_labels": ["__meta_kubernetes_endpoint_node_name"], "target_label": "node"} in job["relabel_configs"]
    assert any(sd["role"] == "pod" for j in scrape_configs("kubernetes.yml") for sd in j["kubernetes_sd_configs"])
    relabel = scrape_configs("sharded.yml")[0]["relabel_configs"]
    hashmod = next(r for r in relabel if r.get("action") == "hashmod")
    assert hashmod["target_label"] == "__tmp_hash" and hashmod["modulus"] > 1
    node_from = next(i for i, r in enumerate(relabel) if r.get("target_label") == "node")
    assert relabel[node_from]["source_labels"] == ["__meta_kubernetes_pod_node_name"]
    assert node_from < relabel.index(hashmod) and hashmod["source_labels"] == ["node"]
    keep = relabel[relabel.index(hashmod) + 1]
    assert keep["action"] == "keep" and keep["source_labels"] == ["__tmp_hash"]
    assert 0 <= int(keep["regex"]) < hashmod["modulus"]
    remote = yaml.safe_load((EXPORTERS / "prometheus/remote-write.yml").read_text())["remote_write"][0]
    assert remote["url"].endswith("/api/v1/write") and "victoriametrics" in remote["url"]


def test_rule_files_check_with_promtool():
    promtool = require_tool("promtool")
    committed = sorted((REPO / "alerts").glob("*.rules.yml"))
    # the whole pack and its two tiers (docs/rule-tiers.md); the fast profile is built where it is used
    assert [p.name for p in committed] == ["gpuobs-global.rules.yml", "gpuobs-local.rules.yml", "gpuobs.rules.yml"]
    for path in committed:
        result = run([promtool, "check", "rules", str(path)])
        assert result.returncode == 0, result.stdout + result.stderr


# --- Kubernetes manifests ---------------------------------------------------------------------

def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "namespace" not in kustomization  # namespace-agnostic
    listed = set(kustomization["resources"])
    # the generated files are not copied here: alerts/ and dashboards/ are kustomize bases
    local = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == local | {"../../alerts", "../../dashboards"}
    assert (REPO / "alerts/kustomization.yaml").is_file() and (REPO / "dashboards/kustomization.yaml").is_file()
    assert {d["kind"] for docs in k8s_docs().values() for d in docs} == {
        "ServiceAccount", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"}
    for doc in (d for docs in k8s_docs().values() for d in docs):
        assert "namespace" not in doc["metadata"], doc["metadata"]["name"]
    assert any(i["name"] == "gpuobs/exporter" for i in kustomization["images"])


def test_daemonset():
    (ds,) = k8s_docs()["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["serviceAccountName"] == k8s_docs()["ServiceAccount"][0]["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    (image,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    assert container["image"] == f"gpuobs/exporter:{image['newTag']}"  # as kustomize sets it
    assert container["ports"] == [{"name": "metrics", "containerPort": 9445, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "add" not in container["securityContext"]["capabilities"]
    # the kubelet's PodResources socket is root's, mode 0755: the exporter runs as its owner, with no capability
    assert container["securityContext"]["runAsUser"] == 0 and container["securityContext"]["runAsNonRoot"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # a read-only root file system needs a writable /tmp for the simulator's cache
    if container["securityContext"].get("readOnlyRootFilesystem"):
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_kernel_log_is_off_in_the_base_and_on_with_its_component(tmp_path):
    """The unprivileged base cannot open /dev/kmsg, so it does not run a watcher that could only
    report itself down (GpuKernelLogWatcherDown on every node); the kernel-log component, rendered
    here through an overlay by the real kustomize, runs the container privileged as root with
    /dev/kmsg and the state directory mounted."""
    (ds,) = k8s_docs()["DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUOBS_KERNEL_LOG"] == "off"
    assert not container["securityContext"].get("privileged")
    assert "/dev/kmsg" not in {m["mountPath"] for m in container["volumeMounts"]}

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S, overlay)], "components": [os.path.relpath(K8S / "kernel-log", overlay)]}))
    result = run([shutil.which("kubectl"), "kustomize", str(overlay)])
    assert result.returncode == 0, result.stderr
    (ds,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUOBS_KERNEL_LOG"] == "/dev/kmsg" and env["NVIDIA_VISIBLE_DEVICES"] == "all"  # merged, not replaced
    sc = container["securityContext"]
    assert sc["privileged"] is True and sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert volumes[mounts["/dev/kmsg"]] == {"path": "/dev/kmsg", "type": "CharDevice"}
    from gpuobs.collect.kernel_log import DEFAULT_STATE

    assert volumes[mounts[os.path.dirname(DEFAULT_STATE)]]["path"] == os.path.dirname(DEFAULT_STATE)
    assert mounts["/var/lib/kubelet/pod-resources"]  # the base's mounts stay


def test_service_and_servicemonitor():
    docs = k8s_docs()
    (service,) = docs["Service"]
    (ds,) = docs["DaemonSet"]
    assert service["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9445, "targetPort": "metrics", "protocol": "TCP"}]
    (monitor,) = docs["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is False
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"} \
        in endpoint["relabelings"]


def test_rbac_is_a_service_account_only():
    docs = k8s_docs()
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & set(docs)
    (account,) = docs["ServiceAccount"]
    assert account["automountServiceAccountToken"] is False


def test_prometheusrule_is_the_generated_one():
    (rule,) = k8s_docs()["PrometheusRule"]
    generated = yaml.safe_load((REPO / "alerts/prometheusrule.yaml").read_text())
    assert rule["metadata"]["labels"].pop("app.kubernetes.io/part-of") == "gpuobs"  # the kustomization's label
    assert rule == generated
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["spec"]["groups"]


def test_dashboard_configmaps_are_the_generated_dashboards():
    """kustomize's configMapGenerator: one ConfigMap per dashboards/*.json, byte for byte, with a
    stable name (no hash suffix) and what Grafana's sidecar selects and files it by."""
    maps = k8s_docs()["ConfigMap"]
    data = {}
    for cm in maps:
        meta = cm["metadata"]
        assert meta["labels"] == {"grafana_dashboard": "1", "app.kubernetes.io/name": "gpuobs-dashboards",
                                  "app.kubernetes.io/part-of": "gpuobs"}
        assert meta["annotations"] == {"grafana_folder": "gpuobs"}
        (name, text), = cm["data"].items()
        assert meta["name"] == f"gpuobs-dashboard-{name.removesuffix('.json')}"
        assert len(text.encode()) < 1024 * 1024 - 4096, f"{name} exceeds a ConfigMap's 1 MiB"
        data[name] = text
    files = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
    assert data.keys() == files.keys(), "run `gpuobs generate`: dashboards/kustomization.yaml lists every dashboard"
    for name, text in files.items():
        assert data[name] == text, f"{name} differs from dashboards/{name}"
        json.loads(data[name])


# --- systemd and the container image ----------------------------------------------------------

def test_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(EXPORTERS / "systemd/gpuobs-exporter.service")
    service = unit["Service"]
    assert service["ExecStart"].split()[-2:] == ["gpuobs", "exporter"] or service["ExecStart"].endswith("gpuobs exporter")
    assert service["ExecStart"].startswith("/")
    assert service["Restart"] == "on-failure"
    assert service["EnvironmentFile"].lstrip("-").startswith("/etc/")
    assert service.get("DynamicUser") == "yes" or service.get("User") not in (None, "root")
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == "yes"
    assert service["PrivateDevices"] == "no"  # NVML needs /dev/nvidia*
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze:  # where systemd is present, let it parse the unit too
        result = run([systemd_analyze, "verify", "--man=no", str(EXPORTERS / "systemd/gpuobs-exporter.service")])
        assert "Unknown key" not in result.stderr and "Unknown section" not in result.stderr, result.stderr


def test_dockerfile():
    text = (EXPORTERS / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    stages = [line.split() for line in lines if line.upper().startswith("FROM ")]
    assert len(stages) >= 2 and stages[0][-1] == "builder"
    names = [s[-1] for s in stages]
    assert names[-1] == "runtime" and "sim" in names  # the default target has no compiler
    assert all(s[1].startswith("python:3.11") or s[1] in names for s in stages)
    runtime_body = text.split("AS runtime", 1)[1]
    user = re.findall(r"^USER\s+(\S+)", runtime_body, re.M)
    assert user and user[-1] not in ("root", "0")
    sim_body = text.split("AS sim", 1)[1].split("FROM ", 1)[0]
    assert "gcc" in sim_body and re.search(r"^USER\s+(?!root|0\b)\S+", sim_body, re.M)
    assert "gcc" not in text.split("AS base", 1)[1].split("FROM ", 1)[0]
    assert re.search(r"^EXPOSE\s+9445\b", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.M)
    assert re.search(r'^ENTRYPOINT \["gpuobs", "exporter"\]', text, re.M)
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in text and "--gpus all" in text
    assert "wheel" in text.split("AS base", 1)[0]  # the builder builds a wheel
