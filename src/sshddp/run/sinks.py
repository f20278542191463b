"""Where node output goes: one local file per node, byte for byte, and the console.

The file gets exactly the bytes the node's remote log holds (so it can be resumed from its
size and compared with the remote copy), owner-only (0600 in a 0700 directory) as on the
hosts; the console gets whole lines, each prefixed with the node rank and host, coloured per
node on a terminal. What reaches the console is filtered for the terminal
(``model.escape.for_terminal``): the ranks' colours and ``\r`` progress bars pass, other
escape sequences do not, and a ``\r`` redraws the line's prefix, so that no rank can
overprint it.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import BinaryIO, Optional, Protocol

from sshddp.errors import LogWriteFailed, UsageError
from sshddp.model.escape import for_terminal, needs_filter, visible
from sshddp.model.plan import LaunchPlan

_COLORS = (b"36", b"33", b"35", b"32", b"34", b"91", b"96", b"93")
_RESET = b"\x1b[0m"
_MAX_PARTIAL = 64 * 1024
_CR = re.compile(rb"\r(?!\n|\Z)")  # a carriage return that starts a redraw of the line


class Screen(Protocol):
    """What a run writes to the user's terminal (``cli.terminal.Terminal`` is one)."""

    stdout_bytes: BinaryIO  #: the ranks' output, prefixed, goes here
    color: bool

    def out(self, text: str) -> None: ...
    def err(self, text: str) -> None: ...


def log_name(node_rank: int, host: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in host)
    return f"node{node_rank}-{safe}.log"


class Console:
    """Prefixed, line-buffered console output shared by every node's thread."""

    def __init__(self, stream: BinaryIO, color: bool) -> None:
        self._stream = stream
        self._color = color
        self._quiet = False  # the reader went away (`| head`); the log files go on
        self._lock = threading.Lock()
        self._partial: dict[int, bytes] = {}
        self._prefix: dict[int, bytes] = {}

    def add_node(self, node_rank: int, host: str, width: int) -> None:
        text = f"[{node_rank} {host}]".ljust(width).encode() + b" "
        if self._color:
            text = b"\x1b[" + _COLORS[node_rank % len(_COLORS)] + b"m" + text + _RESET
        self._prefix[node_rank] = text

    def write(self, node_rank: int, data: bytes) -> None:
        if self._quiet:
            return
        partial = self._partial.get(node_rank)
        buf = partial + data if partial else data
        head, sep, rest = buf.rpartition(b"\n")
        if len(rest) > _MAX_PARTIAL:  # a huge line without newline: show it in pieces
            head, sep, rest = buf, b"\n", b""
        self._partial[node_rank] = rest
        if sep:
            self._emit(node_rank, head)

    def flush_node(self, node_rank: int) -> None:
        """Print a node's unterminated last line (it printed no newline)."""
        rest = self._partial.pop(node_rank, b"")
        if rest and not self._quiet:
            self._emit(node_rank, rest)

    def _emit(self, node_rank: int, lines: bytes) -> None:
        """Print ``lines`` (newline-separated, no final newline), each with the prefix."""
        prefix = self._prefix.get(node_rank, f"[{node_rank}] ".encode())
        if needs_filter(lines):  # rare: most output holds no control character
            lines = _CR.sub(b"\r" + prefix, for_terminal(lines))
        # One C-level replace per chunk, not a Python loop per line: 200 MB of short lines
        # would otherwise cost seconds of coordinator CPU.
        out = prefix + lines.replace(b"\n", b"\n" + prefix) + b"\n"
        with self._lock:
            try:
                self._stream.write(out)
                self._stream.flush()
            except (OSError, ValueError):  # BrokenPipeError, or EIO: the terminal closed
                self._quiet = True  # the reader went away (`| head`); the log files go on

    def message(self, text: str) -> None:
        """One of sshddp's own lines; anything in it that came from a host is escaped."""
        with self._lock:
            self._stream.write(visible(text, multiline=True).encode("utf-8", "replace") + b"\n")
            self._stream.flush()


class NodeLogs:
    """The local log files of one run, opened for appending."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            _private_dirs(directory)
            probe = directory / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UsageError(
                f"log directory {directory}: cannot write there ({exc.strerror}); pass "
                "--log-dir with a writable directory"
            ) from exc
        self._files: dict[int, BinaryIO] = {}
        self.paths: dict[int, Path] = {}

    def open(self, node_rank: int, host: str) -> int:
        """Open (or reopen) a node's file; returns its size, the offset to resume from."""
        path = self.directory / log_name(node_rank, host)
        self.paths[node_rank] = path
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        if os.fstat(fd).st_mode & 0o077:  # a copy an older sshddp left readable to others
            os.fchmod(fd, 0o600)
        fh = os.fdopen(fd, "ab")
        self._files[node_rank] = fh
        return os.fstat(fd).st_size

    def write(self, node_rank: int, data: bytes) -> None:
        """Append ``data``; on failure the file holds an exact prefix of the node's log
        (unbuffered writes), so a later attach or ``logs`` resumes from its size."""
        fd = self._files[node_rank].fileno()
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError as exc:
            path = self.paths[node_rank]
            raise LogWriteFailed(f"cannot write the local log {path}: {exc.strerror}") from exc

    def size(self, node_rank: int) -> int:
        return os.fstat(self._files[node_rank].fileno()).st_size

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()


def _private_dirs(directory: Path) -> None:
    """Make ``directory`` and the parents it lacks, owner-only; the run's own directory is
    made owner-only even if it was there already (its files are the run's output)."""
    missing = []
    for parent in (directory, *directory.parents):
        if parent.exists():
            break
        missing.append(parent)
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)
    if not directory.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(directory))
    info = directory.stat()
    if info.st_mode & 0o077 and info.st_uid == os.getuid():
        directory.chmod(0o700)


def tail_lines(path: Optional[Path], lines: int) -> list[str]:
    """The last ``lines`` lines of a file, decoded leniently."""
    if path is None or not path.exists():
        return []
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - 256 * 1024))
        data = fh.read()
    # Lines end at "\n" only: a "\r" (a progress bar, or a forged overprint) stays inside
    # its line, where the report shows it escaped.
    text = data.decode("utf-8", "replace").removesuffix("\n")
    return [line.removesuffix("\r") for line in text.split("\n")][-lines:] if text else []


def open_sinks(
    plan: LaunchPlan, log_dir: Path, stream: BinaryIO, color: bool
) -> tuple[NodeLogs, Console]:
    """A run's local log files (opened to append, resuming) and its prefixed console."""
    logs = NodeLogs(log_dir)
    console = Console(stream, color)
    width = max(len(f"[{n.node_rank} {n.host.host}]") for n in plan.nodes)
    for node in plan.nodes:
        logs.open(node.node_rank, node.host.host)
        console.add_node(node.node_rank, node.host.host, width)
    return logs, console
