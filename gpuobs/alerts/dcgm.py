"""The dcgm flavour of the rule pack: gpuobs's recording rules and alerts on top of dcgm-exporter's series
(a real dcgm-exporter, or `gpuobs exporter --naming dcgm`), written to alerts/dcgm/.

Design: an adapter group records each DCGM field back as the gpuobs series the pack reads, from the
catalog's dcgm mapping (`Metric.dcgm`: label values after the identity labels -> DCGM field;
`Metric.dcgm_scale`: our unit -> DCGM's, so the adapter divides by it). Each adapted series keeps
gpuobs's labels: `uuid` from DCGM's `UUID`, the values of the metric's extra labels from its dcgm key,
the attribution labels from dcgm-exporter's `pod`/`namespace`/`container`, and none of DCGM's own
(DCGM_LABELS). Three series DCGM has no field for are derived: GPU_UP (1 while any field of the GPU is
served), GPU_INFO (name, pci_bus_id and driver_version from dcgm-exporter's labels) and
CLOCK_EVENT_ACTIVE (one series per bit of the clock-event reasons bitmask). The unchanged records and
alerts run on top, less every one whose inputs the adapter cannot give (computed from their PromQL,
`missing_inputs`), plus dcgm-specific replacements where DCGM's semantics differ and the alert matters
(`replacements`: XIDs, from DCGM's last-XID gauge; a lost GPU, from its series vanishing).

Counters stay counters: an adapted counter is the DCGM counter divided by a positive constant, one
series per GPU and key, so it is as monotone as its source and rate() reads it as it reads the native
one. A DCGM field that dcgm-exporter types counter but that is a rate (NVLink bandwidth) adapts a gauge
metric, read as a gauge.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from .. import catalog as c
from .. import records
from ..records import GPU_BY
from .build import _group_name, alert_rule
from .common import DEFAULT, GPU, Alert, Thresholds

# dcgm-exporter's labels of a GPU's series (gpuobs.exporter.render.DcgmIdentity.labels writes the
# same, checked by tests/test_dcgm_flavour.py): dropped by the adapter, which keeps gpu and the
# scrape's target labels
DCGM_LABELS = ("UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "hostname", "Hostname",
               "DCGM_FI_DRIVER_VERSION")
# dcgm-exporter's attribution labels -> gpuobs's (render.ATTRIBUTION_LABELS; hpc_job is named alike)
DCGM_ATTRIBUTION = {"pod": "k8s_pod", "namespace": "k8s_namespace", "container": "k8s_container"}
# GPU_INFO's labels dcgm-exporter has, by its label name; the others are empty
INFO_LABELS = {"modelName": "name", "pci_bus_id": "pci_bus_id", "DCGM_FI_DRIVER_VERSION": "driver_version"}
XID_LABELS = ("err_code", "err_msg")  # DCGM_FI_DEV_XID_ERRORS: the last XID's code and title
FOLDER = Path("alerts") / "dcgm"
RULES_FILE = "gpuobs-dcgm.rules.yml"
PROMETHEUS_RULE_FILE = "prometheusrule.yaml"
ADAPTER_GROUP = "dcgm-adapter"
# dcgm-exporter's Helm chart names its scrape job and DaemonSet so
DCGM_DEFAULT = dataclasses.replace(DEFAULT, exporter_job="dcgm-exporter", exporter_daemonset="dcgm-exporter")


def adapted() -> tuple[c.Metric, ...]:
    """The whole-GPU catalog metrics with a DCGM field, in catalog order: each recorded by the
    adapter. MIG metrics are not: DCGM has no compute-instance label to rebuild theirs from."""
    return tuple(m for m in c.ALL if m.dcgm and m.identity == c.GPU_LABELS)


def derived() -> tuple[c.Metric, ...]:
    """The catalog metrics the adapter derives from dcgm-exporter's labels and fields (no DCGM field
    of their own): GPU_UP, GPU_INFO, CLOCK_EVENT_ACTIVE."""
    return (c.GPU_UP, c.GPU_INFO, c.CLOCK_EVENT_ACTIVE)


def available() -> frozenset[c.Metric]:
    """Every catalog metric a rule of the flavour may read: the adapter's, and the instrumentation's
    (OpenTelemetry: training and inference processes send them whichever GPU exporter runs)."""
    return frozenset(adapted() + derived()) | frozenset(m for m in c.ALL if m.otel_name)


def _fields(m: c.Metric) -> list[tuple[tuple[str, ...], str]]:
    """(key, DCGM field) of a metric, each alias of a field after it (an older dcgm-exporter serves
    only the old name; `or` keeps the first of two series with the same labels)."""
    return [(key, name) for key, field in m.dcgm.items() for name in (field, *c.DCGM_ALIASES.get(field, ()))]


def _gpu_labels(expr: str, extra: dict[str, str] | None = None) -> str:
    """expr with gpuobs's uuid and attribution labels copied from dcgm-exporter's (and `extra`:
    dcgm-exporter label -> gpuobs label)."""
    for source, target in {"UUID": "uuid", **DCGM_ATTRIBUTION, **(extra or {})}.items():
        expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.*)")'
    return expr


def _without(keep: tuple[str, ...] = (), more: tuple[str, ...] = ()) -> str:
    """`without (...)` of dcgm-exporter's own labels (and `more`), but those in keep."""
    drop = [label for label in DCGM_LABELS + tuple(DCGM_ATTRIBUTION) + more if label not in keep]
    return f"without ({', '.join(drop)})"


def _whole_gpu(field: str) -> str:
    """A field's series per whole GPU. dcgm-exporter serves a MIG GPU as its GPU instances (GPU_I_ID
    set): a device field comes on each instance with the GPU's value, so the instances' series, their
    instance and pod labels dropped, give the GPU's (a GPU's own series carry its parent's
    attribution only, as gpuobs names them); a field DCGM reports per instance
    (c.DCGM_INSTANCE_FIELDS: memory, profiling) has no whole-GPU value on a MIG GPU and none is made."""
    whole = _selector(field, 'GPU_I_ID=""')
    if field in c.DCGM_INSTANCE_FIELDS:
        return whole
    instances = _selector(field, 'GPU_I_ID!=""')
    return f'({whole} or max without (GPU_I_ID, GPU_I_PROFILE, {", ".join(DCGM_ATTRIBUTION)}) ({instances}))'


def _selector(field: str, matcher: str) -> str:
    """A field's name (or a `{__name__=~...}` selector) with one more label matcher."""
    return f"{field[:-1]}, {matcher}}}" if field.startswith("{") else f"{field}{{{matcher}}}"


def _scaled(expr: str, scale: float) -> str:
    """expr (in DCGM's unit) in ours: divided by dcgm_scale, written as a product when that is exact."""
    if scale == 1:
        return expr
    if scale < 1 and float(round(1 / scale)) == 1 / scale:
        return f"{expr} * {round(1 / scale)}"
    return f"{expr} / {scale:.17g}"


def adapter_expr(m: c.Metric) -> str:
    """The PromQL recording metric m (adapted()) from its DCGM fields: one series per GPU and key."""
    branches = []
    for key, field in _fields(m):
        branch = _whole_gpu(field)
        for label, value in zip(m.extra_labels, key):
            branch = f'label_replace({branch}, "{label}", "{value}", "__name__", ".*")'
        branches.append(branch)
    return _scaled(f"max {_without()} ({_gpu_labels(' or '.join(branches))})", m.dcgm_scale)


def _any_field() -> str:
    """Every whole-GPU series of every adapted field: a GPU is there while any of them is served."""
    names = sorted({field for m in adapted() for _, field in _fields(m)} - c.DCGM_INSTANCE_FIELDS)
    return _whole_gpu(f'{{__name__=~"{"|".join(names)}"}}')


def up_expr(t: Thresholds) -> str:
    """GPU_UP: 1 per GPU while dcgm-exporter serves any of its fields; 0 for long_window after they
    vanish (DCGM drops a lost GPU's series), read from the record's own past values."""
    up = c.GPU_UP.name
    return (f"group {_without()} ({_gpu_labels(_any_field())}) "
            f"or 0 * (max_over_time({up}[{t.long_window}]) == 1)")


def info_expr() -> str:
    """GPU_INFO: 1 per GPU, its name, PCI bus id and driver version from dcgm-exporter's labels."""
    renamed = {k: v for k, v in INFO_LABELS.items() if k != v}
    return f"group {_without(keep=('pci_bus_id',))} ({_gpu_labels(_any_field(), renamed)})"


def reasons_expr() -> str:
    """CLOCK_EVENT_ACTIVE: 1 or 0 per reason of CLOCK_EVENT_REASONS, from the adapted bitmask."""
    mask = c.CLOCK_EVENT_REASONS_MASK.name
    return " or ".join(f'label_replace(floor({mask} / {bit}) % 2, "reason", "{reason}", "__name__", ".*")'
                       for bit, reason in c.CLOCK_EVENT_REASONS.items())


def adapter_rules(t: Thresholds) -> list[dict]:
    """The adapter group's rules for windows t, adapted metrics first (CLOCK_EVENT_ACTIVE reads the adapted bitmask)."""
    rules = [{"record": m.exposed_name, "expr": adapter_expr(m)} for m in adapted()]
    return rules + [{"record": c.GPU_UP.exposed_name, "expr": up_expr(t)},
                    {"record": c.GPU_INFO.exposed_name, "expr": info_expr()},
                    {"record": c.CLOCK_EVENT_ACTIVE.exposed_name, "expr": reasons_expr()}]


# ------------------------------------------------------------------------- what runs on the flavour
def missing_inputs(expr: str, dropped: set[str]) -> list[str]:
    """What a rule's PromQL reads that the flavour lacks, sorted: catalog metrics outside available()
    (by exposed name) and records in `dropped` (by name)."""
    lacking = {m.exposed_name for m in records.metrics_read(expr) if m not in available()}
    return sorted(lacking | (set(records.TOKEN.findall(expr)) & dropped))


def left_out_records(t: Thresholds) -> dict[str, list[str]]:
    """{record name: its missing inputs} of the records left out, in definition order: those reading
    what the adapter lacks, then those reading a record left out (until none more is)."""
    exprs = {r.name: r.expr(t) for r in records.RECORDS}
    out: dict[str, list[str]] = {}
    while True:
        more = {name: missing for name, expr in exprs.items() if name not in out
                and (missing := missing_inputs(expr, set(out)))}
        if not more:
            return {name: out[name] for name in exprs if name in out}
        out.update(more)


def left_out_alerts(t: Thresholds) -> dict[str, list[str]]:
    """{alert name: its missing inputs} of the pack's alerts the flavour leaves out (replaced or not)."""
    from .rules import alerts

    dropped = set(left_out_records(t))
    return {a.name: missing for a in alerts(t) if (missing := missing_inputs(a.expr, dropped))}


# ------------------------------------------------------------------------------ dcgm-specific alerts
def _last_xid(offset: str = "") -> str:
    """Per GPU, the code of the last XID dcgm-exporter reports (one series: err_code and err_msg
    dropped, so a new code is a new value of the same series), as it was `offset` ago."""
    selector = f"{c.DCGM_XID_FIELD}{offset}"
    return f"max {_without(more=XID_LABELS)} ({_gpu_labels(selector)})"


def _xid_changed_to(codes: str, t: Thresholds) -> str:
    """GPUs whose last XID is one of codes (an alternation of XID numbers, records.XID_TIERS) and was
    not that code rate_window ago: the gauge holds the last code only, so a change is the event (the
    same code again is invisible; a GPU new within the window counts as changed). Label xid: the code."""
    now, then = _last_xid(), _last_xid(f" offset {t.rate_window}")
    numbers = codes.split("|")
    if not all(n.isdigit() for n in numbers):
        raise ValueError(f"XID tier {codes!r} is not an alternation of XID numbers")
    return " or ".join(f'label_replace({now} == {n} unless on ({GPU_BY}) {then} == {n}, "xid", "{n}", "__name__", ".*")'
                       for n in numbers)


def _gpu_vanished(t: Thresholds) -> str:
    """GPUs the adapter's GPU_UP holds at 0 (served within long_window, not now) while their exporter
    is scraped (a target down is GpuExporterDown's case): DCGM drops a lost GPU's series rather than
    saying it is lost, so this resolves long_window after the last."""
    return f'{c.GPU_UP.name} == 0 and on (instance) up{{job="{t.exporter_job}"}} == 1'


def replacements(t: Thresholds) -> list[Alert]:
    """The pack's alerts that DCGM's semantics break, rewritten on dcgm-exporter's series under the
    same names, severities and runbooks (routes and inhibitions apply unchanged): the XID tiers,
    GpuLost and the training alerts that name a slowdown's cause (without it)."""
    from .rules import alerts

    native = {a.name: a for a in alerts(t)}
    tier_alerts = {"xid_reboot": "GpuXidRebootRequired", "xid_reset": "GpuXidResetRequired",
                   "xid_application": "GpuXidApplicationError", "xid_nvlink": "GpuXidNvlinkError"}
    out = [dataclasses.replace(native[name], expr=_xid_changed_to(records.XID_TIERS[tier], t),
                               description=f"{GPU} reported XID {{{{ $labels.xid }}}} (dcgm-exporter's last XID "
                                           "changed to it); see the runbook for the action.")
           for tier, name in tier_alerts.items()]
    out.append(dataclasses.replace(native["GpuLost"], expr=_gpu_vanished(t),
                                   description=f"{GPU}: dcgm-exporter stopped serving its series while the exporter "
                                               "is still scraped (the GPU fell off the bus or DCGM lost it)."))
    # the slowdown causes read series dcgm-exporter does not serve (processes, NVLink links down, XID
    # counters): the training alerts that name them run without the cause labels
    from .families.training import slowdown_conditions

    out += [dataclasses.replace(native[name], expr=expr) for name, expr in slowdown_conditions(t).items()]
    return out


# ------------------------------------------------------------------------------------------ files
def rule_groups(t: Thresholds) -> list[dict]:
    """The flavour's rule groups: the adapter first, then the pack's groups (build.rule_groups) less
    the records and alerts left out, the replacements in their alerts' groups."""
    from .build import rule_groups as pack_groups

    dropped = set(left_out_records(t)) | set(left_out_alerts(t))
    groups: list[dict] = [{"name": _group_name(ADAPTER_GROUP), "interval": t.eval_interval,
                           "rules": adapter_rules(t)}]
    for group in pack_groups(t):
        rules = [r for r in group["rules"] if r.get("record", r.get("alert")) not in dropped]
        groups.append({**group, "rules": rules})
    for a in replacements(t):
        name = _group_name(a.group)
        target = next((g for g in groups if g["name"] == name), None)
        if target is None:
            target = {"name": name, "interval": t.eval_interval, "rules": []}
            groups.append(target)
        target["rules"].append(alert_rule(a, t))
    return [g for g in groups if g["rules"]]


def _header(t: Thresholds) -> str:
    """The rule file's comment header: what it is, how to load it, what it leaves out and why."""
    lines = [f"Generated by `gpuobs generate` from gpuobs/alerts/dcgm.py (profile {t.profile}); do not edit.",
             "gpuobs's recording rules and alerts on dcgm-exporter's series (a real dcgm-exporter or",
             "`gpuobs exporter --naming dcgm`): load this file instead of alerts/gpuobs.rules.yml. docs/dcgm.md",
             "says what works on which flavour.", "",
             f"Scrape job `{t.exporter_job}` (GpuExporterDown and GpuLost read its `up`).",
             "Replaced by dcgm-specific rules under the same names: "
             + ", ".join(a.name for a in replacements(t)) + ".", "",
             "Left out (inputs the adapter cannot give):"]
    replaced = {a.name for a in replacements(t)}
    for kind, missing in (("record", left_out_records(t)), ("alert", left_out_alerts(t))):
        lines += [f"  {kind} {name}: {', '.join(inputs)}" for name, inputs in missing.items() if name not in replaced]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def rules_file(t: Thresholds = DCGM_DEFAULT) -> str:
    """alerts/dcgm/gpuobs-dcgm.rules.yml: the flavour as a Prometheus rule file."""
    return _header(t) + yaml.safe_dump({"groups": rule_groups(t)}, sort_keys=False, width=120)


def prometheus_rule(t: Thresholds = DCGM_DEFAULT) -> str:
    """alerts/dcgm/prometheusrule.yaml: the flavour as a prometheus-operator PrometheusRule, `gpuobs-dcgm`
    (role alert-rules-dcgm), and alerts/dcgm/kustomization.yaml lists it."""
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "gpuobs-dcgm",
                        "labels": {"app.kubernetes.io/name": "gpuobs", "role": "alert-rules-dcgm"}},
           "spec": {"groups": rule_groups(t)}}
    return "# Generated by `gpuobs generate`; do not edit.\n" + yaml.safe_dump(doc, sort_keys=False, width=120)


def write_fast_rules(directory: Path, t: Thresholds | None = None) -> Path:
    """The flavour with the FAST thresholds (or t) in directory/gpuobs-dcgm-fast.rules.yml, for tests."""
    from .common import FAST

    path = Path(directory) / "gpuobs-dcgm-fast.rules.yml"
    path.write_text(rules_file(t or FAST))
    return path


def outputs(root: Path, runbook_base: str | None = None) -> dict[Path, str]:
    """Every file of alerts/dcgm/ under root and its content (runbook_base: see build.outputs)."""
    t = DCGM_DEFAULT if runbook_base is None else dataclasses.replace(DCGM_DEFAULT, runbook_base=runbook_base)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": [PROMETHEUS_RULE_FILE]}
    return {root / FOLDER / RULES_FILE: rules_file(t), root / FOLDER / PROMETHEUS_RULE_FILE: prometheus_rule(t),
            root / FOLDER / "kustomization.yaml": "# Generated by `gpuobs generate`; do not edit.\n"
            + yaml.safe_dump(kustomization, sort_keys=False)}
