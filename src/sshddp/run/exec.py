"""``sshddp exec``: one command on every host in parallel, each host's output and status.

The command starts through the host's ``python`` (``remote/execute.py``), which gives it the
inventory's ``env`` and that interpreter's directory first on ``PATH``, as a node launcher.

Each host's connection is opened and its command run in the pool's threads (at most
``fanout`` at once). A host that cannot be reached says why, in the words doctor uses. With
``on_line`` every whole line is handed over as it arrives (``--stream``); either way each
host's whole output is kept for the grouped report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Callable, Optional

from sshddp.errors import SshddpError
from sshddp.hosts import shipped
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.exec import ExecStatus, HostExec, check_command, remote_command
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
    with HostPool(inventory.hosts, ssh, fanout) as pool:

        def one(host: Host) -> HostExec:
            start = time.monotonic()
            try:
                pool.transport(host).connect()
            except SshddpError as exc:
                hint = getattr(exc, "hint", "")
                error = exc.message + (f" (fix: {hint})" if hint else "")
                return HostExec(host.index, host.host, ExecStatus.UNREACHABLE, error=error)
            return _run(pool, host, command, timeout, on_line, start)

        outcomes = pool.map(one, inventory.hosts)
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
        output = _read(proc.read, host, on_line)
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


def _read(read: Callable[[], bytes], host: Host, on_line: Optional[LineSink]) -> bytes:
    """Everything the command writes; whole lines to ``on_line`` as they come."""
    chunks: list[bytes] = []
    partial = b""
    while True:
        try:
            chunk = read()
        except (OSError, EOFError):
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
        if on_line is not None:
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                on_line(host, line + b"\n")
    if on_line is not None and partial:
        on_line(host, partial + b"\n")
    return b"".join(chunks)
