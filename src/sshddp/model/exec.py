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

import codecs
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, Protocol, Union

from sshddp.errors import ExitCode, UsageError
from sshddp.model.commands import python_command
from sshddp.model.escape import for_terminal

RULE = "-" * 16
PIECE = 1024 * 1024  #: the most of a host's output handed on at once (and filtered as one)
_SLOT = "\0sshddp: a host's output\0"  #: where json_pieces writes it (no field holds a NUL)


class Output(Protocol):
    """One host's output as kept: in memory, or partly in a file (``run/exec.py``)."""

    @property
    def size(self) -> int:
        """Bytes kept."""

    @property
    def digest(self) -> bytes:
        """SHA-256 of what is kept: identical outputs are grouped by it."""

    @property
    def cut(self) -> str:
        """What of the output was not kept, in words ("" when nothing was cut)."""

    def pieces(self) -> Iterator[bytes]:
        """What is kept, in order, in pieces of at most ``PIECE`` bytes."""


@dataclass(frozen=True)
class InMemory:
    """An output held as one ``bytes``."""

    data: bytes = b""
    cut: str = ""

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.data).digest()

    def pieces(self) -> Iterator[bytes]:
        for start in range(0, len(self.data), PIECE):
            yield self.data[start : start + PIECE]


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
    #: stdout and stderr together, as the command wrote them
    output: Union[bytes, Output] = field(default=b"", compare=False)
    exit: Optional[int] = None  #: the exit status, when the command ended by itself
    error: str = ""  #: why the host has no outcome (unreachable), in words
    seconds: float = 0.0

    def label(self) -> str:
        if self.status is ExecStatus.TIMEOUT:
            return "timed out"
        if self.status is ExecStatus.UNREACHABLE:
            return "unreachable"
        return f"exit {self.exit}"

    def kept(self) -> Output:
        """The output as kept (bytes given: held in memory)."""
        return InMemory(self.output) if isinstance(self.output, bytes) else self.output


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
    """The shell line that starts the host's ``python`` for ``remote/calls/execute.py`` (which
    gets the argv and the environment on stdin), its stderr joined to stdout from the
    start: a missing interpreter says so in the output."""
    return "exec 2>&1; " + python_command(python)


def groups(results: Sequence[HostExec]) -> list[tuple[list[HostExec], Output]]:
    """Hosts with the same output and status, in host order, each group once."""
    found: dict[tuple[bytes, int, str, str], list[HostExec]] = {}
    bodies: dict[tuple[bytes, int, str, str], Output] = {}
    for r in sorted(results, key=lambda r: r.node):
        body = r.kept() if r.status is not ExecStatus.UNREACHABLE else InMemory(r.error.encode())
        key = (body.digest, body.size, body.cut, r.label())
        found.setdefault(key, []).append(r)
        bodies.setdefault(key, body)
    return [(members, bodies[key]) for key, members in found.items()]


def render(results: Sequence[HostExec], terminal: bool = False) -> bytes:
    """The grouped output (``rendered``) as one ``bytes``."""
    return b"".join(rendered(results, terminal))


def rendered(results: Sequence[HostExec], terminal: bool = False) -> Iterator[bytes]:
    """The grouped output, piece by piece: a header naming the hosts and their status, then
    the output (filtered for a ``terminal``), then what of it was cut, if anything."""
    for members, body in groups(results):
        names = ",".join(r.host for r in members)
        yield f"{RULE}\n{names} ({members[0].label()})\n{RULE}\n".encode()
        last = b"\n"
        for piece in _whole_lines(body.pieces()) if terminal else body.pieces():
            shown = for_terminal(piece) if terminal else piece
            if shown:
                last = shown[-1:]
                yield shown
        if last != b"\n":
            yield b"\n"
        if body.cut:
            yield f"[sshddp: {body.cut}]\n".encode()


def _whole_lines(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """``pieces`` cut after a newline where one is near, so the terminal's filter never
    sees an escape sequence split in two."""
    rest = b""
    for piece in pieces:
        rest += piece
        end = rest.rfind(b"\n") + 1
        if end == 0 and len(rest) < PIECE:
            continue
        end = end or len(rest)
        yield rest[:end]
        rest = rest[end:]
    if rest:
        yield rest


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
    """The ``--json`` document (``json_pieces``) as one string."""
    return "".join(json_pieces(results))


def json_pieces(results: Sequence[HostExec]) -> Iterator[str]:
    """The ``--json`` document, piece by piece: each host's output is decoded and escaped
    a piece at a time, so a large one is never held whole (the text is ``json.dumps``'s)."""
    ordered = sorted(results, key=lambda r: r.node)
    hosts: list[dict[str, Any]] = [
        {
            "node": r.node,
            "host": r.host,
            "status": r.status.value,
            "exit": r.exit,
            "output": _SLOT,
            "cut": r.kept().cut or None,
            "error": r.error or None,
            "seconds": round(r.seconds, 3),
        }
        for r in ordered
    ]
    ok = all(r.status is ExecStatus.OK for r in results)
    parts = json.dumps({"ok": ok, "hosts": hosts}, indent=2).split(json.dumps(_SLOT))
    for part, r in zip(parts, ordered):
        yield part + '"'
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for piece in r.kept().pieces():
            yield json.dumps(decoder.decode(piece))[1:-1]
        yield json.dumps(decoder.decode(b"", final=True))[1:-1] + '"'
    yield parts[-1]
