"""``sshddp exec``: one command on every host in parallel, each host's output and status.

The command starts through the host's ``python`` (``remote/calls/execute.py``), which gives it the
inventory's ``env`` and that interpreter's directory first on ``PATH``, as a node launcher.

Each host's connection is opened and its command run in the pool's threads (at most
``fanout`` at once). A host that cannot be reached says why, in the words doctor uses. With
``on_line`` every whole line is handed over as it arrives (``--stream``) and nothing is kept;
otherwise each host's output is kept for the grouped report: ``EXEC_IN_MEMORY`` bytes of it
in memory, the rest in an unlinked file of a private temporary directory, up to
``EXEC_KEPT`` bytes (what is past it, or past a full disk, is counted and said, not kept).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Callable, Optional

from sshddp import defaults
from sshddp.errors import SshddpError
from sshddp.hosts import shipped
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.exec import (
    PIECE,
    ExecStatus,
    HostExec,
    InMemory,
    Output,
    check_command,
    remote_command,
)
from sshddp.model.inventory import Host, Inventory

#: (host, one line of its output, newline included) as it arrives
LineSink = Callable[[Host, bytes], None]


def run_everywhere(
    inventory: Inventory,
    argv: Sequence[str],
    ssh: SshOptions,
    fanout: int,
    timeout: Optional[float] = None,
    on_line: Optional[LineSink] = None,
) -> list[HostExec]:
    """Run ``argv`` on every host of ``inventory``; every host's outcome, in host order."""
    command = check_command(argv)
    spill = tempfile.mkdtemp(prefix="sshddp-exec-")  # 0700: its files are unlinked at once
    with HostPool(inventory.hosts, ssh, fanout) as pool:

        def one(host: Host) -> HostExec:
            start = time.monotonic()
            try:
                pool.transport(host).connect()
            except SshddpError as exc:
                hint = getattr(exc, "hint", "")
                error = exc.message + (f" (fix: {hint})" if hint else "")
                seconds = time.monotonic() - start  # --json: how long it took to give up
                return HostExec(
                    host.index, host.host, ExecStatus.UNREACHABLE, error=error, seconds=seconds
                )
            return _run(pool, host, command, timeout, on_line, start, spill)

        try:
            outcomes = pool.map(one, inventory.hosts)
        finally:
            shutil.rmtree(spill, ignore_errors=True)
    return outcomes.in_order(
        inventory.hosts, lambda h, why: HostExec(h.index, h.host, ExecStatus.UNREACHABLE, error=why)
    )


def _run(
    pool: HostPool,
    host: Host,
    command: Sequence[str],
    timeout: Optional[float],
    on_line: Optional[LineSink],
    start: float,
    spill: str,
) -> HostExec:
    proc = pool.transport(host).start(remote_command(host.python))
    proc.write(shipped.header("execute", {"argv": list(command), "env": dict(host.env)}))
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.close()  # like pdsh -u: the command is abandoned, its host reported

    timer = threading.Timer(timeout, expire) if timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        proc.close_stdin()
        output = _read(proc.read, host, on_line, Spool(spill, keep=on_line is None))
        status = None if expired.is_set() else proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        proc.close()
    seconds = time.monotonic() - start
    if status is None or expired.is_set():
        return HostExec(host.index, host.host, ExecStatus.TIMEOUT, output, seconds=seconds)
    state = ExecStatus.OK if status == 0 else ExecStatus.FAILED
    return HostExec(host.index, host.host, state, output, exit=status, seconds=seconds)


def _read(
    read: Callable[[], bytes], host: Host, on_line: Optional[LineSink], kept: Spool
) -> Output:
    """Everything the command writes, into ``kept``; whole lines to ``on_line`` as they
    come."""
    partial = b""
    while True:
        try:
            chunk = read()
        except (OSError, EOFError):
            chunk = b""
        if not chunk:
            break
        kept.add(chunk)
        if on_line is not None:
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                on_line(host, line + b"\n")
    if on_line is not None and partial:
        on_line(host, partial + b"\n")
    return kept.done()


class Spool:
    """One host's output as it arrives: ``EXEC_IN_MEMORY`` bytes in memory, then the rest
    in a file of ``directory`` (made 0600 and unlinked at once: it goes with its last
    reader), up to ``EXEC_KEPT`` bytes; what is past that, or past a full disk, is counted."""

    def __init__(self, directory: str, keep: bool = True) -> None:
        self.directory = directory
        self.keep = keep
        self.head = bytearray()
        self.file: Optional[IO[bytes]] = None
        self.size = 0
        self.dropped = 0
        self.why = ""
        self.hash = hashlib.sha256()

    def add(self, data: bytes) -> None:
        if not self.keep:
            return
        room = min(len(data), max(0, defaults.EXEC_KEPT - self.size)) if not self.why else 0
        if room < len(data) and not self.why:
            self.why = f"the output is longer than sshddp keeps ({defaults.EXEC_KEPT} bytes)"
        kept, self.dropped = data[:room], self.dropped + len(data) - room
        if self.file is None and len(self.head) + len(kept) <= defaults.EXEC_IN_MEMORY:
            self.head += kept
        elif kept:
            self._spill(kept)
            return
        self._counted(kept)

    def _spill(self, data: bytes) -> None:
        try:
            if self.file is None:
                self.file = tempfile.TemporaryFile(dir=self.directory)
            self.file.write(data)
        except OSError as exc:
            self.why = (
                f"the temporary directory {self.directory} could not take more: {exc.strerror}"
            )
            self.dropped += len(data)
            return
        self._counted(data)

    def _counted(self, data: bytes) -> None:
        self.size += len(data)
        self.hash.update(data)

    def done(self) -> Output:
        """The output as kept."""
        cut = f"{self.dropped} more bytes were not kept: {self.why}" if self.dropped else ""
        if self.file is None:
            return InMemory(bytes(self.head), cut)
        try:
            self.file.flush()
        except OSError as exc:  # what the buffer held is lost: say so, keep the rest
            cut = cut or f"the output was cut: {exc.strerror}"
        return _Spilled(bytes(self.head), self.file, self.size, self.hash.digest(), cut)


class _Spilled:
    """An output partly in memory, the rest in an unlinked file."""

    def __init__(self, head: bytes, file: IO[bytes], size: int, digest: bytes, cut: str) -> None:
        self.head, self.file, self.size, self.digest, self.cut = head, file, size, digest, cut

    def pieces(self) -> Iterator[bytes]:
        yield from InMemory(self.head).pieces()
        offset = 0
        while True:
            piece = os.pread(self.file.fileno(), PIECE, offset)
            if not piece:
                return
            offset += len(piece)
            yield piece
