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

The watcher never fails the exporter: a source it cannot read (missing, not permitted) gives
gpuobs_exporter_kernel_log_up{source} 0 and a warning (once a minute at most), and is retried.
"""

from __future__ import annotations

import collections
import json
import logging
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
from typing import Callable, Iterator

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

# /dev/kmsg: "<priority>,<sequence>,<microseconds>,<flags>[,...];<message>"
_KMSG_RECORD = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)", re.S)
_PCI = re.compile(r"PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")


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
    offset after the last complete line of a regular file, the journal cursor (None: not known)."""
    seq: int | None = None
    inode: int | None = None
    offset: int = 0
    cursor: str | None = None


@dataclass
class Counts:
    """What the watcher counted since boot: {(pci bus id in NVML form or "", xid): n},
    {(pci bus id or "", pattern): n}, and the records lost."""
    xids: collections.Counter = field(default_factory=collections.Counter)
    matches: collections.Counter = field(default_factory=collections.Counter)
    lost: int = 0


class SourceGone(Exception):
    """The source ended (the journalctl process exited, a file was replaced): open it again."""


class KernelLogWatcher:
    """Reads one kernel-log source in a daemon thread and counts what logpatterns matches.

    source: --kernel-log (auto, off, journal, or a path); state_path: the JSON state file (None:
    none); boot_id_path: where the boot id is read; journalctl: the command. For the family:
    start(), stop(), supervise() (restart a dead thread), `up`, `kind` (the source label),
    totals() (a copy of the Counts), note_gpu()/gpu_at() (which GPU is at a PCI address). Raises
    ValueError for source "off" (the exporter builds no watcher then)."""

    def __init__(self, source: str = "auto", state_path: str | None = DEFAULT_STATE, boot_id_path: str = BOOT_ID,
                 journalctl: str = "journalctl", poll_s: float = 0.5, save_every_s: float = 5.0,
                 retry_s: float = 1.0, retry_max_s: float = 30.0, log_every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        resolved = resolve(source, journalctl=journalctl)
        if resolved is None:
            raise ValueError("kernel log source 'off': build no watcher")
        self.kind, self.path = resolved
        self.state_path = state_path
        self.boot_id_path = boot_id_path
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
            return Counts(collections.Counter(self.counts.xids), collections.Counter(self.counts.matches),
                          self.counts.lost)

    # ---- counting --------------------------------------------------------------------------------

    def consume(self, line: str, offset: int | None = None, cursor: str | None = None) -> None:
        """Count one line (a /dev/kmsg record or a plain kernel-log line) unless its sequence number
        is at or before the position; `offset` (regular files: the byte offset after the line) and
        `cursor` (journal) advance the position. A sequence gap counts as lost records."""
        parsed = parse_record(line)
        found = logpatterns.match(parsed[1]) if parsed is not None else None
        with self._lock:
            if offset is not None:
                self.position.offset = offset
            if cursor is not None:
                self.position.cursor = cursor
            self._dirty = True
            if parsed is None or not self._advance(parsed[0]):
                return
            if found is not None:
                pci = _pci_of(found, parsed[1])
                self.counts.matches[(pci, found.name)] += 1
                if found.name == "nvrm_xid":
                    self.counts.xids[(pci, found.fields["xid"])] += 1

    def _advance(self, seq: int | None) -> bool:
        """Move past sequence number `seq` (None: a line without one); False for one already
        consumed. Caller holds the lock."""
        if seq is None:
            return True
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
        """Restore counts and position from the state file when it is of this boot and source."""
        self._boot_id = self._read_boot_id()
        if self._persist and not os.access(os.path.dirname(self.state_path) or ".", os.W_OK):  # type: ignore[arg-type]
            self._no_state(FileNotFoundError("state directory missing or not writable"))  # said at start, not at stop
        if not self._persist:
            return
        try:
            with open(self.state_path) as f:  # type: ignore[arg-type]
                saved = json.load(f)
            same = (saved.get("version") == STATE_VERSION and self._boot_id and saved.get("boot_id") == self._boot_id
                    and saved.get("source") == self._source_id())
            if same:
                self.position = Position(**saved["position"])
                self.counts = Counts(collections.Counter({(p, x): n for p, x, n in saved["xids"]}),
                                     collections.Counter({(p, k): n for p, k, n in saved["matches"]}),
                                     int(saved["lost"]))
                self.gpus = {pci: (str(i), str(u), str(b)) for pci, (i, u, b) in saved.get("gpus", {}).items()}
                log.info("kernel log counts restored", extra={"source": self.kind, "seq": self.position.seq})
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError) as e:  # unreadable or malformed: start from zero
            self._warning("kernel log state file unreadable: counting from zero", type(e).__name__,
                          path=self.state_path)
            self.position, self.counts, self.gpus = Position(), Counts(), {}

    def save(self, force: bool = False) -> None:
        """Write the state file atomically when something changed, at most every save_every_s
        (force: now). A file that cannot be written turns persistence off, with one warning."""
        if not self._persist or not self._dirty or (not force and self._clock() - self._saved_at < self.save_every_s):
            return
        with self._save_lock:
            with self._lock:
                state = {"version": STATE_VERSION, "boot_id": self._boot_id, "source": self._source_id(),
                         "position": vars(self.position).copy(), "lost": self.counts.lost,
                         "xids": [[p, x, n] for (p, x), n in sorted(self.counts.xids.items())],
                         "matches": [[p, k, n] for (p, k), n in sorted(self.counts.matches.items())],
                         "gpus": {p: list(g) for p, g in sorted(self.gpus.items())}}
                self._dirty = False
            self._saved_at = self._clock()
            try:
                _write_atomically(self.state_path, json.dumps(state))  # type: ignore[arg-type]
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
        regular file was replaced or truncated, OSError when it cannot be read."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            regular = stat.S_ISREG(info.st_mode)
            offset = self._resume_offset(fd, info) if regular else 0
            pending = b""
            while not self._stop.is_set():
                chunk = self._read_chunk(fd)
                if chunk:
                    pending, offset = self._lines(pending + chunk, offset, regular)
                elif chunk == b"" and regular:
                    self._check_replaced(fd, offset)
                    self._stop.wait(self.poll_s)
                elif chunk == b"":  # a FIFO whose writers all closed: wait for the next one
                    self._stop.wait(self.poll_s)
                yield
        finally:
            os.close(fd)

    def _resume_offset(self, fd: int, info: os.stat_result) -> int:
        """Seek a regular file to the saved offset when it is the same file (inode) and not shorter."""
        with self._lock:
            same = self.position.inode == info.st_ino and self.position.offset <= info.st_size
            offset = self.position.offset if same else 0
            self.position.inode, self.position.offset = info.st_ino, offset
        os.lseek(fd, offset, os.SEEK_SET)
        return offset

    def _check_replaced(self, fd: int, offset: int) -> None:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return  # rotated away, not yet replaced: keep reading the old one
        if now.st_ino != os.fstat(fd).st_ino or now.st_size < offset:
            raise SourceGone("file replaced or truncated")

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
        return rest, offset

    def _read_journal(self) -> Iterator[None]:
        """`journalctl -k -b -f -o json` from the saved cursor (or the boot's start). Raises
        SourceGone when journalctl exits, OSError when it cannot be started."""
        with self._lock:
            cursor = self.position.cursor
        args = [self.path, "-k", "-b", "-f", "-o", "json", "--no-tail"]
        if cursor:
            args.append(f"--after-cursor={cursor}")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        try:
            fd = proc.stdout.fileno()  # type: ignore[union-attr]
            os.set_blocking(fd, False)
            pending = b""
            while not self._stop.is_set():
                chunk = self._read_chunk(fd)
                if chunk == b"":
                    raise SourceGone(f"journalctl exited ({proc.wait()})")
                if chunk:
                    pending = self._journal_lines(pending + chunk)
                yield
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]

    def _journal_lines(self, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # not an entry (journalctl's own notices)
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald gives a message that is not UTF-8 as bytes
                message = bytes(message).decode("utf-8", "replace")
            if isinstance(message, str):
                self.consume(message.replace("\n", " "), cursor=entry.get("__CURSOR"))
        return rest

    def _source_down(self, err: BaseException) -> None:
        """One warning each time the source goes down (not one per retry): where /dev/kmsg is
        missing or not permitted, the exporter logs it once and serves everything else."""
        if not self._down_logged:
            self._down_logged = True
            log.warning("kernel log source cannot be read: kernel-log XIDs are not counted until it can",
                        extra={"source": self.kind, "path": self.path,
                               "error": getattr(err, "strerror", None) or type(err).__name__, "detail": str(err)})

    def _warning(self, message: str, code: str, **extra) -> None:
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
    and lost records, and restarts its thread if it died."""

    def __init__(self, watcher: KernelLogWatcher):
        super().__init__()
        self.watcher = watcher

    @classmethod
    def build(cls, needs: Needs) -> "KernelLog | None":
        """None without a kernel-log watcher (--kernel-log off): the family is then left out."""
        return cls(needs.kernel_log) if needs.kernel_log is not None else None

    def probe(self, gpu: GpuCtx) -> None:
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
        self.watcher.supervise()
        counts = self.watcher.totals()
        out = [Sample(c.KERNEL_XID_ERRORS, self._labels(pci, known) + (xid,), float(n))
               for (pci, xid), n in sorted(counts.xids.items())]
        out += [Sample(c.KERNEL_LOG_MATCHES, self._labels(pci, known) + (pattern,), float(n))
                for (pci, pattern), n in sorted(counts.matches.items())]
        out.append(Sample(c.KERNEL_LOG_UP, (self.watcher.kind,), float(self.watcher.up)))
        out.append(Sample(c.KERNEL_LOG_LOST, (), float(counts.lost)))
        return out

