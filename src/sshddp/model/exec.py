"""Pure: ``sshddp exec``'s remote command line, its per-host outcomes, and how they print.

A command reaches every host as the argv the user typed, over stdin (no shell in between:
no expansion, no second command), and runs as a node launcher's does: the inventory's
``env`` added and the host's ``python`` directory first on ``PATH``. stderr joins stdout
in the order the command wrote them, as pdsh shows them. Hosts whose
output and status are identical print once under one header listing them (``dshbak -c``).
On a terminal what the hosts wrote passes the console's filter (``escape.for_terminal``):
colours, not clipboard writes, retitles or screen clears; elsewhere it is printed exact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

from sshddp.errors import ExitCode, UsageError
from sshddp.model.commands import python_command
from sshddp.model.escape import for_terminal

RULE = "-" * 16


class ExecStatus(str, Enum):
    """How the command ended on one host."""

    OK = "ok"  #: exit status 0
    FAILED = "failed"  #: a non-zero exit status, or killed by a signal
    TIMEOUT = "timeout"  #: still running at --timeout; the connection was closed
    UNREACHABLE = "unreachable"  #: the host could not be reached


@dataclass(frozen=True)
class HostExec:
    """One host's outcome of ``sshddp exec``."""

    node: int  #: the host's index in the inventory
    host: str
    status: ExecStatus
    output: bytes = b""  #: stdout and stderr together, as the command wrote them
    exit: Optional[int] = None  #: the exit status, when the command ended by itself
    error: str = ""  #: why the host has no outcome (unreachable), in words
    seconds: float = 0.0

    def label(self) -> str:
        if self.status is ExecStatus.TIMEOUT:
            return "timed out"
        if self.status is ExecStatus.UNREACHABLE:
            return "unreachable"
        return f"exit {self.exit}"


def check_command(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` as it is, or ``UsageError`` for one no host could run."""
    if not argv:
        raise UsageError("missing COMMAND: `sshddp exec INVENTORY -- COMMAND [ARGS...]`")
    if argv[0].startswith("-") or not argv[0]:
        raise UsageError(
            f"COMMAND {argv[0]!r}: a command name cannot be empty or start with '-'; put exec's "
            "own options before the inventory"
        )
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(
                f"COMMAND argument {i + 1} ({arg!r}) is not UTF-8 text; an SSH command line is"
            ) from None
    return tuple(argv)


def remote_command(python: str) -> str:
    """The shell line that starts the host's ``python`` for ``remote/execute.py`` (which
    gets the argv and the environment on stdin), its stderr joined to stdout from the
    start: a missing interpreter says so in the output."""
    return "exec 2>&1; " + python_command(python)


def groups(results: Sequence[HostExec]) -> list[tuple[list[HostExec], bytes]]:
    """Hosts with the same output and status, in host order, each group once."""
    found: dict[tuple[bytes, str], list[HostExec]] = {}
    for r in sorted(results, key=lambda r: r.node):
        body = r.output if r.status is not ExecStatus.UNREACHABLE else r.error.encode()
        found.setdefault((body, r.label()), []).append(r)
    return [(members, key[0]) for key, members in found.items()]


def render(results: Sequence[HostExec], terminal: bool = False) -> bytes:
    """The grouped output: a header naming the hosts and their status, then the output
    (filtered for a ``terminal``)."""
    out = []
    for members, body in groups(results):
        names = ",".join(r.host for r in members)
        header = f"{RULE}\n{names} ({members[0].label()})\n{RULE}\n"
        shown = for_terminal(body) if terminal else body
        out.append(header.encode() + shown + (b"" if not shown or shown.endswith(b"\n") else b"\n"))
    return b"".join(out)


def stream_line(prefix: bytes, line: bytes, terminal: bool = False) -> bytes:
    """One line of ``--stream``, after its host's prefix. On a ``terminal`` it is filtered,
    and only what follows its last ``\\r`` is shown (where a progress bar ends): a ``\\r``
    never overprints the prefix to pass the line off as another host's."""
    if terminal:
        body = line[:-1] if line.endswith(b"\n") else line
        line = for_terminal(body.rstrip(b"\r").rsplit(b"\r", 1)[-1]) + b"\n"
    return prefix + line


def summary(results: Sequence[HostExec]) -> str:
    """One line for the terminal's stderr: which hosts failed, and how."""
    bad = [r for r in sorted(results, key=lambda r: r.node) if r.status is not ExecStatus.OK]
    if not bad:
        return f"sshddp: exec: exit 0 on all {len(results)} host(s)"
    named = "; ".join(f"{r.host} ({r.label()})" for r in bad)
    return f"sshddp: exec: failed on {len(bad)} of {len(results)} host(s): {named}"


def exit_code(results: Sequence[HostExec]) -> ExitCode:
    """4 when a host was unreachable, 1 when the command failed somewhere, else 0."""
    if any(r.status is ExecStatus.UNREACHABLE for r in results):
        return ExitCode.UNREACHABLE
    if any(r.status is not ExecStatus.OK for r in results):
        return ExitCode.RUN_FAILED
    return ExitCode.OK


def to_json(results: Sequence[HostExec]) -> str:
    hosts: list[dict[str, Any]] = [
        {
            "node": r.node,
            "host": r.host,
            "status": r.status.value,
            "exit": r.exit,
            "output": r.output.decode("utf-8", "replace"),
            "error": r.error or None,
            "seconds": round(r.seconds, 3),
        }
        for r in sorted(results, key=lambda r: r.node)
    ]
    ok = all(r.status is ExecStatus.OK for r in results)
    return json.dumps({"ok": ok, "hosts": hosts}, indent=2)
