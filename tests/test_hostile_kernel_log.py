"""The kernel-log watcher against hostile or broken input (issue 26): an earlier boot's dated lines
and another boot's journal entries are not counted; each corrupted state file starts clean with
one warning and the thread keeps counting; forged addresses and codes stay under the label-set cap
(also through a real `gpuobs exporter` child on the simulator); truncation, truncation refilled
within one poll, and rotation of a kern.log file."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import pytest
from conftest import free_port
from test_exporter_http import cli_exporter
from test_kernel_log import FIRST, LATER, MATCHES, XIDS, exporter_args, fake_journalctl, kmsg, scrape, wait, watcher

from gpuobs import catalog as c
from gpuobs.collect import kernel_log as kl
from gpuobs.collect.kernel_log import KernelLog, KernelLogWatcher, read_boot_time

OVERFLOW = "gpuobs_exporter_kernel_log_label_overflow_total"
TRUNCATIONS = "gpuobs_exporter_kernel_log_truncations_total"
BOOT = float(int(time.time()) - 5 * 86400)  # the boot the watcher is given; recent: syslog dates have no year
GPU_BUS = "00000000:18:00.0"


def syslog_line(t: float, message: str, host: str = "n1") -> str:
    """A kern.log line as rsyslog's traditional format writes it: local time, no year."""
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(t))
    return f"{stamp} {host} kernel: {message}\n"


def rfc3339_line(t: float, message: str) -> str:
    """A kern.log line as rsyslog's RFC 3339 format writes it."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".123456+00:00"
    return f"{stamp} n1 kernel: {message}\n"


def xid(bus: str, code: int) -> str:
    return f"NVRM: Xid (PCI:{bus}): {code}, pid=1, name=python, forged or real"


def rejected(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpuobs.kernel_log" and "state file rejected" in r.getMessage()]


def warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpuobs.kernel_log" and r.levelno >= logging.WARNING]


def served(w: KernelLogWatcher) -> list[float]:
    return [s.value for s in KernelLog(w).node_samples({})]


# ---------------------------------------------------------------------------- this boot only

def test_an_earlier_boots_dated_lines_are_not_counted_and_a_reboot_does_not_count_the_file_again(tmp_path):
    log_file = tmp_path / "kern.log"
    log_file.write_text(syslog_line(BOOT - 86400, xid("0000:18:00", 79))  # the boot before
                        + rfc3339_line(BOOT - 600, xid("0000:18:00", 48))
                        + syslog_line(BOOT + 30, xid("0000:18:00", 13))  # this boot
                        + rfc3339_line(BOOT + 40, xid("0000:2a:00", 31)))
    w = watcher(tmp_path, log_file, boot_time=BOOT).start()
    wait(lambda: w.totals().xids.total() == 2 and w.position.offset == log_file.stat().st_size, what="this boot")
    with log_file.open("a") as f:  # an old line written late: dated before the last one counted
        f.write(syslog_line(BOOT + 35, xid("0000:18:00", 94)) + syslog_line(BOOT + 50, xid("0000:18:00", 13)))
    wait(lambda: w.position.offset == log_file.stat().st_size, what="the appended lines")
    w.stop()
    assert dict(w.totals().xids) == {(GPU_BUS, "13"): 2, ("00000000:2A:00.0", "31"): 1}

    # a reboot: another boot id; the same file is read from its start and only the new boot counts
    (tmp_path / "boot_id").write_text("second-boot\n")
    with log_file.open("a") as f:
        f.write(syslog_line(BOOT + 7200, xid("0000:18:00", 45)))
    again = watcher(tmp_path, log_file, boot_time=BOOT + 7000).start()
    wait(lambda: again.position.offset == log_file.stat().st_size, what="the file read again")
    again.stop()
    assert dict(again.totals().xids) == {(GPU_BUS, "45"): 1}


def test_boot_time_read_from_proc_stat_else_uptime(tmp_path):
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1712345678\nprocesses 5\n")
    (tmp_path / "uptime").write_text("100.50 300.00\n")
    assert read_boot_time(str(tmp_path / "stat"), str(tmp_path / "uptime")) == 1712345678.0
    (tmp_path / "stat").write_text("cpu  1 2 3\n")
    assert abs(read_boot_time(str(tmp_path / "stat"), str(tmp_path / "uptime")) - (time.time() - 100.5)) < 5
    assert read_boot_time(str(tmp_path / "none"), str(tmp_path / "none")) == 0.0
    assert abs(read_boot_time() - (time.time() - float(Path("/proc/uptime").read_text().split()[0]))) < 5


def test_journal_entries_of_another_boot_are_not_counted(tmp_path, monkeypatch):
    (tmp_path / "boot_id").write_text("4f1c7d0e-0000-4000-8000-00000000aaaa\n")
    ours, other = "4f1c7d0e00004000800000000000aaaa", "0badb0070000400080000000000000bb"
    entries = tmp_path / "entries"
    lines = [(other, xid("0000:18:00", 79)), (ours, xid("0000:18:00", 13)), (other, xid("0000:2a:00", 48)),
             (None, xid("0000:2a:00", 31))]  # no _BOOT_ID: journalctl -b chose it
    entries.write_text("".join(json.dumps({"__CURSOR": f"s=a;i={i}", "MESSAGE": m,
                                           **({"_BOOT_ID": b} if b else {})}) + "\n"
                               for i, (b, m) in enumerate(lines))
                       + json.dumps({"__CURSOR": "s=a;i=4", "MESSAGE": [300, -1], "_BOOT_ID": 7}) + "\n"  # bytes? no
                       + json.dumps({"__CURSOR": "s=a;i=5", "MESSAGE": {"x": 1}}) + "\n")
    fake_journalctl(tmp_path, entries)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    w = watcher(tmp_path, "journal", journalctl="journalctl").start()
    wait(lambda: w.position.cursor == "s=a;i=5", what="the entries")
    assert w.up
    w.stop()
    assert dict(w.totals().xids) == {(GPU_BUS, "13"): 1, ("00000000:2A:00.0", "31"): 1}


# ------------------------------------------------------------------------- corrupted state

def _set(path: str, value):
    def corrupt(state: dict) -> dict:
        *parents, last = path.split(".")
        node = state
        for p in parents:
            node = node[p]
        node[last] = value
        return state
    return corrupt


def _first_count(value):
    def corrupt(state: dict) -> dict:
        state["xids"][0][2] = value
        return state
    return corrupt


CORRUPTIONS = {  # name: a change to the saved state (dict -> dict), or the file's text
    "seq as a string": _set("position.seq", "6"),
    "negative offset": _set("position.offset", -5),
    "seq 10**9": _set("position.seq", 10**9),
    "NaN count": "nan",
    "count -5": _first_count(-5),
    "count 1.5": _first_count(1.5),
    "count true": _first_count(True),
    "lost as a string": _set("lost", "0"),
    "unknown position field": _set("position.evil", 1),
    "position a list": _set("position", [1, 2]),
    "XID code not a code": lambda s: {**s, "xids": [["00000000:18:00.0", "9" * 20, 1]]},
    "PCI address not one": lambda s: {**s, "xids": [["../../etc", "79", 1]]},
    "label set twice": lambda s: {**s, "xids": s["xids"] + s["xids"][:1]},
    "20,000 label sets": lambda s: {**s, "xids": [[f"0000{i // 256:04X}:{i % 256:02X}:00.0", "79", 1]
                                                  for i in range(20_000)]},
    "gpus not an object": _set("gpus", ["x"]),
    "tail not hex": _set("position.tail", "zz"),
    "version as a string": _set("version", "1"),
    "boot id a number": _set("boot_id", 4),
    "garbage JSON": b"{\"version\": 1, \"boot_id\": ",
    "YAML": b"version: 1\nboot_id: 4f1c7d0e-boot-one\nposition: {seq: 3}\n",
    "top level a list": b"[1, 2, 3]",
    "top level a string": b"\"state\"",
    "not UTF-8": b"\xff\xfe\x00garbage",
    "empty": b"",
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_each_corrupted_state_file_starts_clean_with_one_warning(tmp_path, caplog, name):
    """The saved state of a real run, corrupted: one warning, the counts since boot counted again
    from the source (as a watcher without state counts them), only finite non-negative integers
    served, and the thread alive and counting what comes next."""
    log_file = tmp_path / "kmsg"
    log_file.write_text(kmsg(FIRST))
    fresh = watcher(tmp_path, log_file, state_path=None).start()  # what counting from boot gives
    wait(lambda: fresh.totals().matches.total() == 5, what="the fresh count")
    fresh.stop()
    first = watcher(tmp_path, log_file).start()
    wait(lambda: first.totals().matches.total() == 5, what="the first run")
    first.stop()
    state = tmp_path / "state.json"
    saved = json.loads(state.read_text())
    corruption = CORRUPTIONS[name]
    if name == "NaN count":
        state.write_text(json.dumps(saved).replace(json.dumps(saved["xids"][0]),
                                                   json.dumps(saved["xids"][0][:2])[:-1] + ", NaN]", 1))
    elif isinstance(corruption, bytes):
        state.write_bytes(corruption)
    else:
        state.write_text(json.dumps(corruption(saved)))

    caplog.set_level(logging.INFO, "gpuobs.kernel_log")
    w = watcher(tmp_path, log_file).start()
    wait(lambda: rejected(caplog), what="the warning")
    wait(lambda: w.totals() == fresh.totals(), what="the counts since boot")
    values = served(w)
    assert all(math.isfinite(v) and v >= 0 and v == int(v) for v in values), values
    with log_file.open("a") as f:
        f.write(kmsg(LATER, first_seq=len(FIRST)))
    wait(lambda: w.totals().matches.total() == 7, what="the later records")
    assert w.up and w._thread.is_alive()
    w.stop()
    assert len(rejected(caplog)) == 1 and len(warnings(caplog)) == 1, [r.getMessage() for r in warnings(caplog)]
    assert w.totals().xids[(GPU_BUS, "79")] == 2
    assert json.loads(state.read_text())["position"]["seq"] == len(FIRST) + len(LATER) - 1  # saved sound again


def test_a_journal_cursor_journalctl_refuses_starts_clean(tmp_path, monkeypatch, caplog):
    """A cursor of the right type that journalctl does not know: it exits at once; one warning,
    the cursor dropped, the boot's entries counted from the start."""
    entries = tmp_path / "entries"
    entries.write_text("".join(json.dumps({"__CURSOR": f"s=a;i={i}", "MESSAGE": m}) + "\n"
                               for i, (m, _) in enumerate(FIRST)))
    script = fake_journalctl(tmp_path, entries)
    script.write_text(script.read_text().replace("start = cursors.index(after) + 1 if after in cursors else 0",
                                                 "start = cursors.index(after) + 1 if after in cursors else "
                                                 "(sys.exit(1) if after else 0)"))
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    first = watcher(tmp_path, "journal", journalctl="journalctl").start()
    wait(lambda: first.totals().matches.total() == 5, what="the entries")
    first.stop()
    state = tmp_path / "state.json"
    state.write_text(state.read_text().replace("s=a;i=6", "s=forged"))
    caplog.set_level(logging.WARNING, "gpuobs.kernel_log")
    w = watcher(tmp_path, "journal", journalctl="journalctl").start()
    wait(lambda: w.totals() == first.totals() and w.up, what="the entries counted again")
    w.stop()
    assert len(rejected(caplog)) == 1 and len(warnings(caplog)) == 1


# -------------------------------------------------------------------------------- the cap

def forged_lines(n: int) -> str:
    """n undated "NVRM: Xid" lines, each with its own PCI address and XID code."""
    return "".join(xid(f"{i // 256:04x}:{i % 256:02x}:1f", 100 + i % 900) + "\n" for i in range(n))


def test_forged_addresses_stay_under_the_cap_and_the_real_gpus_keep_their_room(tmp_path):
    log_file = tmp_path / "kern.log"
    log_file.write_text(forged_lines(20_000) + xid("0000:00:1f", 99999) + "\n")  # an XID code that is none
    w = watcher(tmp_path, log_file)
    w.note_gpu(GPU_BUS, "0", "GPU-real")
    w.start()
    wait(lambda: w.position.offset == log_file.stat().st_size, timeout=60, what="the forged lines")
    with log_file.open("a") as f:  # the real GPU's XIDs after the flood still get their series
        f.write(xid("0000:18:00", 79) + "\n" + xid("0000:18:00", 48) + "\n")
    wait(lambda: w.totals().xids[(GPU_BUS, "48")] == 1, what="the real XIDs")
    w.stop()
    counts = w.totals()
    forged = {k: n for k, n in counts.xids.items() if k[0] != GPU_BUS}
    assert len(forged) == kl.MAX_UNKNOWN_LABEL_SETS and set(forged.values()) == {1}
    assert len(counts.xids) <= kl.MAX_LABEL_SETS and len(counts.matches) <= kl.MAX_LABEL_SETS
    assert counts.overflow == 20_001 - len(forged)
    assert counts.xids[(GPU_BUS, "79")] == 1
    restored = watcher(tmp_path, log_file).start()  # a state at the cap is a valid state
    assert restored.totals() == counts
    restored.stop()


def test_exporter_under_20000_forged_xid_lines(tmp_path):
    """A real exporter on the simulator reading a kern.log of 20,000 forged XID lines (distinct
    addresses and codes): its kernel-log series stay under the cap, the rest is counted in the
    overflow counter, and a real GPU's XID written afterwards is still served."""
    source, state = tmp_path / "kern.log", tmp_path / "kernel-log.json"
    source.write_text(forged_lines(20_000))
    port = free_port()
    with cli_exporter(tmp_path, exporter_args(source, state, port), port=port) as (_, url, _):
        def overflowed(samples):
            return [v for n, _, v in samples if n == OVERFLOW] == [20_000 - kl.MAX_UNKNOWN_LABEL_SETS]
        wait(lambda: overflowed(scrape(url)), timeout=60, what="the forged lines")
        with source.open("a") as f:
            f.write(xid("0000:18:00", 79) + "\n")
        wait(lambda: any(n == XIDS and labels["pci_bus_id"] == GPU_BUS for n, labels, _ in scrape(url)),
             what="the real XID")
        samples = scrape(url)
    xids = [(labels, v) for n, labels, v in samples if n == XIDS]
    matches = [labels for n, labels, _ in samples if n == MATCHES]
    assert len(xids) == kl.MAX_UNKNOWN_LABEL_SETS + 1 and len(matches) == kl.MAX_UNKNOWN_LABEL_SETS + 1
    assert [(labels["gpu"], labels["xid"], v) for labels, v in xids if labels["pci_bus_id"] == GPU_BUS] == [
        ("0", "79", 1.0)]
    assert overflowed(samples)


def test_exporter_skips_an_earlier_boots_lines_by_the_real_boot_time(tmp_path):
    """The exporter child reads this machine's boot time itself: XIDs dated before it are not
    counted, those after it are."""
    boot = read_boot_time()
    source, state = tmp_path / "kern.log", tmp_path / "kernel-log.json"
    source.write_text(syslog_line(boot - 3600, xid("0000:18:00", 79))
                      + rfc3339_line(boot - 60, xid("0000:18:00", 48))
                      + syslog_line(boot + 60, xid("0000:18:00", 13))
                      + rfc3339_line(time.time(), xid("0000:2a:00", 31)))
    port = free_port()
    with cli_exporter(tmp_path, exporter_args(source, state, port), port=port) as (_, url, _):
        def xids(samples):
            return {(labels["gpu"], labels["xid"]): v for n, labels, v in samples if n == XIDS}
        wait(lambda: xids(scrape(url)) == {("0", "13"): 1.0, ("1", "31"): 1.0}, what="this boot's XIDs")
        time.sleep(1.0)
        assert xids(scrape(url)) == {("0", "13"): 1.0, ("1", "31"): 1.0}


# ------------------------------------------------------------------------ truncation, rotation

def dated_xids(start: float, codes) -> str:
    return "".join(syslog_line(start + i, xid("0000:18:00", code)) for i, code in enumerate(codes))


def test_truncate_then_refill_within_one_poll_loses_nothing_and_is_counted(tmp_path, caplog):
    log_file = tmp_path / "kern.log"
    log_file.write_text(dated_xids(BOOT + 10, [13, 13, 13]))
    w = watcher(tmp_path, log_file, boot_time=BOOT)
    w.poll_s = 1.0  # a long poll: the refill below happens within one
    w.start()
    wait(lambda: w.totals().xids.total() == 3 and w.position.offset == log_file.stat().st_size, what="the first")
    time.sleep(0.1)  # the watcher waits out its poll at the end of the file
    caplog.set_level(logging.WARNING, "gpuobs.kernel_log")
    with log_file.open("r+") as f:  # truncated and written again, longer than what was read
        f.truncate(0)
        f.write(dated_xids(BOOT + 20, [31, 43, 45, 48, 61, 62, 63]))
    wait(lambda: w.totals().truncated == 1 and w.totals().xids.total() == 10, what="the refill")
    time.sleep(0.3)
    assert w.up
    w.stop()
    assert {code: n for (_, code), n in w.totals().xids.items()} == {
        "13": 3, "31": 1, "43": 1, "45": 1, "48": 1, "61": 1, "62": 1, "63": 1}
    assert len([r for r in warnings(caplog) if "truncated" in r.getMessage()]) == 1
    assert [s.value for s in KernelLog(w).node_samples({}) if s.metric is c.KERNEL_LOG_TRUNCATED] == [1.0]


def test_truncated_while_the_exporter_was_down(tmp_path):
    log_file = tmp_path / "kern.log"
    log_file.write_text(dated_xids(BOOT + 10, [13, 13]))
    w = watcher(tmp_path, log_file, boot_time=BOOT).start()
    wait(lambda: w.totals().xids.total() == 2 and w.position.offset == log_file.stat().st_size, what="the first")
    w.stop()
    with log_file.open("r+") as f:  # same inode, same length, other bytes
        f.truncate(0)
        f.write(dated_xids(BOOT + 20, [79, 94]))
    again = watcher(tmp_path, log_file, boot_time=BOOT).start()
    wait(lambda: again.totals().xids.total() == 4, what="the new lines")
    again.stop()
    assert again.totals().truncated == 1 and again.totals().xids[(GPU_BUS, "79")] == 1


def test_plain_truncation_and_rotation(tmp_path, caplog):
    """copytruncate (shorter: counted as a truncation) and rename-and-create rotation (the old
    file read to its end, then the new one from its start: nothing lost, no truncation)."""
    log_file = tmp_path / "kern.log"
    log_file.write_text(dated_xids(BOOT + 10, [13, 13]))
    w = watcher(tmp_path, log_file, boot_time=BOOT).start()
    wait(lambda: w.totals().xids.total() == 2, what="the first")
    log_file.write_text("")
    wait(lambda: w.totals().truncated == 1, what="the truncation")
    with log_file.open("a") as f:
        f.write(dated_xids(BOOT + 20, [31]))
    wait(lambda: w.totals().xids.total() == 3, what="after the truncation")
    with log_file.open("a") as f:
        f.write(dated_xids(BOOT + 30, [48]))  # the old file's last line, then rename-and-create
    log_file.rename(tmp_path / "kern.log.1")
    log_file.write_text(dated_xids(BOOT + 40, [79]))
    wait(lambda: w.totals().xids.total() == 5, what="both files")
    assert w.up
    w.stop()
    counts = w.totals()
    assert {code: n for (_, code), n in counts.xids.items()} == {"13": 2, "31": 1, "48": 1, "79": 1}
    assert counts.truncated == 1 and counts.lost == 0


def test_a_sequence_number_ahead_of_a_replayed_ring_starts_clean(tmp_path, caplog):
    """/dev/kmsg replays its ring on open (a FIFO stands in): a saved sequence number beyond every
    record of the replay is not of this boot's log: one warning, and the next replay is counted."""
    source = tmp_path / "kmsg.fifo"
    os.mkfifo(source)
    keep = os.open(source, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(keep, kmsg(FIRST).encode())
        first = watcher(tmp_path, source).start()
        wait(lambda: first.totals().matches.total() == 5, what="the first records")
        first.stop()
        state = tmp_path / "state.json"
        state.write_text(json.dumps(_set("position.seq", 10**9)(json.loads(state.read_text()))))
        caplog.set_level(logging.WARNING, "gpuobs.kernel_log")
        os.write(keep, kmsg(FIRST).encode())  # the replay on open
        w = watcher(tmp_path, source).start()
        wait(lambda: rejected(caplog), what="the warning")
        os.write(keep, kmsg(FIRST).encode())  # the replay on the next open
        wait(lambda: w.totals() == first.totals(), what="the replay counted from zero")
        assert w.up
        w.stop()
    finally:
        os.close(keep)
    assert len(warnings(caplog)) == 1
