"""The exporter: NVML session -> sampler thread -> rendered snapshot -> HTTP (and optional OTLP).

`Exporter(config).start()` runs everything in daemon threads; `/metrics` serves the bytes of the
latest snapshot and never waits on NVML. A snapshot older than two intervals is not served as
fresh: only self-health metrics are, with gpuobs_exporter_snapshot_stale 1, and /readyz fails.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from .. import catalog
from ..collect import Sampler, Session, XidWatcher, build_families
from ..collect.base import Sample, Snapshot
from .render import Renderer
from .server import HttpServer, WebConfig, make_app

log = logging.getLogger("gpuobs.exporter")

DEFAULT_PORT = 9445  # clear of dcgm-exporter (9400), nvidia_gpu_exporter (9835), node_exporter (9100)


@dataclass
class ExporterConfig:
    """Exporter settings; each has a CLI flag and a GPUOBS_* environment variable."""
    listen_address: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    interval: float = 5.0
    families: set[str] = field(default_factory=lambda: set(catalog.FAMILIES) - catalog.DEFAULT_OFF)
    naming: str = "gpuobs"
    expected_gpus: int | None = None
    process_cap: int = 32
    web_config: str | None = None
    hostname: str | None = None
    otlp_endpoint: str | None = None
    kubelet_socket: str | None = None     # pod attribution from the kubelet PodResources API; None: off
    slurm_job_dir: str | None = None      # Slurm job attribution from a job-mapping directory; None: off
    attribution_refresh: float = 10.0     # seconds between attribution refreshes (never per scrape)
    attribution_timeout: float = 2.0      # deadline of one kubelet List() call


class Exporter:
    """Wires the parts together; safe to start with no driver (NVML is retried with backoff)."""

    def __init__(self, config: ExporterConfig):
        self.config = config
        self.web = WebConfig.load(config.web_config) if config.web_config else WebConfig()
        self.session = Session()
        self.watcher = XidWatcher(self.session) if "xid" in config.families else None
        families = build_families(config.families, self.watcher, config.process_cap)
        self.attribution = []
        if config.kubelet_socket:
            from ..attribution import PodResourcesWatcher

            self.attribution.append(PodResourcesWatcher(config.kubelet_socket, config.attribution_refresh,
                                                        config.attribution_timeout))
        if config.slurm_job_dir:
            from ..attribution import SlurmJobMap

            self.attribution.append(SlurmJobMap(config.slurm_job_dir, config.attribution_refresh))
        self.renderer = Renderer(config.naming, config.hostname, self.attribution)
        self.sampler = Sampler(self.session, families, config.interval, config.expected_gpus,
                               on_snapshot=self._on_snapshot)
        self.http = HttpServer(make_app(self.metrics, self.ready, self.web.users),
                               config.listen_address, config.port, self.web.ssl_context())
        self.otlp = None
        if config.otlp_endpoint:
            from .otlp import OtlpPush

            self.otlp = OtlpPush(config.otlp_endpoint, lambda: self.renderer.snapshot, config.interval)

    def _on_snapshot(self, snap: Snapshot) -> None:
        if self.attribution:  # the sources' health, as of this pass, with the exporter's own
            health = tuple(Sample(catalog.ATTRIBUTION_UP, (source.name,), float(source.up))
                           for source in self.attribution)
            snap = dataclasses.replace(snap, samples=snap.samples + health)
        self.renderer.render(snap)

    def fresh(self) -> bool:
        """True if the latest snapshot is younger than two sampling intervals."""
        snap = self.renderer.snapshot
        return snap is not None and time.time() - snap.time <= 2 * self.config.interval

    def metrics(self) -> bytes:
        """The /metrics body: the latest snapshot, or only self-health when it is stale."""
        return self.renderer.fresh if self.fresh() else self.renderer.stale

    def ready(self) -> tuple[bool, str]:
        """/readyz: NVML up and a fresh snapshot."""
        if not self.session.up:
            return False, f"nvml down: {self.session.init_error or 'not initialised'}"
        if not self.fresh():
            return False, "snapshot stale"
        return True, "ready"

    def start(self) -> "Exporter":
        if self.watcher:
            self.watcher.start()
        for source in self.attribution:
            source.start()
        self.sampler.start()
        self.http.start()
        if self.otlp:
            self.otlp.start()
        log.info("exporter listening", extra={"address": self.config.listen_address, "port": self.http.port,
                                              "tls": self.web.cert_file is not None, "naming": self.config.naming})
        return self

    def stop(self) -> None:
        self.http.stop()
        self.sampler.stop()
        if self.watcher:
            self.watcher.stop()
        if self.otlp:
            self.otlp.stop()
        for source in self.attribution:
            source.stop()
        self.session.shutdown()
