r"""The log-pattern catalog: the log lines that precede or explain a failed GPU job (NCCL timeouts
and errors, CUDA out-of-memory and illegal addresses, kernel Xid lines, ECC and row-remap
failures, NVLink and fabric errors), defined once, like the metric catalog.

Each `LogPattern` names what it matches, how severe it is, which fields it extracts, the metric
it increments (`gpuobs_log_pattern_matches_total{pattern=<name>}`, catalog.LOG_PATTERN_MATCHES,
named here by its catalog name: this module imports nothing of gpuobs so that `gpuobs.logs` may
use it) and the alert that reads that metric (gpuobs.alerts.rules builds it from this name; its
runbook is docs/runbooks/<alert>.md).

`match(line)` returns the first pattern that matches, with its extracted fields, or None. It runs
on every log record of a training process, so most lines are settled by one prefilter scan
(one compiled alternation of literal keywords that every pattern's lines contain); a line that
has some is tried against the patterns its keywords select, in catalog order (specific before general: a
kernel Xid line before the ECC or NVLink text it may carry, an NCCL timeout before the generic
NCCL error that PyTorch logs with it).

Log lines are input an attacker can write (a kernel-log line, a message a training job logs), so
matching is linear in the line and the line is capped. Linear: every quantifier is bounded (no
`+`, `*` or `.*?`: `\w{0,12}`, `.{0,80}?`, at most 300 characters for WorkNCCL's fields), so the
work from one start position is bounded by a constant; and nothing nests or overlaps ambiguously
(a quantified part is followed by something it cannot match, e.g. `\w{1,40}\b`, WorkNCCL's
fields as `key=value, ` units and "(...)" units that start with different characters), so that
constant is a sum of the bounds, not their product. These are plain regexes that Python's `re`
and Fluent Bit's Onigmo (gpuobs.logs.fluentbit) both run, hence no RE2. Capped: match() looks at
the first MAX_LINE_CHARS characters only and counts longer lines (truncated_total).
tests/test_hostile_logs.py times each pattern on hostile 64 KiB lines.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["critical", "warning"]
METRIC = "gpuobs_log_pattern_matches"  # catalog.LOG_PATTERN_MATCHES.name (tests pin the two together)
# The rank a line names: PyTorch's "[Rank 3]", "[PG 0 Rank 3]", torchrun's "[rank3]:" prefix.
# \b keeps "headRank 3" and "local_rank" out; the "]" keeps "rank 3 of 8" prose out.
_RANK = re.compile(r"\b[Rr]ank ?(\d{1,7})\]")
# Only a line's first MAX_LINE_CHARS characters are matched (the signal lines are short: a kernel
# record is at most 1 KiB, PyTorch's longest watchdog line about 600 characters); the rest is not
# looked at, and such lines are counted (truncated_total). With the patterns linear, this bounds
# the time one line can take (tests/test_hostile_logs.py: under 5 ms for any 64 KiB line).
MAX_LINE_CHARS = 8192
_truncated = 0
_truncated_lock = threading.Lock()
_DIGITS = "0123456789"  # a group name's trailing digits tell alternatives apart (ms2 is ms)


@dataclass(frozen=True)
class LogPattern:
    """One kind of log line.

    name: the `pattern` label value (a fixed set: the metric's cardinality is bounded by it);
    regex: compiled, searched anywhere in the line, its named groups are the extracted fields;
    keywords: literal substrings, one of which every matching line contains (the prefilter);
    severity: "critical" (the job fails or a GPU must be drained) or "warning";
    rank: whether the rank the line names (e.g. "[Rank 3]") is extracted as field `rank`;
    metric: the catalog metric a match increments; alert: the alert (and runbook) it feeds;
    summary: one line for the docs."""
    name: str
    regex: re.Pattern[str]
    keywords: tuple[str, ...]
    severity: Severity
    alert: str
    summary: str
    rank: bool = False
    metric: str = METRIC

    @property
    def extracts(self) -> tuple[str, ...]:
        """The field names a match of this pattern may carry (named groups, then `rank`)."""
        groups = dict.fromkeys(name.rstrip(_DIGITS) for name in self.regex.groupindex)  # op2 is op
        return tuple(groups) + (("rank",) if self.rank else ())


@dataclass(frozen=True)
class Match:
    """A line matched by a pattern: the pattern and the fields it extracted (group name -> text;
    groups that did not take part are absent; `rank` when the pattern extracts it and the line
    names one)."""
    pattern: LogPattern
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The pattern's name (the metric's `pattern` label)."""
        return self.pattern.name


_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"


def _work(n: str) -> str:
    """PyTorch's "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, ..., Timeout(ms)=600000)" up to its ")",
    the operation in group op<n>: the fields before OpType as `key=value, ` (at most 3), then up to
    300 characters that are no parenthesis or a short "(...)" (Timeout(ms)). Each character has one
    way to match (linear: see the module's docstring)."""
    return (rf"WorkNCCL\((?:\w{{1,24}}=\w{{1,24}}, ){{0,3}}OpType=(?P<op{n}>\w{{1,40}})\b"
            r"(?:[^()]|\(\w{0,8}\)){0,300}\)")


_WORD_END = r"\w{0,12}\b"  # the rest of a word ("fail" + "ure"), bounded: never the rest of the line
PATTERNS: tuple[LogPattern, ...] = (
    # Kernel: "NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus." (older drivers
    # write the address without "PCI:"). The code says what happened; the address which GPU.
    LogPattern("nvrm_xid", re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\): (?P<xid>\d{{1,6}})\b"),
               ("Xid",), "critical", "GpuXidFromLogs",
               "Kernel Xid line of the NVIDIA driver (any code; code and PCI address extracted)."),
    # PyTorch's ProcessGroupNCCL watchdog: "[Rank 3] Watchdog caught collective operation timeout:
    # WorkNCCL(SeqNum=5, OpType=ALLREDUCE, ...) ran for 600013 milliseconds before timing out.",
    # its blocking-wait form "... timed out in blocking wait." and 2.4's "[PG 0 Rank 3] Timeout at
    # NCCL work: 12, ..."; gloo's "Timed out waiting 3000ms for recv operation to complete" (the
    # text of the RuntimeError a collective raises) and monitored_barrier's "Rank 1 failed to pass
    # monitoredBarrier in 2000 ms"; and gloo's "Application timeout caused pair closure", what every
    # other pending or later operation of a process whose gloo wait timed out raises (its unbound
    # buffer closes all its pairs on the timeout: unbound_buffer.cc), sometimes the first error a
    # rank logs. Alternatives name their groups op2, ms3, ...: Python allows a group name once; the
    # digits are dropped when the fields are read.
    LogPattern("collective_timeout", re.compile(
        r"Watchdog caught collective operation timeout"
        rf"(?:: ?{_work('')}(?: ran for (?P<ms>\d{{1,12}}) milliseconds)?)?"
        rf"|{_work('2')} (?:ran for (?P<ms2>\d{{1,12}}) milliseconds before timing out|timed out in blocking wait)"
        r"|Timeout at NCCL work: \d"
        r"|Timed out waiting (?P<ms3>\d{1,12}) ?ms for (?:recv|send) operation to complete"
        r"|failed to pass monitoredBarrier in (?P<ms4>\d{1,12}) ms"
        r"|Application timeout caused pair closure"),
        ("Watchdog caught", "WorkNCCL", "Timeout at NCCL work", "Timed out waiting", "monitoredBarrier",
         "Application timeout"),
        "critical", "TrainingCollectiveTimeout",
        "A collective did not finish within the process group's timeout: NCCL watchdog or blocking "
        "wait, gloo send/recv or its pair closure, monitored barrier (operation and duration in ms "
        "extracted when given, and the rank).", rank=True),
    # gloo's tcp pair (pair.cc) when the peer's end of the connection goes: EOF, "Connection closed by
    # peer [10.0.0.2]:41822. This is typically caused by a remote worker crashing." (older gloo: the
    # first sentence only), or a reset, "Read error [10.0.0.2]:41822: Connection reset by peer. ..."
    # (a peer that exits with unread data, or closes its pairs hard after its own timeout). The peer
    # crashed, was killed or gave up: its own log says why. The address in brackets (IPv4, IPv6 or a
    # name) is extracted as `peer`; NCCL's "Connection closed by remote peer" is nccl_error's.
    LogPattern("collective_peer_crash", re.compile(
        r"Connection closed by peer \[(?P<peer>[^\]\s]{1,64})\]"
        r"|Read error \[(?P<peer2>[^\]\s]{1,64})\]:\d{1,5}: Connection reset by peer"),
        ("Connection closed by peer", "Connection reset by peer"), "critical", "TrainingCollectivePeerCrash",
        "A peer of a gloo collective closed or reset its connection: it crashed, was killed or gave up "
        "after its own timeout (the peer's address extracted, and the rank).", rank=True),
    LogPattern("cuda_oom", re.compile(
        r"(?:OutOfMemoryError: )?CUDA out of memory(?:\. Tried to allocate (?P<requested>[\d.]{1,12} [KMGT]i?B))?"
        r"(?:.{0,40}?GPU (?P<gpu>\d{1,4})(?: has a total capac|;))?"  # 2.1 wrote "capacty"
        r"|CUDA error: out of memory|Cuda failure 'out of memory'|cudaErrorMemoryAllocation"),
        ("out of memory", "cudaErrorMemoryAllocation"), "critical", "TrainingCudaOOM",
        "CUDA out of memory: torch.OutOfMemoryError, older RuntimeError, CUDA runtime error "
        "(requested size and GPU index extracted when given).", rank=True),
    LogPattern("cuda_illegal_address", re.compile(
        r"illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("illegal memory access", "IllegalAddress", "ILLEGAL_ADDRESS"), "critical", "TrainingCudaIllegalAddress",
        "CUDA illegal memory access (a kernel bug, or bad memory when it follows ECC errors).", rank=True),
    LogPattern("ecc_error", re.compile(
        r"uncorrectable ECC error|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE"
        rf"|[Rr]ow[ -]?[Rr]emap{_WORD_END}.{{0,60}}?\b(?:fail{_WORD_END}|pending\b|error\b)"),
        ("ECC", "emap"), "critical", "GpuEccErrorFromLogs",
        "Uncorrectable ECC error, or a row-remapping failure or pending remap."),
    # "NVLink CRC errors: 0" is no error: the lookahead's parts are disjoint (word, blanks, "count",
    # blanks, ":" or "="), so it has one way to match.
    LogPattern("nvlink_error", re.compile(
        rf"NVLink\b.{{0,80}}?\b(?:[Ee]rror|[Ff]atal|[Ff]ail{_WORD_END})\b"
        r"(?!\s{0,4}(?:count\w{0,4}\s{0,4})?[:=]\s{0,4}0\b)"
        r"|(?:nvidia-fabricmanager|nv-fabricmanager|[Ff]abric ?[Mm]anager)\b.{0,80}?"
        rf"\b(?:[Ee]rror|[Ff]atal|[Ff]ail{_WORD_END}|not running)\b"
        r"|NVSwitch\b.{0,80}?\b(?:[Ee]rror|[Ff]atal)\b|system not yet initialized"),
        ("NVLink", "abric", "NVSwitch", "not yet initialized"), "warning", "GpuNvlinkErrorFromLogs",
        "NVLink, NVSwitch or fabric manager error (the GPU may lose peer bandwidth or fail CUDA "
        "init with 'system not yet initialized')."),
    # Last: the timeout, OOM and illegal-address lines above also mention NCCL or ProcessGroupNCCL.
    LogPattern("nccl_error", re.compile(
        r"NCCL WARN\b|nccl(?:InternalError|SystemError|UnhandledCudaError|RemoteError|InvalidUsage"
        r"|InvalidArgument)\b|NCCL error\b|communicator was aborted|ncclCommWatchdog.{0,40}?"
        r"(?:terminated|exception)|NCCL watchdog thread terminated"),
        ("NCCL", "nccl"), "warning", "TrainingNcclError",
        "NCCL warning or error: WARN lines, ncclInternalError/SystemError/..., an aborted "
        "communicator, the watchdog thread ending.", rank=True),
)
BY_NAME: dict[str, LogPattern] = {p.name: p for p in PATTERNS}
_KEYWORDS = sorted({k for p in PATTERNS for k in p.keywords}, key=len, reverse=True)
# One scan per line settles most: a line without any pattern's keyword matches no pattern. The
# keywords it finds choose the patterns worth trying (most regexes cost µs on a line, the scan
# well under one): a found keyword selects every pattern with a keyword inside it, since the
# scan reports "WorkNCCL" and not the "NCCL" within it.
_PREFILTER = re.compile("|".join(re.escape(k) for k in _KEYWORDS))
_CANDIDATES: dict[str, frozenset[str]] = {
    found: frozenset(p.name for p in PATTERNS if any(k in found for k in p.keywords)) for found in _KEYWORDS}


def _fields(pattern: LogPattern, found: re.Match[str], line: str) -> dict[str, str]:
    """The named groups that matched (an alternative's groups op2, ms3, ... folded into op, ms),
    plus the line's rank when the pattern extracts it."""
    fields = {k.rstrip(_DIGITS): v for k, v in found.groupdict().items() if v is not None}
    if pattern.rank:
        rank = _RANK.search(line)
        if rank is not None:
            fields["rank"] = rank.group(1)
    return fields


def match(line: str) -> Match | None:
    """The first catalog pattern that matches anywhere in the first MAX_LINE_CHARS characters of
    `line` (one log line or record message), with its extracted fields; None when none does (most
    lines: they fail the prefilter). A longer line is matched on its start only and counted in
    truncated_total(). Never raises for a str; linear in min(len(line), MAX_LINE_CHARS), one
    regex scan for a line without any pattern's keyword. The one entry point of both the log
    handlers of training processes and the exporter's kernel-log watcher."""
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS]
        _count_truncated()
    keywords = _PREFILTER.findall(line)
    if not keywords:
        return None
    candidates = frozenset().union(*(_CANDIDATES[k] for k in set(keywords)))
    for pattern in PATTERNS:
        if pattern.name in candidates:
            found = pattern.regex.search(line)
            if found is not None:
                return Match(pattern, _fields(pattern, found, line))
    return None


def _count_truncated() -> None:
    global _truncated
    with _truncated_lock:
        _truncated += 1


def truncated_total() -> int:
    """Lines this process passed to match() that were longer than MAX_LINE_CHARS (matched on their
    start only) since it started; never decreases (a forked child starts from 0). Served as
    gpuobs_telemetry_log_lines_truncated_total by the exporter and the training metrics endpoint."""
    with _truncated_lock:
        return _truncated


def _at_fork_in_child() -> None:
    global _truncated, _truncated_lock
    _truncated_lock = threading.Lock()  # a parent thread may have held it at fork
    _truncated = 0


os.register_at_fork(after_in_child=_at_fork_in_child)
