"""A node's output: one pipe (or a raw pty) that torchrun writes into, and, where the ranks
are told apart, one FIFO (or raw pty) per rank (``rankout``), copied byte for byte to
node.log by the supervisor, whole lines at a time, each span's source recorded in node.idx.

When node.log cannot grow (its disk is full), the copy stops and says why: the supervisor
then stops the node and fails it, since output that cannot be kept would otherwise vanish
silently. A small reserve file, deleted then, leaves room for exit.json on the full disk.

Once the node's processes are gone, the output's last bytes are copied (``drain``); a
process that left the run's session and environment may still hold the write end, and no
EOF would ever come. ``drain`` waits for it ESCAPE_WAIT seconds, then names the holders.
"""

from __future__ import annotations

import errno
import os
import select
import struct
import time
from typing import Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import Escaped, SpecRecord
from sshddp.remote.common import create, listdir
from sshddp.remote.rankside.rankout import (
    DEFAULT_SIZE,
    Source,
    grow_pipe,
    open_pty,
    pipe_id,
    rank_fifos,
    remove_fifos,
    told_apart,
)

PUMP_BYTES = 1 << 20
#: seconds a trickle of output collects before it is read again: one read (and one log
#: write, one index record) per 30 ms of a rank printing line by line, not one per line
GATHER_WAIT = 0.03
GATHER_BELOW = 64 * 1024  # a wakeup that read less than this much is a trickle
RESERVE_BYTES = 64 * 1024
ESCAPE_WAIT = 2.0  # seconds the output may stay open once every process of the node is gone
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
RECORD = struct.Struct(contract.INDEX_RECORD)


def open_output(use_tty: bool, size: Optional[list[int]] = None) -> tuple[int, int]:
    """(read end, write end) of the node's output: a pipe, or a raw pty of ``size``
    ([columns, rows], the user's terminal's)."""
    if use_tty:
        return open_pty(size or DEFAULT_SIZE)
    read, write = os.pipe()
    grow_pipe(read)
    return read, write


class NodeOutput:
    """Copies the output's read end (and, with ``ranks``, each rank's FIFO: ``rankout``)
    into node.log, and then each span's source into node.idx."""

    def __init__(
        self, rundir: str, use_tty: bool, size: Optional[list[int]] = None, ranks: int = 0
    ) -> None:
        self.rundir = rundir
        # node.idx before node.log: a follower that finds node.log alone knows there is none
        index = os.path.join(rundir, contract.INDEX)
        self.index = create(index, flags=os.O_APPEND) if ranks else None
        self.log = create(os.path.join(rundir, contract.LOG), flags=os.O_APPEND)
        self.offset = 0  #: node.log's size
        reserve(rundir)
        self.slave = -1
        self.sources: list[Source] = []
        #: what the ranks' environment gets: how a rank knows its stdout is the node's pipe
        self.env: dict[str, str] = {}
        self._open(use_tty, size, ranks)
        self.full: Optional[str] = None  # why node.log cannot grow (disk full), once it cannot
        #: seconds a trickle collects (0: every wakeup reads at once, as ``drain`` does);
        #: never with ptys: a pty holds ~4 KB, and a rank's write would block mid-line
        self.gather = 0.0 if use_tty else GATHER_WAIT
        self.resume = 0.0  #: (monotonic) when the streams are read again, after a trickle

    def _open(self, use_tty: bool, size: Optional[list[int]], ranks: int) -> None:
        """The write end the processes get (``slave``), and the streams read from."""
        master, self.slave = open_output(use_tty, size)
        os.set_blocking(master, False)
        whole = self.index is not None
        node = Source(master, contract.SOURCE_NODE, _proc_name(self.slave, use_tty), whole)
        self.sources = [node] + rank_fifos(self.rundir, ranks, use_tty, size)
        self.env = {contract.OUTPUT_VAR: pipe_id(self.slave)} if ranks else {}

    def reopen(self, spec: SpecRecord) -> None:
        """A fresh pipe (or pty) and rank FIFOs for the next attempt's processes, once the
        last attempt's output is drained (a restart); node.log and node.idx go on."""
        for source in self.sources:
            source.close()
        remove_fifos(self.rundir)
        self._open(bool(spec.get("tty")), spec.get("tty_size"), told_apart(spec))
        self.gather = 0.0 if spec.get("tty") else GATHER_WAIT

    def close_writer(self) -> None:
        """Close our copy of the write end: the ranks hold the only ones left."""
        os.close(self.slave)

    def pump(self, timeout: float, wake: Optional[int] = None) -> bool:
        """Copy what the pipe or pty (and the ranks' FIFOs) hold to node.log; False once no
        writer is left.

        Waits up to ``timeout`` for output, or for a byte on ``wake``, or until an unfinished
        line is due. Drains each stream non-blocking up to 1 MB per wakeup and writes that in
        one go (a pty read returns at most ~4 KB: one select per read would cap a chatty
        rank's output). After a wakeup that read little (lines printed one at a time), the
        streams fill for ``gather`` s while only ``wake`` is watched: a few dozen reads and
        writes a second for a rank printing 1,000 lines, not thousands.
        """
        watched = [s.fd for s in self.sources if s.fd is not None]
        if not watched:
            return False
        wakes = [] if wake is None else [wake]
        now = time.monotonic()
        timeout = min([timeout] + [s.due(now) for s in self.sources if s.pending])
        if self.resume > now:
            woken = _woken(wakes, min(timeout, self.resume - now))
            now = time.monotonic()
            # An unfinished line that came due ends the wait: its end may be in the stream.
            if woken or (now < self.resume and not _due(self.sources, now)):
                return True
            timeout = 0.0
        ready = select.select(watched + wakes, [], [], timeout)[0]
        if wake is not None and wake in ready:
            _clear(wake)
        now = time.monotonic()
        size = _read(self.sources, ready, now)
        if 0 < size < GATHER_BELOW and self.gather:
            self.resume = now + self.gather
        self._emit(now)
        return any(s.fd is not None for s in self.sources)

    def _emit(self, now: float) -> None:
        """Append what every stream has ready, one span each, and their records."""
        parts: list[bytes] = []
        records: list[bytes] = []
        for source in self.sources:
            data = source.take(now)
            if data:
                parts.append(data)
                records.append(RECORD.pack(self.offset, len(data), source.source))
                self.offset += len(data)
        if parts:
            self._append(b"".join(parts), b"".join(records))

    def write(self, data: bytes) -> None:
        """Append ``data`` as the node's own (sshddp's words about it)."""
        if data:
            record = RECORD.pack(self.offset, len(data), contract.SOURCE_NODE)
            self.offset += len(data)
            self._append(data, record)

    def _append(self, data: bytes, records: bytes) -> None:
        """Append to node.log, then the spans' records to node.idx; on a full disk, note why
        and drop output from then on."""
        if self.full is not None:
            return
        try:
            for fd, what in ((self.log, data), (self.index, records)):
                while fd is not None and what:
                    what = what[os.write(fd, what) :]
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            self.full = (
                f"the disk of {self.rundir} is full ({exc.strerror}): node.log cannot grow, "
                "so the node was stopped"
            )
            self.unreserve()

    def drain(self, wait: float = ESCAPE_WAIT) -> list[Escaped]:
        """After the last process of the node is gone: copy every remaining byte. A writer
        still there after ``wait`` seconds escaped teardown: stop reading (its later output
        is lost) and return who holds the write end."""
        for source in self.sources:
            source.let_go()
        self.gather, self.resume = 0.0, 0.0  # the last bytes are all there: no reason to wait
        deadline = time.time() + wait
        while self.pump(0.05):
            if time.time() > deadline:
                holders: dict[int, Escaped] = {}
                for source in self.sources:
                    if source.fd is not None:
                        holders.update((e["pid"], e) for e in holding(source.name))
                        source.close()
                self._emit(time.monotonic())
                return list(holders.values())
        return []

    def close(self) -> None:
        """Close every descriptor of the output (a supervisor that never started torchrun)."""
        for source in self.sources:
            source.close()
        for fd in (self.log, self.index):
            if fd is not None:
                os.close(fd)

    def unreserve(self) -> None:
        unreserve(self.rundir)


def node_output(rundir: str, spec: SpecRecord) -> NodeOutput:
    """The node's output as its spec asks: a pipe or a pty, and its ranks told apart where
    they can be (``rankout.told_apart``)."""
    return NodeOutput(rundir, bool(spec.get("tty")), spec.get("tty_size"), told_apart(spec))


def reserve(rundir: str) -> None:
    """RESERVE_BYTES of room kept for exit.json, given back once node.log fills the disk."""
    try:
        with os.fdopen(create(os.path.join(rundir, contract.RESERVE)), "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)
    except FileExistsError:
        raise  # planted: refuse it rather than zero what it points to
    except OSError:
        unreserve(rundir)  # no room even for that: exit.json will try its luck


def unreserve(rundir: str) -> None:
    try:
        os.unlink(os.path.join(rundir, contract.RESERVE))
    except OSError:
        pass


def _due(sources: list[Source], now: float) -> bool:
    """Whether an unfinished line must go out now, as it is or with its end."""
    return any(s.pending and not s.due(now) for s in sources)


def _read(sources: list[Source], ready: list[int], now: float) -> int:
    """Read every stream in ``ready`` into its source; the bytes read."""
    size = 0
    for source in sources:
        if source.fd is not None and source.fd in ready:
            chunks, alive = _read_available(source.fd)
            data = b"".join(chunks)
            size += len(data)
            source.feed(data, now)
            if not alive:
                source.close()
    return size


def _woken(wakes: list[int], timeout: float) -> bool:
    """Wait up to ``timeout`` for a byte on one of ``wakes``; True (and read) if one came."""
    if not select.select(wakes, [], [], max(0.0, timeout))[0]:
        return False
    _clear(wakes[0])
    return True


def _clear(wake: int) -> None:
    try:
        os.read(wake, 4096)
    except OSError:
        pass


def _read_available(fd: int) -> tuple[list[bytes], bool]:
    """What ``fd`` holds now, up to PUMP_BYTES; False once its writers are all gone."""
    chunks: list[bytes] = []
    size = 0
    while size < PUMP_BYTES:
        try:
            # A pipe gives all it holds in one read, so the first asks for it all (a 200 MB
            # flood: 0.13-0.15 s of the supervisor's CPU, against 0.18-0.37 in 64 KB reads
            # joined); a pty gives ~4 KB a read, and the reads after the first ask for 64 KB.
            data = os.read(fd, PUMP_BYTES if not chunks else 1 << 16)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno != errno.EIO:  # EIO: a pty whose last writer closed
                raise
            data = b""
        if not data:
            return chunks, False
        chunks.append(data)
        size += len(data)
    return chunks, True


def _proc_name(fd: int, use_tty: bool) -> str:
    """What /proc/PID/fd/N reads for a descriptor of this output's write end."""
    return os.ttyname(fd) if use_tty else f"pipe:[{os.fstat(fd).st_ino}]"


def holding(target: str) -> list[Escaped]:
    """The processes (but this one) with a descriptor open on ``target`` (a /proc fd link)."""
    me = os.getpid()
    found: list[Escaped] = []
    for name in listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fds = f"/proc/{name}/fd"
        for fd in listdir(fds):
            try:
                if os.readlink(f"{fds}/{fd}") == target:
                    found.append({"pid": int(name), "command": command_of(int(name))})
                    break
            except OSError:
                continue
    return found


def command_of(pid: int) -> str:
    """A process's command line, printable ASCII only (shown to people), at most 200 chars."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read().rstrip(b"\0").replace(b"\0", b" ")
    except OSError:
        return "?"
    text = "".join(c if " " <= c <= "~" else "?" for c in raw.decode("ascii", "replace"))
    return text[:200]
