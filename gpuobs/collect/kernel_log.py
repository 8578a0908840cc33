"""The kernel-log watcher: a second XID source beside the NVML events. A daemon thread reads the
kernel log (/dev/kmsg, a kernel-log file or FIFO, or `journalctl -k`), matches each record with the
log-pattern catalog (gpuobs.logpatterns) and counts, per GPU (by the PCI address the line names),
the driver's "NVRM: Xid" lines by XID code and every catalog match by pattern.

Counts are since boot and exactly once across exporter restarts: the watcher keeps, in a small
JSON state file (written atomically, at most every `save_every_s` and at stop), the boot id, its
read position (the /dev/kmsg sequence number; for a regular file also its inode and byte offset;
for the journal the cursor) and the counts. On start with the same boot id and source it restores
the counts and skips the records at or before the saved position (/dev/kmsg replays its whole ring
buffer on open); a different boot id, or another source, starts from zero. A crash loses nothing:
the saved counts and position belong together, and the records after that position are read again.
Without a state file (its directory missing or not writable) the counts are still right within one
run; a restart re-reads the ring buffer and counts again from zero since boot, which gives the
previous values unless the kernel overwrote records meanwhile.

Lost records: EPIPE from /dev/kmsg (the kernel overwrote records before they were read) and gaps
in the sequence numbers after the first record read count in KERNEL_LOG_LOST; reading goes on.
Records overwritten before the watcher's first read are not counted as lost.

Nothing read is trusted (docs/security.md):
- Only records of the current boot count. A kern.log-style line dated ("Mar  5 23:33:35" or
  RFC 3339) before the boot time (/proc/stat btime, else /proc/uptime; BOOT_SLACK_S of slack) or
  before the date of the last line counted is skipped, so a reboot or a re-read file does not count
  an earlier boot's XIDs again; journal entries of another `_BOOT_ID` are skipped. Undated lines
  (no date, no sequence number) are counted.
- The state file is validated field by field (types, ranges, at most MAX_STATE_BYTES; a position
  ahead of the log, or a journal cursor journalctl refuses, is found on reading): anything wrong
  gives one warning and a clean start, as without a state file (counts from zero since boot: the
  source is read again from its start), never a dead thread or a NaN, negative or fractional count.
- At most MAX_LABEL_SETS distinct (PCI address, code) label sets per counter (XID codes; pattern
  names), of which MAX_UNKNOWN_LABEL_SETS for addresses no GPU of this node was seen at, so forged
  lines cannot take the room of the real GPUs; XID codes of more than MAX_XID_DIGITS digits are
  forged. A record over the cap is counted in KERNEL_LOG_OVERFLOW only.
- A regular file is checked by inode (rotated: the new file is read from its start once the old one
  is read to its end) and by size and the last bytes read (truncated, or truncated and refilled
  within one poll: read again from its start). A truncation counts in KERNEL_LOG_TRUNCATED: records
  written between the last read and the truncation may be lost.

The watcher never fails the exporter: a source it cannot read (missing, not permitted) gives
gpuobs_exporter_kernel_log_up{source} 0 and a warning (once a minute at most), and is retried.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator

import pynvml as N

from .. import catalog as c
from .. import logpatterns
from .base import Family, GpuCtx, LogLimiter, Needs, Sample, register

log = logging.getLogger("gpuobs.kernel_log")

KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
DEFAULT_STATE = "/var/lib/gpuobs/kernel-log.json"
STATE_VERSION = 1
READ_SIZE = 65536  # more than one /dev/kmsg record (at most ~8 KiB): a smaller read() gets EINVAL
PROC_STAT, PROC_UPTIME = "/proc/stat", "/proc/uptime"
BOOT_SLACK_S = 2.0  # btime moves by clock steps; the previous boot's last line is much older than that
MAX_LABEL_SETS = 256  # distinct (PCI address, code) label sets per counter family and node
MAX_UNKNOWN_LABEL_SETS = 64  # of those, for addresses no GPU of this node was seen at
MAX_XID_DIGITS = 4  # XID codes are below 1000
MAX_STATE_BYTES = 1 << 20  # the state of MAX_LABEL_SETS label sets is far less
TAIL_BYTES = 64  # bytes before the read offset compared to find a truncated and refilled file

# /dev/kmsg: "<priority>,<sequence>,<microseconds>,<flags>[,...];<message>"
_KMSG_RECORD = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)", re.S)
_PCI = re.compile(r"PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
# kern.log dates: rsyslog's traditional "Mar  5 23:33:35 " (local time, no year) and RFC 3339
_SYSLOG_TIME = re.compile(r"([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d\d:\d\d:\d\d) ")
_ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-]\d\d:?\d\d)?) ")


def pci_bus_id(address: str) -> str | None:
    """A PCI address as the kernel writes it ("0000:18:00", "0000:3b:00.0") or NVML does
    ("00000000:3B:00.0") -> NVML's form: 8 hex digits of domain, upper case, function (default 0).
    None for a text that is no such address."""
    m = re.fullmatch(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?", address.strip())
    if m is None:
        return None
    domain, bus, device = (int(x, 16) for x in m.group(1, 2, 3))
    return f"{domain:08X}:{bus:02X}:{device:02X}.{int(m.group(4) or 0)}"


def parse_record(line: str) -> tuple[int | None, str] | None:
    """One line of the kernel log -> (sequence number or None, message). A /dev/kmsg record gives
    its sequence number; a plain line (a kern.log) is all message. None for a /dev/kmsg
    continuation line (" KEY=value", which repeats what the record said) and empty lines."""
    if not line.strip() or line[0] == " ":
        return None
    m = _KMSG_RECORD.fullmatch(line)
    if m is None:
        return None, line
    return int(m.group(2)), m.group(4)


def line_time(line: str, now: float | None = None) -> float | None:
    """The date a kern.log-style line starts with, in seconds since the epoch: RFC 3339 (with its
    offset, else local time) or the traditional "Mar  5 23:33:35 " in local time, of the latest year
    that puts it at most a day after `now` (default: the wall clock). None for an undated line."""
    m = _ISO_TIME.match(line)
    if m is not None:
        try:
            return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    m = _SYSLOG_TIME.match(line)
    if m is None:
        return None
    now = time.time() if now is None else now
    year = datetime.fromtimestamp(now).year
    for y in (year, year - 1):  # the year is not written: a December line read in January is last year's
        try:
            t = datetime.strptime(f"{y} {m.group(1)} {m.group(2)} {m.group(3)}", "%Y %b %d %H:%M:%S").timestamp()
        except ValueError:  # Feb 29 of a year without one, or a month name that is none
            continue
        if t <= now + 86400:
            return t
    return None


def read_boot_time(proc_stat: str = PROC_STAT, proc_uptime: str = PROC_UPTIME) -> float:
    """This boot's start in seconds since the epoch: /proc/stat's btime, else the wall clock less
    /proc/uptime; 0.0 (nothing is dated before it) where neither can be read."""
    try:
        with open(proc_stat) as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(proc_uptime) as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def resolve(source: str, kmsg: str = KMSG, journalctl: str = "journalctl") -> tuple[str, str] | None:
    """--kernel-log -> (kind, path): kind is the `source` label, "kmsg", "file" or "journal"; path
    the device, file or journalctl command. "off": None. "auto": /dev/kmsg if it opens for reading,
    else the journal if journalctl is on PATH, else /dev/kmsg (which then reports up 0)."""
    if source == "off":
        return None
    if source == "journal":
        return "journal", journalctl
    if source != "auto":
        return ("kmsg" if source == kmsg or _is_char_device(source) else "file"), source
    try:
        os.close(os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK))
        return "kmsg", kmsg
    except OSError:
        found = shutil.which(journalctl)
        return ("journal", found) if found else ("kmsg", kmsg)


def _is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


@dataclass
class Position:
    """Where reading stopped: the last /dev/kmsg sequence number consumed, the inode and byte
    offset after the last complete line of a regular file with the hex of its last TAIL_BYTES bytes
    before that offset (`tail`), the journal cursor, the date of the last dated line counted
    (seconds since the epoch); None: not known."""
    seq: int | None = None
    inode: int | None = None
    offset: int = 0
    cursor: str | None = None
    time: float | None = None
    tail: str | None = None


@dataclass
class Counts:
    """What the watcher counted since boot: {(pci bus id in NVML form or "", xid): n},
    {(pci bus id or "", pattern): n}, the records lost, the records over the label-set cap
    (`overflow`) and the truncations of a regular file (`truncated`)."""
    xids: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    matches: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    lost: int = 0
    overflow: int = 0
    truncated: int = 0

    def copy(self) -> "Counts":
        """An independent copy."""
        return Counts(collections.Counter(self.xids), collections.Counter(self.matches), self.lost, self.overflow,
                      self.truncated)


class SourceGone(Exception):
    """The source ended (the journalctl process exited, a file was replaced): open it again."""


class StateRejected(Exception):
    """The saved position proved wrong on reading (ahead of the log, a cursor journalctl refuses):
    the state was dropped; open the source again at once and count from its start."""


class StateError(ValueError):
    """A field of the state file that is missing, unknown, or of the wrong type or range."""


class KernelLogWatcher:
    """Reads one kernel-log source in a daemon thread and counts what logpatterns matches.

    source: --kernel-log (auto, off, journal, or a path); state_path: the JSON state file (None:
    none); boot_id_path: where the boot id is read; journalctl: the command; boot_time: this boot's
    start in seconds since the epoch (None: read_boot_time()). For the family:
    start(), stop(), supervise() (restart a dead thread), `up`, `kind` (the source label),
    totals() (a copy of the Counts), note_gpu()/gpu_at() (which GPU is at a PCI address). Raises
    ValueError for source "off" (the exporter builds no watcher then)."""

    def __init__(self, source: str = "auto", state_path: str | None = DEFAULT_STATE, boot_id_path: str = BOOT_ID,
                 journalctl: str = "journalctl", poll_s: float = 0.5, save_every_s: float = 5.0,
                 retry_s: float = 1.0, retry_max_s: float = 30.0, log_every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, boot_time: float | None = None):
        resolved = resolve(source, journalctl=journalctl)
        if resolved is None:
            raise ValueError("kernel log source 'off': build no watcher")
        self.kind, self.path = resolved
        self.state_path = state_path
        self.boot_id_path = boot_id_path
        self.boot_time = read_boot_time() if boot_time is None else boot_time
        self.poll_s, self.save_every_s = poll_s, save_every_s
        self.retry_s, self.retry_max_s = retry_s, retry_max_s
        self._clock = clock
        self._lock = threading.Lock()  # counts and position: the reader thread and the sampler
        self._save_lock = threading.Lock()
        self.counts = Counts()
        self.position = Position()
        self.gpus: dict[str, tuple[str, str, str]] = {}  # NVML-form bus id -> (index, UUID, NVML's busId)
        self._boot_id = ""
        self._dirty = False
        self._saved_at = clock()
        self._persist = state_path is not None
        self._up = False
        self._down_logged = False
        self._warn = LogLimiter(log_every_s, 1, clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_restart = 0.0
        self._backoff = retry_s
        self._unknown = {"xids": 0, "matches": 0}  # label sets admitted for addresses no GPU was seen at
        self._max_seq_read: int | None = None  # since the source was opened

    # ---- public surface --------------------------------------------------------------------------

    def start(self) -> "KernelLogWatcher":
        """Load the saved state (same boot and source) and start the thread."""
        self._load()
        self._spawn()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread (waits at most `timeout`, default one poll plus 1 s) and save the state."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(self.poll_s + 1.0 if timeout is None else timeout)
        self.save(force=True)

    @property
    def up(self) -> bool:
        """The thread runs and its source is open."""
        t = self._thread
        return self._up and t is not None and t.is_alive() and not self._stop.is_set()

    def supervise(self) -> bool:
        """Restart a dead thread, with a back-off doubling from retry_s to retry_max_s. True if it did."""
        t = self._thread
        if t is None or t.is_alive() or self._stop.is_set() or self._clock() < self._next_restart:
            return False
        self._next_restart = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)
        self._warning("kernel log watcher thread died: restarting it", "restarted")
        self._spawn()
        return True

    def note_gpu(self, bus_id: str, index: str, uuid: str) -> None:
        """Remember the GPU (NVML index, UUID) at a PCI address (NVML's busId text) for this boot:
        kept in the state file, so that a GPU that fell off the bus keeps its labels on its lines
        after a restart."""
        key = pci_bus_id(bus_id)
        if key is None:
            return
        with self._lock:
            if self.gpus.get(key) != (index, uuid, bus_id):
                self.gpus[key] = (index, uuid, bus_id)
                self._dirty = True

    def gpu_at(self, pci: str) -> tuple[str, str, str] | None:
        """(NVML index, UUID, NVML's busId text) of the GPU seen at a PCI address (NVML form) in
        this boot; None for an address no GPU was seen at."""
        with self._lock:
            return self.gpus.get(pci)

    def totals(self) -> Counts:
        """A copy of the counts since boot."""
        with self._lock:
            return self.counts.copy()

    # ---- counting --------------------------------------------------------------------------------

    def consume(self, line: str, offset: int | None = None, cursor: str | None = None) -> None:
        """Count one line (a /dev/kmsg record or a plain kernel-log line) unless its sequence number
        is at or before the position; `offset` (regular files: the byte offset after the line) and
        `cursor` (journal) advance the position. A sequence gap counts as lost records."""
        parsed = parse_record(line)
        found = logpatterns.match(parsed[1]) if parsed is not None else None
        dated = line_time(parsed[1]) if parsed is not None and parsed[0] is None and self.kind == "file" else None
        with self._lock:
            if offset is not None:
                self.position.offset = offset
            if cursor is not None:
                self.position.cursor = cursor
            self._dirty = True
            if parsed is None or not self._advance(parsed[0]) or not self._this_boot(dated):
                return
            if found is not None:
                self._count(_pci_of(found, parsed[1]), found)

    def _this_boot(self, dated: float | None) -> bool:
        """False for a line dated before the boot or before the last dated line counted; moves the
        position's date on. Caller holds the lock."""
        if dated is None:
            return True
        if dated < self.boot_time - BOOT_SLACK_S or (self.position.time is not None and dated < self.position.time):
            return False
        self.position.time = dated
        return True

    def _count(self, pci: str, found: logpatterns.Match) -> None:
        """Count a matched record in its label sets, or in `overflow` when one of them would pass
        the cap (or its XID code is forged). Caller holds the lock."""
        keys = [("matches", self.counts.matches, (pci, found.name))]
        if found.name == "nvrm_xid":
            xid = _xid_code(found.fields.get("xid", ""))
            if xid is None:
                self.counts.overflow += 1
                return
            keys.append(("xids", self.counts.xids, (pci, xid)))
        if not all(self._admissible(name, counter, key) for name, counter, key in keys):
            self.counts.overflow += 1
            return
        for name, counter, key in keys:
            if key not in counter and key[0] not in self.gpus:
                self._unknown[name] += 1
            counter[key] += 1

    def _admissible(self, name: str, counter: collections.Counter[tuple[str, str]], key: tuple[str, str]) -> bool:
        """A label set counted already, or room for a new one under the caps."""
        if key in counter:
            return True
        if len(counter) >= MAX_LABEL_SETS:
            return False
        return key[0] in self.gpus or self._unknown[name] < MAX_UNKNOWN_LABEL_SETS

    def _advance(self, seq: int | None) -> bool:
        """Move past sequence number `seq` (None: a line without one); False for one already
        consumed. Caller holds the lock."""
        if seq is None:
            return True
        if self._max_seq_read is None or seq > self._max_seq_read:
            self._max_seq_read = seq
        last = self.position.seq
        if last is not None and seq <= last:
            return False
        if last is not None and seq > last + 1:
            self.counts.lost += seq - last - 1
        self.position.seq = seq
        return True

    def overwritten(self) -> None:
        """EPIPE from /dev/kmsg: records were overwritten. The next record's sequence gap counts them."""
        self._warning("kernel log records overwritten before they were read", "EPIPE")

    # ---- state file ------------------------------------------------------------------------------

    def _read_boot_id(self) -> str:
        try:
            with open(self.boot_id_path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def _source_id(self) -> str:
        return f"{self.kind}:{self.path}"

    def _load(self) -> None:
        """Restore counts and position from the state file when it is of this boot and source and
        every field is valid; else start clean (one warning for a file that is not valid)."""
        self._boot_id = self._read_boot_id()
        path = self.state_path
        if not self._persist or path is None:
            return
        if not os.access(os.path.dirname(path) or ".", os.W_OK):
            self._no_state(FileNotFoundError("state directory missing or not writable"))  # said at start, not at stop
            return
        try:
            saved = _read_state(path)
            if not _same_run(saved, self._boot_id, self._source_id()):
                return  # another boot or source: its counts are not this one's
            position, counts, gpus = _position(saved.get("position")), _counts(saved), _gpus(saved.get("gpus", {}))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:  # unreadable, not JSON, or a field wrong: start clean
            self._reject_state(e)
            return
        self.position, self.counts, self.gpus = position, counts, gpus
        self._unknown = {name: sum(1 for pci, _ in getattr(counts, name) if pci not in gpus)
                         for name in ("xids", "matches")}
        log.info("kernel log counts restored", extra={"source": self.kind, "seq": self.position.seq})

    def _reject_state(self, err: Exception) -> None:
        """One warning, and counts and position from zero (the GPUs seen stay: NVML told them)."""
        log.warning("kernel log state file rejected: counting from zero since boot",
                    extra={"path": self.state_path, "error": type(err).__name__, "detail": str(err)[:200]})
        with self._lock:
            self.position, self.counts = Position(), Counts()
            self._unknown = {"xids": 0, "matches": 0}
            self._dirty = True

    def save(self, force: bool = False) -> None:
        """Write the state file atomically when something changed, at most every save_every_s
        (force: now). A file that cannot be written turns persistence off, with one warning."""
        path = self.state_path
        if not self._persist or path is None or not self._dirty or (
                not force and self._clock() - self._saved_at < self.save_every_s):
            return
        with self._save_lock:
            with self._lock:
                state = {"version": STATE_VERSION, "boot_id": self._boot_id, "source": self._source_id(),
                         "position": vars(self.position).copy(), "lost": self.counts.lost,
                         "overflow": self.counts.overflow, "truncated": self.counts.truncated,
                         "xids": [[p, x, n] for (p, x), n in sorted(self.counts.xids.items())],
                         "matches": [[p, k, n] for (p, k), n in sorted(self.counts.matches.items())],
                         "gpus": {p: list(g) for p, g in sorted(self.gpus.items())}}
                self._dirty = False
            self._saved_at = self._clock()
            try:
                _write_atomically(path, json.dumps(state))
            except OSError as e:
                self._no_state(e)

    def _no_state(self, err: OSError) -> None:
        self._persist = False
        log.warning("kernel log state cannot be written: counts restart from zero with the exporter",
                    extra={"path": self.state_path, "error": type(err).__name__, "detail": str(err)})

    # ---- thread ----------------------------------------------------------------------------------

    def _spawn(self) -> None:
        self._thread = threading.Thread(target=self._main, name="gpuobs-kernel-log", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        delay = self.retry_s
        while not self._stop.is_set():
            try:
                for _ in self._read():  # each yield: the source answered
                    self._up, self._down_logged, delay = True, False, self.retry_s
                    self.save()
                    if self._stop.is_set():
                        return
            except StateRejected:
                continue  # warned: open the source again at once, from its start
            except (OSError, SourceGone, ValueError) as e:
                self._up = False
                self._source_down(e)
            self._up = False
            self._stop.wait(delay)
            delay = min(delay * 2, self.retry_max_s)

    def _read(self) -> Iterator[None]:
        return self._read_journal() if self.kind == "journal" else self._read_stream()

    def _read_stream(self) -> Iterator[None]:
        """/dev/kmsg, a regular file or a FIFO, opened without blocking (a FIFO with no writer
        yet is then open, not hung); lines are counted as they complete. Raises SourceGone when a
        regular file was replaced (rotated), StateRejected when the saved position proved ahead of
        the log, OSError when it cannot be read."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            regular = stat.S_ISREG(info.st_mode)
            offset = self._resume_offset(fd, info) if regular else 0
            pending, replayed = b"", False
            with self._lock:
                saved_seq, self._max_seq_read = self.position.seq, None
            while not self._stop.is_set():
                chunk = self._read_chunk(fd)
                if regular and self._truncated(fd, offset):  # also after a read: it may have read new bytes
                    offset, pending, chunk = self._restart_file(fd), b"", None
                if chunk:
                    pending, offset = self._lines(pending + chunk, offset, regular)
                elif not replayed:  # the first idle read: what the source held at open is read
                    replayed = True
                    self._check_replay(saved_seq)
                if chunk == b"" and regular:
                    self._check_replaced(fd)
                if chunk == b"":
                    self._stop.wait(self.poll_s)
                yield
        finally:
            os.close(fd)

    def _resume_offset(self, fd: int, info: os.stat_result) -> int:
        """Seek a regular file to the saved offset when it is the same file (inode), not shorter and
        with the same bytes before the offset; a truncated file is counted and read from its start."""
        with self._lock:
            same = self.position.inode == info.st_ino
            offset = self.position.offset if same else 0
            self.position.inode = info.st_ino
            if not same:
                self.position.offset, self.position.tail = 0, None
        if same and offset and self._truncated(fd, offset):
            return self._restart_file(fd)
        if same and offset:
            self._check_last_record(fd, offset)
        os.lseek(fd, offset, os.SEEK_SET)
        return offset

    def _check_last_record(self, fd: int, offset: int) -> None:
        """A file in /dev/kmsg's format resumed at its offset: the last record before it must have
        the saved sequence number, else the position is not this file's. Raises StateRejected."""
        start = max(0, offset - READ_SIZE)
        lines = os.pread(fd, offset - start, start).decode("utf-8", "replace").split("\n")
        records = (parse_record(line) for line in reversed(lines))
        last = next((r[0] for r in records if r is not None), None)
        with self._lock:
            saved = self.position.seq
        if last is not None and saved is not None and last != saved:
            self._reject_state(StateError(f"position.seq {saved} is not the record at the offset ({last})"))
            raise StateRejected()

    def _truncated(self, fd: int, offset: int) -> bool:
        """The file is shorter than the offset read to, or the bytes before it changed (truncated
        and written again)."""
        with self._lock:
            tail = bytes.fromhex(self.position.tail or "")
        if os.fstat(fd).st_size < offset:
            return True
        return bool(tail) and os.pread(fd, len(tail), offset - len(tail)) != tail

    def _restart_file(self, fd: int) -> int:
        """Count a truncation and read the file again from its start (lines dated before the last
        one counted are skipped there). Returns the new offset, 0."""
        with self._lock:
            self.counts.truncated += 1
            self.position.offset, self.position.tail, self._dirty = 0, None, True
        self._warning("kernel log file truncated: reading it again from its start; records written just "
                      "before the truncation may be lost", "truncated", path=self.path)
        os.lseek(fd, 0, os.SEEK_SET)
        return 0

    def _check_replay(self, saved_seq: int | None) -> None:
        """After what the source held at open is read: a saved sequence number beyond every record
        read is not of this log (sequence numbers only grow within a boot). Raises StateRejected."""
        with self._lock:
            ahead = saved_seq is not None and self._max_seq_read is not None and self._max_seq_read < saved_seq
        if ahead:
            self._reject_state(StateError(f"position.seq {saved_seq} is ahead of the log ({self._max_seq_read})"))
            raise StateRejected()

    def _check_replaced(self, fd: int) -> None:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return  # rotated away, not yet replaced: keep reading the old one
        if now.st_ino != os.fstat(fd).st_ino:
            raise SourceGone("file replaced")

    def _read_chunk(self, fd: int) -> bytes | None:
        """What one read gives; None when nothing came within a poll (EAGAIN) or records were
        overwritten (EPIPE, counted by the next record's sequence gap)."""
        ready, _, _ = select.select([fd], [], [], self.poll_s)
        if not ready:
            return None
        try:
            return os.read(fd, READ_SIZE)
        except BlockingIOError:
            return None
        except BrokenPipeError:
            self.overwritten()
            return None

    def _lines(self, data: bytes, offset: int, regular: bool) -> tuple[bytes, int]:
        """Consume the complete lines of `data`; (the incomplete rest, offset after the last line)."""
        *lines, rest = data.split(b"\n")
        for line in lines:
            offset += len(line) + 1
            self.consume(line.decode("utf-8", "replace"), offset=offset if regular else None)
        if regular and lines:
            with self._lock:
                tail = bytes.fromhex(self.position.tail or "") + data[:len(data) - len(rest)]
                self.position.tail = tail[-TAIL_BYTES:].hex()
        return rest, offset

    def _read_journal(self) -> Iterator[None]:
        """`journalctl -k -b -f -o json` from the saved cursor (or the boot's start). Raises
        SourceGone when journalctl exits, StateRejected when it exits at once on the saved cursor
        (one it does not know), OSError when it cannot be started."""
        with self._lock:
            cursor = self.position.cursor
        args = [self.path, "-k", "-b", "-f", "-o", "json", "--no-tail"]
        if cursor:
            args.append(f"--after-cursor={cursor}")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        stdout = proc.stdout
        try:
            if stdout is None:  # not reached: stdout=PIPE
                raise SourceGone("journalctl without a pipe")
            fd = stdout.fileno()
            os.set_blocking(fd, False)
            pending, answered = b"", False
            while not self._stop.is_set():
                chunk = self._read_chunk(fd)
                if chunk == b"" and proc.wait() != 0 and cursor and not answered:
                    self._reject_state(StateError(f"position.cursor refused by journalctl ({proc.returncode})"))
                    raise StateRejected()
                if chunk == b"":
                    raise SourceGone(f"journalctl exited ({proc.wait()})")
                if chunk:
                    answered = True
                    pending = self._journal_lines(pending + chunk)
                yield
        finally:
            proc.kill()
            proc.wait()
            if stdout is not None:
                stdout.close()

    def _journal_lines(self, data: bytes) -> bytes:
        """Consume the complete JSON entries of `data`: those of another boot (`_BOOT_ID`) only move
        the cursor on. Returns the incomplete rest."""
        *lines, rest = data.split(b"\n")
        ours = self._boot_id.replace("-", "").lower()
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # not an entry (journalctl's own notices)
            if not isinstance(entry, dict):
                continue
            cursor = entry.get("__CURSOR") if isinstance(entry.get("__CURSOR"), str) else None
            boot = entry.get("_BOOT_ID")
            message = _journal_message(entry.get("MESSAGE"))
            if isinstance(boot, str) and ours and boot.replace("-", "").lower() != ours:
                message = ""  # another boot's: not counted
            self.consume(message.replace("\n", " "), cursor=cursor)
        return rest

    def _source_down(self, err: BaseException) -> None:
        """One warning each time the source goes down (not one per retry): where /dev/kmsg is
        missing or not permitted, the exporter logs it once and serves everything else."""
        if not self._down_logged:
            self._down_logged = True
            log.warning("kernel log source cannot be read: kernel-log XIDs are not counted until it can",
                        extra={"source": self.kind, "path": self.path,
                               "error": getattr(err, "strerror", None) or type(err).__name__, "detail": str(err)})

    def _warning(self, message: str, code: str, **extra: Any) -> None:
        suppressed = self._warn.allow((message, code))
        if suppressed is not None:
            log.warning(message, extra={"error": code, "suppressed": suppressed, **extra})


def _pci_of(found: logpatterns.Match, message: str) -> str:
    """The GPU a matched line names: the pattern's `pci` field, else a "PCI:<address>" in the
    line, in NVML's form; "" when it names none."""
    address = found.fields.get("pci")
    if address is None:
        m = _PCI.search(message)
        address = m.group(1) if m else None
    return (pci_bus_id(address) or "") if address else ""


def _xid_code(text: str) -> str | None:
    """An XID code in canonical form ("079" -> "79"); None for one of more than MAX_XID_DIGITS digits."""
    digits = text.lstrip("0") or "0"
    return digits if digits.isascii() and digits.isdigit() and len(digits) <= MAX_XID_DIGITS else None


def _no_constant(name: str) -> float:
    raise StateError(f"{name} is not a number")


def _read_state(path: str) -> dict[str, Any]:
    """The state file's top-level object. Raises FileNotFoundError, OSError, StateError (over
    MAX_STATE_BYTES, NaN or Infinity, not an object) or ValueError (not JSON, not UTF-8)."""
    with open(path, "rb") as f:
        data = f.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise StateError(f"larger than {MAX_STATE_BYTES} bytes")
    saved = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    if not isinstance(saved, dict):
        raise StateError(f"top level: {type(saved).__name__}, not an object")
    return saved


def _same_run(saved: dict[str, Any], boot_id: str, source: str) -> bool:
    """True when the state is of this boot and source. Raises StateError for a version, boot id or
    source of the wrong type, or a version this code does not write."""
    if saved.get("version") != STATE_VERSION or type(saved.get("version")) is not int:
        raise StateError(f"version: {saved.get('version')!r:.40}, not {STATE_VERSION}")
    for name in ("boot_id", "source"):
        if not isinstance(saved.get(name), str):
            raise StateError(f"{name}: {saved.get(name)!r:.40}, not a string")
    return bool(boot_id) and saved["boot_id"] == boot_id and saved["source"] == source


def _int(value: object, name: str) -> int:
    """A JSON integer from 0 to 2**63 - 1 (bool and float refused). Raises StateError."""
    if type(value) is not int or not 0 <= value < 2**63:
        raise StateError(f"{name}: {value!r:.40}, not an integer from 0")
    return value


def _optional_int(value: object, name: str) -> int | None:
    """None, or a JSON integer as _int reads it. Raises StateError."""
    return None if value is None else _int(value, name)


def _text(value: object, name: str, limit: int) -> str:
    """A JSON string of at most `limit` characters. Raises StateError."""
    if not isinstance(value, str) or len(value) > limit:
        raise StateError(f"{name}: {value!r:.40}, not a string of at most {limit} characters")
    return value


def _optional_text(value: object, name: str, limit: int) -> str | None:
    """None, or a JSON string as _text reads it. Raises StateError."""
    return None if value is None else _text(value, name, limit)


def _position(saved: object) -> Position:
    """The `position` object, field by field. Raises StateError."""
    if not isinstance(saved, dict) or set(saved) - set(Position.__dataclass_fields__):
        raise StateError(f"position: {saved!r:.80}, not an object of {sorted(Position.__dataclass_fields__)}")
    dated = saved.get("time")
    if dated is not None and (type(dated) not in (int, float) or not math.isfinite(dated) or dated < 0):
        raise StateError(f"position.time: {dated!r:.40}, not a date")
    tail = _optional_text(saved.get("tail"), "position.tail", 2 * TAIL_BYTES)
    if tail is not None and (len(tail) % 2 or any(ch not in "0123456789abcdef" for ch in tail)):
        raise StateError(f"position.tail: {tail!r:.40}, not hex")
    return Position(seq=_optional_int(saved.get("seq"), "position.seq"),
                    inode=_optional_int(saved.get("inode"), "position.inode"),
                    offset=_int(saved.get("offset", 0), "position.offset"),
                    cursor=_optional_text(saved.get("cursor"), "position.cursor", 1024),
                    time=None if dated is None else float(dated), tail=tail)


def _label_sets(saved: object, name: str, valid: Callable[[str], bool]) -> collections.Counter[tuple[str, str]]:
    """[[pci, code, n], ...] -> Counter: at most MAX_LABEL_SETS, each address "" or in NVML's
    form, each code valid, each n an integer from 0, no label set twice. Raises StateError."""
    if not isinstance(saved, list) or len(saved) > MAX_LABEL_SETS:
        raise StateError(f"{name}: not a list of at most {MAX_LABEL_SETS} label sets")
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for item in saved:
        if not isinstance(item, list) or len(item) != 3:
            raise StateError(f"{name}: {item!r:.60}, not [pci, code, count]")
        pci, code, n = item
        if not isinstance(pci, str) or (pci and pci_bus_id(pci) != pci):
            raise StateError(f"{name}: PCI address {pci!r:.40}")
        if not isinstance(code, str) or not valid(code) or (pci, code) in out:
            raise StateError(f"{name}: code {code!r:.40}, not valid or twice")
        out[(pci, code)] = _int(n, f"{name} count")
    return out


def _counts(saved: dict[str, Any]) -> Counts:
    """The counters of the state file. Raises StateError."""
    def pattern_name(k: str) -> bool:
        return re.fullmatch(r"[a-z0-9_]{1,64}", k) is not None

    return Counts(_label_sets(saved.get("xids"), "xids", lambda x: _xid_code(x) == x),
                  _label_sets(saved.get("matches"), "matches", pattern_name),
                  _int(saved.get("lost"), "lost"),
                  _int(saved.get("overflow", 0), "overflow"),
                  _int(saved.get("truncated", 0), "truncated"))


def _gpus(saved: object) -> dict[str, tuple[str, str, str]]:
    """{pci: [index, uuid, busId]} of the state file. Raises StateError."""
    if not isinstance(saved, dict) or len(saved) > MAX_LABEL_SETS:
        raise StateError(f"gpus: not an object of at most {MAX_LABEL_SETS} addresses")
    out: dict[str, tuple[str, str, str]] = {}
    for pci, gpu in saved.items():
        if pci_bus_id(pci) != pci or not isinstance(gpu, list) or len(gpu) != 3:
            raise StateError(f"gpus: {pci!r:.40}: {gpu!r:.60}")
        index, uuid, bus_id = (_text(g, "gpus entry", 128) for g in gpu)
        out[pci] = (index, uuid, bus_id)
    return out


def _journal_message(message: object) -> str:
    """A journal entry's MESSAGE as text: journald gives one that is not UTF-8 as a list of bytes;
    "" for anything else."""
    if isinstance(message, list) and all(type(b) is int and 0 <= b < 256 for b in message):
        return bytes(message).decode("utf-8", "replace")
    return message if isinstance(message, str) else ""


def _write_atomically(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in its directory and rename(2), so that a
    reader (the next start) sees the old or the new state, never half of one. Raises OSError."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".kernel-log.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up in the parent: the child of a threaded process must not dlopen."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl()


def _die_with_parent() -> None:
    """In the journalctl child: SIGTERM when the exporter dies (also by SIGKILL), so that no
    `journalctl -f` outlives it. prctl(PR_SET_PDEATHSIG) where there is one."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


@register("kernel_log", summary="XIDs and NVIDIA driver messages counted from the kernel log")
class KernelLog(Family):
    """Hands the watcher each GPU's PCI bus id (nvmlDeviceGetPciInfo_v3, read at probe) and UUID,
    and exports the watcher's counts for every address: labelled with the GPU that has (or had, in
    this boot) that address, or gpu="" uuid="" for one no GPU seen has; also the watcher's health
    lost records, records over the label-set cap and truncations, and restarts its thread if it
    died."""

    def __init__(self, watcher: KernelLogWatcher):
        super().__init__()
        self.watcher = watcher

    @classmethod
    def build(cls, needs: Needs) -> "KernelLog | None":
        """None without a kernel-log watcher (--kernel-log off): the family is then left out."""
        return cls(needs.kernel_log) if needs.kernel_log is not None else None

    def probe(self, gpu: GpuCtx) -> None:
        """Tells the watcher the GPU's PCI bus id (nvmlDeviceGetPciInfo_v3), index and UUID, so that kernel
        lines naming the address are labelled with the GPU."""
        info = gpu.get(N.nvmlDeviceGetPciInfo_v3)
        bus_id = info.busId if info is not None else None
        if isinstance(bus_id, bytes):  # older pynvml
            bus_id = bus_id.decode("ascii", "replace")
        if bus_id:
            self.watcher.note_gpu(bus_id, str(gpu.index), gpu.uuid)

    def _labels(self, pci: str, known: dict[str, int]) -> tuple[str, str, str]:
        """(gpu, uuid, pci_bus_id) of a counted address."""
        found = self.watcher.gpu_at(pci)
        if found is None:
            return "", "", pci
        index, uuid, bus_id = found
        return str(known.get(uuid, index)), uuid, bus_id

    def node_samples(self, known: dict[str, int]) -> list[Sample]:
        """The watcher's counts as node samples, kept across GPU loss: c.KERNEL_XID_ERRORS and
        c.KERNEL_LOG_MATCHES per address (labelled with the GPU where known), and its health (up, lost, overflow,
        truncated). Restarts the watcher's thread first if it died."""
        self.watcher.supervise()
        counts = self.watcher.totals()
        out = [Sample(c.KERNEL_XID_ERRORS, self._labels(pci, known) + (xid,), float(n))
               for (pci, xid), n in sorted(counts.xids.items())]
        out += [Sample(c.KERNEL_LOG_MATCHES, self._labels(pci, known) + (pattern,), float(n))
                for (pci, pattern), n in sorted(counts.matches.items())]
        out.append(Sample(c.KERNEL_LOG_UP, (self.watcher.kind,), float(self.watcher.up)))
        out.append(Sample(c.KERNEL_LOG_LOST, (), float(counts.lost)))
        out.append(Sample(c.KERNEL_LOG_OVERFLOW, (), float(counts.overflow)))
        out.append(Sample(c.KERNEL_LOG_TRUNCATED, (), float(counts.truncated)))
        return out

