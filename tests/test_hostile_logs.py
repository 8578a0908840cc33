"""Hostile log lines (issue 26, acceptance 2): any catalog pattern on any 64 KiB line takes under
5 ms, and a training process whose gpuobs.logs handler matches such lines never pauses a step
for longer than that.

The lines are built to attack each pattern: its literals repeated without the parts that close a
match ("WorkNCCL(" + "OpType=A, " thousands of times, "Watchdog caught collective operation
timeout:" + "OpType=" fragments), long runs of what a quantifier accepts (digits, word characters,
blanks, parentheses) after each keyword, and real signal lines padded to 64 KiB. Timings run in a
child process (nothing else of the test session in it), the median of several runs per line, a
line retried before it fails (the machine is slow and shared); the catalog's patterns are
linear, so a slow line is slow every time while load comes and goes. The former
collective_timeout and nvlink_error patterns (nested or adjacent unbounded quantifiers) are kept
here to show the lines are hostile: on a sixteenth of a line they already take over the budget."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from test_logpatterns import EXAMPLES

from gpuobs import logpatterns as lp

REPO = Path(__file__).resolve().parents[1]
LINE = 64 * 1024
BUDGET_S = 0.005  # the bound per line
# The patterns as they were before issue 26: super-linear on the lines below
OLD = {
    "collective_timeout": re.compile(
        r"Watchdog caught collective operation timeout(?::.*?OpType=(?P<op>\w+))?"
        r"(?:.*?ran for (?P<ms>\d+) milliseconds)?"
        r"|WorkNCCL\(.*?OpType=(?P<op2>\w+).*?\) (?:ran for (?P<ms2>\d+) milliseconds before timing out"
        r"|timed out in blocking wait)"),
    "nvlink_error": re.compile(
        r"NVLink\b.{0,80}?\b(?:[Ee]rror|[Ff]atal|[Ff]ail\w*)\b(?!\w*\s*(?:count\w*)?\s*[:=]\s*0\b)"),
    "ecc_error": re.compile(r"[Rr]ow[ -]?[Rr]emap\w*\b.{0,60}?\b(?:fail\w*|pending|error)\b"),
}


def fill(unit: str, head: str = "", tail: str = "", size: int = LINE) -> str:
    """head + unit repeated + tail, exactly `size` characters."""
    body = unit * ((size - len(head) - len(tail)) // len(unit) + 1)
    return head + body[:size - len(head) - len(tail)] + tail


def _attacks() -> dict[str, str]:
    """Name -> a 64 KiB line, hand-made against each pattern's quantifiers."""
    watchdog = "Watchdog caught collective operation timeout"
    return {
        "watchdog+optype": fill("OpType=A ", watchdog + ":"),
        "watchdog+work": fill("OpType=ALLREDUCE, x=1) ran for ", watchdog + ": WorkNCCL("),
        "watchdog repeated": fill(watchdog + ": WorkNCCL(OpType=X"),
        "worknccl+optype": fill("WorkNCCL(OpType=A, x) "),
        "worknccl nested": fill("OpType=ALLREDUCE, Timeout(ms)=1) ", "WorkNCCL("),
        "worknccl+fields": fill("SeqNum=1, ", "WorkNCCL("),
        "worknccl repeated": fill("WorkNCCL("),
        "worknccl parens": fill("(ms)", "WorkNCCL(OpType=ALLREDUCE"),
        "gloo digits": fill("1", "Timed out waiting "),
        "gloo repeated": fill("Timed out waiting 1"),
        "barrier digits": fill("1", "failed to pass monitoredBarrier in "),
        "oom repeated": fill("CUDA out of memory. GPU "),
        "oom digits": fill("1", "CUDA out of memory. Tried to allocate "),
        "remap words": fill("Rowremap"),
        "remap fail": fill("Row remap failx"),
        "remap spaces": fill(" ", "Row remap"),
        "nvlink zero counts": fill("NVLink error: 0 "),
        "nvlink blanks": fill(" ", "NVLink error"),
        "nvlink fail words": fill("NVLink fail"),
        "nvlink count blanks": fill(" ", "NVLink error count"),
        "fabric zero": fill("Fabric Manager failure: 0 "),
        "nvswitch": fill("NVSwitch "),
        "nccl watchdog": fill("ncclCommWatchdog "),
        "xid digits": fill("1", "NVRM: Xid (PCI:0000:18:00): "),
        "xid repeated": fill("NVRM: Xid (PCI:0000:18:00): 1"),
        "rank repeated": fill("[Rank 1"),
        "rank digits": fill("1", "[Rank "),
        "keywords": fill("NCCLWorkNCCLXidemapNVLinkabric"),
        "mixed": fill("NVLink NVSwitch Fabric Manager Row remap ncclCommWatchdog WorkNCCL(OpType=A NVLink error: 0 "),
    }


def hostile_lines() -> dict[str, str]:
    """The hand-made attacks, each pattern's keywords followed by runs of what its quantifiers
    accept, and real signal lines padded to 64 KiB (matched and truncated)."""
    lines = _attacks()
    for p in lp.PATTERNS:
        for k in p.keywords:
            for run in (" ", "a", "1", "(", ":", k, k + " ", k + "("):
                lines[f"{p.name}: {k!r} + {run!r}*"] = fill(run, k)
    for name, (good, _bad) in EXAMPLES.items():
        lines[f"{name}: signal padded"] = fill(" x", good[0][0])
    return lines


def _run_child(script: str, *args: str, timeout: float = 240) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


TIMING = textwrap.dedent('''
    import gc, json, statistics, sys, time
    from gpuobs import logpatterns as lp

    lines, budget = json.load(open(sys.argv[1])), float(sys.argv[2])


    def median(fn, arg, runs=5):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn(arg)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


    def settled(fn, arg):
        """The median of 5 runs; a line over budget is measured again (up to 4 times), the best kept:
        a linear pattern gets under once the machine has a quiet moment, a super-linear one never."""
        best = median(fn, arg)
        for _ in range(4):
            if best < budget:
                break
            time.sleep(0.05)
            best = min(best, median(fn, arg))
        return best


    gc.disable()
    out = {}
    for name, line in lines.items():
        capped = line[:lp.MAX_LINE_CHARS]
        out[name] = {"match": settled(lp.match, line),
                     **{p.name: settled(p.regex.search, capped) for p in lp.PATTERNS}}
    print(json.dumps(out))
''')


def test_every_pattern_on_every_hostile_64k_line_is_under_5ms(tmp_path):
    lines = hostile_lines()
    assert all(len(line) == LINE for line in lines.values())
    path = tmp_path / "lines.json"
    path.write_text(json.dumps(lines))
    times = _run_child(TIMING, str(path), str(BUDGET_S))
    assert set(times) == set(lines)
    slow = {(name, what): round(t * 1000, 2) for name, row in times.items() for what, t in row.items()
            if t >= BUDGET_S}
    assert not slow, f"over {BUDGET_S * 1000:g} ms (ms): {slow}"


def test_the_attacks_are_hostile_to_the_former_patterns():
    """The same lines, a sixteenth of their length, against the former patterns: each already takes
    longer than the whole budget (super-linear: the full line would take seconds). Being slower
    here only makes the point stronger, so load cannot make this fail."""
    attacks = _attacks()
    for name, attack in (("collective_timeout", "worknccl+optype"), ("collective_timeout", "worknccl nested"),
                         ("nvlink_error", "nvlink blanks"), ("ecc_error", "remap words")):
        part = attacks[attack][:LINE // 16]
        t0 = time.perf_counter()
        old = OLD[name].search(part)
        assert time.perf_counter() - t0 > BUDGET_S, (name, attack)
        assert (old is None) == (lp.BY_NAME[name].regex.search(part) is None)  # and the new one agrees


def test_only_the_start_of_a_long_line_is_matched_and_counted():
    signal = "NVRM: Xid (PCI:0000:18:00): 79, pid=4133, name=python, GPU has fallen off the bus."
    before = lp.truncated_total()
    found = lp.match(fill(" ", signal))  # the signal at the start: matched, the line counted
    assert found is not None and found.fields == {"pci": "0000:18:00", "xid": "79"}
    assert lp.truncated_total() == before + 1
    assert lp.match(fill(" ", tail=signal)) is None  # beyond the cap: not looked at
    assert lp.match(" " * (lp.MAX_LINE_CHARS - len(signal)) + signal) is not None  # at the cap: whole
    assert lp.truncated_total() == before + 2


STEPS = textwrap.dedent('''
    import json, logging, os, sys, threading, time
    from gpuobs import logpatterns as lp, logs

    lines = list(json.load(open(sys.argv[1])).values())
    logs.configure("info", stream=open(os.devnull, "w"))
    log = logging.getLogger("train")
    # Threads take turns at the GIL every 0.5 ms rather than 5 ms: a pause longer than that is
    # one call holding the GIL (a regex search in C does), not the interpreter's time slicing.
    sys.setswitchinterval(0.0005)
    before = (sum(logs.pattern_matches_total().values()), lp.truncated_total())

    # A step that logs: each line once per round, the step's duration kept per line (best round).
    in_step = [float("inf")] * len(lines)
    for _ in range(5):
        for i, line in enumerate(lines):
            t0 = time.perf_counter()
            log.error(line)
            in_step[i] = min(in_step[i], time.perf_counter() - t0)

    # Empty steps while another thread logs one line: the longest gap between two step ends, per
    # line the best of up to 5 rounds (short rounds: the OS's own preemptions, in 4 ms ticks on a
    # busy machine, land in some of them only; a slow match would lengthen every one).
    def gap(line):
        worker = threading.Thread(target=log.error, args=(line,))
        last, longest = time.perf_counter(), 0.0
        worker.start()
        while worker.is_alive():
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        worker.join()
        return max(longest, time.perf_counter() - last)

    gaps = []
    for line in lines:
        best = gap(line)
        for _ in range(4):
            if best < 0.005:
                break
            best = min(best, gap(line))
        gaps.append(best)
    after = (sum(logs.pattern_matches_total().values()), lp.truncated_total())
    print(json.dumps({"in_step": max(in_step), "gap": max(gaps), "matched": after[0] - before[0],
                      "truncated": after[1] - before[1]}))
''')


def test_a_training_loop_logging_hostile_lines_never_pauses_over_5ms(tmp_path):
    """In a process with gpuobs.logs configured (JSON lines, the catalog's filter on the handler):
    no step that logs a hostile 64 KiB line takes 5 ms, and empty steps while another thread logs
    one never wait 5 ms between two step ends (threads switch every 0.5 ms: a regex search holds
    the GIL for as long as it runs). Per line the best of a few rounds: a slow match shows in each
    round, the machine's load only in some."""
    lines = hostile_lines()
    path = tmp_path / "lines.json"
    path.write_text(json.dumps(lines))
    out = _run_child(STEPS, str(path))
    assert out["truncated"] >= 6 * len(lines)  # every line went through the matcher, each time
    assert out["matched"] >= 6 * len(EXAMPLES)  # the padded signal lines at least matched
    assert out["in_step"] < BUDGET_S, out
    assert out["gap"] < BUDGET_S, out


def test_the_filter_matches_a_long_record_in_bounded_time_and_lets_it_through():
    """The logging filter of this process: a hostile record passes through untouched and the
    match is counted (the budget here is loose: this process runs the whole test session)."""
    from gpuobs.logs import PatternFilter

    record = logging.LogRecord("x", logging.ERROR, __file__, 1, _attacks()["worknccl nested"], (), None)
    t0 = time.perf_counter()
    assert PatternFilter().filter(record) is True
    assert time.perf_counter() - t0 < 0.5
    assert len(record.getMessage()) == LINE and "log_pattern" not in record.__dict__
