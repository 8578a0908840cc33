"""The log-pattern catalog as a Fluent Bit pipeline, for the logs that never pass through
gpuobs.logs: the C++ lines of a training process (the c10d/NCCL watchdog, NCCL WARN, gloo), other
containers' output, the kernel log (NVRM Xid, NVLink). `gpuobs generate` writes two includes in
Fluent Bit's classic format: deploy/fluent-bit/gpuobs-log-patterns.conf (the filters and the
metric: included by the compose stack's deploy/fluent-bit/fluent-bit.conf) and
deploy/fluent-bit/gpuobs-node-inputs.conf (the node's inputs: a node's Fluent Bit, e.g.
deploy/fluent-bit/node.conf, includes it first). The regexes are the catalog's own, converted,
never copied.

The pipeline (only documented keys of each plugin):
- node inputs: `tail` of /var/log/containers/*.log (Kubernetes' container logs, with the built-in
  `docker` and `cri` multiline parsers, whose text lands in `log`) tagged pipe.container.*, and
  `kmsg` (the kernel ring buffer; its `msg` renamed to `log`) tagged pipe.kernel. Kept apart
  because a kmsg input fails where /dev/kmsg is not readable (rootless containers, the compose
  stack). Records that gpuobs already counted (the forward input of the gpuobs handlers) are not
  tagged pipe.* and are not counted again, nor are the JSON lines gpuobs.logs writes to a
  container's stdout with their `"log_pattern"` (counted in the process that wrote them).
- one `modify` filter per pattern, in catalog order: when `log` matches the pattern's regex and no
  earlier pattern matched, it sets `log_pattern` to the pattern's name (the first match wins, as
  in gpuobs.logpatterns.match).
- one `log_to_metrics` counter over the records with a `log_pattern`, named from the catalog
  metric (gpuobs_log_pattern_matches_total: namespace `gpuobs`, subsystem and name the rest), its
  label `pattern` taken from the record (`add_label` takes a record accessor, not a constant, which
  is why the pattern name is set on the record first).
- a `prometheus_exporter` output on port 2021. A pattern's series appears at its first match;
  rank and job_id are not known to the pipeline (the scrape adds job and instance).

`onigmo(regex)` converts a catalog regex to Fluent Bit's Onigmo (Ruby) syntax: `(?P<name>` ->
`(?<name>`, and spaces and quotes as \\x20/\\x22/\\x27, since the modify filter splits its
condition on spaces. It raises ValueError on a Python-only construct it cannot convert."""

from __future__ import annotations

import re

from .. import catalog, logpatterns

PATH = "deploy/fluent-bit/gpuobs-log-patterns.conf"
INPUTS_PATH = "deploy/fluent-bit/gpuobs-node-inputs.conf"
PORT = 2021  # Fluent Bit's documented prometheus_exporter port
TAG = "pipe"  # the inputs this pipeline counts are tagged pipe.*
METRICS_TAG = "metrics.gpuobs_log_patterns"  # apart from the forward input's <tag>.<logger> tags
FIELD = "log_pattern"  # the record key naming the matched pattern (as gpuobs.logs ships it)
# Python-only syntax with no Onigmo meaning (or another one): named backreferences and calls,
# \Z (end of string in Python, before a final newline in Onigmo), the ASCII/locale flags.
_PYTHON_ONLY = re.compile(r"\(\?P[=>]|\\Z|\(\?[aL]")
_ESCAPES = {" ": r"\x20", '"': r"\x22", "'": r"\x27"}


def onigmo(regex: str) -> str:
    """The catalog regex `regex` (Python syntax) in Onigmo syntax, one token without spaces or
    quotes (so that Fluent Bit's `Condition Key_value_matches KEY REGEX` keeps it whole).
    ValueError on Python-only syntax (named backreferences, \\Z, (?a)/(?L))."""
    bad = _PYTHON_ONLY.search(regex)
    if bad is not None:
        raise ValueError(f"Python-only regex syntax {bad.group()!r} in {regex!r}")
    out = regex.replace("(?P<", "(?<")
    return "".join(_ESCAPES.get(ch, ch) for ch in out)


def _section(name: str, keys: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in keys) + 1
    return f"[{name}]\n" + "".join(f"    {k.ljust(width)}{v}\n" for k, v in keys)


def _inputs() -> list[str]:
    return [
        _section("INPUT", [("Name", "tail"), ("Tag", f"{TAG}.container.*"), ("Path", "/var/log/containers/*.log"),
                           ("multiline.parser", "docker, cri"), ("Skip_Long_Lines", "On"),
                           ("Refresh_Interval", "10")]),
        _section("INPUT", [("Name", "kmsg"), ("Tag", f"{TAG}.kernel")]),
        _section("FILTER", [("Name", "modify"), ("Match", f"{TAG}.kernel"), ("Rename", "msg log")]),
    ]


def _pattern_filter(pattern: logpatterns.LogPattern) -> str:
    return _section("FILTER", [
        ("Name", "modify"), ("Alias", f"gpuobs_pattern_{pattern.name}"), ("Match", f"{TAG}.*"),
        ("Condition", f"Key_does_not_exist {FIELD}"),
        ("Condition", f"Key_value_matches log {onigmo(pattern.regex.pattern)}"),
        ("Set", f"{FIELD} {pattern.name}")])


def metric_parts() -> tuple[str, str, str]:
    """(metric_namespace, metric_subsystem, metric_name) for log_to_metrics, which exposes
    namespace_subsystem_name: the catalog metric's exposed name split in three."""
    namespace, rest = catalog.LOG_PATTERN_MATCHES.exposed_name.split("_", 1)
    subsystem, name = rest.rsplit("_", 1)
    return namespace, subsystem, name


def _metrics() -> list[str]:
    namespace, subsystem, name = metric_parts()
    names = "|".join(p.name for p in logpatterns.PATTERNS)
    return [
        _section("FILTER", [
            ("Name", "log_to_metrics"), ("Match", f"{TAG}.*"), ("Tag", METRICS_TAG), ("Metric_Mode", "counter"),
            ("Metric_Namespace", namespace), ("Metric_Subsystem", subsystem), ("Metric_Name", name),
            ("Metric_Description", "Log lines of containers and of the kernel that matched a pattern of the "
                                   "gpuobs log-pattern catalog, by pattern (Fluent Bit)."),
            ("Regex", f"{FIELD} ^(?:{names})$"),
            # gpuobs.logs' own JSON lines (stdout of an instrumented process) name their pattern: counted there
            ("Exclude", f"log {onigmo(chr(34) + FIELD + chr(34) + ':')}"),
            ("Add_Label", f"pattern ${FIELD}")]),
        _section("OUTPUT", [("Name", "prometheus_exporter"), ("Match", METRICS_TAG), ("Host", "0.0.0.0"),
                            ("Port", str(PORT))]),
    ]


def _header(included_by: str) -> str:
    return ("# Generated by `gpuobs generate` from gpuobs/logs/fluentbit.py (the log-pattern catalog,\n"
            f"# gpuobs/logpatterns.py); do not edit. Included by {included_by}.\n")


def config() -> str:
    """The classic-format Fluent Bit include of the pattern pipeline: one modify filter per catalog
    pattern (in catalog order), the log_to_metrics counter and the prometheus_exporter output,
    over the records tagged pipe.*."""
    sections = [_pattern_filter(p) for p in logpatterns.PATTERNS] + _metrics()
    return _header("fluent-bit.conf (compose) and node.conf") + "\n" + "\n".join(sections)


def node_inputs() -> str:
    """The classic-format Fluent Bit include of a GPU node's inputs (container logs and the kernel
    log, tagged pipe.*), for a node's Fluent Bit that also includes config()."""
    return _header("node.conf, before gpuobs-log-patterns.conf") + "\n" + "\n".join(_inputs())
