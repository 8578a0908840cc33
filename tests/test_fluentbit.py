"""The Fluent Bit pipeline generated from the log-pattern catalog (deploy/fluent-bit/gpuobs-log-patterns.conf).

Fluent Bit cannot be installed here (no Debian package, no download), so its config check cannot run:
these tests read the file as Fluent Bit's classic format and its documented plugin keys, check that
every catalog pattern has its filter (in catalog order: the first match wins) and that the metric is
the catalog's, and run the pipeline's converted regexes, converted back, on the catalog's example
lines (tests/test_logpatterns.py) and on the real gloo lines of torch 2.13: each line gets the same
pattern as gpuobs.logpatterns.match gives it, and the look-alikes none. Where the onigurumacffi
package is installed, the converted regexes are also compiled and run by Oniguruma itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_logpatterns import EXAMPLES

from gpuobs import catalog, generated, logpatterns
from gpuobs.logs import fluentbit

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / fluentbit.PATH
INPUTS = REPO / fluentbit.INPUTS_PATH

# Documented keys per plugin (docs.fluentbit.io/manual, 3.x: pipeline/inputs, filters, outputs), plus
# the keys every input, filter or output takes. Lower case: Fluent Bit's keys are case-insensitive.
COMMON = {"INPUT": {"name", "tag", "alias", "log_level", "mem_buf_limit"},
          "FILTER": {"name", "match", "match_regex", "alias", "log_level"},
          "OUTPUT": {"name", "match", "match_regex", "alias", "log_level", "retry_limit"}}
KEYS = {
    ("SERVICE", None): {"flush", "log_level", "daemon", "parsers_file", "http_server", "http_listen", "http_port"},
    ("INPUT", "forward"): {"listen", "port", "buffer_chunk_size", "buffer_max_size"},
    ("INPUT", "tail"): {"path", "exclude_path", "multiline.parser", "skip_long_lines", "refresh_interval", "db",
                        "read_from_head", "path_key", "mem_buf_limit"},
    ("INPUT", "kmsg"): {"prio_level"},
    ("FILTER", "modify"): {"condition", "set", "add", "remove", "rename", "copy", "hard_rename", "hard_copy"},
    ("FILTER", "log_to_metrics"): {"tag", "metric_mode", "metric_name", "metric_namespace", "metric_subsystem",
                                   "metric_description", "add_label", "label_field", "value_field", "regex",
                                   "exclude", "kubernetes_mode", "bucket", "emitter_name", "emitter_mem_buf_limit",
                                   "discard_logs", "flush_interval_sec", "flush_interval_nsec"},
    ("OUTPUT", "stdout"): {"format", "json_date_key", "json_date_format"},
    ("OUTPUT", "prometheus_exporter"): {"host", "port", "add_label"},
}
# modify's documented conditions and how many arguments each takes
CONDITIONS = {"key_exists": 1, "key_does_not_exist": 1, "a_key_matches": 1, "no_key_matches": 1,
              "key_value_equals": 2, "key_value_does_not_equal": 2, "key_value_matches": 2,
              "key_value_does_not_match": 2, "matching_keys_have_matching_values": 2,
              "matching_keys_do_not_have_matching_values": 2}
# What torch 2.13's gloo backend printed on stderr in a real 2-process job (tests/test_logpatterns_torch.py
# runs one): the last line of the uncaught RuntimeError with PyTorch's rank prefix, and the C++ log
# line of monitored_barrier, a crashed peer, the pair closure after a timeout. Each tuple: the line, the pattern Fluent Bit must give it (None: none).
REAL_STDERR = [
    ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
     "Timed out waiting 3000ms for recv operation to complete", "collective_timeout"),
    ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
     "Timed out waiting 3000ms for send operation to complete", "collective_timeout"),
    ("[rank0]:[E1201 20:49:10.307454268 ProcessGroupGloo.cpp:67] [Rank 0]: Rank 1 failed to pass "
     "monitoredBarrier in 2000 ms", "collective_timeout"),
    ("[rank1]:     dist.all_reduce(torch.ones(4))  # rank 0 never joins: gloo times out after 3 s and raises",
     None),
    ("[rank1]:   File \"/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py\", line "
     "3252, in all_reduce", None),
    ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
     "closed by peer [127.0.0.1]:63197. This is typically caused by a remote worker crashing.", "collective_peer_crash"),
    ("[rank1]: RuntimeError: Application timeout caused pair closure", "collective_timeout"),
]


def parse(text: str) -> tuple[list[tuple[str, list[tuple[str, str]]]], list[str]]:
    """Fluent Bit's classic format: ([SECTION] with its indented `Key value` lines, in order; the
    @INCLUDE files). Comments (#) and blank lines skipped; anything else fails the test."""
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    includes = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("@INCLUDE "):
            includes.append(line.split(None, 1)[1])
        elif re.fullmatch(r"\[[A-Z]+\]", line):
            sections.append((line[1:-1], []))
        else:
            assert sections and re.match(r"    \S+ +\S", line), f"not classic format: {line!r}"
            key, value = line.split(None, 1)
            sections[-1][1].append((key, value.strip()))
    return sections, includes


def values(keys: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in keys if k.lower() == key]


def pattern_filters(sections) -> list[tuple[str, str]]:
    """(pattern name set, Onigmo regex) of each conditional modify filter, in order."""
    out = []
    for kind, keys in sections:
        if kind == "FILTER" and values(keys, "name") == ["modify"] and values(keys, "condition"):
            regex = next(c.split(" ", 2)[2] for c in values(keys, "condition")
                         if c.lower().startswith("key_value_matches log "))
            out.append((values(keys, "set")[0].split(" ", 1)[1], regex))
    return out


def python_regex(onigmo: str) -> re.Pattern[str]:
    """A converted regex converted back: Onigmo's (?<name> is Python's (?P<name>; \\x20 is both."""
    return re.compile(onigmo.replace("(?<", "(?P<"))


@pytest.fixture(scope="module")
def conf():
    """The pipeline of a GPU node: node.conf's includes in order (inputs, then the patterns)."""
    inputs, inputs_includes = parse(INPUTS.read_text())
    patterns, includes = parse(CONF.read_text())
    return inputs + patterns, inputs_includes + includes


def pipeline_pattern(line: str, filters: list[tuple[str, str]] | None = None) -> str | None:
    """The pattern the pipeline's modify filters set on a record whose `log` is `line` (the first
    filter whose regex matches anywhere in it: Key_does_not_exist log_pattern stops the others)."""
    if filters is None:
        filters = pattern_filters(parse(CONF.read_text())[0])
    return next((name for name, regex in filters if python_regex(regex).search(line)), None)


def test_the_committed_config_is_generated_and_included():
    assert CONF.read_text() == fluentbit.config()
    assert INPUTS.read_text() == fluentbit.node_inputs()
    outputs = generated.outputs()  # gpuobs generate writes them (--check sees drift)
    assert outputs[CONF] == fluentbit.config() and outputs[INPUTS] == fluentbit.node_inputs()
    main, includes = parse((REPO / "deploy/fluent-bit/fluent-bit.conf").read_text())
    assert includes == [CONF.name]  # compose: no kernel or container input (a kmsg input fails without /dev/kmsg)
    assert [values(k, "name") for kind, k in main if kind == "INPUT"] == [["forward"]]
    node, includes = parse((REPO / "deploy/fluent-bit/node.conf").read_text())
    assert includes == [INPUTS.name, CONF.name]  # inputs first: the filters match what they tag
    assert [kind for kind, _ in node] == ["SERVICE"]
    assert not [k for kind, k in parse(CONF.read_text())[0] if kind == "INPUT"]


def test_every_key_is_documented_for_its_plugin(conf):
    sections, includes = conf
    main, _ = parse((REPO / "deploy/fluent-bit/fluent-bit.conf").read_text())
    node, _ = parse((REPO / "deploy/fluent-bit/node.conf").read_text())
    assert includes == []
    for kind, keys in sections + main + node:
        name = (values(keys, "name") or [None])[0]
        allowed = KEYS[(kind, name)] | COMMON.get(kind, set())
        unknown = {k for k, _ in keys if k.lower() not in allowed}
        assert not unknown, (kind, name, unknown)
        if kind != "SERVICE":
            assert values(keys, "match") or values(keys, "match_regex") or kind == "INPUT", (kind, keys)
        for condition in values(keys, "condition"):
            words = condition.split(" ")
            assert CONDITIONS[words[0].lower()] == len(words) - 1, condition  # modify splits on spaces
        for setting in values(keys, "set") + values(keys, "rename"):
            assert len(setting.split(" ")) == 2, setting


def test_every_pattern_has_its_filter_in_catalog_order(conf):
    sections, _ = conf
    filters = pattern_filters(sections)
    assert [name for name, _ in filters] == [p.name for p in logpatterns.PATTERNS]
    for (_name, regex), pattern in zip(filters, logpatterns.PATTERNS):
        assert regex == fluentbit.onigmo(pattern.regex.pattern)
        assert " " not in regex and "'" not in regex and '"' not in regex and "(?P" not in regex
        assert python_regex(regex).pattern.replace(r"\x20", " ").replace(r"\x27", "'") == pattern.regex.pattern
    for _kind, keys in sections:
        if values(keys, "condition"):
            assert values(keys, "condition")[0] == "Key_does_not_exist log_pattern"  # the first match wins
            assert values(keys, "match") == ["pipe.*"]


def test_the_metric_is_the_catalogs_with_a_pattern_label(conf):
    sections, _ = conf
    [metrics] = [keys for kind, keys in sections if values(keys, "name") == ["log_to_metrics"]]
    fqname = "_".join(values(metrics, k)[0] for k in ("metric_namespace", "metric_subsystem", "metric_name"))
    assert fqname == catalog.LOG_PATTERN_MATCHES.exposed_name == "gpuobs_log_pattern_matches_total"
    assert values(metrics, "metric_mode") == ["counter"]
    assert values(metrics, "add_label") == ["pattern $log_pattern"]
    assert "pattern" in catalog.LOG_PATTERN_MATCHES.labels
    field, regex = values(metrics, "regex")[0].split(" ", 1)
    assert field == "log_pattern"
    assert all(re.fullmatch(regex, p.name) for p in logpatterns.PATTERNS) and not re.fullmatch(regex, "other")
    # gpuobs.logs' own JSON lines on a container's stdout were counted by the process: excluded here
    field, exclude = values(metrics, "exclude")[0].split(" ", 1)
    own = '{"level": "ERROR", "message": "[Rank 1] Watchdog caught collective operation timeout", "log_pattern": ' \
          '"collective_timeout"}'
    assert field == "log" and python_regex(exclude).search(own)
    assert pipeline_pattern(own) == "collective_timeout"  # matched, then excluded from the count
    assert not python_regex(exclude).search("[Rank 1] Watchdog caught collective operation timeout: log_pattern")
    [exporter] = [keys for kind, keys in sections if values(keys, "name") == ["prometheus_exporter"]]
    assert values(exporter, "port") == [str(fluentbit.PORT)] == ["2021"]
    assert values(exporter, "match") == values(metrics, "tag")
    inputs = {values(keys, "name")[0]: keys for kind, keys in sections if kind == "INPUT"}
    assert values(inputs["tail"], "path") == ["/var/log/containers/*.log"]
    assert values(inputs["tail"], "multiline.parser") == ["docker, cri"]
    assert all(values(keys, "tag")[0].startswith("pipe.") for keys in inputs.values())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_converted_regexes_give_each_example_line_its_catalog_pattern(conf, name):
    filters = pattern_filters(conf[0])
    good, bad = EXAMPLES[name]
    for line, _fields in good:
        assert pipeline_pattern(line, filters) == logpatterns.match(line).name == name, line
    for line in bad:
        assert pipeline_pattern(line, filters) is None, line


def test_real_gloo_stderr_lines_are_matched(conf):
    filters = pattern_filters(conf[0])
    for line, expected in REAL_STDERR:
        assert pipeline_pattern(line, filters) == expected, line
        found = logpatterns.match(line)  # and gpuobs itself agrees
        assert (found.name if found else None) == expected, line


def test_python_only_syntax_is_refused():
    for regex in (r"(?P<a>x)(?P=a)", r"end\Z", r"(?a)\w+"):
        with pytest.raises(ValueError):
            fluentbit.onigmo(regex)
    assert fluentbit.onigmo(r"(?P<ms>\d+) ms 'x'") == r"(?<ms>\d+)\x20ms\x20\x27x\x27"


def test_oniguruma_itself_runs_the_converted_regexes(conf):
    """Onigmo (Fluent Bit's engine) is a fork of Oniguruma: same syntax for everything used here."""
    onig = pytest.importorskip("onigurumacffi")
    filters = [(name, onig.compile(regex)) for name, regex in pattern_filters(conf[0])]
    lines = [(line, name) for name, (good, _) in EXAMPLES.items() for line, _ in good]
    lines += [(line, None) for _, (_, bad) in EXAMPLES.items() for line in bad] + REAL_STDERR
    for line, expected in lines:
        got = next((name for name, regex in filters if regex.search(line) is not None), None)
        assert got == expected, line
