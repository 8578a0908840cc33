"""The `gpuobs` command line."""

from __future__ import annotations

import ipaddress
import math
import re
import signal
import subprocess
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from . import __version__


@click.group()
@click.version_option(__version__, prog_name="gpuobs")
def main() -> None:
    """gpuobs: GPU observability and alerting."""


@main.command()
@click.option("--simulate", "scenario_file", type=click.Path(exists=True, dir_okay=False),
              help="Read simulated GPUs from this scenario (default: the real driver, or the 8xH100 "
                   "example scenario when no driver is present).")
def smi(scenario_file: str | None) -> None:
    """List the node's GPUs through NVML: name, utilization, memory, power, temperature, clock."""
    import pynvml

    from . import smi as smi_mod

    sim = None
    if scenario_file is None and not smi_mod.driver_present():
        scenario_file = str(smi_mod.DEFAULT_SCENARIO)
        sim = _load_simulation(scenario_file)
        click.echo(f"no NVIDIA driver found: using simulated GPUs from {scenario_file}")
    elif scenario_file:
        sim = _load_simulation(scenario_file)  # before any output: a bad file gives one line
        click.echo(f"using simulated GPUs from {scenario_file}")
    try:
        for line in smi_mod.rows():
            click.echo(line)
    except pynvml.NVMLError as e:
        raise click.ClickException(f"NVML: {e}") from None
    finally:
        if sim:
            sim.close()


class SimulationLoadError(click.ClickException):
    """A --simulate scenario or capture that cannot be loaded: one line on stderr, exit status 2."""
    exit_code = 2


def _load_simulation(path: str):
    """The activated Simulator of a scenario (or nvidia-smi capture) file. Raises SimulationLoadError
    naming the file and what is wrong with it, never a traceback."""
    from .sim import BuildError, Simulator
    from .sim.scenario import ScenarioError

    try:
        return Simulator.from_file(path).activate()
    except (ScenarioError, BuildError, OSError) as e:
        raise SimulationLoadError(f"cannot load --simulate {path}: {' '.join(str(e).split())}") from None


def _finite(value: float, hint: str) -> float:
    if not math.isfinite(value):  # FloatRange lets NaN through: it compares false with both bounds
        raise click.BadParameter("must be a finite number", param_hint=hint)
    return value


def _families(value: str | None, flag: str = "--families", default: set[str] | None = None) -> set[str]:
    """The families named by --families (or another `flag`: --detail), comma-separated; else
    `default` (None: the registry's default ones). Raises BadParameter for an empty list or an
    unknown name."""
    from .collect import REGISTRY, default_families

    if not value:
        return default_families() if default is None else default
    names = {v.strip() for v in value.split(",") if v.strip()}
    if not names:
        raise click.BadParameter("name at least one family", param_hint=flag)
    unknown = names - set(REGISTRY)
    if unknown:
        raise click.BadParameter(f"unknown: {', '.join(sorted(unknown))}; known: {', '.join(REGISTRY)}",
                                 param_hint=flag)
    return names


def _opt_in_families() -> list[str]:
    """Families off by default; each has a flag --<name>/--no-<name> (GPUOBS_<NAME>), e.g. --processes."""
    from .collect import REGISTRY

    return [name for name, spec in REGISTRY.items() if not spec.default]


def _option(*decls: str, envvar: str | list[str], **kw):
    """click.option that shows its environment variable(s) in --help: every exporter flag has one."""
    return click.option(*decls, envvar=envvar, show_envvar=True, **kw)


# host:port, :port (host "": every address) or [IPv6]:port, as exporter-toolkit's --web.listen-address
_HOST_PORT = re.compile(r"(?:\[(?P<ipv6>[^\[\]]+)\]|(?P<host>[^:\[\]/@\s]*)):(?P<port>[0-9]{1,5})")


def _split_listen_address(value: str) -> tuple[str, int]:
    """--web.listen-address "host:port", ":port" (every address: host "") or "[IPv6]:port" ->
    (host, port). Raises BadParameter for any other form or a port over 65535."""
    m = _HOST_PORT.fullmatch(value)
    if m and m["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(m["ipv6"])
        except ValueError:
            m = None
    if not m or int(m["port"]) > 65535:
        raise click.BadParameter(f"expected host:port, :port (every address) or [IPv6]:port, with a port of 0 to "
                                 f"65535; got {value!r}", param_hint="--web.listen-address")
    return (m["host"] if m["ipv6"] is None else m["ipv6"]), int(m["port"])


def _check_listen_address(ctx, param, value: str | None) -> str | None:
    if value is not None:
        _split_listen_address(value)  # a malformed address is a usage error before anything starts
    return value


def _check_telemetry_path(ctx, param, value: str) -> str:
    from .exporter.server import check_telemetry_path

    try:
        return check_telemetry_path(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _origin(ctx: click.Context, name: str) -> str:
    """How the exporter option `name` was given: its flag, or its environment variable."""
    param = next(p for p in ctx.command.params if p.name == name)
    if ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT:
        return param.envvar if isinstance(param.envvar, str) else "/".join(param.envvar or ())
    return param.opts[0]


def _listen_on(ctx: click.Context, web_listen_address: str | None, address: str, port: int) -> tuple[str, int]:
    """(address, port) to serve on: --web.listen-address's when it is given, else --listen-address
    and --port. Raises UsageError when --web.listen-address disagrees with a --listen-address or
    --port also given (on the command line or in the environment); defaulted ones give way."""
    if web_listen_address is None:
        return address, port
    host, web_port = _split_listen_address(web_listen_address)
    for name, given, wanted in (("listen_address", address, host), ("port", port, web_port)):
        explicit = ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        if explicit and given != wanted:
            raise click.UsageError(f"{_origin(ctx, 'web_listen_address')}={web_listen_address} disagrees with "
                                   f"{_origin(ctx, name)}={given}: give one of them, or the same address and port")
    return host, web_port


def _web_options(d) -> list:
    """Where and how the metrics are served (`d`: the ExporterConfig defaults)."""
    return [
        _option("--web.listen-address", "web_listen_address", envvar="GPUOBS_WEB_LISTEN_ADDRESS",
                metavar="HOST:PORT", callback=_check_listen_address,
                help="Address and port to serve on, as node_exporter takes them: host:port, :port (every address, "
                     "IPv6 and IPv4) or [IPv6]:port. Instead of --listen-address and --port (default: "
                     f"{d.listen_address}:{d.port}); an error if they are given too and disagree."),
        _option("--listen-address", envvar="GPUOBS_LISTEN_ADDRESS", default=d.listen_address, show_default=True,
                help="Address to serve on (127.0.0.1 for loopback only; '' for every address, IPv6 and IPv4)."),
        _option("--port", envvar="GPUOBS_PORT", type=click.IntRange(0, 65535), default=d.port, show_default=True,
                help="9445: clear of dcgm-exporter (9400) and nvidia_gpu_exporter (9835)."),
        _option("--web.telemetry-path", "telemetry_path", envvar="GPUOBS_WEB_TELEMETRY_PATH",
                default=d.telemetry_path, show_default=True, callback=_check_telemetry_path,
                help="Path to serve the metrics on; /healthz and /readyz stay where they are."),
        _option("--web-config", "--web.config.file", "web_config", envvar="GPUOBS_WEB_CONFIG",
                type=click.Path(exists=True, dir_okay=False),
                help="Prometheus web-config file: TLS and bcrypt basic auth."),
        _option("--web.max-connections", "max_connections", envvar="GPUOBS_WEB_MAX_CONNECTIONS",
                type=click.IntRange(min=1), default=d.max_connections, show_default=True,
                help="Most open HTTP connections, all clients together; more are closed at once and counted "
                     "(kept 128 under the open-files limit)."),
        _option("--web.max-connections-per-client", "max_connections_per_client",
                envvar="GPUOBS_WEB_MAX_CONNECTIONS_PER_CLIENT", type=click.IntRange(min=1),
                default=d.max_connections_per_client, show_default=True,
                help="Most open HTTP connections from one client address (at most --web.max-connections); "
                     "behind a proxy such as kube-rbac-proxy every scrape comes from its address."),
    ]


def _check_connection_caps(ctx: click.Context, total: int, per_client: int) -> int:
    """The per-client connection cap: as given, or its default lowered to a lower total cap. Raises
    BadParameter, naming how each cap was given, when a per-client cap given is over the total."""
    from .exporter.server import check_connection_caps

    if ctx.get_parameter_source("max_connections_per_client") is ParameterSource.DEFAULT:
        return min(per_client, total)
    try:
        check_connection_caps(total, per_client)
    except ValueError as e:
        raise click.BadParameter(f"{e}: {_origin(ctx, 'max_connections_per_client')}={per_client}, "
                                 f"{_origin(ctx, 'max_connections')}={total}",
                                 param_hint=_origin(ctx, "max_connections_per_client")) from None
    return per_client


def _collection_options(d, opt_in: list) -> list:
    """What is read from the GPUs and how it is named (`d`: the ExporterConfig defaults; `opt_in`:
    the registry's families that are off by default)."""
    from .collect import REGISTRY

    return [
        _option("--interval", envvar="GPUOBS_INTERVAL", type=click.FloatRange(0.1, 3600), default=d.interval,
                show_default=True, callback=lambda ctx, param, v: _finite(v, "--interval"),
                help="Seconds between sampling passes (0.1 to 3600)."),
        _option("--families", envvar="GPUOBS_FAMILIES",
                help=f"Comma-separated metric families to collect, of: {', '.join(REGISTRY)} (default: all but "
                     f"{', '.join(spec.name for spec in opt_in)})."),
        *[_option(f"--{spec.name}/--no-{spec.name}", envvar=f"GPUOBS_{spec.name.upper()}", default=False,
                  show_default=True, help=f"Also export {spec.summary} (the {spec.name} family).")
          for spec in opt_in],
        _option("--profile", envvar="GPUOBS_PROFILE", type=click.Choice(["default", "full"]),
                help="Series served: default (what the alerts, recording rules and default panels read: at "
                     "most 40 per H100) or full (every series, the detail too: per-link NVLink, ECC by "
                     "location, clock-event durations, ...). Default: default, full with --naming dcgm. "
                     "See docs/cardinality.md."),
        _option("--detail", envvar="GPUOBS_DETAIL",
                help="Comma-separated families served in full under the default profile (e.g. nvlink,ecc)."),
        _option("--process-cap", envvar="GPUOBS_PROCESS_CAP", type=click.IntRange(min=1), default=d.process_cap,
                show_default=True, help="Most processes exported per GPU (the largest memory users)."),
        _option("--naming", envvar="GPUOBS_NAMING", type=click.Choice(["gpuobs", "dcgm"]), default=d.naming,
                show_default=True, help="dcgm: dcgm-exporter's DCGM_FI_* names and labels."),
        _option("--expected-gpus", envvar="GPUOBS_EXPECTED_GPUS", type=click.IntRange(min=0),
                help="GPUs this node should have (default: the most seen since start)."),
        _option("--hostname", envvar=["GPUOBS_HOSTNAME", "NODE_NAME"], help="Hostname label for dcgm naming."),
        _option("--kernel-log", envvar="GPUOBS_KERNEL_LOG", default=d.kernel_log, show_default=True,
                metavar="auto|PATH|journal|off",
                help="Kernel log to count XIDs and driver messages from (the kernel_log family): auto is "
                     "/dev/kmsg if readable, else the journal if journalctl exists; PATH a kmsg device, "
                     "kernel-log file or FIFO."),
        _option("--kernel-log-state", envvar="GPUOBS_KERNEL_LOG_STATE", default=d.kernel_log_state,
                show_default=True, help="State file that keeps kernel-log counts and read position across "
                                        "restarts ('': none; the directory must exist)."),
    ]


def _run_options() -> list:
    """Attribution, OTLP, the simulator, logging and liveness."""
    from .exporter import LIVENESS_INTERVALS, LIVENESS_MIN_S, NVML_DOWN_TIMEOUT_S

    return [
        _option("--otlp-endpoint", envvar=["GPUOBS_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                                           "OTEL_EXPORTER_OTLP_ENDPOINT"],
                help="Also push the metrics over OTLP (gRPC, or HTTP for .../v1/metrics URLs)."),
        _option("--kubelet-socket", envvar="GPUOBS_KUBELET_SOCKET",
                help="Kubelet PodResources socket for pod attribution (default: "
                     "/var/lib/kubelet/pod-resources/kubelet.sock when it exists; '' turns it off)."),
        _option("--slurm-job-dir", envvar="GPUOBS_SLURM_JOB_DIR",
                help="Slurm job-mapping directory (one file per GPU index holding job ids) for job attribution."),
        _option("--simulate", "scenario_file", envvar="GPUOBS_SIMULATE",
                help="Run on simulated GPUs from this scenario instead of the driver; 'auto': the driver if "
                     "one answers, else the 8xH100 example scenario."),
        _option("--log-level", envvar="GPUOBS_LOG_LEVEL", default="info", show_default=True,
                type=click.Choice(["debug", "info", "warning", "error"]), help="Least level logged (JSON on stderr)."),
        _option("--liveness-timeout", envvar="GPUOBS_LIVENESS_TIMEOUT", type=click.FloatRange(0, 86400, min_open=True),
                callback=lambda ctx, param, v: v if v is None else _finite(v, "--liveness-timeout"),
                help="Seconds without a completed sampling pass after which /healthz fails (503), so that "
                     f"the exporter is restarted (default: {LIVENESS_INTERVALS} intervals, at least "
                     f"{LIVENESS_MIN_S:g} s; more than 2 intervals)."),
        _option("--nvml-down-timeout", envvar="GPUOBS_NVML_DOWN_TIMEOUT", type=click.FloatRange(0, 86400),
                default=NVML_DOWN_TIMEOUT_S, show_default=True,
                callback=lambda ctx, param, v: _finite(v, "--nvml-down-timeout"),
                help="Seconds NVML may answer nothing but driver-level errors (UNKNOWN, ...), re-initialisations "
                     "included, before /healthz fails (503), so that a container only a restart cures is "
                     "restarted; 0: never."),
    ]


def _exporter_options(command):
    """The exporter command's options, each with a GPUOBS_* environment variable (shown in --help):
    defaults from ExporterConfig, the families and their opt-in flags from gpuobs.collect.REGISTRY."""
    from .collect import REGISTRY
    from .exporter import ExporterConfig

    d = ExporterConfig()
    opt_in = [REGISTRY[name] for name in _opt_in_families()]
    for option in reversed([*_web_options(d), *_collection_options(d, opt_in), *_run_options()]):
        command = option(command)
    return command


def _simulator(scenario_file: str | None, log):
    """The activated Simulator for --simulate (None: the real driver). Raises BadParameter for a
    scenario file that does not exist, SimulationLoadError for one that cannot be loaded."""
    if scenario_file == "auto":
        from . import smi as smi_mod

        scenario_file = None if smi_mod.driver_present() else str(smi_mod.DEFAULT_SCENARIO)
    elif scenario_file and not Path(scenario_file).is_file():
        raise click.BadParameter(f"no such scenario file: {scenario_file}", param_hint="--simulate")
    if not scenario_file:
        return None
    sim = _load_simulation(scenario_file)
    log.warning("no NVIDIA driver in use: running on SIMULATED GPUs", extra={"scenario": scenario_file})
    return sim


def _kubelet_socket(value: str | None) -> str | None:
    """--kubelet-socket: unset, the default socket on a Kubernetes node (quietly off elsewhere); '' is off."""
    if value is None:
        from .attribution import DEFAULT_SOCKET

        return DEFAULT_SOCKET if Path(DEFAULT_SOCKET).exists() else None
    return value or None


def _serve(exp, sim, log) -> None:
    """Run until SIGTERM or SIGINT, then stop the exporter and the simulator within a bound."""
    import logging
    import os
    import threading

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping")
    clean = exp.stop()  # bounded (config.stop_timeout), even with every NVML call hanging
    try:
        if sim:
            sim.close()
    finally:
        if not clean:
            # Threads are still blocked in NVML (the abandoned steps were logged): exit now rather
            # than let interpreter shutdown wait on anything they hold. Logs are flushed first.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


@main.command()
@_exporter_options
@click.pass_context
def exporter(ctx, families, scenario_file, log_level, kubelet_socket, slurm_job_dir, web_listen_address,
             **settings) -> None:
    """Serve GPU metrics to Prometheus: /metrics (--web.telemetry-path), /healthz, /readyz.

    Every option can be set by the environment variable shown with it."""
    import logging

    from . import logs
    from .exporter import Exporter, ExporterConfig, tune_process
    from .exporter.server import WebConfigError

    chosen = _families(families) | {name for name in _opt_in_families() if settings.pop(name)}  # usage errors first
    settings["listen_address"], settings["port"] = _listen_on(ctx, web_listen_address, settings["listen_address"],
                                                              settings["port"])
    settings["max_connections_per_client"] = _check_connection_caps(ctx, settings["max_connections"],
                                                                    settings["max_connections_per_client"])
    interval, liveness = settings["interval"], settings["liveness_timeout"]
    if liveness is not None and liveness <= 2 * interval:
        raise click.BadParameter(f"must be more than 2 intervals ({2 * interval:g} s): a healthy exporter "
                                 "completes a pass every interval", param_hint="--liveness-timeout")
    logs.setup(log_level)
    log = logging.getLogger("gpuobs.exporter")
    sim = _simulator(scenario_file, log)
    settings["detail"] = _families(settings["detail"], "--detail", default=set())
    config = ExporterConfig(families=chosen, kubelet_socket=_kubelet_socket(kubelet_socket),
                            slurm_job_dir=slurm_job_dir or None, **settings)
    tune_process()  # GIL switch interval, malloc's mmap threshold: see there
    try:
        exp = Exporter(config).start()
    except (WebConfigError, OSError) as e:
        if sim:
            sim.close()
        raise click.ClickException(str(e)) from None
    _serve(exp, sim, log)


@main.command()
@click.option("--duration", type=click.FloatRange(min=0), help="Exit after the scripted incident once this many "
              "seconds have passed (default: run until Ctrl-C).")
@click.option("--keep-logs", is_flag=True, help="Keep the components' logs and data after a clean run.")
def demo(duration: float | None, keep_logs: bool) -> None:
    """The whole stack on loopback with simulated GPUs, and a scripted incident."""
    from . import demo as demo_mod

    raise SystemExit(demo_mod.run(duration, keep_logs))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback: only "
              "this machine's processes can send).")
@click.option("--port", type=click.IntRange(0, 65535), default=4318, show_default=True,
              help="OTLP/HTTP port (0: any free port; the first line says which).")
def traces(host: str, port: int) -> None:
    """A local trace receiver: print every span sent over OTLP/HTTP (protobuf) until Ctrl-C.

    In another terminal: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/train.py"""
    import threading

    from . import demo as demo_mod

    try:
        receiver = demo_mod.serve_traces(host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None
    click.echo(f"receiving OTLP/HTTP on {receiver.url}: set OTEL_EXPORTER_OTLP_ENDPOINT={receiver.url} "
               "(Ctrl-C stops)", err=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.close()


def _runbook_base(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Reject a runbook base that is not an absolute http(s) URL before anything is written."""
    if value is not None:
        from .alerts.rules import Thresholds

        try:
            Thresholds(runbook_base=value)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--runbook-base-url / GPUOBS_RUNBOOK_BASE_URL") from None
    return value


@main.command()
@click.option("--check", is_flag=True, help="Write nothing: list the generated files that differ or are missing, "
              "and stale ones; exit 1 if any.")
@click.option("--runbook-base-url", envvar="GPUOBS_RUNBOOK_BASE_URL", metavar="URL", callback=_runbook_base,
              help="Absolute http(s) URL the runbook_url annotations start with (<URL>/<Alert>.md), for "
                   "example where your copy of docs/runbooks is served. Default: the project's repository.")
@click.option("--out", type=click.Path(file_okay=False), metavar="DIR",
              help="Write under DIR (alerts/, dashboards/, docs/) instead of the repository.")
def generate(check: bool, runbook_base_url: str | None, out: str | None) -> None:
    """Regenerate every generated, committed file (alerts, dashboards, docs).

    alerts/ and docs/runbooks/ come from gpuobs/alerts, dashboards/ from gpuobs/dashboards,
    docs/metrics.md and docs/cardinality.md from gpuobs/docs.py, deploy/fluent-bit/gpuobs-*.conf
    from the log-pattern catalog. Exits 1 when, with --check, a file differs, or when a stale file
    (one no generator makes any more) is left in alerts/, dashboards/ or docs/runbooks/."""
    from . import generated

    root = Path(out).resolve() if out else generated.ROOT
    changed, stale = generated.generate(root, check=check, runbook_base=runbook_base_url)
    for path in changed:
        click.echo(f"{'differs' if check else 'wrote'}: {path.relative_to(root)}")
    for path in stale:
        click.echo(f"stale: {path.relative_to(root)} (no generator makes it; delete it)")
    if stale or (check and changed):
        raise SystemExit(1)


@main.command()
@click.option("--prometheus", "url", required=True, metavar="URL",
              help="Prometheus base URL, e.g. http://prometheus:9090.")
@click.option("--from", "start", metavar="TIME", help="Start: Unix seconds or ISO 8601 (default: --to minus --range).")
@click.option("--to", "end", metavar="TIME", help="End: Unix seconds or ISO 8601 (default: now).")
@click.option("--range", "length", default="7d", show_default=True, metavar="DURATION",
              help="Length of the range when --from is not given (s, m, h, d or w).")
@click.option("--step", type=click.IntRange(min=1), metavar="SECONDS",
              help="Seconds between evaluations (default: 60 s up to about 41 h, then coarser).")
@click.option("--cost-file", type=click.Path(exists=True, dir_okay=False), metavar="YAML",
              help="Cost per GPU-hour per model, currency and namespace-to-team mapping (docs/report.md).")
@click.option("--out", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
def report(url: str, start: str | None, end: str | None, length: str, step: int | None, cost_file: str | None,
           out: str) -> None:
    """A self-contained HTML report of a time range from Prometheus, for a weekly review: utilisation
    and waste by team, placement problems, MIG candidates, failures and MTBF, top alerts. Exits 2
    when Prometheus is unreachable or an option is wrong."""
    from . import explain as explain_mod
    from . import report as report_mod

    try:
        window = report_mod.make_window(start, end, length, step)
        path = report_mod.write(url, window, report_mod.load_settings(cost_file), out,
                                sections=report_mod.SECTIONS + (explain_mod.section_slow_jobs,))
    except report_mod.ReportError as e:
        click.echo(f"gpuobs report: {e}", err=True)
        raise SystemExit(2) from None
    click.echo(f"wrote {path}")


@main.command()
@click.argument("job")
@click.option("--prometheus", "url", required=True, metavar="URL",
              help="Prometheus base URL, e.g. http://prometheus:9090.")
@click.option("--at", metavar="TIME", help="End of the window: Unix seconds or ISO 8601 (default: now).")
@click.option("--window", default="15m", show_default=True, metavar="DURATION",
              help="How far back from --at to look (s, m, h, d or w).")
@click.option("--profile", type=click.Choice(["default", "fast"]), default="default", show_default=True,
              help="The rule profile loaded in that Prometheus (its windows and thresholds).")
@click.option("--trace-url", default=None, metavar="URL",
              help="Tracing UI base for the slowest step's trace link (default: the demo's Jaeger).")
def explain(job: str, url: str, at: str | None, window: str, profile: str, trace_url: str | None) -> None:
    """Why training job JOB is slow: per rank (step time, compute, data and collective waits) and per
    GPU (clock-event reasons, XIDs, ECC, PCIe, NVLink, other processes, utilization), the causes the
    slowdown records name, most likely first, the slowest step's trace and how to confirm each cause.
    Exits 1 for an unknown job or a malformed option, 2 when Prometheus is unreachable."""
    from . import explain as explain_mod
    from . import report as report_mod
    from .alerts.rules import DEFAULT, FAST

    try:
        when = report_mod.parse_time(at) if at else None
        report_mod.parse_duration(window)
    except report_mod.ReportError as e:
        click.echo(f"gpuobs explain: {e}", err=True)
        raise SystemExit(1) from None
    try:
        d = explain_mod.diagnose(url, job, at=when, window=window, thresholds=FAST if profile == "fast" else DEFAULT)
    except explain_mod.ExplainError as e:
        click.echo(f"gpuobs explain: {e}", err=True)
        raise SystemExit(1) from None
    except report_mod.ReportError as e:
        click.echo(f"gpuobs explain: {e}", err=True)
        raise SystemExit(2) from None
    click.echo(explain_mod.render(d, **({"trace_url": trace_url} if trace_url else {})), nl=False)


def _prometheus_query(url: str, promql: str) -> list[dict]:
    """An instant query of Prometheus's HTTP API (/api/v1/query): its result vector. Raises
    click.ClickException when Prometheus is unreachable or refuses the query."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    query = f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(query, timeout=60) as r:
            body = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise click.ClickException(f"cannot query {url}: {e}") from None
    if body.get("status") != "success":
        raise click.ClickException(f"{url} refused the query: {body.get('error')}")
    return body["data"]["result"]


def _mig_peaks(url: str, length: str) -> list[tuple[dict, float, float, bool]]:
    """Per GPU with a model name: (labels, peak memory used in bytes, peak SM activity ratio, in MIG
    mode) over the last `length`, read by the expressions of the weekly records' steps (gpuobs.records)
    with `length` as their window."""
    import dataclasses

    from . import catalog as c
    from . import records as rec
    from .alerts.rules import DEFAULT

    t = dataclasses.replace(DEFAULT, weekly_interval=length)
    key = rec.GPU_BY.split(", ")

    def by_gpu(promql: str) -> dict[tuple, dict]:
        return {tuple(s["metric"].get(k, "") for k in key): s for s in _prometheus_query(url, promql)}

    memory, sm = by_gpu(rec.GPU_MEMORY_STEP.expr(t)), by_gpu(rec.GPU_SM_STEP.expr(t))
    mig_on = by_gpu(f"{c.MIG_MODE.name} == 1")
    rows = []
    for gpu_key, info in sorted(by_gpu(c.GPU_INFO.exposed_name).items()):
        if gpu_key in memory and gpu_key in sm:
            rows.append((info["metric"], float(memory[gpu_key]["value"][1]), float(sm[gpu_key]["value"][1]),
                         gpu_key in mig_on))
    return rows


@main.command("mig-advice")
@click.option("--prometheus", "url", required=True, metavar="URL",
              help="Prometheus base URL, e.g. http://prometheus:9090.")
@click.option("--range", "length", default="7d", show_default=True, metavar="DURATION",
              help="The past window whose peaks must fit (a Prometheus duration).")
def mig_advice(url: str, length: str) -> None:
    """Per GPU, the smallest MIG profile that its peak memory and SM activity over --range fit, with the
    default right-sizing headroom: the table of gpuobs.mig, the logic of the recording rule
    uuid:gpuobs_gpu_mig_profile:smallest_fit. GPUs in MIG mode, of a model without MIG or too busy
    for any profile say so. Exits 1 when Prometheus cannot be queried."""
    from . import mig
    from .alerts.rules import DEFAULT

    rows = _mig_peaks(url, length)
    click.echo(f"{'node':<16} {'gpu':>3} {'model':<26} {'peak memory':>12} {'peak SM':>8}  "
               f"advice (headroom {DEFAULT.mig_headroom:.0%})")
    for labels, memory, sm, in_mig in rows:
        name = labels.get("name", "")
        profile = mig.recommend(name, memory, sm, DEFAULT.mig_headroom)
        advice = ("already in MIG mode" if in_mig else profile.name if profile else
                  "no MIG on this model" if mig.model_for(name) is None else "needs the whole GPU")
        click.echo(f"{labels.get('node', ''):<16} {labels.get('gpu', ''):>3} {name:<26} "
                   f"{memory / 1024 ** 3:>8.1f} GiB {sm:>8.0%}  {advice}")


@main.group()
def sim() -> None:
    """The NVML simulator (a libnvidia-ml.so.1 built from source)."""


@sim.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if a cached library matches the source.")
def sim_build(force: bool) -> None:
    """Compile the simulator library and print its path."""
    from .sim import BuildError, build

    try:
        click.echo(build(force=force))
    except BuildError as e:
        raise click.ClickException(str(e)) from None


@sim.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--scenario", "scenario_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Scenario YAML describing the simulated node.")
@click.option("--state-dir", type=click.Path(file_okay=False),
              help="Keep the state file here (for live changes with `gpuobs sim inject`).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def sim_exec(scenario_file: str, state_dir: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with the simulator loaded as libnvidia-ml.so.1 and the scenario applied."""
    from .sim import Simulator
    from .sim.scenario import ScenarioError

    try:
        simulator = Simulator.from_file(scenario_file, directory=state_dir)
    except ScenarioError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"gpuobs sim: simulated GPUs from {scenario_file}; state {simulator.state_path}", err=True)
    try:
        proc = subprocess.Popen(list(command), env=simulator.env())
    except OSError as e:
        simulator.close()
        raise click.ClickException(f"cannot run {command[0]}: {e}") from None
    # Ctrl-C already reaches the child through the terminal's process group: the parent only
    # waits, so the state file outlives the child. SIGTERM and SIGHUP are passed on.
    forward = {sig: signal.signal(sig, lambda num, _: proc.send_signal(num))
               for sig in (signal.SIGTERM, signal.SIGHUP)}
    forward[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = proc.wait()
    finally:
        for sig, previous in forward.items():
            signal.signal(sig, previous)
        simulator.close()
    sys.exit(code if code >= 0 else 128 - code)


@sim.command("inject")
@click.option("--state", "state_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="State file of a running simulated node.")
@click.option("--gpu", type=int, help="GPU slot (default: every GPU).")
@click.option("--xid", type=int, help="Queue an XID event with this code.")
@click.option("--lose", is_flag=True, help="The GPU falls off the bus (GPU_IS_LOST).")
@click.option("--fail", "func", help="Make this NVML function fail (use with --error).")
@click.option("--error", type=int, default=999, show_default=True, help="NVML return code for --fail.")
@click.option("--times", type=int, help="Fail only this many calls.")
@click.option("--clear", is_flag=True, help="Clear every injected fault and lost GPU.")
def sim_inject(state_file: str, gpu: int | None, xid: int | None, lose: bool, func: str | None,
               error: int, times: int | None, clear: bool) -> None:
    """Change a running simulated node: XID events, lost GPUs, failing NVML calls."""
    if not (clear or lose or func or xid is not None):
        raise click.UsageError("nothing to do: give --xid, --lose, --fail or --clear")
    if times is not None and times < 1:
        raise click.BadParameter("must be at least 1", param_hint="--times")
    st = _open_state(state_file)
    if gpu is not None and not 0 <= gpu < st.s.gpu_slots:
        raise click.BadParameter(f"the node has GPU slots 0-{st.s.gpu_slots - 1}", param_hint="--gpu")
    slots = range(st.s.gpu_slots) if gpu is None else [gpu]
    try:
        if clear:
            st.clear_faults()
            st.clear_init_error()
            for s in slots:
                st.lose_gpu(s, False)
        for s in slots:
            if xid is not None:
                st.xid(s, xid)
            if lose:
                st.lose_gpu(s)
        if func:
            st.fail(func, error, gpu=gpu, times=times)
    except (IndexError, KeyError) as e:
        raise click.ClickException(str(e.args[0])) from None


def _open_state(path: str):
    from .sim import SimState

    try:
        return SimState.open(path)
    except (ValueError, OSError) as e:
        raise click.ClickException(f"{path} is not a simulator state file: {e}") from None


@sim.command("calls")
@click.option("--state", "state_file", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--reset", is_flag=True, help="Zero the counters after printing.")
def sim_calls(state_file: str, reset: bool) -> None:
    """Print NVML calls per function made against a simulated node."""
    st = _open_state(state_file)
    for name, n in sorted(st.calls().items()):
        click.echo(f"{n:10d}  {name}")
    if reset:
        st.reset_calls()


@sim.command("check-capture")
@click.argument("capture_file", metavar="FILE", type=click.Path(exists=True, dir_okay=False))
@click.option("--phase", type=click.Choice(["idle", "load"]), default="load", show_default=True,
              help="Which of the capture's nvidia-smi -q sections to check.")
@click.option("--failures-only", is_flag=True, help="Print only mismatched and unknown fields (and the summary).")
@click.option("--synthesize", "synthesize", multiple=True, type=click.Choice(["energy", "nvlink_counters"]),
              help="Let the simulator make up this value the capture cannot show (repeatable); its rows say "
                   "'synthesized'. Without it such a value must be absent.")
def sim_check_capture(capture_file: str, phase: str, failures_only: bool, synthesize: tuple[str, ...]) -> None:
    """Check that the exporter, on a GPU seeded from an nvidia-smi capture, reports what it says.

    Prints field, capture value, exported value and verdict for every line of the capture's -q
    section (and per-process pmon utilization); exits 1 on a mismatch or a field that is neither
    exported nor listed as not exported (gpuobs.sim.fidelity), 2 when the capture cannot be loaded."""
    from .sim import BuildError, fidelity
    from .sim.scenario import ScenarioError
    from .smi import exported_samples

    try:
        rows = fidelity.check(capture_file, phase, exported_samples, synthesize)
    except (ScenarioError, BuildError, ValueError, OSError, RuntimeError) as e:
        raise SimulationLoadError(f"cannot check {capture_file}: {' '.join(str(e).split())}") from None
    lines = fidelity.report(rows)
    shown = [lines[0], *(line for row, line in zip(rows, lines[1:]) if row.failed or not failures_only), lines[-1]]
    for line in shown:
        click.echo(line)
    if any(row.failed for row in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
