"""The exporter: NVML session -> sampler thread -> rendered snapshot -> HTTP (and optional OTLP).

`Exporter(config).start()` runs everything in daemon threads; `/metrics` (or the configured
telemetry path) serves the bytes of the latest snapshot and never waits on NVML. A snapshot older
than two intervals is not served as fresh: only self-health metrics are, with
gpuobs_exporter_snapshot_stale 1, and /readyz fails (the OTLP push withholds the same values).
/healthz fails once no sampling pass has completed for the liveness timeout, so that an
orchestrator restarts an exporter that NVML has wedged, and `stop()` returns within a bound
whatever NVML does.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import gc
import logging
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .. import __version__, catalog
from ..collect import KernelLogWatcher, Sampler, Session, XidWatcher, build_families, default_families, needs_watcher
from ..collect.base import Sample, Snapshot
from ..collect.kernel_log import DEFAULT_STATE
from ..collect.profile import Profile
from .render import CONTENT_TYPES, FORMATS, Renderer, negotiate, self_health_body
from .server import Exposition, HttpServer, Limits, WebConfig, make_app, raise_open_files_limit
from .webconfig import TlsReloader

if TYPE_CHECKING:  # imported where configured: the kubelet client loads grpc
    from ..attribution import PodResourcesWatcher, SlurmJobMap

log = logging.getLogger("gpuobs.exporter")

FRESH_INTERVALS = 2        # a snapshot older than this many intervals is stale: its values are withheld
LIVENESS_INTERVALS = 6     # default liveness timeout: this many intervals without a completed pass,
LIVENESS_MIN_S = 30.0      # and never less than this many seconds
STOP_TIMEOUT_S = 5.0       # Exporter.stop() gives up (and says what it abandoned) after this long
NVML_DOWN_TIMEOUT_S = 300.0  # /healthz fails once NVML has answered only driver-level errors this long
INITIALIZING = "initializing"  # gpuobs_nvml_init_error reason before the first sampling pass
# NVML down for these is the node's state, not the process's: a restart cannot cure it (a node with no
# driver, a driver upgraded without a reboot, a container without the libraries or devices), so
# /healthz does not ask for one; it keeps serving gpuobs_nvml_up 0 (NvmlDown) instead
RESTART_CANNOT_CURE = frozenset({"DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "LIBRARY_NOT_FOUND",
                                 "NO_PERMISSION"})


M_MMAP_THRESHOLD = -3  # glibc's mallopt() parameter number


def tune_process() -> None:
    """Process settings the exporter runs under (the CLI sets them before starting it):
    - a 0.5 ms GIL switch interval: the sampling pass is pure Python for tens of ms on a big node; a
      scrape needs the GIL a few times, and at the default 5 ms it waited up to ~60 ms behind a pass;
    - glibc's mmap threshold pinned at its 128 KiB default: each pass makes and frees bodies of
      megabytes (2.4 MB at 64 GPUs); after the first such free glibc raises the threshold, later
      bodies come from the heap, which fragments and keeps its pages (about 5 MiB of RSS at 64 GPUs).
      Not glibc (musl, macOS): left as it is;
    - the cyclic garbage collector mostly out of the way: a pass's objects (samples, label tuples,
      text) form no cycles and reference counting frees them, yet at 64 GPUs the default thresholds
      ran about four collections a pass, a quarter of its CPU, and a full one paused every thread for
      ~40 ms (a scrape's p99). The objects alive at start (modules, the catalog) are frozen out of
      every collection, and a collection waits for 20,000 more objects instead of 700: cycles are
      still collected, later."""
    sys.setswitchinterval(0.0005)
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    try:
        ctypes.CDLL(None).mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(128 * 1024))
    except (OSError, AttributeError):
        pass


def liveness_timeout(interval: float, configured: float | None = None) -> float:
    """Seconds without a completed sampling pass after which /healthz fails: `configured`, else
    max(6 intervals, 30 s)."""
    if configured:
        return float(configured)
    return max(LIVENESS_INTERVALS * interval, LIVENESS_MIN_S)


@dataclass(kw_only=True)
class ExporterConfig:
    """Exporter settings, and the one home of their defaults (the CLI's come from here); each has
    a CLI flag and a GPUOBS_* environment variable."""
    listen_address: str = "0.0.0.0"  # "": every address, IPv6 and IPv4; an IPv6 address binds IPv6
    port: int = 9445  # clear of dcgm-exporter (9400), nvidia_gpu_exporter (9835), node_exporter (9100)
    telemetry_path: str = "/metrics"  # where the metrics are served; /healthz and /readyz stay
    interval: float = 5.0  # seconds between sampling passes
    families: set[str] = field(default_factory=default_families)  # names in gpuobs.collect.REGISTRY
    naming: str = "gpuobs"
    # the series served (gpuobs.collect.profile): "default" or "full"; None: default, but full with
    # dcgm naming (a drop-in for dcgm-exporter serves every field its dashboards read)
    profile: str | None = None
    detail: set[str] = field(default_factory=set)  # families served in full under the default profile
    expected_gpus: int | None = None
    process_cap: int = 32  # most processes per GPU (the largest memory users)
    web_config: str | None = None
    hostname: str | None = None
    otlp_endpoint: str | None = None
    kubelet_socket: str | None = None     # pod attribution from the kubelet PodResources API; None: off
    slurm_job_dir: str | None = None      # Slurm job attribution from a job-mapping directory; None: off
    attribution_refresh: float = 10.0     # seconds between attribution refreshes (never per scrape)
    attribution_timeout: float = 2.0      # deadline of one kubelet List() call
    liveness_timeout: float | None = None  # /healthz fails after this long with no completed pass; None: default
    # /healthz fails after NVML answered only driver-level errors (re-inits included) this long; 0: never
    nvml_down_timeout: float = NVML_DOWN_TIMEOUT_S
    stop_timeout: float = STOP_TIMEOUT_S   # bound of stop(), NVML shutdown included
    kernel_log: str = "auto"  # kernel-log source: auto, /dev/kmsg or another path, journal, off
    kernel_log_state: str = DEFAULT_STATE  # its state file ('': none); its directory is not created
    # open HTTP connections, all clients together and from one client address (server.Limits; kept
    # under the open-files limit); behind a proxy every scrape comes from the proxy's one address
    max_connections: int = Limits.max_connections
    max_connections_per_client: int = Limits.max_per_client


def series_profile(config: ExporterConfig) -> Profile:
    """The Profile the config asks for (ExporterConfig.profile, .detail). Raises ValueError for an
    unknown profile or detail family."""
    from ..collect import REGISTRY

    unknown = set(config.detail) - set(REGISTRY)
    if unknown:
        raise ValueError(f"unknown metric families in detail: {', '.join(sorted(unknown))}")
    name = config.profile or ("full" if config.naming == "dcgm" else "default")
    return Profile(name, frozenset(config.detail))


def _kernel_log_watcher(config: ExporterConfig) -> KernelLogWatcher | None:
    """The kernel-log watcher when the kernel_log family is on and --kernel-log is not off."""
    if "kernel_log" not in config.families or config.kernel_log == "off":
        return None
    return KernelLogWatcher(config.kernel_log, state_path=config.kernel_log_state or None)


class Exporter:
    """Wires the parts together; safe to start with no driver (NVML is retried with backoff)."""

    def __init__(self, config: ExporterConfig):
        self.config = config
        self.web = WebConfig.load(config.web_config) if config.web_config else WebConfig()
        self.session = Session()
        self.watcher = XidWatcher(self.session) if needs_watcher(config.families) else None
        self.kernel_log = _kernel_log_watcher(config)
        families = build_families(config.families, watcher=self.watcher, kernel_log=self.kernel_log,
                                  process_cap=config.process_cap)
        self.attribution: list[PodResourcesWatcher | SlurmJobMap] = []
        if config.kubelet_socket:
            from ..attribution import PodResourcesWatcher

            self.attribution.append(PodResourcesWatcher(config.kubelet_socket, config.attribution_refresh,
                                                        config.attribution_timeout))
        if config.slurm_job_dir:
            from ..attribution import SlurmJobMap

            self.attribution.append(SlurmJobMap(config.slurm_job_dir, config.attribution_refresh))
        profile = series_profile(config)
        dcgm_zero = [m for m in catalog.EXPORTED if m.dcgm_zero and m.family in config.families and profile.serves(m)]
        self.renderer = Renderer(config.naming, config.hostname, self.attribution, dcgm_zero)
        # responses by (format, encoding), every one the naming can serve counted from 0
        self._served = collections.Counter({(fmt, enc): 0 for fmt in FORMATS for enc in ("identity", "gzip")
                                            if fmt == "text" or config.naming == "gpuobs"})
        self._served_lock = threading.Lock()
        self._build_info = Sample(catalog.BUILD_INFO, (__version__, platform.python_version()), 1.0)
        self.sampler = Sampler(self.session, families, config.interval, config.expected_gpus,
                               on_snapshot=self._on_snapshot, profile=profile)
        self.liveness_timeout = liveness_timeout(config.interval, config.liveness_timeout)
        # connections cost file descriptors: the soft limit goes up to the hard one and the
        # connection cap stays under it (server.Limits.for_open_files)
        limits = Limits(max_connections=config.max_connections, max_per_client=config.max_connections_per_client)
        limits = limits.for_open_files(raise_open_files_limit())
        tls = TlsReloader(self.web) if self.web.cert_file else None  # reloads rotated files per handshake
        self.http = HttpServer(make_app(self.metrics, self.ready, self.web.users, alive=self.alive,
                                        telemetry_path=config.telemetry_path),
                               config.listen_address, config.port, tls, limits)
        self.otlp = None
        if config.otlp_endpoint:
            from .otlp import OtlpPush

            self.otlp = OtlpPush(config.otlp_endpoint, lambda: self.renderer.snapshot, config.interval,
                                 fresh=self.fresh)

    def _on_snapshot(self, snap: Snapshot) -> None:
        health: tuple[Sample, ...] = ()
        if self.attribution:  # the sources' health, as of this pass, with the exporter's own
            health = tuple(Sample(catalog.ATTRIBUTION_UP, (source.name,), float(source.up))
                           for source in self.attribution)
        with self._served_lock:
            served = tuple(Sample(catalog.SCRAPES, key, float(n)) for key, n in sorted(self._served.items()))
        served += self._refused_samples()
        self.renderer.render(dataclasses.replace(snap, samples=snap.samples + health + served + (self._build_info,)))

    def _refused_samples(self) -> tuple[Sample, ...]:
        """The HTTP server's refused connections by reason (none before it exists)."""
        http = getattr(self, "http", None)
        return tuple(Sample(catalog.HTTP_REFUSED, (reason,), float(n))
                     for reason, n in sorted(http.refused_counts().items())) if http is not None else ()

    def _initializing_samples(self) -> list[Sample]:
        """Self-health before the first sampling pass (no value of NVML or a GPU exists yet): NVML
        not up, with reason 'initializing', no pass completed, the scrapes served and connections
        refused, build info."""
        with self._served_lock:
            served = [Sample(catalog.SCRAPES, key, float(n)) for key, n in sorted(self._served.items())]
        out = [Sample(catalog.NVML_UP, (), 0.0), Sample(catalog.NVML_INIT_ERROR, (INITIALIZING,), 1.0),
               Sample(catalog.SAMPLES, (), 0.0), Sample(catalog.NVML_REINITS, (), 0.0), self._build_info]
        if self.config.expected_gpus is not None:
            out.append(Sample(catalog.GPUS_EXPECTED, (), float(self.config.expected_gpus)))
        return out + served + list(self._refused_samples())

    def fresh(self, snap: Snapshot | None = None) -> bool:
        """True if the latest snapshot (or `snap`) is younger than two sampling intervals."""
        snap = self.renderer.snapshot if snap is None else snap
        return snap is not None and time.time() - snap.time <= FRESH_INTERVALS * self.config.interval

    def metrics(self, accept: str | None = None, accept_encoding: str | None = None) -> Exposition:
        """The /metrics response for a scrape's Accept and Accept-Encoding headers (render.negotiate:
        OpenMetrics and gzip when asked for, else text 0.0.4): the latest snapshot, or only
        self-health when it is stale, or before the first sampling pass (nvmlInit may take long or
        hang) self-health saying so: never an empty body. Counted in gpuobs_exporter_scrapes_total."""
        fmt, gz = negotiate(accept, accept_encoding, self.config.naming)
        with self._served_lock:
            self._served[(fmt, "gzip" if gz else "identity")] += 1
        if self.renderer.snapshot is None:
            body = self_health_body(self._initializing_samples(), fmt, gz)
        else:
            body = self.renderer.body(fmt, gz, stale=not self.fresh())
        return Exposition(body, CONTENT_TYPES[fmt], gz)

    def ready(self) -> tuple[bool, str]:
        """/readyz: a first sampling pass completed, NVML up, a fresh snapshot, and the XID watcher
        (when on) neither dead nor failing its waits for two intervals."""
        if self.renderer.snapshot is None:
            return False, f"{INITIALIZING}: no sampling pass completed yet"
        if not self.session.up:
            return False, f"nvml down: {self.session.init_error or 'not initialised'}"
        if not self.fresh():
            return False, "snapshot stale"
        if self.watcher is not None:
            down = self.watcher.down_reason(FRESH_INTERVALS * self.config.interval)
            if down:
                return False, f"xid watcher {down}"
        return True, "ready"

    def alive(self) -> tuple[bool, str]:
        """/healthz (liveness): fails once no sampling pass has completed for the liveness timeout,
        i.e. the sampler is stuck (in NVML, as a rule); a restart is then the way out. Slow or
        failing NVML is not stuck: passes that complete, with errors or with NVML down, count.
        Also fails once NVML has answered nothing but driver-level errors, re-initialisations
        included, for nvml_down_timeout seconds (the "Unknown Error" zombie that only a restart
        of the container cures), unless the last one is RESTART_CANNOT_CURE; 0 turns that check off."""
        idle = time.monotonic() - self.sampler.last_pass_end
        if idle > self.liveness_timeout:
            first = "; the first one (nvmlInit) never did" if self.renderer.snapshot is None else ""
            return False, (f"sampling stalled: no pass completed for {idle:.1f}s "
                           f"(liveness timeout {self.liveness_timeout:g}s){first}")
        down, limit = self.session.down_for(), self.config.nvml_down_timeout
        if limit and down > limit and self.session.last_error not in RESTART_CANNOT_CURE:
            return False, (f"nvml down for {down:.1f}s through {self.session.reinits} re-initialisations "
                           f"(last error {self.session.last_error or 'none'}; limit {limit:g}s)")
        return True, "ok"

    def start(self) -> "Exporter":
        """Starts the XID and kernel-log watchers, the attribution refreshers, the sampler, the HTTP server
        (which answers "initializing" self-health until the first pass) and the OTLP push; logs the address
        served and returns self (the port was bound when the exporter was made)."""
        if self.watcher:
            self.watcher.start()
        if self.kernel_log:
            self.kernel_log.start()
        for source in self.attribution:
            source.start()
        self.sampler.start()
        self.http.start()
        if self.otlp:
            self.otlp.start()
        log.info("exporter listening", extra={"address": self.http.address, "port": self.http.port,
                                              "path": self.config.telemetry_path,
                                              "tls": self.web.cert_file is not None, "naming": self.config.naming})
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Stop everything within `timeout` seconds (config.stop_timeout) overall, whatever NVML does.

        The steps run in order on a daemon thread: HTTP, the OTLP push (its final export),
        attribution and the kernel-log watcher (which saves its state) first, which need no NVML,
        then the sampler, the XID watcher and NVML shutdown,
        any of which a wedged driver can hold for ever. True when every step finished; otherwise the
        step in progress and those not reached are logged as abandoned and False is returned: the
        caller should then exit without waiting on anything NVML holds (the threads are daemons).
        """
        timeout = self.config.stop_timeout if timeout is None else timeout
        steps: list[tuple[str, Callable[[], object]]] = [("http", self.http.stop)]
        if self.otlp:
            steps.append(("otlp", self.otlp.stop))
        steps += [(f"attribution:{source.name}", source.stop) for source in self.attribution]
        if self.kernel_log:  # no NVML: before the steps a wedged driver can hold; saves its state
            steps.append(("kernel-log", self.kernel_log.stop))
        steps.append(("sampler", self.sampler.stop))
        if self.watcher:
            steps.append(("xid-watcher", self.watcher.stop))
        steps.append(("nvml-shutdown", self.session.shutdown))
        at = [0]  # index of the step in progress
        finished = threading.Event()

        def run() -> None:
            for i, (name, step) in enumerate(steps):
                at[0] = i
                try:
                    step()
                except Exception:  # noqa: BLE001 - one failing step must not keep the others from running
                    log.exception("stop step failed", extra={"step": name})
            finished.set()

        threading.Thread(target=run, name="gpuobs-stop", daemon=True).start()
        if finished.wait(timeout):
            return True
        log.warning("shutdown abandoned: steps still running at the deadline",
                    extra={"timeout_s": timeout, "step": steps[at[0]][0],
                           "abandoned": [name for name, _ in steps[at[0]:]]})
        return False
