"""Where node output goes: one local file per node, byte for byte, and the console.

The file gets exactly the bytes the node's remote log holds (so it can be resumed from its
size and compared with the remote copy), owner-only (0600 in a 0700 directory) as on the
hosts; the console gets whole lines, each prefixed with the node's rank (or ranks) and host,
coloured per node on a terminal, and the live state of each node's progress bar
(``model.bars``). What reaches the console is filtered for the terminal
(``model.escape.for_terminal``): the ranks' colours pass, other escape sequences do not, and
a line that ``\r`` redraws shows as a terminal would leave it, after its prefix, so that no
rank can overprint the prefix.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable, Optional, Protocol

from sshddp import defaults
from sshddp.errors import LogWriteFailed, UsageError
from sshddp.model.bars import LineState, Sparse, bar_line, screen_rows
from sshddp.model.escape import for_terminal, needs_filter, visible
from sshddp.model.plan import LaunchPlan
from sshddp.model.ranksel import check_ranks, rank_label, shows

_COLORS = (b"36", b"33", b"35", b"32", b"34", b"91", b"96", b"93")
_RESET = b"\x1b[0m"
_MAX_PARTIAL = 64 * 1024
_SGR = re.compile(rb"\x1b\[[0-9;:]*m")


class Screen(Protocol):
    """What a run writes to the user's terminal (``cli.terminal.Terminal`` is one)."""

    stdout_bytes: BinaryIO  #: the ranks' output, prefixed, goes here
    color: bool
    ranks: Optional[frozenset[int]]  #: the ranks whose output the console shows (all: None)

    def out(self, text: str) -> None: ...
    def err(self, text: str) -> None: ...


def log_name(node_rank: int, host: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in host)
    return f"node{node_rank}-{safe}.log"


class Console:
    """Prefixed console output shared by every node's thread: whole lines, each as a terminal
    would leave it; and each node's live progress bar, as one line per node redrawn in place
    below the scrolling output on a terminal (``live``), or its latest state at most every
    ``bar_every`` seconds when piped."""

    def __init__(
        self,
        stream: BinaryIO,
        color: bool,
        live: bool = False,
        bar_every: float = defaults.BAR_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._color = color
        self._quiet = False  # the reader went away (`| head`); the log files go on
        self._lock = threading.Lock()
        self._lines: dict[int, LineState] = {}
        self._prefix: dict[int, bytes] = {}
        self._hidden: set[int] = set()  # nodes --ranks leaves out
        self._region = _BarRegion(stream, self._prefix) if live else None
        self._sparse = Sparse(bar_every)
        self._clock = clock

    def add_node(self, node_rank: int, label: str, width: int, shown: bool = True) -> None:
        """``label``: the node's ``rank host`` (``ranksel.rank_label``); ``shown``: whether
        --ranks lets its lines through."""
        text = f"[{label}]".ljust(width).encode() + b" "
        if self._color:
            text = b"\x1b[" + _COLORS[node_rank % len(_COLORS)] + b"m" + text + _RESET
        self._prefix[node_rank] = text
        if not shown:
            self._hidden.add(node_rank)

    def write(self, node_rank: int, data: bytes) -> None:
        if self._quiet or node_rank in self._hidden:
            return
        update = self._lines.setdefault(node_rank, LineState(_MAX_PARTIAL)).feed(data)
        lines = b"" if update.lines is None else self._prefixed(node_rank, update.lines)
        self._show(node_rank, lines, update.bar)

    def flush_node(self, node_rank: int) -> None:
        """Print a node's unterminated last line (it printed no newline)."""
        state = self._lines.pop(node_rank, None)
        rest = state.finish() if state is not None else None
        if not self._quiet and node_rank not in self._hidden:
            self._show(node_rank, b"" if rest is None else self._prefixed(node_rank, rest), None)

    def _prefixed(self, node_rank: int, lines: bytes) -> bytes:
        """``lines`` (newline-separated, no final newline), each with the prefix."""
        prefix = self._prefix.get(node_rank, f"[{node_rank}] ".encode())
        if needs_filter(lines):  # rare: most output holds no control character
            lines = for_terminal(lines)
        # One C-level replace per chunk, not a Python loop per line: 200 MB of short lines
        # would otherwise cost seconds of coordinator CPU.
        return prefix + lines.replace(b"\n", b"\n" + prefix) + b"\n"

    def _show(self, node_rank: int, lines: bytes, bar: Optional[bytes]) -> None:
        shown = None if bar is None else for_terminal(bar)
        with self._lock:
            if self._region is not None:
                if self._region.set(node_rank, shown) or lines:
                    self._put(self._region.around(lines))
                return
            if shown is None:
                self._sparse.done(node_rank)
            elif self._sparse.due(node_rank, self._clock()):
                lines += self._prefixed(node_rank, bar_line(shown, _MAX_PARTIAL))
            if lines:
                self._put(lines)

    def _put(self, data: bytes) -> None:
        try:
            self._stream.write(data)
            self._stream.flush()
        except (OSError, ValueError):  # BrokenPipeError, or EIO: the terminal closed
            self._quiet = True  # the reader went away (`| head`); the log files go on

    def message(self, text: str) -> None:
        """One of sshddp's own lines; anything in it that came from a host is escaped."""
        line = visible(text, multiline=True).encode("utf-8", "replace") + b"\n"
        with self._lock:
            self._put(line if self._region is None else self._region.around(line))


class _BarRegion:
    """The live bars on a terminal: one line per node below the scrolling output. The
    cursor rests at the start of the line below them."""

    def __init__(self, stream: BinaryIO, prefixes: dict[int, bytes]) -> None:
        self._stream = stream
        self._prefix = prefixes
        self._bars: dict[int, bytes] = {}
        self._widths: list[int] = []  # the characters of each line the region drew

    def set(self, node_rank: int, state: Optional[bytes]) -> bool:
        """Note a node's bar state (None: it has none); whether that changes the region."""
        if state is None:
            return self._bars.pop(node_rank, None) is not None
        changed = self._bars.get(node_rank) != state
        self._bars[node_rank] = state
        return changed

    def around(self, lines: bytes) -> bytes:
        """Erase the region, print ``lines`` where it was, draw it again below them."""
        columns, rows = terminal_size(self._stream)
        up = screen_rows(self._widths, columns)  # a narrower window re-wraps what was drawn
        erase = b"\x1b[%dA\x1b[J" % up if up else b""
        drawn, self._widths = [], []
        for node_rank in sorted(self._bars)[: max(1, rows - 2)]:
            prefix = self._prefix.get(node_rank, b"")
            shown = len(_SGR.sub(b"", prefix).decode("utf-8", "replace"))
            bar = bar_line(self._bars[node_rank], columns - 1 - shown)
            drawn.append(prefix + bar + _RESET + b"\n")
            self._widths.append(shown + len(bar.decode("utf-8", "replace")))
        return erase + lines + b"".join(drawn)


def terminal_size(*streams: IO[Any]) -> tuple[int, int]:
    """The columns and rows of the terminal the first of ``streams`` that is on one is on;
    80x24 when none is."""
    for stream in streams:
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError, AttributeError):  # not a terminal, or no descriptor
            continue
        if size.columns and size.lines:
            return size.columns, size.lines
    return defaults.TTY_SIZE


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


def open_sinks(plan: LaunchPlan, log_dir: Path, screen: Screen) -> tuple[NodeLogs, Console]:
    """A run's local log files (opened to append, resuming) and its prefixed console, which
    shows the ranks ``screen.ranks`` selects (every one when None)."""
    if screen.ranks is not None:
        check_ranks(screen.ranks, plan.world_size, plan.run_id)
    logs = NodeLogs(log_dir)
    stream = screen.stdout_bytes
    console = Console(stream, screen.color, live=_isatty(stream))
    labels = {n.node_rank: f"{rank_label(n.first_rank, n.nproc)} {n.host.host}" for n in plan.nodes}
    width = max(len(f"[{label}]") for label in labels.values())
    for node in plan.nodes:
        logs.open(node.node_rank, node.host.host)
        ranks = range(node.first_rank, node.first_rank + node.nproc)
        console.add_node(node.node_rank, labels[node.node_rank], width, shows(screen.ranks, ranks))
    return logs, console


def _isatty(stream: BinaryIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
