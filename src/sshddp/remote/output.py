"""A node's output: one pipe (or a raw pty) that every rank writes into, copied byte for byte
to node.log by the supervisor.

When node.log cannot grow (its disk is full), the copy stops and says why: the supervisor
then stops the node and fails it, since output that cannot be kept would otherwise vanish
silently. A small reserve file, deleted then, leaves room for exit.json on the full disk.

Once the node's processes are gone, the output's last bytes are copied (``drain``); a
process that left the run's session and environment may still hold the write end, and no
EOF would ever come. ``drain`` waits for it ESCAPE_WAIT seconds, then names the holders.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import select
import struct
import termios
import time
import tty
from typing import Optional

from sshddp.remote import contract
from sshddp.remote.common import create, listdir
from sshddp.remote.contract import Escaped

PUMP_BYTES = 1 << 20
PIPE_BYTES = 1 << 20  # a bigger pipe buffer: fewer wakeups for a chatty node
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux only, named in Python 3.10+
RESERVE_BYTES = 64 * 1024
ESCAPE_WAIT = 2.0  # seconds the output may stay open once every process of the node is gone
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
DEFAULT_SIZE = [80, 24]  # columns, rows of the pty when the spec names none (defaults.TTY_SIZE)


def open_output(use_tty: bool, size: Optional[list[int]] = None) -> tuple[int, int]:
    """(read end, write end) of the node's output: a pipe, or a raw pty of ``size``
    ([columns, rows], the user's terminal's)."""
    if use_tty:
        master, slave = pty.openpty()
        tty.setraw(slave)  # bytes pass unchanged: no CR added, no echo, no signal keys
        set_size(slave, size or DEFAULT_SIZE)
        return master, slave
    read, write = os.pipe()
    try:
        fcntl.fcntl(read, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size for this user: keep the default
        pass
    return read, write


def set_size(fd: int, size: list[int]) -> None:
    """Give the terminal ``fd`` is on [columns, rows] (TIOCSWINSZ), as a terminal emulator
    does when its window changes."""
    columns, rows = (max(1, min(int(v), 0xFFFF)) for v in size[:2])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


class NodeOutput:
    """Copies the output's read end into node.log."""

    def __init__(self, rundir: str, use_tty: bool, size: Optional[list[int]] = None) -> None:
        self.rundir = rundir
        self.log = create(os.path.join(rundir, contract.LOG), flags=os.O_APPEND)
        self._reserve()
        master, self.slave = open_output(use_tty, size)
        self.writer = _proc_name(self.slave, use_tty)  # how /proc names the write end
        os.set_blocking(master, False)
        self.master: Optional[int] = master
        self.full: Optional[str] = None  # why node.log cannot grow (disk full), once it cannot

    def close_writer(self) -> None:
        """Close our copy of the write end: the ranks hold the only ones left."""
        os.close(self.slave)

    def pump(self, timeout: float, wake: Optional[int] = None) -> bool:
        """Copy what the pipe or pty holds to node.log; False once no writer is left.

        Waits up to ``timeout`` for output, or for a byte on ``wake``. Drains it
        non-blocking up to 1 MB per wakeup and writes that in one go (a pty read returns at
        most ~4 KB: one select per read would cap a chatty rank's output).
        """
        if self.master is None:
            return False
        watched = [self.master] if wake is None else [self.master, wake]
        ready, _, _ = select.select(watched, [], [], timeout)
        if wake is not None and wake in ready:
            try:
                os.read(wake, 4096)
            except OSError:
                pass
        if self.master not in ready:
            return True
        chunks, alive = self._read_available()
        self.write(b"".join(chunks))
        if not alive:
            os.close(self.master)
            self.master = None
        return alive

    def _read_available(self) -> tuple[list[bytes], bool]:
        assert self.master is not None
        chunks: list[bytes] = []
        size = 0
        while size < PUMP_BYTES:
            try:
                data = os.read(self.master, 1 << 16)
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

    def write(self, data: bytes) -> None:
        """Append to node.log; on a full disk, note why and drop output from then on."""
        if self.full is not None:
            return
        try:
            while data:
                data = data[os.write(self.log, data) :]
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
        deadline = time.time() + wait
        while self.pump(0.05):
            if time.time() > deadline:
                holders = holding(self.writer)
                if self.master is not None:
                    os.close(self.master)
                    self.master = None
                return holders
        return []

    def _reserve(self) -> None:
        try:
            with os.fdopen(create(os.path.join(self.rundir, contract.RESERVE)), "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
        except FileExistsError:
            raise  # planted: refuse it rather than zero what it points to
        except OSError:
            self.unreserve()  # no room even for that: exit.json will try its luck

    def unreserve(self) -> None:
        try:
            os.unlink(os.path.join(self.rundir, contract.RESERVE))
        except OSError:
            pass


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
