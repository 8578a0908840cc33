"""Alerts of the exporter's self-health: scraped, still a target, its pods, fresh, its collectors and
watchers."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ...records.allocation import KSM_GPU, KSM_REQUESTS
from ..common import Alert, Thresholds, _unreliable


def exporter(t: Thresholds) -> list[Alert]:
    """The exporter: scraped, still a target, its pods, fresh, its collectors, watchers and attribution."""
    alert = partial(Alert, family="exporter")
    up = f'up{{job="{t.exporter_job}"}}'
    ds = f'{{daemonset="{t.exporter_daemonset}"}}'
    by_ds = "max by (cluster, namespace, daemonset)"
    flapping = f"{t.flap_share:.0%} of the last {t.long_window}'s scrapes"
    return [
        alert(name="GpuExporterDown", expr=_unreliable(up, 0, t), for_=t.for_short, severity="critical", scope="node",
              summary="A GPU exporter cannot be scraped.",
              description="The gpuobs exporter on {{ $labels.node }} ({{ $labels.instance }}) cannot be scraped, now "
                          f"or in more than {flapping}."),
        # A target that left service discovery has no `up` at all: compare with the last hour's targets.
        # By node: a restarted pod comes back with another pod name (and maybe address); by instance for
        # targets without a node label. Only while some target is left (else GpuExporterAbsent). A node
        # taken away on purpose resolves once its last scrape is long_window old.
        alert(name="GpuExporterGone",
              expr=f"max without (pod) (last_over_time({up}[{t.long_window}])) unless on (cluster, node, instance) "
                   f'{up} unless on (cluster, node) up{{job="{t.exporter_job}", node!=""}} and on () count({up})',
              for_=t.for_short, severity="critical", scope="node",
              summary="A node's GPU exporter is no longer a scrape target.",
              description="The gpuobs exporter on {{ $labels.node }} ({{ $labels.instance }}) left service discovery "
                          "while other exporters are still scraped: the node's GPUs are not monitored (it resolves "
                          f"{t.long_window} after its last scrape if the node was removed on purpose)."),
        alert(name="GpuExporterPodsUnavailable",
              expr=f"{by_ds} (kube_daemonset_status_desired_number_scheduled{ds}) - "
                   f"{by_ds} (kube_daemonset_status_number_available{ds}) > 0 unless on (cluster, namespace, "
                   f"daemonset) changes(kube_daemonset_status_updated_number_scheduled{ds}[{t.rate_window}]) > 0",
              for_=t.for_medium, severity="critical", scope="cluster",
              summary="GPU exporter pods are missing or not ready.",
              description="DaemonSet {{ $labels.namespace }}/{{ $labels.daemonset }} has {{ $value }} of its pods "
                          "unavailable and no rollout progressing: the GPUs of those nodes are not monitored."),
        alert(name="GpuExporterAbsent", expr=f"absent({up})", for_=t.for_short, severity="critical", scope="cluster",
              summary="No GPU exporter is being scraped at all.",
              description=f"Prometheus scrapes no target of job {t.exporter_job}: GPU alerts cannot fire."),
        alert(name="GpuMetricsStale", expr=_unreliable(c.SNAPSHOT_STALE.name, 1, t), for_=t.for_short,
              severity="warning", scope="node", summary="The GPU exporter serves stale data (NVML hangs).",
              description="The exporter on {{ $labels.node }} has no fresh snapshot, now or in more than "
                          f"{flapping}: NVML calls are hanging."),
        alert(name="GpuExporterCollectorFailing", expr=_unreliable(c.COLLECTOR_SUCCESS.name, 0, t),
              for_=t.for_medium, severity="warning", scope="node",
              summary="A collector of the GPU exporter keeps failing.",
              description="The {{ $labels.collector }} collector of the exporter on {{ $labels.node }} fails, now or "
                          f"in more than {flapping}: its metrics are missing and the alerts on them cannot fire."),
        alert(name="GpuXidWatcherDown", expr=_unreliable(c.XID_WATCHER_UP.name, 0, t), for_=t.for_short,
              severity="warning", scope="node",
              summary="The exporter's XID event thread is not running: XIDs may be missed.",
              description="The XID watcher of the exporter on {{ $labels.node }} is down, now or in more than "
                          f"{flapping}: XIDs on this node may be missed."),
        alert(name="GpuKernelLogWatcherDown", expr=_unreliable(c.KERNEL_LOG_UP.name, 0, t), for_=t.for_medium,
              severity="warning", scope="node",
              summary="The exporter cannot read the kernel log: kernel-log XIDs and driver messages are not counted.",
              description="The kernel-log watcher ({{ $labels.source }}) of the exporter on {{ $labels.node }} has "
                          f"not read its source for {t.for_medium}, now or in more than {flapping}: XIDs that NVML "
                          "misses and driver ECC and NVLink messages on this node go unseen."),
        _attribution_down(t, flapping),
    ]


def _attribution_down(t: Thresholds, flapping: str) -> Alert:
    """Pod or Slurm attribution failing on a node: down now or flapping (_unreliable), on a node where
    kube-state-metrics shows pods requesting GPUs, or in a cluster without kube-state-metrics (a Slurm
    cluster: its job-mapping directory is always expected). A node with no GPU pod has nothing to
    attribute: a kubelet restarting there pages no one."""
    down = f"({_unreliable(c.ATTRIBUTION_UP.name, 0, t)})"
    gpu_pods = f"group by (cluster, node) ({KSM_REQUESTS}{{{KSM_GPU}}} > 0)"
    return Alert(name="GpuAttributionDown", family="exporter", scope="node", severity="warning", for_=t.for_medium,
                 expr=f"{down} and on (cluster, node) {gpu_pods} or {down} unless on (cluster) "
                      f"group by (cluster) ({KSM_REQUESTS})",
                 summary="The exporter cannot tell which pod or job holds its GPUs.",
                 description="The {{ $labels.source }} attribution of the exporter on {{ $labels.node }} fails, now "
                             f"or in more than {flapping}: its GPUs' series carry no pod, namespace or job, so the "
                             "fleet's allocation, idle-GPU and cost records and the per-pod panels miss them.")
