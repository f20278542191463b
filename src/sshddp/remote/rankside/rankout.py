"""Each rank's own output: a FIFO per local rank, read beside the node's pipe (with --tty a
pty per local rank, beside the node's), so that every span of node.log is known to come from
one rank (node.idx, ``contract.INDEX_RECORD``).

The supervisor makes RUNDIR/out/<local rank> (0600) before torchrun starts and holds both of
its ends: the read end, and a write end that keeps the FIFO from reaching end of file while
no rank has it open yet (or between torchrun's restarts). A rank whose stdout is the node's
pipe moves its stdout and stderr onto its FIFO as it starts (``ranksite``); whatever it
starts inherits them, so a DataLoader worker's lines are its rank's.

A ``Source`` gathers what one stream wrote into whole lines: node.log gets a rank's bytes
one whole line (or many) at a time, so no rank's line is ever split by another's. A line
left unfinished for PARTIAL_WAIT seconds (a ``\\r`` progress bar, a prompt) goes out as it
is, and so does one over MAX_PENDING bytes: output stays live.
"""

from __future__ import annotations

import fcntl
import os
import pty
import stat
import struct
import termios
import tty
from typing import Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import SpecRecord
from sshddp.remote.common import listdir, unlink

DEFAULT_SIZE = [80, 24]  # columns, rows of a pty when the spec names none (defaults.TTY_SIZE)
PARTIAL_WAIT = 0.1  # seconds an unfinished line waits for its end before it is written
MAX_PENDING = (1 << 20) + (1 << 16)  # a line a rank writes in one piece (rank.LINE_BYTES) fits
# A bigger pipe buffer: fewer wakeups for a chatty node, and room for what a rank writes
# while the supervisor lets a trickle collect (output.GATHER_WAIT) without blocking it.
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux only, named in Python 3.10+


class Source:
    """One stream into node.log, read non-blocking: the node's pipe or pty, or a rank's FIFO.

    ``whole``: hold an unfinished line back (node.idx then names its source); without it,
    every byte is written as it comes, as when there is no node.idx."""

    def __init__(
        self, fd: int, source: int, name: str, whole: bool, keeper: Optional[int] = None
    ) -> None:
        self.fd: Optional[int] = fd
        self.source = source  #: the local rank, or contract.SOURCE_NODE
        self.name = name  #: what /proc/PID/fd/N reads for a descriptor of its write end
        self.whole = whole
        self.keeper = keeper  #: our own write end of a FIFO, closed once the node is gone
        self.pending = b""
        self.since = 0.0  #: when the unfinished line's first byte came

    def feed(self, data: bytes, now: float) -> None:
        if data and not self.pending:
            self.since = now
        self.pending += data

    def due(self, now: float) -> float:
        """Seconds until the unfinished line goes out as it is."""
        return max(0.0, self.since + PARTIAL_WAIT - now)

    def take(self, now: float) -> bytes:
        """What may go to node.log now: whole lines, or the unfinished one once it is due
        (or too long, or its stream ended)."""
        buf = self.pending
        if not buf:
            return b""
        if not self.whole or self.fd is None or len(buf) > MAX_PENDING:
            self.pending = b""
            return buf
        cut = buf.rfind(b"\n") + 1
        if cut:
            # The line that waited has ended: what follows its end is a new line, with a
            # wait of its own (a read that stopped mid-line, its rest still in the stream).
            self.pending = buf[cut:]
            self.since = now
            return buf[:cut]
        if not self.due(now):  # one unfinished line that waited long enough: out as it is
            self.pending = b""
            return buf
        return b""

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.let_go()

    def let_go(self) -> None:
        """Close our write end: the FIFO ends once the processes that hold it are gone."""
        if self.keeper is not None:
            os.close(self.keeper)
            self.keeper = None


def rank_fifos(
    rundir: str, nproc: int, use_tty: bool = False, size: Optional[list[int]] = None
) -> list[Source]:
    """RUNDIR/out/<local rank> for every rank of the node (none for 0), open at both ends:
    a FIFO, or with ``use_tty`` a link to a pty of the rank's own, of ``size``, so that each
    rank's lines stay its own on a terminal too."""
    if not nproc:
        return []
    directory = os.path.join(rundir, contract.OUTPUTS)
    os.mkdir(directory, 0o700)  # new, like every file of the run directory
    if use_tty:
        return [_rank_pty(directory, local, size or DEFAULT_SIZE) for local in range(nproc)]
    sources = []
    for local in range(nproc):
        path = os.path.join(directory, str(local))
        os.mkfifo(path, 0o600)
        read = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        keeper = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        if not stat.S_ISFIFO(os.fstat(read).st_mode):
            raise OSError(f"{path} is not the FIFO it was made as")
        grow_pipe(read)
        sources.append(Source(read, local, os.readlink(f"/proc/self/fd/{read}"), True, keeper))
    return sources


def _rank_pty(directory: str, local: int, size: list[int]) -> Source:
    """A raw pty for one rank, and RUNDIR/out/<local rank> linked to it; its other end kept
    open here, as a FIFO's is (a pty's reader gets EIO once no writer is left)."""
    master, slave = open_pty(size)
    os.set_blocking(master, False)
    name = os.ttyname(slave)
    os.symlink(name, os.path.join(directory, str(local)))
    return Source(master, local, name, True, slave)


def grow_pipe(fd: int) -> None:
    """Give the pipe or FIFO ``fd`` PIPE_BYTES of buffer where the system allows it."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size for this user: keep the default
        pass


def open_pty(size: list[int]) -> tuple[int, int]:
    """(master, slave) of a new raw pty of ``size`` ([columns, rows])."""
    master, slave = pty.openpty()
    tty.setraw(slave)  # bytes pass unchanged: no CR added, no echo, no signal keys
    set_size(slave, size)
    return master, slave


def set_size(fd: int, size: list[int]) -> None:
    """Give the terminal ``fd`` is on [columns, rows] (TIOCSWINSZ), as a terminal emulator
    does when its window changes."""
    columns, rows = (max(1, min(int(v), 0xFFFF)) for v in size[:2])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def rank_ptys(rundir: str) -> list[str]:
    """The ranks' ptys (--tty), as RUNDIR/out links to them."""
    directory = os.path.join(rundir, contract.OUTPUTS)
    links = [os.path.join(directory, name) for name in sorted(listdir(directory))]
    targets = [os.readlink(link) for link in links if os.path.islink(link)]
    return [path for path in targets if path.startswith("/dev/pts/")]


def remove_fifos(rundir: str) -> None:
    """RUNDIR/out and its FIFOs gone, for the next attempt's (a restart) to be made anew."""
    directory = os.path.join(rundir, contract.OUTPUTS)
    for name in listdir(directory):
        unlink(os.path.join(directory, name))
    if os.path.isdir(directory):
        os.rmdir(directory)


def pipe_id(fd: int) -> str:
    """The node pipe's ``DEV:INO``, as a rank compares its stdout with it."""
    info = os.fstat(fd)
    return f"{info.st_dev}:{info.st_ino}"


def told_apart(spec: SpecRecord) -> int:
    """How many rank outputs the node gets: its ranks, for torchrun's ranks. None (0) for a
    node launcher's workers, which are not torchrun's ranks."""
    if spec.get("launcher", contract.LAUNCH_TORCHRUN) != contract.LAUNCH_TORCHRUN:
        return 0
    watch = spec.get("watch")
    nprocs = watch["nprocs"] if watch is not None else []
    node = spec.get("node_rank", 0)
    return int(nprocs[node]) if 0 <= node < len(nprocs) else 0
