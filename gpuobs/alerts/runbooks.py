"""The runbook texts (meaning, impact, diagnosis, action) rendered into docs/runbooks by `gpuobs generate`.

The texts name no metric or recording rule literally: `$NAME` stands for the sample name of the catalog
metric `gpuobs.catalog.NAME` (counters with `_total`; `${NAME}_sum`, `_count`, `_bucket` for a
histogram's series) or for the name of the record `gpuobs.records.NAME`, filled in when rendered
(`render`), so that they follow a rename. `$thresholds.FIELD` stands for the value of that field of the
`Thresholds` the runbook is rendered for (`threshold_values`: durations in words, shares in percent),
so that the prose quotes the thresholds in use and cannot drift from them. `$$` writes a dollar sign.
"""

from __future__ import annotations

import dataclasses
import re
from string import Template
from textwrap import dedent

from .. import catalog as c
from .. import records
from .rules import DEFAULT, Thresholds

SECTIONS = ("meaning", "impact", "diagnosis", "action")
# metrics of the catalog without a name of their own there
ALIASES = {"GPM_DRAM_ACTIVE": c.GPM_METRICS[10]}  # 10: NVML_GPM_METRIC_DRAM_BW_UTIL


def names() -> dict[str, str]:
    """What each `$NAME` of the texts stands for, from the catalog and the records as they are now.
    ValueError if a Python name means both a metric and a record."""
    metrics = {k: v for k, v in vars(c).items() if isinstance(v, c.Metric)} | ALIASES
    both = metrics.keys() & records.NAMES.keys()
    if both:
        raise ValueError(f"both a catalog metric and a record: {sorted(both)}")
    return {k: m.exposed_name for k, m in metrics.items()} | {k: r.name for k, r in records.NAMES.items()}


class _Text(Template):
    """A runbook text: `$NAME` (a catalog metric or record) or `$thresholds.FIELD` (a Thresholds field)."""
    idpattern = r"(?a:thresholds\.[a-z][a-z0-9_]*|[_a-z][_a-z0-9]*)"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}
_PERCENT = ("_share", "_utilization", "_ratio")  # fields that are a share of 1, quoted in percent


def _words(duration: str) -> str:
    """A Prometheus duration in words: "5m" -> "5 minutes", "1h" -> "1 hour"."""
    number, unit = _DURATION.fullmatch(duration).groups()
    return f"{number} {_UNITS[unit]}{'' if float(number) == 1 else 's'}"


def _quote(name: str, value: object) -> str:
    """How prose quotes one Thresholds field: durations in words, shares in percent ("10 %"), bytes in
    GiB, other numbers as %g, other strings as they are."""
    if isinstance(value, str):
        return _words(value) if _DURATION.fullmatch(value) else value
    if name.endswith(_PERCENT):
        return f"{value * 100:g} %"
    if name.endswith("_bytes"):
        return f"{value / 1024 ** 3:g} GiB"
    if isinstance(value, tuple):  # a table of (key, number) pairs: gpu_hour_costs
        return ", ".join(f"{key} {number:g}" for key, number in value)
    return f"{value:g}"


def threshold_values(t: Thresholds = DEFAULT) -> dict[str, str]:
    """What each `$thresholds.FIELD` of the texts stands for under thresholds t (_quote), and two
    derived quantities: `FIELD_per_h` for each `*_per_s` field (an hourly count), and
    `power_brake_changes` (the state changes GpuPowerBrakeRepeated counts: 2 per episode, less one)."""
    values = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    out = {name: _quote(name, v) for name, v in values.items()}
    out |= {f"{name[:-len('_per_s')]}_per_h": f"{v * 3600:g}" for name, v in values.items() if name.endswith("_per_s")}
    out["power_brake_changes"] = f"{2 * t.power_brake_episodes - 1}"
    return {f"thresholds.{name}": text for name, text in out.items()}


def render(alert: str, t: Thresholds = DEFAULT) -> dict[str, str]:
    """The runbook of alert, section by section (SECTIONS), its `$NAME`s and `$thresholds.FIELD`s filled
    in for thresholds t. KeyError for an alert without a runbook, or a `$NAME` that is neither a catalog
    metric nor a record, or a `$thresholds.FIELD` that Thresholds lacks; ValueError for a `$` followed
    by no name."""
    values = names() | threshold_values(t)
    return {section: _Text(text).substitute(values) for section, text in RUNBOOKS[alert].items()}


def _md(text: str | list[str]) -> str:
    """Dedent one Markdown section; a list is joined as separate paragraphs."""
    parts = [text] if isinstance(text, str) else text
    return "\n\n".join(dedent(p).strip() for p in parts)


def _rb(meaning: str | list[str], impact: str | list[str], diagnosis: str | list[str],
        action: str | list[str]) -> dict[str, str]:
    return {"meaning": _md(meaning), "impact": _md(impact), "diagnosis": _md(diagnosis), "action": _md(action)}


def _drain(reason: str) -> str:
    """Take a node out of scheduling, Kubernetes and Slurm."""
    return f"""
        ```sh
        kubectl cordon <node>    # Kubernetes; evict with: kubectl drain <node> --ignore-daemonsets --delete-emptydir-data
        scontrol update nodename=<node> state=drain reason="{reason}"    # Slurm
        ```"""


_UNDRAIN = """
    Return the node to service once the check passes: `kubectl uncordon <node>` or
    `scontrol update nodename=<node> state=resume`."""

_RESET = """
    Reset the GPU once nothing runs on it (`nvidia-smi --query-compute-apps=pid,process_name --format=csv -i <index>`
    is empty): `nvidia-smi -r -i <index>`. On NVSwitch (HGX/DGX) systems a reset may have to cover every GPU of the
    baseboard, with the fabric manager restarted; if the reset fails, reboot the node."""

_THROTTLE_QUERIES = """
    ```promql
    $CLOCK_EVENT_ACTIVE{node="<node>", reason!="gpu_idle"} == 1
    $CLOCK{node="<node>", clock="sm"} / $MAX_CLOCK{node="<node>", clock="sm"}
    rate($CLOCK_EVENT_DURATION{node="<node>"}[1h])   # share of time held down, per reason
    ```"""

_XID_TIMING = """
    The alert reads the event's own time, `$XID_LAST_SEEN` (Unix time of the last
    event of that code on that GPU and MIG instance), as well as the counter: it fires for $thresholds.rate_window
    after each
    event and is kept $thresholds.keep_firing more, so it resolves that long after the last one. An XID right after
    an exporter restart pages too, even when the same code was counted before the restart (the counter series
    then come back at 1). An exporter restart without a new XID does not: the series are gone until the code
    recurs."""

_FLAPPING = """
    It also fires when the input flaps: bad in more than $thresholds.flap_share of the samples of the last
    $thresholds.long_window and at least
    once in the last $thresholds.for_medium (every other scrape, or one scrape in five, never stays bad for the
    whole `for`).
    One failed scrape or an exporter restart stays under that. Once the input is good again, a flapping alert
    resolves $thresholds.for_medium after its last bad sample."""

_DEGRADING_IMPACT = """
    Nothing fails yet: jobs run. It is the curve that comes before a GPU is pulled, and a GPU that fails
    mid-job costs the whole job's progress since its last checkpoint (every rank of it). Replacing it
    between jobs costs one drain."""


def _degrading_action(tunables: str) -> str:
    """The degradation alerts' shared action: drain and plan the replacement, then what tunes it."""
    return f"""
        The GPU is degrading: drain it and plan its replacement. Ticket, not page. Stop scheduling new work on
        the node, let the running jobs reach a checkpoint or finish, then take the GPU out of service and
        open a vendor case (RMA) with the diagnosis above and `nvidia-bug-report.sh`; run the vendor's field
        diagnostic (`dcgmi diag -r 3`) before the case if you can.
        {_drain("gpu degrading")}

        If the diagnostic passes and the cause was outside the GPU (a reseated riser, a fixed fan, a
        replaced PSU), return the node to service and watch the same query for a day. The alert resolves
        on its own once the new level is the baseline: a resolved degradation alert is not a repaired GPU.
        Tunables: {tunables} in `Thresholds` in `gpuobs/alerts/rules.py`."""


RUNBOOKS: dict[str, dict[str, str]] = {
    # ------------------------------------------------------------------------------ throttling and thermals
    "GpuHwThermalSlowdown": _rb(
        meaning="""
            NVML reports the clock-event reason `HW Thermal Slowdown` (bit 0x40 of
            `nvmlDeviceGetCurrentClocksEventReasons`) as active: the hardware itself is cutting the core clocks,
            typically by half or more, because the GPU (or its memory) has reached its thermal protection limit.
            This is the last protection before the thermal shutdown temperature. The bit flaps, so the alert
            keeps firing for $thresholds.keep_firing after it clears.""",
        impact="""
            Kernels on this GPU run at a fraction of their normal speed. In synchronous data-parallel training
            every rank waits for this one, so the whole job slows down. If the temperature keeps rising the GPU
            reaches its shutdown temperature, drops off the bus (XID 79) and kills every process on it.""",
        diagnosis=["""
            - `nvidia-smi -q -d PERFORMANCE,TEMPERATURE -i <index>`: "Clocks Event Reasons" shows which reasons
              are active; compare "GPU Current Temp" with "GPU Slowdown Temp" and "GPU Shutdown Temp".
            - Is it one GPU or the whole node? One GPU points at its heatsink, fan or cold plate; the whole node
              or rack points at inlet air, fans or coolant.
            - Chassis side: `ipmitool sdr type temperature` and `ipmitool sdr type fan` for inlet temperature and
              fan state.""", """
            ```promql
            $TEMPERATURE{node="<node>"}
            $SLOWDOWN_TEMPERATURE{node="<node>"}
            $MEMORY_TEMPERATURE{node="<node>"}
            $FAN_SPEED{node="<node>"}          # air-cooled boards only
            ```""", _THROTTLE_QUERIES],
        action=["""
            Treat it as urgent: the GPU is protecting itself. If it persists, or more than one GPU of the node is
            affected, take the node out of scheduling:""", _drain("GpuHwThermalSlowdown"), """
            Then fix the cooling: failed fans, blocked airflow, missing blanking panels, hot-aisle recirculation,
            coolant flow or temperature on liquid-cooled systems. A single GPU running much hotter than its
            neighbours under the same load suggests a seating or thermal-interface problem: open a case with the
            system vendor. Do not put the node back into service until temperatures under load stay well below
            the slowdown threshold."""]),
    "GpuSwThermalSlowdown": _rb(
        meaning="""
            The clock-event reason `SW Thermal Slowdown` (bit 0x20) has been active for $thresholds.for_short: the
            driver is
            lowering clocks because the GPU temperature is above its maximum operating temperature, or the memory
            temperature is above the memory maximum operating temperature. It is the gentler, earlier stage
            before the hardware thermal slowdown.""",
        impact="""
            The GPU runs slower than it could, so steps or requests on it take longer; in a synchronous job the
            whole job runs at this GPU's pace. It is a warning that cooling is marginal.""",
        diagnosis=["""
            - `nvidia-smi -q -d PERFORMANCE,TEMPERATURE -i <index>`: compare "GPU Current Temp" with "GPU Max
              Operating Temp" and "Memory Current Temp" with "Memory Max Operating Temp".
            - Check whether the whole node or rack runs hot (inlet air, fans, coolant) or only this GPU.""", """
            ```promql
            $TEMPERATURE{node="<node>"} - $MAX_OPERATING_TEMPERATURE{node="<node>"}
            $MEMORY_TEMPERATURE{node="<node>"}
              - $MEMORY_MAX_TEMPERATURE{node="<node>"}
            ```""", _THROTTLE_QUERIES],
        action="""
            Fix the cooling before it becomes a hardware thermal slowdown: airflow, fans, inlet temperature,
            coolant. If only one GPU is affected under the same load as its neighbours, schedule a vendor check of
            its heatsink or cold plate. If it escalates to `GpuHwThermalSlowdown`, drain the node. The alert is not
            actionable by the job owner."""),
    "GpuTemperatureNearSlowdown": _rb(
        meaning="""
            The GPU core temperature (`nvmlDeviceGetTemperature`) has been within $thresholds.temp_margin_c °C of
            the GPU's own
            slowdown threshold (`NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`) for $thresholds.for_short. The threshold is
            read from each GPU,
            so the alert is right for every model. Nothing is throttled yet by the hardware.""",
        impact="""
            No slowdown yet, but a little more heat (higher load, a warmer aisle, a failing fan) will trigger the
            hardware thermal slowdown and cut the clocks by half or more.""",
        diagnosis=["""
            - `nvidia-smi -q -d TEMPERATURE,PERFORMANCE -i <index>`: current temperature, slowdown and shutdown
              temperatures, and whether any clock-event reason is already active.
            - Compare with the node's other GPUs and with neighbouring nodes: one GPU, a node or a rack?
            - `ipmitool sdr type temperature` / `ipmitool sdr type fan` on the node's BMC.""", """
            ```promql
            $SLOWDOWN_TEMPERATURE{node="<node>"} - $TEMPERATURE{node="<node>"}
            max by (node) ($TEMPERATURE)       # hottest GPU per node across the fleet
            $POWER_USAGE{node="<node>"}
            ```"""],
        action="""
            Check and fix cooling (fans, airflow, blanking panels, inlet temperature, coolant) before throttling
            starts. If a single GPU runs hotter than its peers under the same load, schedule a vendor check. The
            margin is `temp_margin_c` in `Thresholds` in `gpuobs/alerts/rules.py`; change it there and run
            `gpuobs generate`."""),
    "GpuMemoryTemperatureNearMax": _rb(
        meaning="""
            The HBM/GDDR temperature (`NVML_FI_DEV_MEMORY_TEMP`) has been within $thresholds.temp_margin_c °C of
            the memory
            maximum operating temperature (`NVML_TEMPERATURE_THRESHOLD_MEM_MAX`) for $thresholds.for_short. Above
            that limit the
            driver engages SW thermal slowdown. Memory-bandwidth-bound workloads heat the memory more than the
            core.""",
        impact="""
            No slowdown yet, but the GPU is close to being throttled. Memory running hot for long periods also
            raises the rate of ECC errors.""",
        diagnosis=["""
            - `nvidia-smi -q -d TEMPERATURE,PERFORMANCE,ECC -i <index>`: "Memory Current Temp" against "Memory
              Max Operating Temp", active clock-event reasons, ECC counters.
            - Is the core temperature high too (cooling problem) or only the memory (bandwidth-heavy
              workload)?""", """
            ```promql
            $MEMORY_MAX_TEMPERATURE{node="<node>"}
              - $MEMORY_TEMPERATURE{node="<node>"}
            $GPM_DRAM_ACTIVE{node="<node>"}
            rate($ECC_ERRORS{node="<node>", error_type="corrected"}[1h])
            ```"""],
        action="""
            Improve cooling of the node (airflow, fans, coolant). If one GPU's memory runs much hotter than its
            peers under the same load, schedule a vendor check. Watch `GpuEccCorrectedRate` for this GPU. The
            margin is `temp_margin_c` in `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "GpuHwPowerBrake": _rb(
        meaning="""
            The clock-event reason `HW Power Brake Slowdown` (bit 0x80) is active: an external power-brake signal,
            asserted by the system (for example the power supply or the board management controller), makes the
            GPU cut its clocks by a factor of two or more. It usually affects every GPU of the chassis at once.""",
        impact="""
            Every job on the affected GPUs runs at half speed or worse. The usual cause is a power-delivery
            problem (a failed or unplugged PSU, lost PSU redundancy, an overloaded PDU), which can escalate into
            GPUs or the whole node powering off.""",
        diagnosis=["""
            - How many GPUs of the node have it? All of them points at the chassis power.
            - `nvidia-smi -q -d PERFORMANCE,POWER`: "HW Power Brake Slowdown: Active" and the power draw.
            - On the BMC: `ipmitool sdr type "Power Supply"` for PSU status, `ipmitool sel elist` for power
              events, and the chassis power-capping policy.""", """
            ```promql
            count by (node) ($CLOCK_EVENT_ACTIVE{reason="hw_power_brake_slowdown"} == 1)
            sum by (node) ($POWER_USAGE{node="<node>"})
            rate($CLOCK_EVENT_DURATION{node="<node>", reason="hw_power_brake_slowdown"}[1h])
            ```"""],
        action=["""
            Drain the node if the brake stays asserted:""", _drain("GpuHwPowerBrake"), """
            Check the power supplies and their feeds: replace a failed PSU, reconnect a lost feed, review the BMC's
            power-capping settings and the rack's PDU load. Escalate to the data-centre team or the system vendor
            for PSU replacement. Return the node to service once the bit no longer sets under load."""]),
    "GpuHwSlowdown": _rb(
        meaning="""
            The clock-event reason `HW Slowdown` (bit 0x8) has been active for $thresholds.for_short. NVML
            documents it as the
            hardware reducing core clocks by a factor of two or more because the temperature is too high, an
            external power brake is asserted, or power draw is too high and the fast-trigger protection is
            reducing clocks. It can also flicker during P-state or clock changes, hence the wait.""",
        impact="""
            Work on this GPU runs at half speed or worse; synchronous jobs slow down to its pace.""",
        diagnosis=["""
            - See which specific bit is set alongside: `hw_thermal_slowdown` (a thermal cause),
              `hw_power_brake_slowdown` (an external power brake). If neither is, suspect power excursions
              (fast trigger) and power delivery.
            - `nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE -i <index>`.""", _THROTTLE_QUERIES, """
            ```promql
            $POWER_USAGE{node="<node>"} / $POWER_LIMIT{node="<node>"}
            $TEMPERATURE{node="<node>"}
            ```"""],
        action=["""
            Follow the thermal or power-brake runbook when one of those bits explains it. If HW slowdown persists
            with no thermal or power explanation, drain the node, reset the GPU and watch whether it comes back:""",
            _drain("GpuHwSlowdown"), _RESET, """
            If it recurs, open a case with the system vendor (power delivery on the board or baseboard)."""]),
    "GpuSwPowerCapSustained": _rb(
        meaning="""
            The clock-event reason `SW Power Cap` (bit 0x4) has been active for $thresholds.for_medium: the
            driver's power
            management is holding clocks below the requested ones to keep the board's power draw at its enforced
            power limit. Short bursts are normal under heavy load; a sustained cap means the GPU is power-bound.""",
        impact="""
            Work runs slower than it could at full clocks. Power-hungry kernels (large GEMMs) on some GPUs run at
            the cap by design; a cap lowered below the default limit costs throughput on every job placed here.""",
        diagnosis=["""
            - `nvidia-smi -q -d POWER,PERFORMANCE -i <index>`: "Current Power Limit" against "Default Power Limit"
              and "Max Power Limit", and the power draw.
            - A limit below the default means someone or something (a site power policy, DCGM, an admin) lowered
              it.""", """
            ```promql
            $POWER_LIMIT{node="<node>"} < $POWER_DEFAULT_LIMIT{node="<node>"}
            $POWER_USAGE{node="<node>"} / $POWER_LIMIT{node="<node>"}
            rate($CLOCK_EVENT_DURATION{node="<node>", reason="sw_power_cap"}[1h])
            $TEMPERATURE{node="<node>"}    # hot silicon draws more power for the same work
            ```"""],
        action="""
            If the limit was lowered by mistake, restore it: `nvidia-smi -pl <watts> -i <index>` (root; it does not
            survive a reboot or driver reload, so fix whatever sets it at boot). If the cap is a deliberate site
            power budget, or the workload simply runs at the limit, this is expected: silence it for those nodes,
            or lengthen the wait (`for_medium` in `Thresholds` in `gpuobs/alerts/rules.py`). Improve cooling if
            the GPU also runs hot."""),
    # ------------------------------------------------------------------------------ allocation
    "GpuAllocatedIdle": _rb(
        meaning="""
            The GPU has held more than $thresholds.allocated_memory_bytes of device memory, so some process, pod or
            job has it, while its
            utilization (`nvmlDeviceGetUtilizationRates`, the share of time a kernel ran) stayed at or below
            $thresholds.idle_utilization for $thresholds.for_idle.""",
        impact="""
            A GPU is reserved and paid for but does no work, while other jobs may be queued waiting for
            capacity. Common causes: an idle notebook or interactive session, an inference server with no traffic,
            a crashed or hung process still holding memory, a job waiting on something outside the GPU.""",
        diagnosis=["""
            - Who holds it: `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv -i <index>`
              on the node, or the opt-in per-process series (exporter `--processes`).
            - Kubernetes: `kubectl get pods -A -o wide --field-selector spec.nodeName=<node>` and
              `kubectl describe node <node>` (allocated `nvidia.com/gpu`).
            - Slurm: `squeue -w <node>` and `scontrol show job -d <jobid>` (the GRES indexes it holds).""", """
            ```promql
            max_over_time($UTILIZATION{node="<node>"}[30m])
            $MEMORY_USED{node="<node>"}
            $PROCESS_MEMORY{node="<node>"}      # with --processes
            ```"""],
        action="""
            Contact the owner of the pod or job and ask them to release the GPU; kill processes left behind by a
            finished job. Apply the site's idle-reaping policy where there is one (notebook culling, scale-to-zero
            for idle inference). The thresholds are `for_idle`, `idle_utilization` and `allocated_memory_bytes`
            in `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "GpuFleetIdleCapacity": _rb(
        meaning="""
            Informational: the given number of GPUs in the cluster have had a utilization at or below
            $thresholds.idle_utilization for $thresholds.for_idle, whether allocated or not. It is routed to the
            `null` receiver by default and is meant for
            dashboards and capacity reviews, not for paging.""",
        impact="""
            Capacity is paid for and unused. When jobs are queued at the same time, the scheduler cannot place
            them on the idle GPUs (fragmentation, node drains, quotas, affinity rules) or the GPUs are allocated
            but idle.""",
        diagnosis=["""
            ```promql
            $CLUSTER_GPUS_IDLE
            $CLUSTER_GPUS_ALLOCATED_IDLE      # idle GPUs that someone holds: see GpuAllocatedIdle
            $CLUSTER_UTILIZATION
            ```""", """
            - Queued work: `squeue -t PENDING` (Slurm), `kubectl get pods -A --field-selector status.phase=Pending`.
            - Drained or cordoned nodes: `sinfo -R`, `kubectl get nodes` (SchedulingDisabled)."""],
        action="""
            No immediate action. Review in capacity planning: reclaim allocated-but-idle GPUs, return drained nodes
            to service, fix scheduler fragmentation, or scale down cloud capacity. Change `for_idle` or
            `idle_utilization` in `Thresholds` if the signal is too noisy."""),
    # ------------------------------------------------------------------------------ XID
    "GpuXidRebootRequired": _rb(
        meaning=["""
            The driver reported XID 79, which NVIDIA documents as "GPU has fallen off the bus": the GPU stopped
            responding on PCIe and the driver can no longer reach it. Causes include hardware failure, PCIe or
            riser faults, power delivery problems, overheating to the shutdown temperature, and driver
            faults.""", _XID_TIMING],
        impact="""
            Every process on the GPU has failed (CUDA errors), and peers of a distributed job hang in collectives
            until they time out. The GPU stays unusable until the node reboots; `GpuLost` normally fires for the
            same GPU.""",
        diagnosis=["""
            - `dmesg -T | grep -i -E "xid|fallen off the bus|NVRM"` (or `journalctl -k`): the XID line and what
              came before it (AER errors, thermal events).
            - `nvidia-smi` usually reports the GPU as lost or cannot get its handle; `lspci -d 10de:` shows
              whether the device still enumerates, `lspci -vv -s <pci_bus_id>` whether its config space reads.
            - BMC event log: `ipmitool sel elist` for PCIe, power or thermal events.""", """
            ```promql
            increase($XID_ERRORS{node="<node>"}[1h])
            $XID_LAST_SEEN{node="<node>"}
            $GPU_UP{node="<node>"}
            $GPU_INFO{node="<node>"}          # pci_bus_id and serial for the vendor case
            max_over_time($TEMPERATURE{node="<node>"}[1h])
            ```"""],
        action=["""
            Drain the node and reboot it; a GPU reset does not normally recover from XID 79.""",
            _drain("XID 79 on GPU <index>"), """
            After the reboot, check that all GPUs are back (`nvidia-smi -L`) and run a diagnostic such as
            `dcgmi diag -r 3` where DCGM is installed before returning the node to service. If the same GPU (same
            serial) falls off the bus again, keep the node drained, collect `nvidia-bug-report.sh` and open an RMA
            with the vendor.""", _UNDRAIN]),
    "GpuXidResetRequired": _rb(
        meaning=["""
            The driver reported one of the XIDs after which NVIDIA recommends resetting the GPU:

            - 48: double-bit (uncorrectable) ECC error.
            - 62: internal micro-controller halt.
            - 63: ECC page retirement or row-remapping recording event (the repair applies at the next reset).
            - 64: ECC page retirement or row-remapper recording failure.
            - 95: uncontained ECC error: the error could not be limited to one application.
            - 119 / 120: GSP RPC timeout / GSP error: the GPU System Processor firmware stopped answering or
              reported an error.""", _XID_TIMING],
        impact="""
            Processes on the GPU have failed or will fail (all of them for 95, 119 and 120). Until the GPU is
            reset, a pending row remap or page retirement is not applied and new work can hit the same fault.
            Jobs scheduled onto it crash.""",
        diagnosis=["""
            - `dmesg -T | grep -i xid`: the exact code, the PCI address and any text the driver adds.
            - `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER -i <index>` for the memory XIDs; recent drivers
              also show a recommendation under `nvidia-smi -q -d RESET_STATUS`.
            - Who ran on it: `kubectl get pods -A -o wide --field-selector spec.nodeName=<node>`,
              `squeue -w <node>`.""", """
            ```promql
            increase($XID_ERRORS{node="<node>"}[1h])
            $REMAP_PENDING{node="<node>"}
            $RETIRED_PAGES_PENDING{node="<node>"}
            $REMAP_FAILURE{node="<node>"}
            ```"""],
        action=["""
            Drain the GPU's node and let or make its jobs stop:""", _drain("XID reset required on GPU <index>"),
            _RESET, """
            After the reset check that `$REMAP_PENDING` and `$RETIRED_PAGES_PENDING` are 0
            and `$REMAP_FAILURE` is 0, then run `dcgmi diag -r 3` where DCGM is installed. Escalate
            to the vendor (RMA) on XID 64, a row-remap failure, or the same XID recurring on the same GPU after a
            reset; for recurring 119/120 also check the driver release notes and consider a driver update.""",
            _UNDRAIN]),
    "GpuXidApplicationError": _rb(
        meaning=["""
            The driver reported an XID that usually concerns one application rather than the GPU:

            - 13: graphics engine exception, typically an out-of-bounds access or illegal instruction in a kernel.
            - 31: GPU memory page fault (MMU fault), typically an illegal memory access by the application.
            - 43: GPU stopped processing: a channel hit a fault and the driver stopped it.
            - 45: preemptive cleanup due to previous errors, most often a user-initiated termination (Ctrl-C,
              kill, job cancellation) or cleanup after another XID.
            - 94: contained ECC error: an uncorrectable ECC error limited to the applications using the affected
              memory; other applications continue, and the row is remapped at the next reset.""", _XID_TIMING],
        impact="""
            The affected process usually died with a CUDA error ("an illegal memory access was encountered", an
            ECC error) and its job failed or restarted. The GPU itself stays usable. The same XID recurring on one
            GPU across different users' jobs points at hardware rather than code.""",
        diagnosis=["""
            - `dmesg -T | grep -i xid`: recent drivers print the pid and process name with the XID; match them to
              the job (`kubectl get pods -A -o wide --field-selector spec.nodeName=<node>`, `squeue -w <node>`).
            - For 13/31/43: the application's log; rerun with `CUDA_LAUNCH_BLOCKING=1` or under
              `compute-sanitizer` to find the faulting kernel.
            - For 94: `nvidia-smi -q -d ECC,ROW_REMAPPER -i <index>`.""", """
            ```promql
            increase($XID_ERRORS{node="<node>", xid=~"13|31|43|45|94"}[1h])
            topk(10, sum by (node, gpu, uuid, xid) (increase($XID_ERRORS{xid=~"13|31|43|45|94"}[7d])))
            $REMAP_PENDING{node="<node>"}
            ```"""],
        action="""
            Restart the affected application or job; tell its owner for 13, 31 and 43 (code or library bugs,
            mismatched CUDA versions). An isolated 45 after a cancelled job needs nothing. For 94, no drain is
            needed right away, but schedule a GPU reset to apply the pending row remap (see `GpuRowRemapPending`).
            If one GPU keeps producing these XIDs across different jobs, drain its node, reset the GPU, run
            `dcgmi diag -r 3` where DCGM is installed, and escalate to the vendor if it fails."""),
    "GpuXidNvlinkError": _rb(
        meaning=["""
            The driver reported XID 74, an NVLink error: a link of this GPU detected an error (for example a CRC or
            replay problem, or a link that failed to train or recover). The XID message in the kernel log carries
            the link number and error bits. It can be transient or mark a failing link.""", _XID_TIMING],
        impact="""
            Collectives over NVLink (NCCL all-reduce, tensor and pipeline parallelism) slow down through retries,
            or fail with NCCL errors and hang or crash the job. A link that goes down lowers the GPU's bandwidth to
            its peers.""",
        diagnosis=["""
            - `dmesg -T | grep -i xid` for the link and error detail.
            - `nvidia-smi nvlink -s -i <index>` (link state and speed) and `nvidia-smi nvlink -e -i <index>`
              (error counters); `nvidia-smi topo -m` for the topology.
            - On NVSwitch systems: `systemctl status nvidia-fabricmanager` and its journal.""", """
            ```promql
            $NVLINKS_DOWN{node="<node>"} > 0
            rate($NVLINKS_ERRORS{node="<node>"}[5m])
            increase($XID_ERRORS{node="<node>", xid="74"}[24h])
            ```"""],
        action=["""
            A single XID 74 with all links up and no rising error counters: restart the affected job if it failed
            and watch. If it recurs, a link is down, or error counters keep rising, drain the node:""",
            _drain("XID 74 NVLink error on GPU <index>"), """
            Reset the GPUs (on NVSwitch systems all of them, with the fabric manager restarted) or reboot. If the
            link stays bad, open a vendor case (GPU, baseboard, NVSwitch or NVLink bridge).""", _UNDRAIN]),
    # ------------------------------------------------------------------------------ memory errors
    "GpuEccUncorrectable": _rb(
        meaning="""
            The volatile count of uncorrected ECC errors (`NVML_FI_DEV_ECC_DBE_VOL_TOTAL`, double-bit errors) rose
            in the last $thresholds.rate_window: ECC detected an error in device memory that it could not correct.
            The driver
            reports it as XID 48, 94 (contained) or 95 (uncontained); Ampere and newer GPUs mark the DRAM row for
            remapping, older ones retire the page. Volatile counters reset with the driver or a GPU reset; the
            aggregate counters persist.""",
        impact="""
            The process that read the bad memory gets an ECC error and dies (every process on the GPU when the
            error is uncontained). Until the GPU is reset, the remap or retirement is pending and the fault can
            hit again.""",
        diagnosis=["""
            - `nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT -i <index>`: volatile and aggregate counts,
              pending remaps, remap failure, bank remap availability.
            - `dmesg -T | grep -i xid` for 48/94/95 and the process affected.""", """
            ```promql
            increase($ECC_ERRORS{uuid="<uuid>", error_type="uncorrected"}[24h])
            $REMAPPED_ROWS{uuid="<uuid>"}
            $REMAP_PENDING{uuid="<uuid>"}
            $REMAP_FAILURE{uuid="<uuid>"}
            $RETIRED_PAGES{uuid="<uuid>"}
            ```"""],
        action=["""
            Drain the node so no new work lands on the GPU:""", _drain("uncorrectable ECC on GPU <index>"),
            _RESET, """
            After the reset, `$REMAP_PENDING` (or `$RETIRED_PAGES_PENDING`) must be 0 and
            `$REMAP_FAILURE` 0; a GPU whose error was repaired by a row remap can return to service.
            If uncorrectable errors recur after the remap, or the remap failed, keep it drained and RMA it.""",
            _UNDRAIN]),
    "GpuEccCorrectedRate": _rb(
        meaning="""
            The GPU has corrected more than $thresholds.ecc_corrected_per_h single-bit ECC errors per hour,
            averaged over the last
            $thresholds.long_window, for $thresholds.for_medium (`NVML_FI_DEV_ECC_SBE_VOL_TOTAL`). ECC fixes these
            transparently, but a high or rising rate
            indicates degrading memory cells. Repeated correctable errors can also lead to row remapping (Ampere
            and newer) or page retirement (older GPUs), and the driver may report XID 92 (high single-bit ECC
            error rate).""",
        impact="""
            No direct effect on jobs today. It is an early warning: degrading memory is more likely to produce
            uncorrectable errors that crash jobs.""",
        diagnosis=["""
            - `nvidia-smi -q -d ECC,ROW_REMAPPER -i <index>`: volatile and aggregate counts, pending remaps, bank
              remap availability.
            - Is the rate growing over days, and is the memory running hot?""", """
            ```promql
            rate($ECC_ERRORS{uuid="<uuid>", error_type="corrected", counter_type="volatile"}[1h])
            increase($ECC_ERRORS{uuid="<uuid>", error_type="corrected", counter_type="aggregate"}[7d])
            $REMAPPED_ROWS{uuid="<uuid>"}
            $MEMORY_TEMPERATURE{uuid="<uuid>"}
            ```"""],
        action="""
            Ticket, not page. Schedule a GPU reset in the next maintenance window so pending remaps take effect. If
            the rate keeps growing, uncorrectable errors appear, or remap availability runs low, drain the node
            and open a vendor case. The threshold is `ecc_corrected_per_s` in `Thresholds` in
            `gpuobs/alerts/rules.py`."""),
    "GpuRowRemapPending": _rb(
        meaning="""
            `NVML_FI_DEV_REMAPPED_PENDING` is 1: the GPU (Ampere or newer) has recorded a DRAM row to be remapped
            to a spare row after ECC errors, but the remap only takes effect at the next GPU reset or reboot. It
            usually follows an uncorrectable error (XID 48/94/95, recorded with XID 63).""",
        impact="""
            The GPU keeps working, but the faulty row is not yet replaced, so further errors on it remain possible
            and can crash jobs. NVIDIA's guidance is to reset the GPU soon to apply the remap.""",
        diagnosis=["""
            - `nvidia-smi -q -d ROW_REMAPPER -i <index>` (or `nvidia-smi -q | grep -A3 "Remapped Rows"`): counts
              for correctable and uncorrectable errors, "Pending: Yes", "Remapping Failure Occurred", and the bank
              remap availability histogram.
            - `dmesg -T | grep -i xid` for the XID that caused it.""", """
            ```promql
            $REMAP_PENDING{uuid="<uuid>"}
            $REMAPPED_ROWS{uuid="<uuid>"}
            increase($ECC_ERRORS{uuid="<uuid>", error_type="uncorrected"}[24h])
            ```"""],
        action=["""
            Plan a reset within hours, not weeks: drain the node, let running jobs finish, then reset.""",
            _drain("row remap pending on GPU <index>"), _RESET, """
            Check afterwards that `$REMAP_PENDING` is 0 and `$REMAP_FAILURE` is 0. If
            the availability histogram shows banks with few or no spare rows left, plan an RMA.""", _UNDRAIN]),
    "GpuRowRemapFailure": _rb(
        meaning="""
            `NVML_FI_DEV_REMAPPED_FAILURE` is 1: the GPU tried to remap a failing DRAM row and could not, usually
            because the bank has no spare rows left. nvidia-smi shows "Remapping Failure Occurred: Yes". The memory
            can no longer be repaired in the field and the GPU needs service.""",
        impact="""
            The bad row stays in use; uncorrectable errors on it will keep crashing jobs placed on this GPU.""",
        diagnosis=["""
            - `nvidia-smi -q -d ROW_REMAPPER,ECC -i <index>`: remap failure, bank remap availability histogram,
              ECC counts.
            - `dmesg -T | grep -i xid` for XID 64 and ECC XIDs.""", """
            ```promql
            $REMAP_FAILURE{uuid="<uuid>"}
            $REMAPPED_ROWS{uuid="<uuid>"}
            $GPU_INFO{uuid="<uuid>"}     # serial and pci_bus_id for the RMA
            ```"""],
        action=["""
            Take the GPU out of service and keep it out; a reset does not fix it.""",
            _drain("row remap failure on GPU <index>: RMA"), """
            Collect `nvidia-bug-report.sh` and the GPU's serial, and open an RMA with the vendor. Where the node
            must keep working meanwhile, exclude only this GPU from scheduling (for example with the device
            plugin's or Slurm's GRES configuration)."""]),
    # ------------------------------------------------------------------------------ interconnects
    "GpuNvlinkDown": _rb(
        meaning="""
            An NVLink link of this GPU reports inactive (`NVML_FI_DEV_NVLINK_GET_STATE` is 0) for
            $thresholds.for_short: the
            link failed to train, dropped after errors (often with XID 74), or was disabled.""",
        impact="""
            The GPU has less bandwidth to its peers: NCCL collectives and model-parallel traffic slow down or fall
            back to slower paths, and on NVSwitch systems the fabric manager may fail to set up the GPU, so CUDA
            jobs fail to start on it.""",
        diagnosis=["""
            - `nvidia-smi nvlink -s -i <index>`: which links are inactive; `nvidia-smi nvlink -e -i <index>`: error
              counters; `nvidia-smi topo -m`.
            - `dmesg -T | grep -i -E "xid|nvlink"`.
            - On NVSwitch systems: `systemctl status nvidia-fabricmanager` and `journalctl -u nvidia-fabricmanager`.""",
            """
            ```promql
            $NVLINKS_DOWN{node="<node>"} > 0
            rate($NVLINKS_ERRORS{node="<node>"}[1h])
            increase($XID_ERRORS{node="<node>", xid="74"}[24h])
            ```"""],
        action=["""
            Drain the node:""", _drain("NVLink down on GPU <index>"), """
            Reset the GPUs (on NVSwitch systems all of them, restarting the fabric manager) or reboot the node. If
            the link stays down, open a vendor case: GPU, baseboard, NVSwitch, or the NVLink bridge on PCIe
            cards.""", _UNDRAIN]),
    "GpuNvlinkErrorRate": _rb(
        meaning="""
            The NVLink links of this GPU count more than $thresholds.nvlink_errors_per_s data-link errors per
            second together over $thresholds.rate_window: `crc` (received flits or data with CRC errors), `replay`
            (retransmissions) and `recovery` (link recovery events, where the link retrains). Which link and
            which counter: the per-link series, served with the exporter's `--detail nvlink`, or
            `nvidia-smi nvlink -e -i <index>`.""",
        impact="""
            Retries and recoveries eat bandwidth and add latency to NCCL collectives; a link that keeps degrading
            may raise XID 74 or go down.""",
        diagnosis=["""
            - `nvidia-smi nvlink -e -i <index>` for the counters, `nvidia-smi nvlink -s -i <index>` for link
              state and speed.
            - One link (a physical fault) or many links on many GPUs (driver, firmware, fabric)?""", """
            ```promql
            rate($NVLINKS_ERRORS{node="<node>"}[5m])
            $NVLINKS_DOWN{node="<node>"}
            rate($NVLINKS_TX{node="<node>"}[5m])
            ```"""],
        action="""
            Ticket. If errors persist on one link, drain the node at a convenient time, reset or reboot, and open a
            vendor case if they continue. If many nodes show it after a driver or firmware change, escalate to the
            platform team. The threshold is `nvlink_errors_per_s` in `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "GpuPcieLinkDegraded": _rb(
        meaning="""
            For $thresholds.for_medium, while the GPU was more than $thresholds.pcie_busy_utilization busy, its
            PCIe link ran below the maximum generation
            or width that the GPU and the system support (`nvmlDeviceGetCurrPcieLinkGeneration/Width` against
            `nvmlDeviceGetMaxPcieLinkGeneration/Width`). GPUs lower the link generation at idle to save power,
            which is why only busy GPUs count. A narrower width (x8 instead of x16) means lanes failed to train.""",
        impact="""
            Host-to-device and device-to-host transfers are slower: data loading, checkpointing, CPU offload, and
            GPUDirect traffic to NICs through the PCIe switch. Jobs that depend on them slow down.""",
        diagnosis=["""
            - `nvidia-smi --query-gpu=index,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv`
            - `lspci -vv -s <pci_bus_id> | grep -E "LnkCap|LnkSta"`: capability against status (recent pciutils
              mark a downgraded link).
            - `dmesg -T | grep -i -E "aer|pcie bus error"` for link errors.""", """
            ```promql
            $PCIE_GENERATION{node="<node>"} < $PCIE_MAX_GENERATION{node="<node>"}
            $PCIE_WIDTH{node="<node>"} < $PCIE_MAX_WIDTH{node="<node>"}
            rate($PCIE_REPLAYS{node="<node>"}[5m])
            $GPU_INFO{node="<node>"}       # pci_bus_id
            ```""", """
            The exporter reads the link state every tenth sampling pass, so a change shows with a delay."""],
        action=["""
            Drain the node at a convenient time and reboot to retrain the link:""",
            _drain("PCIe link degraded on GPU <index>"), """
            If it comes back degraded, check the BIOS PCIe settings, reseat the GPU, riser or cables, and open a
            vendor case. The busy threshold is `pcie_busy_utilization` in `Thresholds` in
            `gpuobs/alerts/rules.py`.""", _UNDRAIN]),
    "GpuPcieReplayRate": _rb(
        meaning="""
            The GPU's PCIe replay counter (`NVML_FI_DEV_PCIE_REPLAY_COUNTER`) rises by more than
            $thresholds.pcie_replays_per_s per second: the
            data-link layer keeps retransmitting packets that arrived corrupted or unacknowledged. It indicates
            signal-integrity problems on the link: seating, riser, retimer, cable or slot.""",
        impact="""
            Retransmissions cost bandwidth and latency on host transfers. A link that keeps degrading can escalate
            to fatal PCIe errors and the GPU falling off the bus (XID 79).""",
        diagnosis=["""
            - `nvidia-smi -q -i <index> | grep -i -A1 replay` ("Replays Since Reset") and the link generation and
              width.
            - `dmesg -T | grep -i aer` for corrected and uncorrected PCIe errors on the GPU's address or its
              upstream switch.
            - `lspci -vv -s <pci_bus_id>` for link status and AER registers.""", """
            ```promql
            rate($PCIE_REPLAYS{node="<node>"}[5m])
            $PCIE_GENERATION{node="<node>"}
            $PCIE_WIDTH{node="<node>"}
            ```"""],
        action="""
            Ticket. If the rate stays high, drain the node at a convenient time, reseat the GPU and riser or
            cables, check BIOS and firmware, and open a vendor case if it persists. Drain at once if it comes with
            XIDs or `GpuLost`. The threshold is `pcie_replays_per_s` in `Thresholds` in
            `gpuobs/alerts/rules.py`."""),
    # ------------------------------------------------------------------------------ presence and exporter
    "GpuLost": _rb(
        meaning=["""
            `$GPU_UP` is 0 and the GPU is lost: NVML returns `GPU_IS_LOST` for it
            (`$GPU_UNHEALTHY{reason="lost"}`), or the exporter gives no reason (one without
            `$GPU_UNHEALTHY`). The exporter withholds its value series, so its other alerts resolve and are
            inhibited; the XID alert that explains the loss (usually XID 79) stays. A GPU unusable for another
            reason (reset required, timeouts, unreadable) is `GpuUnhealthy`'s case, so one GPU pages once.""",
            _FLAPPING],
        impact="""
            Every process on the GPU has failed, and the GPU is unusable until the node reboots. Distributed jobs
            using it hang or fail.""",
        diagnosis=["""
            - `dmesg -T | grep -i -E "xid|NVRM|fallen off the bus"`.
            - `nvidia-smi` (shows the GPU as lost or cannot get its handle), `lspci -d 10de:` (does the device
              still enumerate?).
            - BMC event log: `ipmitool sel elist`.""", """
            ```promql
            $GPU_UP{node="<node>"} == 0
            $GPU_UNHEALTHY{node="<node>"}
            avg_over_time($GPU_UP{node="<node>"}[1h])      # share of samples it answered
            increase($XID_ERRORS{node="<node>"}[1h])
            increase($NVML_ERRORS{node="<node>", code="GPU_IS_LOST"}[1h])
            $GPU_INFO{node="<node>"}       # serial and pci_bus_id
            ```"""],
        action=["""
            Drain the node and reboot it:""", _drain("GPU <index> lost"), """
            After the reboot confirm the GPU is back (`nvidia-smi -L`, `$GPU_UP` 1) and run `dcgmi diag -r 3`
            where DCGM is installed. If the same GPU is lost again, keep the node drained and RMA the GPU with
            `nvidia-bug-report.sh` output.""", _UNDRAIN]),
    "GpuUnhealthy": _rb(
        meaning=["""
            `$GPU_UP` is 0 and `$GPU_UNHEALTHY` gives the reason the GPU is unusable (the alert's
            `reason` label):

            - `reset_required`: NVML returns `RESET_REQUIRED`: the GPU needs a reset (after an uncontained error,
              a GSP fault or a pending repair).
            - `timeout`: its NVML reads missed the exporter's sampling deadline: the GPU or the driver hangs for it.
            - `unreadable`: its handle or UUID cannot be read.

            The exporter withholds the GPU's value series meanwhile. A lost GPU (`GPU_IS_LOST`) is `GpuLost`'s case
            instead; a GPU seen lost in the last $thresholds.for_medium stays `GpuLost` whatever other reason it
            gives.""",
            _FLAPPING],
        impact="""
            Jobs on the GPU have failed or hang; new ones scheduled onto it fail. Its metrics have gaps or are
            gone, so its other alerts cannot fire.""",
        diagnosis=["""
            - `nvidia-smi -q -i <index>` (with `timeout 60`: for `timeout` it may hang too); recent drivers show
              a recommendation under `nvidia-smi -q -d RESET_STATUS`.
            - `dmesg -T | grep -i -E "xid|NVRM"`: XIDs 48, 62, 79, 95, 119 and 120 come before these states.
            - The exporter's logs: the failing call and its NVML code, rate-limited.""", """
            ```promql
            $GPU_UNHEALTHY{node="<node>"}
            avg_over_time($GPU_UP{node="<node>"}[1h])
            increase($GPU_TIMEOUTS{node="<node>"}[1h])
            sum by (call, code) (increase($NVML_ERRORS{node="<node>"}[1h]))
            increase($XID_ERRORS{node="<node>"}[1h])
            ```"""],
        action=["""
            Drain the node and stop or move the GPU's jobs:""", _drain("GPU <index> unusable"), """
            For `reset_required`, reset the GPU:""", _RESET, """
            For `timeout` and `unreadable`, try the same reset; if `nvidia-smi` hangs or the reset fails, reboot
            the node. After it, check `$GPU_UP` is 1 and run `dcgmi diag -r 3` where DCGM is installed. If the
            same GPU comes back to this state, keep the node drained and open a vendor case with the output of
            `nvidia-bug-report.sh`.""", _UNDRAIN]),
    "GpuSamplingTimeouts": _rb(
        meaning="""
            In more than $thresholds.gpu_timeout_share of the exporter's sampling passes over the last
            $thresholds.long_window (held for $thresholds.for_medium), the GPU's
            NVML reads missed the sampling deadline (`$GPU_TIMEOUTS` against
            `$SAMPLES`): its series were withheld from those passes. Slow or hanging NVML calls
            on one GPU are often the first sign of a GPU or driver fault. While the GPU is unusable
            (`GpuUnhealthy`, same family) this warning is inhibited.""",
        impact="""
            The GPU's metrics have gaps, so its alerts fire late or not at all; whatever slows NVML down can slow
            or hang CUDA work on it too.""",
        diagnosis=["""
            - `time nvidia-smi -q -i <index>`: slow on this GPU only, or on all of them?
            - `dmesg -T | grep -i -E "xid|NVRM"`.
            - Families that are slow on some boards (`processes`, MIG, NVLink) and `--interval`: the exporter's
              sampling deadline is 0.8 of its interval.""", """
            ```promql
            rate($GPU_TIMEOUTS{node="<node>"}[1h])
              / ignoring (gpu, uuid) group_left rate($SAMPLES{node="<node>"}[1h])
            $COLLECTION_DURATION{node="<node>"}
            $GPU_UNHEALTHY{node="<node>"}
            ```"""],
        action="""
            If other GPUs of the node answer in time and this one does not, drain the node at a convenient point,
            reset the GPU (or reboot) and run `dcgmi diag -r 3` where DCGM is installed. If every GPU of the node
            is slow, look at the driver (persistence mode off, `nvidia-persistenced` not running) and at the
            exporter's families and interval before the hardware. The threshold is `gpu_timeout_share` in
            `Thresholds`."""),
    "GpuMissing": _rb(
        meaning="""
            The driver counts fewer GPUs on the node (`$GPUS_PRESENT`) than it should have
            (`$GPUS_EXPECTED`: the exporter's `--expected-gpus`, else the most it has seen since it started):
            a GPU did not enumerate or initialise, typically after a reboot. A GPU the driver still counts but
            that is lost or unusable is `GpuLost`'s or `GpuUnhealthy`'s case.""",
        impact="""
            The node offers less GPU capacity than it is supposed to; jobs that need all of its GPUs cannot run
            there, and the scheduler may still advertise the missing one.""",
        diagnosis=["""
            - `nvidia-smi -L` against the node's specification; `lspci | grep -i nvidia` to see whether the
              device enumerates on PCIe at all.
            - `dmesg -T | grep -i -E "NVRM|RmInitAdapter|xid"` for initialisation failures.
            - `kubectl describe node <node>` (capacity and allocatable `nvidia.com/gpu`), `scontrol show node <node>`
              (Gres).""", """
            ```promql
            $GPUS_EXPECTED{node="<node>"} - $GPUS_PRESENT{node="<node>"}
            $GPU_UP{node="<node>"}
            ```""", """
            Without `--expected-gpus` the expected count is a high-water mark that resets when the exporter
            restarts, so a GPU missing since boot goes unnoticed: set `--expected-gpus` per node type."""],
        action=["""
            Drain the node and reboot it:""", _drain("GPU missing"), """
            If the GPU still does not appear, reseat it or open a vendor case. If the node's GPU count changed on
            purpose, correct `--expected-gpus` (or restart the exporter to reset the high-water mark).""",
            _UNDRAIN]),
    "NvmlDown": _rb(
        meaning=["""
            `$NVML_UP` is 0: `nvmlInit_v2` fails on the node, so no GPU can be read. `$NVML_INIT_ERROR`
            carries the reason, for example `DRIVER_NOT_LOADED` (no kernel module), `LIB_RM_VERSION_MISMATCH`
            (the user-space library and the kernel module differ, typically after a driver upgrade without a
            reboot), `LIBRARY_NOT_FOUND` (libnvidia-ml.so.1 is not visible to the exporter) or `NO_PERMISSION`.
            The exporter keeps serving and retries with a backoff of 1 s doubling to 30 s.""", """
            The reason `initializing` means the exporter's first `nvmlInit` (or its first sampling pass) has
            not completed: from its first request on, the exporter serves `$NVML_UP` 0 with this reason
            until it does, so a driver that never finishes initialising (a wedged GPU at boot) pages here,
            on Prometheus and on VictoriaMetrics alike, while a slow start that completes within
            $thresholds.for_short stays quiet. Its `/healthz` fails after the liveness timeout, so Kubernetes
            restarts it; the alert holds as long as the restarted exporter still cannot initialise.""", _FLAPPING],
        impact="""
            The node is blind: no GPU metric, and every GPU and node alert of the node is inhibited. A driver
            problem usually breaks CUDA jobs on the node too.""",
        diagnosis=["""
            - `$NVML_INIT_ERROR{node="<node>"}`; the exporter's JSON logs ("nvml init failed" with the
              error); `curl -s http://<node>:9445/readyz` answers 503 with the reason.
            - On the node: `nvidia-smi` (the same error if the driver is at fault), `lsmod | grep nvidia`,
              `cat /proc/driver/nvidia/version`, `dmesg -T | grep NVRM`.
            - If `nvidia-smi` works on the host but the exporter fails, the exporter's container lacks the driver
              libraries or devices (NVIDIA container runtime, device access)."""],
        action="""
            - `LIB_RM_VERSION_MISMATCH`: drain the node and reboot it (or reload the kernel modules once no process
              uses them).
            - `DRIVER_NOT_LOADED`: check that the module is built for the running kernel (DKMS) and load it, or
              reboot; drain the node meanwhile.
            - `LIBRARY_NOT_FOUND` / `NO_PERMISSION`: fix the exporter's deployment (NVIDIA runtime, mounts, device
              permissions) and restart it.
            - `initializing`: `nvidia-smi` on the node hangs as well when the driver or a GPU is wedged; drain the
              node and reset the GPU (`nvidia-smi -r`) or reboot it.
            - `UNKNOWN` on every call and re-initialisation (the container's view of the driver went stale, for
              example after a driver reload): the exporter's `/healthz` fails after `--nvml-down-timeout`
              (5 min) so that Kubernetes restarts it; if it keeps failing after restarts, reboot the node.

            Escalate to the platform team if the driver fails on several nodes, for example after a rollout."""),
    "GpuExporterDown": _rb(
        meaning=["""
            Prometheus has failed to scrape the gpuobs exporter on this node (`up{job="gpuobs"} == 0`) for
            $thresholds.for_short. The process is down or crash-looping, the port is unreachable, TLS or basic auth
            does not
            match Prometheus's scrape settings, or the node itself is down.""", _FLAPPING, """
            A flapping target usually means scrapes time out now and then (a slow `/metrics`: many GPUs, MIG, the
            `processes` family, or an overloaded node) or the exporter restarts in a loop. A target that left
            service discovery has no `up` at all: that is `GpuExporterGone`."""],
        impact="""
            No GPU metrics from the node, and all its GPU and node alerts are inhibited, so a hardware failure
            there goes unnoticed. Dashboards show gaps.""",
        diagnosis=["""
            - The Prometheus targets page shows the scrape error for the instance.
            - `curl -s http://<node>:9445/healthz` (the process runs) and `/metrics`; add the CA and credentials
              if a `--web-config` is in use.
            - Kubernetes: `kubectl get pods -A -o wide --field-selector spec.nodeName=<node> | grep gpuobs`, then
              `kubectl logs --previous` on the exporter pod. Otherwise the service's journal.
            - The exporter stops with a one-line error when its port is in use or its web-config does not
              load.""", """
            ```promql
            up{job="gpuobs", node="<node>"}
            avg_over_time(up{job="gpuobs", node="<node>"}[1h])     # share of scrapes that worked
            scrape_duration_seconds{job="gpuobs", node="<node>"}    # near the scrape timeout?
            up{node="<node>"}       # other targets on the node: is the node itself down?
            ```"""],
        action="""
            Restart the exporter; fix its configuration (port, web-config, credentials) if that is what fails. If
            the node is down, handle it as a node outage. Escalate if the exporter crash-loops with a stack trace,
            with its logs attached."""),
    "GpuExporterGone": _rb(
        meaning="""
            A node's exporter was scraped in the last $thresholds.long_window but is no longer a target at all (no
            `up` series for
            its node, nor for its instance when targets carry no node label), while exporters of other nodes
            still are, for $thresholds.for_short. Service discovery no longer lists it: its DaemonSet pod is gone
            or not
            scheduled (node taint or label change, eviction), its Service endpoint is gone, or the node left the
            cluster. A pod that restarts comes back as a target of the same node within a minute or two and does
            not fire. If every target goes, `GpuExporterAbsent` fires instead.""",
        impact="""
            The node's GPUs are not monitored and none of their alerts can fire, while nothing else says so:
            `GpuExporterDown` needs a target that fails.""",
        diagnosis=["""
            - `kubectl get pods -A -o wide --field-selector spec.nodeName=<node> | grep gpuobs`;
              `kubectl describe daemonset gpuobs-exporter` (desired against scheduled, node selector
              `nvidia.com/gpu.present`, tolerations); `kubectl get node <node> --show-labels`.
            - The Prometheus service-discovery page: is the node's target dropped by relabelling?""", """
            ```promql
            max by (node, instance) (last_over_time(up{job="gpuobs"}[1h])) unless on (node) up{job="gpuobs"}
            kube_daemonset_status_desired_number_scheduled{daemonset="gpuobs-exporter"}
            ```"""],
        action="""
            Bring the exporter back on the node: restore its label or toleration, delete a stuck pod, or fix the
            Service. If the node was removed on purpose (decommissioned, scaled down), nothing is to be done: the
            alert resolves $thresholds.long_window after the node's last scrape; silence it for that time in
            Alertmanager
            (matchers `alertname="GpuExporterGone"`, `node="<node>"`)."""),
    "GpuExporterPodsUnavailable": _rb(
        meaning="""
            kube-state-metrics reports fewer available pods of the exporter DaemonSet (`gpuobs-exporter`,
            `exporter_daemonset` in `Thresholds`) than it should run
            (`kube_daemonset_status_desired_number_scheduled - kube_daemonset_status_number_available`), for
            $thresholds.for_medium, with no rollout progressing (`kube_daemonset_status_updated_number_scheduled`
            unchanged for $thresholds.rate_window). Pods are crash-looping, not ready, pending (image pull,
            resources), or a rollout is stuck.
            A rolling update that keeps moving does not fire.""",
        impact="""
            The GPUs of the nodes without a running exporter are not monitored. Such a node may still be a
            failing target (`GpuExporterDown`) or none at all (`GpuExporterGone`); this alert also covers a
            Prometheus that never had it as a target.""",
        diagnosis=["""
            - `kubectl -n <namespace> get pods -l app.kubernetes.io/name=gpuobs-exporter -o wide | grep -v Running`
            - `kubectl -n <namespace> describe pod <pod>` (events: image pull, scheduling, probes) and
              `kubectl -n <namespace> logs <pod> --previous`.
            - `kubectl -n <namespace> rollout status daemonset/gpuobs-exporter`.""", """
            ```promql
            kube_daemonset_status_desired_number_scheduled{daemonset="gpuobs-exporter"}
              - kube_daemonset_status_number_available{daemonset="gpuobs-exporter"}
            kube_daemonset_status_updated_number_scheduled{daemonset="gpuobs-exporter"}
            ```"""],
        action="""
            Fix what keeps the pods from running (image, resources, node pressure, the NVIDIA runtime on new
            nodes); roll back a stuck rollout with `kubectl -n <namespace> rollout undo daemonset/gpuobs-exporter`.
            Needs kube-state-metrics scraped by the same Prometheus; without it the alert never fires."""),
    "GpuExporterAbsent": _rb(
        meaning="""
            Prometheus has no target at all for the exporter's job (`absent(up{job="gpuobs"})`) for
            $thresholds.for_short. The
            scrape configuration, service discovery (ServiceMonitor, PodMonitor, labels) or the exporter
            DaemonSet is gone or renamed, or the job name no longer matches `exporter_job` in `Thresholds`.""",
        impact="""
            No GPU in the cluster is monitored and no GPU alert can fire, except this one and `Watchdog`.""",
        diagnosis=["""
            - `count by (job) (up)`: is the exporter scraped under another job name?
            - The Prometheus targets and service-discovery pages; recent changes to the scrape configuration.
            - `kubectl get daemonsets -A | grep gpuobs` and the ServiceMonitor or PodMonitor that selects it."""],
        action="""
            Restore the scrape configuration or the exporter deployment. If the job was renamed on purpose, set
            `exporter_job` in `Thresholds` in `gpuobs/alerts/rules.py`, run `gpuobs generate`, and deploy the
            new rules."""),
    "GpuMetricsStale": _rb(
        meaning=["""
            `$SNAPSHOT_STALE` is 1: the exporter's last complete sampling pass is older than two
            intervals, because an NVML call hangs. The exporter then withholds the GPU series rather than serve
            old values, and `/readyz` answers 503. A hanging NVML usually means the driver or a GPU is in a bad
            state (often together with XID 79 or the GSP errors 119/120).""", _FLAPPING],
        impact="""
            No fresh GPU data from the node, so its GPU alerts cannot fire. Whatever makes NVML hang often makes
            `nvidia-smi` and CUDA jobs on the node hang too.""",
        diagnosis=["""
            - `timeout 60 nvidia-smi` on the node: if it hangs too, the driver is stuck.
            - `dmesg -T | grep -i -E "xid|NVRM|hung task"`.
            - The exporter's logs; `py-spy dump --pid <pid>` of the exporter shows which NVML call hangs.
            - `curl -s http://<node>:9445/readyz`.""", """
            ```promql
            time() - $LAST_SUCCESS{node="<node>"}
            $COLLECTION_DURATION{node="<node>"}
            sum by (call, code) (rate($NVML_ERRORS{node="<node>"}[5m]))
            increase($NVML_REINITS{node="<node>"}[1h])
            ```"""],
        action=["""
            If `nvidia-smi` hangs as well, drain the node and reboot it; a GPU reset is rarely possible with a hung
            driver.""", _drain("NVML hangs"), """
            If only the exporter is stuck, restart it and report the hanging call. If passes are merely slow (many
            GPUs, MIG, the `processes` family), raise `--interval` or turn off the costly families."""]),
    "GpuExporterCollectorFailing": _rb(
        meaning=["""
            `$COLLECTOR_SUCCESS` is 0 for one collector (the `collector` label: a metric family
            such as `power` or `nvlink`, or `sampler`): it raised an exception in the last pass, on at least one
            GPU, for $thresholds.for_medium. The exporter logs each exception (rate-limited) and counts it in
            `$COLLECTOR_ERRORS`, and serves what the other collectors read.""", _FLAPPING],
        impact="""
            That family's series are missing or partial on the node, so the alerts that read them cannot fire
            (for a failing `clock_events` collector, no throttling alert). Dashboards show gaps for it.""",
        diagnosis=["""
            - The exporter's JSON logs: the collector's exception and traceback.
            - Did it start with a driver upgrade, a new GPU model, MIG being turned on? Compare with a node of the
              same type where it works.""", """
            ```promql
            $COLLECTOR_SUCCESS{node="<node>"} == 0
            increase($COLLECTOR_ERRORS{node="<node>"}[1h])
            $NVML_UNAVAILABLE{node="<node>"}
            ```"""],
        action="""
            Turn the family off on that node type if it cannot work there (`--families`), and report the exception
            with the driver version and GPU model (`$NVML_INFO`, `$GPU_INFO`). If every collector
            fails, treat it as `NvmlDown` or `GpuMetricsStale`."""),
    "GpuXidWatcherDown": _rb(
        meaning=["""
            `$XID_WATCHER_UP` is 0: the exporter's XID event thread is not waiting on its NVML
            event set (it could not create it or register any GPU, its wait fails, or the thread died and waits
            to be restarted) for $thresholds.for_short. `$XID_WATCHER_ERRORS` counts why, by NVML
            code.""", _FLAPPING],
        impact="""
            XIDs on this node may be missed: the XID alerts cannot fire for them and the XID history has holes.
            The other GPU metrics are not affected.""",
        diagnosis=["""
            - The exporter's logs ("xid" lines) for the failing call and its code.
            - `dmesg -T | grep -i xid` on the node: the kernel log still has every XID.""", """
            ```promql
            $XID_WATCHER_UP{node="<node>"}
            increase($XID_WATCHER_ERRORS{node="<node>"}[1h])
            $NVML_UP{node="<node>"}
            ```"""],
        action="""
            Check the kernel log for XIDs the exporter missed and act on them as the XID runbooks say. Restart the
            exporter; `NOT_SUPPORTED` codes mean the GPU or driver gives no XID events to the exporter (some
            virtualised GPUs): then watch the kernel log another way. Report a thread that keeps dying, with its
            logs."""),
    "TelemetryLogRecordsDropped": _rb(
        meaning="""
            A process (the exporter, or a training or inference process using `gpuobs.logs`) dropped log records
            in every window of $thresholds.for_medium for $thresholds.for_long (`$LOGS_DROPPED`): its Fluentd
            forwarder is down, unreachable or too slow, so its queue fills and new records are dropped rather
            than block the process. One short burst (a Fluentd restart) does not fire.""",
        impact="""
            Logs are lost for the time: incident timelines and the traces they belong to miss those records.
            The process itself is not slowed down.""",
        diagnosis=["""
            - The Fluentd or Fluent Bit forwarder on the node: running, reachable on its port, its buffer full,
              its output failing?
            - The process's own logs on stderr mention when it starts and stops dropping.""", """
            ```promql
            increase($LOGS_DROPPED[15m]) > 0
            sum by (node) (rate($LOGS_DROPPED[5m]))   # one node, or everywhere?
            ```"""],
        action="""
            Restore the forwarder (restart it, fix its output or buffer). If it is healthy but cannot keep up,
            raise its capacity or lower the processes' log level. Nothing is needed on the processes."""),
    # ------------------------------------------------------------------------------ training
    "TrainingStalled": _rb(
        meaning="""
            A rank of a training job has not finished an optimizer step for $thresholds.training_stall
            (`time() - $LAST_STEP`). Common causes: a collective waiting on a peer that
            crashed or hung, a GPU fault on one rank, a stuck data loader, a checkpoint stuck on storage, or a long
            phase without steps (evaluation, a big checkpoint).""",
        impact="""
            The job makes no progress while holding all its GPUs, until a collective timeout kills it or someone
            notices. If a rank's process has exited, its series stop being exported and this alert resolves:
            `TrainingRankLost` (the job's other ranks still report) or `TrainingTargetDown` (the target is still
            scraped but does not answer) fire instead.""",
        diagnosis=["""
            - Which ranks stalled, and which stopped first? A single rank that stopped before the others is the
              likely culprit.
            - GPU utilization of the job's GPUs: 100 % while spinning in an NCCL kernel, 0 % when waiting on the
              host, data or storage.
            - Hardware alerts on the job's nodes: `GpuLost`, XIDs, `GpuNvlinkDown`.
            - Stacks: `py-spy dump --pid <pid>` on a rank; NCCL logs with `NCCL_DEBUG=INFO`.
            - Scheduler: `squeue -j <jobid>`, `kubectl get pods -o wide` for the job's pods and their logs.""",
            """
            ```promql
            time() - $LAST_STEP{job_id="<job>"}
            rate($BADPUT{job_id="<job>"}[5m])
            $DATA_WAIT_RATIO{job_id="<job>"}
            ```"""],
        action="""
            If a hardware alert explains it, drain that node and restart the job from its last checkpoint without
            it. Otherwise capture stacks, kill the job and restart it from its last checkpoint. Make hangs fail
            fast: set a collective timeout (`timeout=` in `torch.distributed.init_process_group`) so a dead peer
            ends the job instead of holding it. For jobs with long steps or long evaluation phases, raise
            `training_stall` in `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "TrainingStepTimeRegression": _rb(
        meaning="""
            The job's median step time (`$JOB_STEP_P50`) has been more than
            $thresholds.step_regression times its own median over the last $thresholds.baseline_window for
            $thresholds.for_medium. The job compares against itself, so
            the alert needs some hours of history to be meaningful. Each rank computes the exact median of its
            recent steps in process (`$STEP_QUANTILE`, a 5-minute window), so a
            sustained 1.3x slowdown fires and a 1.1x change stays quiet; the job's value is the median rank's.""",
        impact="""
            The job trains slower than it did: fewer tokens per second, longer time to result, and more GPU hours
            for the same work.""",
        diagnosis=["""
            ```promql
            $JOB_STEP_P50{job_id="<job>"}
            $RANK_STEP_P50{job_id="<job>"}   # one slow rank? see TrainingStragglerRank
            $DATA_WAIT_RATIO{job_id="<job>"}             # input pipeline?
            $JOB_TOKENS{job_id="<job>"}
            $MFU_RATIO{job_id="<job>"}
            ```""", """
            - Throttling on the job's nodes: `$CLOCK_EVENT_ACTIVE{node="<node>", reason!="gpu_idle"} == 1`,
              and `$CLUSTER_THROTTLED` fleet-wide.
            - NVLink, PCIe or XID alerts on the job's nodes; congestion on the inter-node network.
            - Changes to the job itself: batch size, sequence length, model, code or library versions."""],
        action="""
            Fix the cause that the diagnosis points to: drain a throttling or faulty node and restart the job
            without it, fix the input pipeline, or take up network congestion with the fabric team. If the change
            is intentional (new configuration), silence the alert until the baseline of $thresholds.baseline_window
            has caught up. The
            ratio and baseline are `step_regression` and `baseline_window` in `Thresholds` in
            `gpuobs/alerts/rules.py`."""),
    "TrainingDataLoaderBound": _rb(
        meaning="""
            For $thresholds.for_medium, a rank has spent more than $thresholds.data_wait_share of its wall time
            over the
            last $thresholds.rate_window waiting for
            its next batch (`$DATA_WAIT_RATIO`, the rate of the data-wait badput
            counter: an average over the window, so a few slow batches do not fire it and it resolves once
            training stops). The input pipeline cannot keep up with the GPUs.""",
        impact="""
            The GPUs sit idle for that share of every step: throughput and MFU drop in proportion, and in a
            synchronous job one slow rank's loader slows every rank.""",
        diagnosis=["""
            ```promql
            $DATA_WAIT_RATIO{job_id="<job>"}     # all ranks, or one node's ranks?
            $DATA_WAIT_QUANTILE{job_id="<job>", quantile="0.99"}
            rate($BADPUT{job_id="<job>", cause="data_wait"}[5m])
            ```""", """
            - All ranks: the pipeline or shared storage. One node's ranks: that node's CPU, disk or network.
            - On the node: CPU saturation of the loader worker processes (`top`), disk I/O (`iostat -x 1`),
              container CPU limits and throttling."""],
        action="""
            Raise `num_workers` and `prefetch_factor`, use `persistent_workers=True` and `pin_memory=True`; move
            expensive preprocessing and tokenization offline or onto the GPU; stage the dataset on local NVMe or
            use a streaming, sharded format; give the pod more CPU. Tell the job owner: it is a job configuration
            issue, not a platform fault, unless storage is degraded. The threshold is `data_wait_share` in
            `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "TrainingSlowCheckpoint": _rb(
        meaning="""
            A rank's checkpoint saves averaged more than $thresholds.checkpoint_seconds s over the last
            $thresholds.long_window
            (`$CHECKPOINT_DURATION`). The storage is slow or contended, the checkpoint is
            large, or one rank gathers and writes the whole state alone.""",
        impact="""
            With synchronous checkpoints the GPUs idle for the whole save (badput `checkpoint`), and peers waiting
            in a collective can hit their timeout. Slow checkpoints also push teams to checkpoint less often, so
            more work is lost on each failure.""",
        diagnosis=["""
            ```promql
            rate(${CHECKPOINT_DURATION}_sum{job_id="<job>"}[1h])
              / rate(${CHECKPOINT_DURATION}_count{job_id="<job>"}[1h])
            rate($BADPUT{job_id="<job>", cause="checkpoint"}[1h])
            ```""", """
            - One rank slow (it writes everything) or all ranks (storage)?
            - Storage throughput and latency of the checkpoint target, other jobs writing at the same time, and
              the checkpoint's size."""],
        action="""
            Use asynchronous checkpointing (for example `torch.distributed.checkpoint.async_save`) and sharded
            checkpoints written by every rank; write to local NVMe and upload in the background; move checkpoints
            to a faster storage tier; or checkpoint less often where failures are rare. Escalate to the storage
            team if the target is degraded. The threshold is `checkpoint_seconds` in `Thresholds` in
            `gpuobs/alerts/rules.py`."""),
    "TrainingStragglerRank": _rb(
        meaning="""
            For $thresholds.for_medium, one rank has computed more than $thresholds.straggler times as long per
            step as the mean of its job's
            other ranks (`$STRAGGLER_RATIO`). In a synchronous job all
            ranks' step times are equal, since the fast ranks wait for the slow one inside the gradient
            all-reduce; gpuobs times that wait (`$COLLECTIVE_WAIT`, from a DDP
            communication hook or `run.collective()`) and subtracts it, so the compute time per step names the
            slow rank. Without a timed collective (FSDP, pipeline stages, no `watch_ddp`) the signal is the step
            time less data wait, which stays equal across synchronous ranks: the alert then stays quiet.""",
        impact="""
            A synchronous job runs at the pace of its slowest rank: every other GPU of the job waits each step.""",
        diagnosis=["""
            - Map the rank to its node and GPU: the launcher's logs, `kubectl get pod -o wide`,
              `scontrol show job -d <jobid>`.
            - Then look at that node's GPUs:""", _THROTTLE_QUERIES, """
            ```promql
            $COMPUTE_PER_STEP{job_id="<job>"}
            rate($COLLECTIVE_WAIT{job_id="<job>"}[5m])   # the others wait, it does not
            $DATA_WAIT_RATIO{job_id="<job>", rank="<rank>"}
            $TEMPERATURE{node="<node>"}
            ```""", """
            - PCIe, NVLink or XID alerts on the node; CPU contention or a degraded NIC on it; uneven data shards
              (sequence lengths)."""],
        action="""
            Fix the hardware cause (see the throttling, PCIe and NVLink runbooks), or cordon the node and restart
            the job without it. If the cause is the rank's data (uneven shards), rebalance. The ratio is
            `straggler` in `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "TrainingRankLost": _rb(
        meaning="""
            A rank of a training job stopped reporting (its `$LAST_STEP` series
            went stale) while other ranks of the same job still report, and its target is not merely down (that
            is `TrainingTargetDown`). The rank's process exited or its pod was deleted mid-job: a crash, an OOM
            kill, a preemption, or a node failure.""",
        impact="""
            A synchronous job cannot progress without the rank: the others block in their next collective until
            its timeout kills them, holding every GPU of the job meanwhile. Work since the last checkpoint is lost.""",
        diagnosis=["""
            ```promql
            last_over_time($LAST_STEP{job_id="<job>"}[1h])   # which ranks, and when
            time() - $LAST_STEP{job_id="<job>"}                # are the others stalling?
            ```""", """
            - The rank's exit: `kubectl describe pod <pod>` (OOMKilled, Evicted, exit code), `sacct -j <jobid>`,
              the launcher's log (torchrun prints the failing rank and its exit code), `dmesg` on its node.
            - Hardware alerts on its node at that time: `GpuLost`, XIDs, ECC."""],
        action="""
            If the job is elastic it may recover by itself; otherwise stop it (the other ranks will only time out)
            and restart from the last checkpoint, without the node if hardware is at fault. The alert resolves when
            the rank comes back or $thresholds.long_window after it disappeared."""),
    "TrainingTargetDown": _rb(
        meaning="""
            A training rank that reported in the last $thresholds.long_window is still a scrape target but its
            endpoint does not
            answer (`up == 0` for its instance). The process crashed and the target stayed (a static
            configuration, a restarting pod), or it hangs so hard that its metrics server cannot answer.""",
        impact="""
            The rank makes no progress and its metrics are gone, so `TrainingStalled` cannot see it. A job
            whose every rank crashed shows nothing but this alert: without it, a crashed job looks resolved.""",
        diagnosis=["""
            ```promql
            up{instance="<instance>"}
            last_over_time($LAST_STEP{job_id="<job>"}[1h])
            ```""", """
            - Is the process alive? `kubectl get pod`, `ps` on the node; a live process that does not answer: take
              its stacks with `py-spy dump --pid <pid>`.
            - A job that ended cleanly behind a static target also reads as down: remove finished jobs from the
              scrape configuration, or use service discovery that drops completed pods."""],
        action="""
            Restart the crashed rank or job from its last checkpoint; for a hung process, capture stacks and kill
            it. Remove the target when the job is over."""),
    # ------------------------------------------------------------------------------ inference
    "InferenceLatencyHigh": _rb(
        meaning="""
            The p99 of a model's request durations (`$REQUEST_QUANTILE`, exact
            over each replica's last 5 minutes; the worst replica's) has been above
            $thresholds.inference_p99_seconds s for
            $thresholds.for_short. For
            generative models the end-to-end time grows with the number of output tokens, so look at time to first
            token too.""",
        impact="""
            Users wait longer; clients may time out and retry, which adds load.""",
        diagnosis=["""
            ```promql
            $MODEL_REQUEST_P99{gen_ai_request_model="<model>"}
            histogram_quantile(0.99, sum by (le) (rate(${TIME_TO_FIRST_TOKEN}_bucket{gen_ai_request_model="<model>"}[5m])))
            $MODEL_REQUESTS{gen_ai_request_model="<model>"}
            sum by (gen_ai_token_type) (rate($INFERENCE_TOKENS{gen_ai_request_model="<model>"}[5m]))
            $REQUEST_QUANTILE{gen_ai_request_model="<model>", quantile="0.99"}   # per replica
            ```""", """
            - High time to first token: queueing or prefill (overload, too large batches). Normal first token but
              long requests: long outputs or slow decoding.
            - One slow replica (by `job_id`/`rank`): check its GPUs for throttling and XIDs."""],
        action="""
            Scale out replicas or shed load; cap maximum output tokens, batch size or concurrency; take a slow
            replica out of rotation and drain its node if the hardware is at fault. The threshold is one value for
            all models (`inference_p99_seconds` in `Thresholds` in `gpuobs/alerts/rules.py`); set it from the
            service's SLO."""),
    "InferenceErrorRate": _rb(
        meaning="""
            More than $thresholds.inference_error_ratio of a model's requests have failed over
            $thresholds.rate_window (`$INFERENCE_ERRORS` against
            the request rate). `error_type` carries the GenAI `error.type` (exception type or status).""",
        impact="""
            Users get errors. A bad rollout, GPU out-of-memory on large inputs, a failing replica or a GPU fault
            can be behind it.""",
        diagnosis=["""
            ```promql
            sum by (error_type) (rate($INFERENCE_ERRORS{gen_ai_request_model="<model>"}[5m]))
            sum by (job_id, rank) (rate($INFERENCE_ERRORS{gen_ai_request_model="<model>"}[5m]))
            $MODEL_REQUESTS{gen_ai_request_model="<model>"}
            ```""", """
            - One replica or all? All points at a rollout or a dependency; one at that replica's process or GPU.
            - The server's structured logs: they carry `trace_id`, which leads to the failing `chat <model>` spans.
            - XIDs (13, 31, 94) and `GpuLost` on the serving nodes; the time of the last deployment."""],
        action="""
            Roll back a bad deploy; restart or replace a failing replica and drain its node if the GPU is at
            fault; for out-of-memory errors reduce maximum batch size or context length. Escalate to the model's
            owners. If client-side errors (invalid requests) dominate, that is not a serving fault: consider
            excluding them. The threshold is `inference_error_ratio` in `Thresholds` in
            `gpuobs/alerts/rules.py`."""),
    # ------------------------------------------------------------------------------ log patterns
    "TrainingCollectiveTimeout": _rb(
        meaning="""
            A training process of the job logged a collective timeout in the last $thresholds.rate_window
            (`$LOG_PATTERN_MATCHES{pattern="collective_timeout"}`, counted by `gpuobs.logs` from PyTorch's
            ProcessGroupNCCL watchdog: "Watchdog caught collective operation timeout: WorkNCCL(... OpType=...)
            ran for ... milliseconds before timing out"). A collective waited for a peer longer than the process
            group's timeout: one rank crashed, hung, or lost its network or GPU. The watchdog then aborts the
            communicator and the process, so the job is failing. The count is summed over each rank's targets and
            restarts, per rank (and node: the alert names the rank that logged it); a counter that appears at 0 or
            a restarted trainer does not fire.""",
        impact="""
            The job stops: every rank of a synchronous job fails or waits, holding its GPUs, and the work since
            the last checkpoint is lost. It pages the job's owner (Alertmanager receiver `job-owner`).""",
        diagnosis=["""
            - Which rank timed out first, and which rank did it wait for? The first timeout line of each rank
              names the operation (`OpType`) and its sequence number; the rank with the lowest `SeqNum` or the
              one that logged nothing is the one the others waited for.
            - Hardware on that rank's node at the time: XIDs, `GpuLost`, NVLink or ECC alerts,
              `GpuXidFromLogs`.
            - The job's NCCL and network logs (`NCCL_DEBUG=INFO`), and whether the rank's process was killed
              (OOM killer, preemption).""", """
            ```promql
            sum by (rank, node) (increase($LOG_PATTERN_MATCHES{job_id="<job>", pattern="collective_timeout"}[1h]))
            sum by (pattern) (increase($LOG_PATTERN_MATCHES{job_id="<job>"}[1h]))   # what else it logged
            time() - $LAST_STEP{job_id="<job>"}
            ```"""],
        action="""
            Restart the job from its last checkpoint, without the node of the rank that stopped if hardware is at
            fault (drain that node and follow its hardware runbook). If no rank is at fault, look for a
            network problem between the ranks' nodes before restarting. The alert resolves
            $thresholds.keep_firing after the job stops logging timeouts."""),
    "TrainingCudaOOM": _rb(
        meaning="""
            The job's processes logged CUDA out-of-memory errors (`torch.OutOfMemoryError`, "CUDA error: out of
            memory", `cudaErrorMemoryAllocation`; `$LOG_PATTERN_MATCHES{pattern="cuda_oom"}`) again and again:
            at least $thresholds.oom_repeats_job in the whole job, or $thresholds.oom_repeats_rank on one
            rank (across its restarts), within $thresholds.for_long. One OOM that the job's retry logic handles
            (a smaller batch, a skipped sample) does not fire: this is a job that does not recover.""",
        impact="""
            The job crash-loops or makes no progress while holding its GPUs; each restart costs its startup time
            and the work since the last checkpoint.""",
        diagnosis=["""
            - The OOM lines say how much was requested and on which GPU ("Tried to allocate ... GPU <n>"):
              one rank (uneven data, a longer sequence) or all of them (the batch or model does not fit)?
            - Another process on the same GPU (`nvidia-smi` on the node), or memory left by a previous
              attempt?""", """
            ```promql
            sum by (rank) (increase($LOG_PATTERN_MATCHES{job_id="<job>", pattern="cuda_oom"}[1h]))
            $MEMORY_USED{node="<node>"} / $MEMORY_TOTAL{node="<node>"}
            ```"""],
        action="""
            The job owner's to fix: lower the batch or micro-batch size, enable activation checkpointing or
            sharding, cap the sequence length, or set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
            against fragmentation. Kill processes that hold the GPU from an earlier attempt. Tunables:
            `oom_repeats_job`, `oom_repeats_rank` and `for_long` in `Thresholds` in `gpuobs/alerts/rules.py`."""),
    "TrainingCudaIllegalAddress": _rb(
        meaning="""
            A process of the job logged a CUDA illegal memory access ("an illegal memory access was
            encountered", `cudaErrorIllegalAddress`; `$LOG_PATTERN_MATCHES{pattern="cuda_illegal_address"}`)
            in the last $thresholds.rate_window. The CUDA context is corrupted: the process cannot continue.
            Usually a kernel bug (a custom or fused kernel, an out-of-range index); when it follows ECC errors
            or an XID on the same GPU, bad memory.""",
        impact="""
            The rank dies and the job with it (the other ranks time out in their collectives). A restart on the
            same code and data fails again if it is a bug.""",
        diagnosis=["""
            - XIDs on the rank's GPU at the same time (XID 13 or 31 for an application fault, 48/94/95 for
              ECC) and `GpuEccUncorrectable` or `GpuEccErrorFromLogs`: hardware or software?
            - Rerun the failing step with `CUDA_LAUNCH_BLOCKING=1` or `compute-sanitizer` to find the kernel.""",
            """
            ```promql
            sum by (rank, node) (increase($LOG_PATTERN_MATCHES{job_id="<job>", pattern="cuda_illegal_address"}[1h]))
            increase($XID_ERRORS{node="<node>"}[1h])
            increase($ECC_ERRORS{node="<node>", error_type="uncorrected"}[1h])
            ```"""],
        action="""
            With ECC errors or XIDs on the GPU: drain the node (see those runbooks) and restart the job without
            it. Without: a software fault for the job's owner; restart from the last checkpoint after the fix,
            or pin the last working version of the kernels or framework."""),
    "TrainingNcclError": _rb(
        meaning="""
            The job's processes have logged NCCL warnings or errors ("NCCL WARN", `ncclInternalError`,
            `ncclSystemError`, an aborted communicator; `$LOG_PATTERN_MATCHES{pattern="nccl_error"}`) in every
            $thresholds.rate_window for $thresholds.for_medium. NCCL logs a WARN line now and then for things
            it works around (a missing plugin, a network device it skips at start-up): one line, or a burst at
            start-up, does not fire. Errors that keep coming do.""",
        impact="""
            Collectives retry, fall back to slower transports or fail: the job slows down and may end in a
            collective timeout (`TrainingCollectiveTimeout`, which silences this warning for the rank).""",
        diagnosis=["""
            - The lines themselves: NET/IB (InfiniBand or RoCE), a socket error, a CUDA error inside NCCL,
              `ncclRemoteError` (a peer failed). `NCCL_DEBUG=WARN` or `INFO` says which transport.
            - Is it one node's ranks (its NIC, its GPUs) or all of them (the fabric, a version mismatch)?""", """
            ```promql
            sum by (rank, node) (increase($LOG_PATTERN_MATCHES{job_id="<job>", pattern="nccl_error"}[1h]))
            $STRAGGLER_RATIO{job_id="<job>"}
            ```"""],
        action="""
            Fix the transport the lines name: the node's NIC or cable for one node, the fabric or the NCCL and
            driver versions for all. Restart the job without a faulty node if the job slows down. Ticket, not
            page."""),
    "GpuXidFromLogs": _rb(
        meaning="""
            The kernel log of the node counted XIDs of this code on this GPU in the last $thresholds.long_window
            (`$KERNEL_XID_ERRORS`, the driver's own "NVRM: Xid" lines, read by the exporter's kernel-log
            watcher) that the exporter's NVML event path did not report (`$XID_ERRORS`): more of them than NVML
            counted, or a code NVML did not report at all. So the XID alerts (`GpuXidRebootRequired` and the
            others) did not fire for them. Typically the exporter was down or restarting when they happened
            (the kernel-log counter counts since boot, so it catches up when the exporter comes back), the XID
            event thread was down (`GpuXidWatcherDown`), or the GPU fell off the bus before NVML could report it
            (then `gpu` and `uuid` are empty and `pci_bus_id` names the device). An exporter restart by itself,
            and XIDs that both sources saw, do not fire.""",
        impact="""
            The XID's own impact (see the XID runbooks: an application error, a GPU reset or a node reboot
            needed) without the alert that should have said so.""",
        diagnosis=["""
            - `dmesg -T | grep -i xid` (or `journalctl -k | grep -i xid`) on the node: the lines, their time and
              PCI address.
            - Was the exporter or its XID thread down at that time?""", """
            ```promql
            increase($KERNEL_XID_ERRORS{node="<node>"}[1h])
            increase($XID_ERRORS{node="<node>"}[1h])
            $XID_WATCHER_UP{node="<node>"}
            $KERNEL_LOG_UP{node="<node>"}
            up{job="gpuobs", node="<node>"}
            ```"""],
        action="""
            Act on the XID as its runbook says (`GpuXidRebootRequired` for 79, `GpuXidResetRequired` for
            48/62/63/64/95/119/120, `GpuXidApplicationError` for 13/31/43/45/94, `GpuXidNvlinkError` for 74),
            then find out why the exporter missed it: restart a dead XID thread, look at why the exporter was
            down."""),
    "GpuEccErrorFromLogs": _rb(
        meaning="""
            The logs report an uncorrectable ECC error or a row-remapping failure or pending remap
            (`$KERNEL_LOG_MATCHES{pattern="ecc_error"}` from the kernel log, per GPU; or, where the kernel log
            counted none on the node, `$LOG_PATTERN_MATCHES{pattern="ecc_error"}` from a training process,
            e.g. `cudaErrorECCUncorrectable`, per job) in the last $thresholds.rate_window. The same fault
            usually shows in NVML's counters too (`GpuEccUncorrectable`, `GpuRowRemapPending`,
            `GpuRowRemapFailure`); the log sees it when NVML's counters cannot be read or the driver reports
            it only in text.""",
        impact="""
            The process that read the bad memory died; the row is not yet repaired, and further errors can crash
            the jobs placed on the GPU.""",
        diagnosis=["""
            - `dmesg -T | grep -i -E "ecc|remap|xid"` on the node; `nvidia-smi -q -d ECC,ROW_REMAPPER -i <index>`.
            - For a training-side match (a `job_id`, no GPU): the rank's node and GPU from the job's logs.""", """
            ```promql
            increase($KERNEL_LOG_MATCHES{node="<node>", pattern="ecc_error"}[1h])
            increase($ECC_ERRORS{node="<node>", error_type="uncorrected"}[1h])
            $REMAP_PENDING{node="<node>"}
            $REMAP_FAILURE{node="<node>"}
            ```"""],
        action=["""
            Drain the node so no new work lands on the GPU:""", _drain("ECC error in the logs of GPU <index>"),
            _RESET, """
            As for `GpuEccUncorrectable`: after the reset `$REMAP_PENDING` and `$REMAP_FAILURE` must be 0;
            if errors recur or the remap failed, keep the GPU out and RMA it.""", _UNDRAIN]),
    "GpuNvlinkErrorFromLogs": _rb(
        meaning="""
            The logs report NVLink, NVSwitch or fabric manager errors (`$KERNEL_LOG_MATCHES{pattern="nvlink_error"}`
            from the kernel log, per GPU; or, where the kernel log counted none on the node,
            `$LOG_PATTERN_MATCHES{pattern="nvlink_error"}` from a training process, per job) in the last
            $thresholds.rate_window: link errors, a fabric manager that failed or is not running, or CUDA
            failing with "system not yet initialized" on an NVSwitch system.""",
        impact="""
            The GPU may have lost peer bandwidth (NCCL slows down or falls back to PCIe) or cannot start CUDA
            work at all until the fabric is set up.""",
        diagnosis=["""
            - `dmesg -T | grep -i -E "nvlink|nvswitch|xid"`; `nvidia-smi nvlink -s -i <index>`.
            - On NVSwitch systems: `systemctl status nvidia-fabricmanager`, `journalctl -u nvidia-fabricmanager`.""",
            """
            ```promql
            increase($KERNEL_LOG_MATCHES{node="<node>", pattern="nvlink_error"}[1h])
            $NVLINKS_DOWN{node="<node>"} > 0
            rate($NVLINKS_ERRORS{node="<node>"}[1h])
            ```"""],
        action="""
            Restart a failed fabric manager; if links stay down or errors keep coming, drain the node, reset
            its GPUs (all of them on NVSwitch systems) or reboot it, and open a vendor case if they persist
            (see `GpuNvlinkDown`). Ticket, not page."""),
    "GpuKernelLogWatcherDown": _rb(
        meaning=["""
            `$KERNEL_LOG_UP` is 0 for $thresholds.for_medium: the exporter's kernel-log watcher cannot read its
            source (the `source` label: /dev/kmsg, a kernel-log file, or `journalctl -k`): it is missing, not
            permitted (the container lacks the capability or the mount), or failed. With the kernel_log family
            off the series is absent and nothing fires.""", _FLAPPING],
        impact="""
            XIDs that NVML misses (`GpuXidFromLogs`) and the driver's ECC and NVLink messages
            (`GpuEccErrorFromLogs`, `GpuNvlinkErrorFromLogs`) on this node go unseen. The NVML-based alerts
            still work.""",
        diagnosis=["""
            - The exporter's logs for the watcher's error; `ls -l /dev/kmsg` and the container's capabilities
              (reading /dev/kmsg needs `CAP_SYSLOG` or `kernel.dmesg_restrict=0`).""", """
            ```promql
            $KERNEL_LOG_UP{node="<node>"}
            increase($KERNEL_LOG_LOST{node="<node>"}[1h])
            ```"""],
        action="""
            Give the exporter access to the kernel log (device mount, capability, or a journal it may read), or
            turn the kernel_log family off on nodes where it cannot work. Ticket, not page."""),
    # ------------------------------------------------------------------------------ degradation trends
    "GpuEccCorrectedRising": _rb(
        meaning="""
            The GPU's corrected (single-bit) ECC errors come faster: the median of their rate
            (`$GPU_ECC_CORRECTED_RATE`, per second over the last $thresholds.trend_step) over the last
            $thresholds.trend_window is over $thresholds.trend_factor times its median over the
            $thresholds.trend_baseline that ended $thresholds.trend_baseline ago, and over
            $thresholds.ecc_corrected_trend_per_h an hour. Medians, so that one burst of
            errors is no trend. It fires well below `GpuEccCorrectedRate`'s level: the rate's growth, not its
            size, is the sign of memory cells wearing out.""",
        impact=_DEGRADING_IMPACT,
        diagnosis=["""
            - `nvidia-smi -q -d ECC,ROW_REMAPPER -i <index>`: volatile and aggregate counts, pending remaps, banks
              left with spare rows.
            - Is the memory running hot (`$MEMORY_TEMPERATURE`)? Heat raises corrected errors without wear.""", """
            ```promql
            $GPU_ECC_CORRECTED_RATE{uuid="<uuid>"}
            $GPU_REMAP_BANKS_LOW{uuid="<uuid>"}
            $MEMORY_TEMPERATURE{uuid="<uuid>"}
            ```"""],
        action=_degrading_action("`trend_step`, `trend_window`, `trend_baseline`, `trend_factor` and "
                                 "`ecc_corrected_trend_per_s`")),
    "GpuRowRemapBanksDepleting": _rb(
        meaning="""
            More of the GPU's memory banks have few or no spare rows left (`$REMAP_BANKS` with availability
            `low` or `none`, summed in `$GPU_REMAP_BANKS_LOW`) than at any time in the last
            $thresholds.trend_baseline: at
            least $thresholds.remap_banks_rise banks moved there. Each remapped row uses a spare row of its bank; a
            bank with none cannot remap
            another failing row, and the next one in it ends in `GpuRowRemapFailure`.""",
        impact=_DEGRADING_IMPACT,
        diagnosis=["""
            - `nvidia-smi -q -d ROW_REMAPPER -i <index>`: the bank histogram, remapped rows, pending remaps.""", """
            ```promql
            $REMAP_BANKS{uuid="<uuid>"}
            $GPU_REMAP_BANKS_LOW{uuid="<uuid>"}
            increase($REMAPPED_ROWS{uuid="<uuid>"}[1d])
            ```"""],
        action=_degrading_action("`trend_baseline` and `remap_banks_rise`")),
    "GpuNvlinkErrorsRising": _rb(
        meaning="""
            The GPU's NVLink CRC or replay errors, summed over its links (`$GPU_NVLINK_ERRORS_RATE`, per second
            over the last $thresholds.trend_step), have a median over the last $thresholds.trend_window over
            $thresholds.trend_factor times their median over the $thresholds.trend_baseline that ended
            $thresholds.trend_baseline ago, and over $thresholds.nvlink_errors_trend_per_s a second. A sustained
            climb, not one burst: a link's
            signal margin shrinking (connector, NVSwitch, baseboard, heat) before `GpuNvlinkErrorRate` or a
            link down.""",
        impact=_DEGRADING_IMPACT,
        diagnosis=["""
            - `nvidia-smi nvlink -e -i <index>` for the per-link counters: one link or all of them? One link
              points at that link's path (and the peer GPU or NVSwitch port), all of them at the GPU or its
              baseboard.""", """
            ```promql
            $GPU_NVLINK_ERRORS_RATE{uuid="<uuid>"}
            rate($NVLINKS_ERRORS{uuid="<uuid>"}[1h])
            sum by (link, error_type) (rate($NVLINK_ERRORS{uuid="<uuid>"}[1h]))  # with --detail nvlink
            ```"""],
        action=_degrading_action("`trend_step`, `trend_window`, `trend_baseline`, `trend_factor` and "
                                 "`nvlink_errors_trend_per_s`")),
    "GpuPcieReplaysRising": _rb(
        meaning="""
            The GPU's PCIe replays (`$GPU_PCIE_REPLAYS_RATE`, per second over the last $thresholds.trend_step) have a
            median over the last $thresholds.trend_window over $thresholds.trend_factor times their median over the
            $thresholds.trend_baseline that ended $thresholds.trend_baseline ago, and over
            $thresholds.pcie_replays_trend_per_s a second: the link retransmits more and more, well below
            `GpuPcieReplayRate`'s level. Seating,
            riser, retimer, cable or slot losing margin.""",
        impact=_DEGRADING_IMPACT,
        diagnosis=["""
            - `nvidia-smi -q -i <index> | grep -i -A1 replay`, the link generation and width.
            - `dmesg -T | grep -i aer` for corrected PCIe errors on the GPU's address or its upstream switch.""", """
            ```promql
            $GPU_PCIE_REPLAYS_RATE{uuid="<uuid>"}
            $PCIE_GENERATION{uuid="<uuid>"}
            $PCIE_WIDTH{uuid="<uuid>"}
            ```"""],
        action=_degrading_action("`trend_step`, `trend_window`, `trend_baseline`, `trend_factor` and "
                                 "`pcie_replays_trend_per_s`")),
    "GpuTemperatureTrendingToSlowdown": _rb(
        meaning="""
            At its pace over the last $thresholds.temp_trend_window, and over the last $thresholds.for_medium too,
            `$TEMPERATURE` reaches the GPU's own `$SLOWDOWN_TEMPERATURE` within $thresholds.temp_trend_horizon
            (`predict_linear`), while it is not yet within $thresholds.temp_margin_c °C of it
            (`GpuTemperatureNearSlowdown` takes over there). The pace over $thresholds.for_medium keeps a job's
            start (a
            step up, then flat) out. A GPU that keeps heating at the same load: a failing fan, a clogged heat
            sink, dried thermal interface, or the node's airflow or coolant.""",
        impact=_DEGRADING_IMPACT,
        diagnosis=["""
            - Did the load change (`$POWER_USAGE`, `$UTILIZATION`)? Heat with the same power points at cooling.
            - Do the other GPUs of the node heat up too (the node's cooling) or only this one (the GPU's)?""", """
            ```promql
            $TEMPERATURE{uuid="<uuid>"}
            $SLOWDOWN_TEMPERATURE{uuid="<uuid>"}
            $POWER_USAGE{uuid="<uuid>"}
            $NODE_MAX_TEMPERATURE{node="<node>"}
            ```"""],
        action=_degrading_action("`temp_trend_window`, `temp_trend_horizon` and `temp_margin_c`")),
    "GpuPowerBrakeRepeated": _rb(
        meaning="""
            `$CLOCK_EVENT_ACTIVE{reason="hw_power_brake_slowdown"}` changed at least
            $thresholds.power_brake_changes times in the last
            $thresholds.power_brake_window: the GPU entered the HW power brake $thresholds.power_brake_episodes
            times or more. The brake is an external signal (the node's power
            supply or baseboard asking the GPUs to slow down); once is an event (`GpuHwPowerBrake`), again and
            again is a supply or a board wearing out.""",
        impact=_DEGRADING_IMPACT,
        diagnosis=["""
            - Only this GPU, or every GPU of the node (then the node's power supplies, see the BMC's event log:
              `ipmitool sel list`)?""", """
            ```promql
            changes($CLOCK_EVENT_ACTIVE{node="<node>", reason="hw_power_brake_slowdown"}[6h])
            $POWER_USAGE{node="<node>"}
            ```"""],
        action=_degrading_action("`power_brake_episodes` and `power_brake_window`")),
    # ------------------------------------------------------------------------------ placement
    "GpuPodPlacementWithoutNvlink": _rb(
        meaning="""
            A pod holds two or more GPUs of a node that are in different NVLink domains (a GPU's domain,
            `$NVLINK_DOMAIN`, is the lowest index it reaches over NVLink, from `nvmlDeviceGetP2PStatus` with the
            NVLink index and the links' remote devices), while other GPUs of the same node do share NVLink
            (`$NODE_NVLINK_DOMAIN_MAX`: more than one GPU in a domain). Typical nodes: PCIe cards
            joined two by two by NVLink bridges (H100 NVL), where the scheduler handed out GPUs of two
            different bridges; an HGX board where one GPU's NVLinks or its fabric registration are down.""",
        impact="""
            Collectives and peer-to-peer copies between those GPUs go over PCIe or across CPU sockets: a few
            to tens of times less bandwidth than NVLink, often 3-8x slower steps for communication-heavy
            training or tensor-parallel inference. Nothing fails; the work is slow and the GPUs are wasted.""",
        diagnosis=["""
            - The pairs and their paths: on the node, `nvidia-smi topo -m` (NV# for NVLink, PIX/PXB/PHB/NODE/SYS
              for PCIe paths), or the node dashboard's topology table.
            - Which GPUs the pod holds: `kubectl get pod -n <namespace> <pod> -o yaml` and the
              kubelet's PodResources (the exporter's `k8s_pod` labels).
            - A GPU whose NVLinks are down (HGX): `nvidia-smi nvlink -s -i <index>`, and
              `$NVLINKS_DOWN{node="<node>"} > 0`.""", """
            ```promql
            $NVLINK_DOMAIN{node="<node>", k8s_pod="<pod>"}
            $POD_NVLINK_DOMAINS{node="<node>"}
            $TOPOLOGY_NVLINK{node="<node>", k8s_pod="<pod>"} == 0  # the pairs, with --detail topology
            $POD_NUMA_NODES{node="<node>"}
            ```"""],
        action="""
            Reschedule the pod onto GPUs that share NVLink: with the NVIDIA device plugin, enable its
            topology-aware allocation (`nvidia.com/gpu` allocated with the `best-effort` or `guaranteed`
            topology policy) or the kubelet Topology Manager; ask for whole NVLink groups (2 GPUs on a bridged
            node, 8 on an HGX board). On Slurm, request GPUs with `--gres-flags=enforce-binding` and a gres.conf
            that names the NVLink groups (`Links=`). Where a GPU's NVLinks are down, drain it
            and have the node serviced."""),
    # ------------------------------------------------------------------------------ meta
    "Watchdog": _rb(
        meaning="""
            This alert is meant to fire always (`vector(1)`). It proves that Prometheus evaluates the rules,
            Alertmanager receives alerts, and notifications leave Alertmanager. It is not a problem by itself; its
            absence is.""",
        impact="""
            None while it fires. If it stops arriving, the alerting pipeline is broken and no other alert reaches
            anyone.""",
        diagnosis=["""
            When the heartbeat stops:

            - Is Prometheus up and evaluating rules? `prometheus_rule_evaluation_failures_total`,
              `prometheus_rule_group_last_evaluation_timestamp_seconds`.
            - Does it reach Alertmanager? `prometheus_notifications_errors_total`,
              `prometheus_notifications_dropped_total`, `prometheus_notifications_alertmanagers_discovered`.
            - Does Alertmanager deliver? `amtool alert query alertname=Watchdog`,
              `alertmanager_notifications_failed_total`."""],
        action="""
            Wire it as a dead man's switch: the generated `alerts/alertmanager.yml` routes `alertname="Watchdog"`
            to the `watchdog` receiver with a 1-minute repeat interval. Point that webhook at an external heartbeat
            service (a dead-man's-switch service or the heartbeat feature of the paging system) that pages when
            no heartbeat has arrived for a few minutes. Never silence or inhibit it. When the heartbeat is
            missing, treat the GPU fleet as unmonitored: fix Prometheus or Alertmanager first."""),
}
