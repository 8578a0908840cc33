"""The kernel-log watcher (gpuobs.collect.kernel_log): XIDs and driver messages counted per GPU from
a file, a FIFO or a fake journalctl standing in for /dev/kmsg, exactly once across exporter
restarts (a real `gpuobs exporter` child on the simulator), reset by a new boot id; lost records;
a source that cannot be read."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import free_port
from test_exporter_http import SCENARIO, clean_env, cli_exporter, fetch, parse

from gpuobs.collect import kernel_log as kl
from gpuobs.collect.kernel_log import KernelLogWatcher, parse_record, pci_bus_id, resolve

XIDS = "gpuobs_gpu_kernel_xid_errors_total"
MATCHES = "gpuobs_gpu_kernel_log_matches_total"
UP = "gpuobs_exporter_kernel_log_up"
LOST = "gpuobs_exporter_kernel_log_records_lost_total"

# The 8xH100 scenario's GPUs sit on the HGX buses 18, 2A, 3A, 5D, 9A, AB, BA, DB (NVML: 00000000:18:00.0).
FIRST = [  # (message, continuation lines): what the kernel logged before the exporter started
    ("NVRM: Xid (PCI:0000:18:00): 79, pid=4133, name=python, GPU has fallen off the bus.", [" SUBSYSTEM=pci"]),
    ("usb 1-1: new high-speed USB device number 2 using xhci_hcd", []),
    ("NVRM: Xid (PCI:0000:2a:00): 13, pid=2197, name=pt_main_thread, Graphics SM Warp Exception", []),
    ("NVRM: Xid (0000:2A:00): 13, 0001 00000000 0000a1c0 00000e00 00000000", [" DEVICE=+pci:0000:2a:00.0"]),
    ("NVRM: NVLink: fatal error detected on link 3 (0x40000)", []),
    ("NVRM: Xid (PCI:0000:ee:00): 48, pid=1, An uncorrectable double bit error", []),  # no GPU has ee
    ("EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode", []),
]
LATER = [  # while the exporter was down
    ("NVRM: Xid (PCI:0000:18:00): 79, pid=4133, name=python, GPU has fallen off the bus.", []),
    ("NVRM: Xid (PCI:0000:db:00): 94, pid=77, name=python, Contained ECC error", []),
    ("systemd[1]: Started Session 4 of user root.", []),
]


def kmsg(records, first_seq: int = 0) -> str:
    """/dev/kmsg's text for these records: "prio,seq,usec,flags;message" and continuation lines."""
    out = []
    for i, (message, more) in enumerate(records):
        out.append(f"{4 if 'NVRM' in message else 6},{first_seq + i},{(first_seq + i) * 1000 + 17},-;{message}\n")
        out += [line + "\n" for line in more]
    return "".join(out)


# ------------------------------------------------------------------------------------ unit level

@pytest.mark.parametrize("address, nvml", [
    ("0000:18:00", "00000000:18:00.0"), ("0000:ca:00", "00000000:CA:00.0"), ("00000000:3B:00.0", "00000000:3B:00.0"),
    ("0001:3b:00.1", "00000001:3B:00.1"), ("00000000:ab:01", "00000000:AB:01.0"), ("0:5d:0", "00000000:5D:00.0")])
def test_pci_addresses_normalised_to_nvml_form(address, nvml):
    assert pci_bus_id(address) == nvml


@pytest.mark.parametrize("text", ["", "nope", "0000:18", "0000:118:00", "0000:18:00.9", "000000000:18:00"])
def test_pci_addresses_refused(text):
    assert pci_bus_id(text) is None


def test_records_parsed():
    assert parse_record("4,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1") == (
        1234, "NVRM: Xid (PCI:0000:18:00): 79, pid=1")
    assert parse_record("6,7,8,c,more;text; with ; semicolons") == (7, "text; with ; semicolons")
    assert parse_record(" SUBSYSTEM=pci") is None and parse_record("") is None
    plain = "Mar 05 23:33:35 node7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1"
    assert parse_record(plain) == (None, plain)


def test_resolve_sources(tmp_path, monkeypatch):
    assert resolve("off") is None
    assert resolve("journal", journalctl="/bin/jc") == ("journal", "/bin/jc")
    assert resolve(str(tmp_path / "kern.log")) == ("file", str(tmp_path / "kern.log"))
    assert resolve("/dev/null") == ("kmsg", "/dev/null")  # a character device is read as /dev/kmsg
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve("auto", kmsg=str(tmp_path / "none"), journalctl="journalctl") == ("kmsg", str(tmp_path / "none"))
    fake = fake_journalctl(tmp_path, tmp_path / "entries")
    assert resolve("auto", kmsg=str(tmp_path / "none")) == ("journal", str(fake))
    (tmp_path / "kmsg").write_text("")
    assert resolve("auto", kmsg=str(tmp_path / "kmsg")) == ("kmsg", str(tmp_path / "kmsg"))


def watcher(tmp_path, source, **kw) -> KernelLogWatcher:
    kw.setdefault("state_path", str(tmp_path / "state.json"))
    kw.setdefault("boot_id_path", str(tmp_path / "boot_id"))
    kw.setdefault("boot_time", 0.0)  # the dated lines here are of this boot whenever the tests run
    if not Path(kw["boot_id_path"]).exists():
        Path(kw["boot_id_path"]).write_text("4f1c7d0e-boot-one\n")
    return KernelLogWatcher(str(source), poll_s=0.05, retry_s=0.05, **kw)


def wait(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_counts_since_boot_and_a_new_boot_id_resets(tmp_path):
    log_file = tmp_path / "kmsg"
    log_file.write_text(kmsg(FIRST))
    w = watcher(tmp_path, log_file).start()
    wait(lambda: w.totals().matches.total() == 5, what="the first records")
    w.stop()
    counts = w.totals()
    assert counts.xids == {("00000000:18:00.0", "79"): 1, ("00000000:2A:00.0", "13"): 2, ("00000000:EE:00.0", "48"): 1}
    assert counts.matches[("", "nvlink_error")] == 1 and counts.lost == 0
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["boot_id"] == "4f1c7d0e-boot-one" and saved["position"]["seq"] == len(FIRST) - 1

    # the same boot: restored; the ring buffer replayed from its start is not counted again
    again = watcher(tmp_path, log_file).start()
    assert again.totals() == counts
    with log_file.open("a") as f:
        f.write(kmsg(LATER, first_seq=len(FIRST)))
    wait(lambda: again.totals().matches.total() == 7, what="the later records")
    again.stop()
    assert again.totals().xids[("00000000:18:00.0", "79")] == 2

    # a reboot: a new boot id and a new ring buffer whose sequence numbers start again at 0
    (tmp_path / "boot_id").write_text("9a2e-boot-two\n")
    log_file.unlink()
    log_file.write_text(kmsg([("NVRM: Xid (PCI:0000:18:00): 31, pid=5, MMU Fault", [])]))
    rebooted = watcher(tmp_path, log_file).start()
    wait(lambda: rebooted.totals().matches.total() == 1, what="the new boot's record")
    rebooted.stop()
    assert rebooted.totals().xids == {("00000000:18:00.0", "31"): 1}


def test_a_lost_gpu_keeps_its_labels_across_a_restart(tmp_path):
    """The family labels a line with the GPU seen at its address in this boot, kept in the state
    file: an XID 79 GPU, gone from NVML after the restart, keeps its index and UUID."""
    from gpuobs import catalog as c
    from gpuobs.collect.kernel_log import KernelLog

    log_file = tmp_path / "kmsg"
    log_file.write_text(kmsg(FIRST[:1]))
    w = watcher(tmp_path, log_file).start()
    w.note_gpu("00000000:18:00.0", "3", "GPU-lost")
    wait(lambda: w.totals().xids, what="the XID")
    w.stop()
    again = watcher(tmp_path, log_file).start()
    samples = KernelLog(again).node_samples({"GPU-other": 0})  # the lost GPU is not among the known ones
    again.stop()
    xids = [(s.labels, s.value) for s in samples if s.metric is c.KERNEL_XID_ERRORS]
    assert xids == [(("3", "GPU-lost", "00000000:18:00.0", "79"), 1.0)]
    assert [s.labels for s in samples if s.metric is c.KERNEL_LOG_UP] == [("file",)]


def test_plain_file_resumes_at_its_offset(tmp_path):
    log_file = tmp_path / "kern.log"
    log_file.write_text("Dec  1 10:00:00 n1 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, fallen off\n"
                        "Dec  1 10:00:01 n1 kernel: NVRM: Xid (PCI:0000:18:00): 45, pid=1, Preemptive clean")
    w = watcher(tmp_path, log_file).start()  # the second line is not complete: not counted yet
    wait(lambda: w.totals().xids, what="the first line")
    w.stop()
    assert dict(w.totals().xids) == {("00000000:18:00.0", "79"): 1}
    with log_file.open("a") as f:
        f.write("up\nDec  1 10:00:02 n1 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=2, fallen off\n")
    again = watcher(tmp_path, log_file).start()
    wait(lambda: again.totals().matches.total() == 3, what="the appended lines")
    time.sleep(0.2)
    again.stop()
    assert dict(again.totals().xids) == {("00000000:18:00.0", "79"): 2, ("00000000:18:00.0", "45"): 1}


def test_overwritten_records_are_counted_lost(tmp_path, monkeypatch, caplog):
    """EPIPE from read(2) (the kernel overwrote records) and the sequence gap after it: lost, and
    reading goes on. A fake read raises EPIPE once, where /dev/kmsg would."""
    log_file = tmp_path / "kmsg"
    log_file.write_text("")
    real_read, calls = os.read, []

    def read(fd, n):
        calls.append(fd)
        if len(calls) == 2:
            raise BrokenPipeError(32, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(kl.os, "read", read)
    w = watcher(tmp_path, log_file, state_path=None)
    caplog.set_level(logging.WARNING, "gpuobs.kernel_log")
    with log_file.open("a") as f:
        f.write(kmsg(FIRST[:2], first_seq=10))
    w.start()
    wait(lambda: len(calls) >= 3, what="the EPIPE")
    with log_file.open("a") as f:  # 12..19 were overwritten: the next record read is 20
        f.write(kmsg(FIRST[2:3], first_seq=20))
    wait(lambda: w.totals().xids.total() == 2, what="the record after the gap")
    assert w.totals().lost == 8 and w.up
    w.stop()
    assert any("overwritten" in r.getMessage() for r in caplog.records)


def test_missing_source_and_unwritable_state(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "gpuobs.kernel_log")
    w = watcher(tmp_path, tmp_path / "absent", state_path=str(tmp_path / "no-dir" / "state.json")).start()
    time.sleep(0.5)  # several retries
    assert not w.up
    down = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(down) == 1, "one warning, not one per retry"
    (tmp_path / "absent").write_text(kmsg(FIRST[:1]))
    wait(lambda: w.up and w.totals().xids.total() == 1, what="the source to appear")
    w.stop()  # the state directory does not exist: persistence off, counting unaffected
    assert any("cannot be written" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "no-dir").exists()


def fake_journalctl(tmp_path: Path, entries: Path) -> Path:
    """A `journalctl` on PATH that prints the JSON entries of `entries` after --after-cursor (or
    all) and then follows, as `journalctl -k -b -f -o json` would; its arguments go to args.log."""
    script = tmp_path / "journalctl"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys, time
        open({str(tmp_path / 'args.log')!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
        after = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--after-cursor=")), None)
        lines = open({str(entries)!r}).read().splitlines()
        cursors = [json.loads(l)["__CURSOR"] for l in lines]
        start = cursors.index(after) + 1 if after in cursors else 0
        for line in lines[start:]:
            print(line, flush=True)
        time.sleep(60)
    """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def journal_entries(records, first: int = 0) -> str:
    return "".join(json.dumps({"__CURSOR": f"s=abc;i={first + i:x}", "MESSAGE": m, "_TRANSPORT": "kernel"}) + "\n"
                   for i, (m, _) in enumerate(records))


def test_journal_source_resumes_after_its_cursor(tmp_path, monkeypatch):
    entries = tmp_path / "entries"
    not_utf8 = {"MESSAGE": [78, 86, 82, 77, 58, 32, 255], "__CURSOR": "s=abc;i=ff"}  # journald's bytes form
    entries.write_text(journal_entries(FIRST) + json.dumps(not_utf8) + "\n")
    fake_journalctl(tmp_path, entries)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    w = watcher(tmp_path, "journal", journalctl="journalctl").start()
    assert w.kind == "journal"
    wait(lambda: w.totals().matches.total() == 5, what="the journal entries")
    assert w.up
    w.stop()
    assert json.loads((tmp_path / "state.json").read_text())["position"]["cursor"] == "s=abc;i=ff"
    with entries.open("a") as f:
        f.write(journal_entries(LATER, first=0x100))
    again = watcher(tmp_path, "journal", journalctl="journalctl").start()
    wait(lambda: again.totals().matches.total() == 7, what="the later entries")
    time.sleep(0.2)
    again.stop()
    assert again.totals().xids[("00000000:18:00.0", "79")] == 2
    args = (tmp_path / "args.log").read_text().splitlines()
    assert args[0] == "-k -b -f -o json --no-tail" and args[1].endswith("--after-cursor=s=abc;i=ff")


# --------------------------------------------------------------- through a real exporter process

def scrape(url: str) -> list[tuple[str, dict, float]]:
    status, _, body = fetch(url + "/metrics")
    assert status == 200
    return parse(body)


def uuids_by_bus(samples) -> dict[str, str]:
    return {labels["pci_bus_id"]: labels["uuid"] for name, labels, _ in samples if name == "gpuobs_gpu_info"}


def kernel_counts(samples) -> dict[tuple, float]:
    """{(metric, gpu, uuid, pci_bus_id, xid or pattern): value} of the kernel-log counters."""
    return {(name, labels["gpu"], labels["uuid"], labels["pci_bus_id"], labels.get("xid") or labels["pattern"]): v
            for name, labels, v in samples if name in (XIDS, MATCHES)}


def wait_scrape(url: str, predicate, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if predicate(samples):
            return samples
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {kernel_counts(samples)}"
        time.sleep(0.1)


def exporter_args(source: Path, state: Path, port: int) -> list[str]:
    return ["--simulate", str(SCENARIO), "--interval", "0.3", "--port", str(port), "--kernel-log", str(source),
            "--kernel-log-state", str(state)]


def expected(samples, later: bool) -> dict[tuple, float]:
    """The counters after FIRST (and LATER): per GPU with the simulator's UUIDs."""
    by_bus = uuids_by_bus(samples)
    b18, b2a, bdb = "00000000:18:00.0", "00000000:2A:00.0", "00000000:DB:00.0"
    g0, g1, g7 = ("0", by_bus[b18], b18), ("1", by_bus[b2a], b2a), ("7", by_bus[bdb], bdb)
    none, ee = ("", "", ""), ("", "", "00000000:EE:00.0")
    out = {(XIDS, *g0, "79"): 1 + later, (MATCHES, *g0, "nvrm_xid"): 1 + later,
           (XIDS, *g1, "13"): 2, (MATCHES, *g1, "nvrm_xid"): 2,
           (XIDS, *ee, "48"): 1, (MATCHES, *ee, "nvrm_xid"): 1, (MATCHES, *none, "nvlink_error"): 1}
    if later:
        out.update({(XIDS, *g7, "94"): 1, (MATCHES, *g7, "nvrm_xid"): 1})
    return out


def settle(url: str, want: dict, what: str):
    """Scrape until the kernel-log counters are `want`, then once more after a few passes (nothing
    counted twice arrives late)."""
    samples = wait_scrape(url, lambda s: kernel_counts(s) == want(s), what)
    time.sleep(1.0)
    samples = scrape(url)
    assert kernel_counts(samples) == want(samples)
    return samples


def test_exporter_counts_a_file_exactly_once_across_a_crash(tmp_path):
    """A regular file in /dev/kmsg's format: counted per GPU; the exporter is killed (SIGKILL) once
    its state is saved, records are added, and the restarted exporter counts each once."""
    source, state = tmp_path / "kmsg", tmp_path / "kernel-log.json"
    source.write_text(kmsg(FIRST))
    port = free_port()
    with cli_exporter(tmp_path, exporter_args(source, state, port), port=port) as (proc, url, _):
        samples = settle(url, lambda s: expected(s, later=False), "the first records")
        assert [(labels, v) for n, labels, v in samples if n == UP] == [({"source": "file"}, 1.0)]
        assert [v for n, _, v in samples if n == LOST] == [0.0]
        wait(lambda: state.exists() and json.loads(state.read_text())["position"]["seq"] == len(FIRST) - 1,
             timeout=15, what="the state file")
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
    with source.open("a") as f:
        f.write(kmsg(LATER, first_seq=len(FIRST)))
    with cli_exporter(tmp_path, exporter_args(source, state, port), port=port) as (_, url, _):
        settle(url, lambda s: expected(s, later=True), "the later records, once")


def test_exporter_reads_a_fifo_and_a_replayed_ring_once(tmp_path):
    """A FIFO standing in for /dev/kmsg: records written while the exporter is down wait in the
    pipe; after the restart the whole ring buffer is replayed (as /dev/kmsg does on open) and only
    the new records count."""
    source, state = tmp_path / "kmsg.fifo", tmp_path / "kernel-log.json"
    os.mkfifo(source)
    keep = os.open(source, os.O_RDWR | os.O_NONBLOCK)  # holds the pipe (and what is in it) between readers
    try:
        os.write(keep, kmsg(FIRST).encode())
        port = free_port()
        with cli_exporter(tmp_path, exporter_args(source, state, port), port=port) as (proc, url, _):
            settle(url, lambda s: expected(s, later=False), "the first records")
            proc.send_signal(signal.SIGTERM)  # a clean stop saves the state
            assert proc.wait(10) == 0
        assert json.loads(state.read_text())["position"]["seq"] == len(FIRST) - 1
        os.write(keep, kmsg(LATER, first_seq=len(FIRST)).encode())  # while the exporter is down
        with cli_exporter(tmp_path, exporter_args(source, state, port), port=port) as (_, url, _):
            os.write(keep, kmsg(FIRST + LATER).encode())  # the replay on open
            settle(url, lambda s: expected(s, later=True), "the later records, once")
    finally:
        os.close(keep)


def test_exporter_serves_everything_without_its_kernel_log(tmp_path):
    """/dev/kmsg missing (or not permitted): up{source} 0, one warning, every GPU still served."""
    missing = tmp_path / "no-kmsg"
    env = clean_env(GPUOBS_KERNEL_LOG=str(missing), GPUOBS_KERNEL_LOG_STATE="")
    port = free_port()
    args = ["--simulate", str(SCENARIO), "--interval", "0.3", "--port", str(port)]
    with cli_exporter(tmp_path, args, env=env, port=port) as (_, url, err):
        time.sleep(1.5)
        samples = scrape(url)
        assert [(labels, v) for n, labels, v in samples if n == UP] == [({"source": "file"}, 0.0)]
        assert len([1 for n, _, v in samples if n == "gpuobs_gpu_up" and v == 1]) == 8
        assert not kernel_counts(samples)
        records = [json.loads(line) for line in err.read_text().splitlines()]
        assert len([r for r in records if "kernel log source cannot be read" in r["message"]]) == 1


def test_build_families_hands_the_family_its_watcher(tmp_path):
    from gpuobs.collect import build_families

    w = watcher(tmp_path, tmp_path / "kmsg")
    assert [f.watcher for f in build_families({"kernel_log"}, process_cap=1, kernel_log=w)] == [w]
    assert build_families({"kernel_log"}, process_cap=1) == []


def test_kernel_log_off_leaves_the_family_out(exporter, tmp_path):
    run = exporter({"gpus": [{"profile": "h100-sxm-80gb", "count": 1}]}, kernel_log="off")
    assert run.exp.kernel_log is None and not run.values(UP)
    assert "kernel_log" not in {f.name for f in run.exp.sampler.families}
