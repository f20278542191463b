"""Where node output goes: one local file per node, byte for byte, and the console.

The file gets exactly the bytes the node's remote log holds (so it can be resumed from its
size and compared with the remote copy), and beside it the node's index, which rank wrote
each span (``model.spans``), owner-only (0600 in a 0700 directory) as on the hosts; the
console gets whole lines, each prefixed with the rank that wrote it (or, where that is not
known, the node's ranks) and host, coloured per node on a terminal, and the live state of
each rank's progress bar (``model.bars``). What reaches the console is filtered for the terminal
(``model.escape.for_terminal``): the ranks' colours pass, other escape sequences do not, and
a line that ``\r`` redraws shows as a terminal would leave it, after its prefix, so that no
rank can overprint the prefix. On a node that tells its ranks apart, what is not a rank's is
torchrun's agent (its OMP banner, its stopping of workers, its failure summary): the console
leaves that to the logs, but for sshddp's own lines about the node, unless asked (``agent``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable, Optional, Protocol

from sshddp import defaults
from sshddp.errors import UsageError
from sshddp.model import spans
from sshddp.model.bars import LineState, Sparse, bar_line, screen_rows
from sshddp.model.escape import for_terminal, needs_filter, visible
from sshddp.model.layout import NodeLayout, RunLayout
from sshddp.model.ranksel import check_ranks, rank_label, shows, source_ranks
from sshddp.model.victims import Folds, Writer
from sshddp.protocol.contract import SOURCE_NODE
from sshddp.run.logfiles import LocalCopy, Say, open_run_dir

_COLORS = (b"36", b"33", b"35", b"32", b"34", b"91", b"96", b"93")
_RESET = b"\x1b[0m"
_MAX_PARTIAL = 64 * 1024
_SGR = re.compile(rb"\x1b\[[0-9;:]*m")
Key = tuple[int, int]  #: a stream of the console: (node rank, local rank or SOURCE_NODE)


class Screen(Protocol):
    """What a run writes to the user's terminal (``cli.terminal.Terminal`` is one)."""

    stdout_bytes: BinaryIO  #: the ranks' output, prefixed, goes here
    color: bool
    verbose: bool  #: torchrun's agent's lines shown too (-v)

    def out(self, text: str) -> None: ...
    def err(self, text: str) -> None: ...


def log_name(node_rank: int, host: str, suffix: str = ".log") -> str:
    """A node's local log file; with ``suffix`` ".idx", its index (``model.spans``)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in host)
    return f"node{node_rank}-{safe}{suffix}"


def goes_nowhere(stream: BinaryIO) -> bool:
    """Whether ``stream`` is /dev/null: what nobody can read is not formatted (prefixing and
    filtering a flood of 64-byte lines costs the coordinator about 0.65 s of CPU a GB)."""
    try:
        return os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's buffer)
        return False


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
        agent: bool = True,
        fold: bool = False,
    ) -> None:
        """``fold``: later tracebacks shown one line each (``model.victims``)."""
        self._stream = stream
        self._agent = agent  # torchrun's own lines shown (-v, logs)
        self._color = color
        # the reader went away (`| head`), or there is none (/dev/null); the log files go on
        self._quiet = goes_nowhere(stream)
        self._lock = threading.Lock()
        self._lines: dict[Key, LineState] = {}
        self._prefix: dict[Key, bytes] = {}
        self._hidden: set[Key] = set()  # nodes and ranks --ranks leaves out
        self._region = _BarRegion(stream, self._prefix) if live else None
        self._sparse = Sparse(bar_every)
        self._clock = clock
        self._folds = Folds() if fold else None
        self.width = 0  #: the prefixes' width (``open_sinks``)
        self.selected: Optional[frozenset[int]] = None  #: --ranks (None: every rank)

    def add_node(
        self,
        node_rank: int,
        label: str,
        width: int,
        shown: bool = True,
        writer: Optional[Writer] = None,
    ) -> None:
        """``label``: the node's ``rank host`` (``ranksel.rank_label``); ``shown``: whether
        --ranks lets its lines through; ``writer``: who it is, for a folded traceback."""
        self._add((node_rank, SOURCE_NODE), label, width, shown, writer)

    def add_rank(
        self,
        node_rank: int,
        local_rank: int,
        label: str,
        width: int,
        shown: bool = True,
        writer: Optional[Writer] = None,
    ) -> None:
        """A rank's own lines, on a node that tells its ranks apart; ``label``: its
        ``rank host``."""
        self._add((node_rank, local_rank), label, width, shown, writer)

    def _add(self, key: Key, label: str, width: int, shown: bool, writer: Optional[Writer]) -> None:
        if writer is not None and self._folds is not None:
            self._folds.add(key, writer)
        text = f"[{label}]".ljust(width).encode() + b" "
        if self._color:
            text = b"\x1b[" + _COLORS[key[0] % len(_COLORS)] + b"m" + text + _RESET
        self._prefix[key] = text
        self._hidden.discard(key)  # added again: a spare seated mid-run (``seat_spare``)
        if not shown:
            self._hidden.add(key)

    def write(
        self, node_rank: int, data: bytes, source: int = SOURCE_NODE, agent: bool = False
    ) -> None:
        """A node's output; ``source``: the local rank that wrote it, where known; ``agent``:
        the bytes are torchrun's agent's (the node's own, on a node that tells ranks apart)."""
        key = (node_rank, source)
        if key not in self._prefix:
            key = (node_rank, SOURCE_NODE)
        if self._quiet or key in self._hidden:
            return
        if agent and not self._agent:
            data = sshddp_lines(data)
            if not data:
                return
        update = self._lines.setdefault(key, LineState(_MAX_PARTIAL)).feed(data)
        shown = self._folded(key, update.lines)
        lines = b"" if shown is None else self._prefixed(key, shown)
        self._show(key, lines, update.bar)

    def _folded(self, key: Key, lines: Optional[bytes]) -> Optional[bytes]:
        """``lines`` as the console shows them: with later tracebacks folded."""
        if lines is None or self._folds is None:
            return lines
        with self._lock:  # every node's thread: one first failure
            return self._folds.lines(key, lines, self._clock())

    def flush_node(self, node_rank: int) -> None:
        """Print a node's unterminated last lines (it printed no newline), and a traceback
        it ended inside of."""
        keys = {k for k in self._lines if k[0] == node_rank}
        for key in sorted(keys | {(node_rank, SOURCE_NODE)}):
            state = self._lines.pop(key, None)
            rest = self._folded(key, None if state is None else state.finish())
            held = self._held(key)
            if not self._quiet and key not in self._hidden:
                for text in (held, rest):
                    if text is not None:
                        self._show(key, self._prefixed(key, text), None)

    def _held(self, key: Key) -> Optional[bytes]:
        if self._folds is None:
            return None
        with self._lock:
            return self._folds.flush(key)

    def _prefixed(self, key: Key, lines: bytes) -> bytes:
        """``lines`` (newline-separated, no final newline), each with the prefix."""
        prefix = self._prefix.get(key, f"[{key[0]}] ".encode())
        if needs_filter(lines):  # rare: most output holds no control character
            lines = for_terminal(lines)
        # One C-level replace per chunk, not a Python loop per line: 200 MB of short lines
        # would otherwise cost seconds of coordinator CPU.
        return b"".join((prefix, lines.replace(b"\n", b"\n" + prefix), b"\n"))

    def _show(self, key: Key, lines: bytes, bar: Optional[bytes]) -> None:
        shown = None if bar is None else for_terminal(bar)
        with self._lock:
            if self._region is not None:
                if self._region.set(key, shown) or lines:
                    self._put(self._region.around(lines))
                return
            if shown is None:
                self._sparse.done(key)
            elif self._sparse.due(key, self._clock()):
                rows = shown.split(b"\n")
                lines += self._prefixed(key, b"\n".join(bar_line(r, _MAX_PARTIAL) for r in rows))
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


_OWN = b"sshddp: "  #: how the supervisor's lines in a node's log start (cannot start ...)


def sshddp_lines(data: bytes) -> bytes:
    """The lines of ``data`` (whole lines: its spans end at a newline) that sshddp wrote."""
    if _OWN not in data:  # torchrun's agent: most of its spans
        return b""
    return b"".join(line for line in data.splitlines(keepends=True) if line.startswith(_OWN))


class _BarRegion:
    """The live bars on a terminal: each stream's live rows (one for a ``\\r`` bar, more
    for a display that moves the cursor up) below the scrolling output. The cursor rests
    at the start of the line below them."""

    def __init__(self, stream: BinaryIO, prefixes: dict[Key, bytes]) -> None:
        self._stream = stream
        self._prefix = prefixes
        self._bars: dict[Key, bytes] = {}
        self._widths: list[int] = []  # the characters of each line the region drew

    def set(self, key: Key, state: Optional[bytes]) -> bool:
        """Note a stream's bar state (None: it has none); whether that changes the region."""
        if state is None:
            return self._bars.pop(key, None) is not None
        changed = self._bars.get(key) != state
        self._bars[key] = state
        return changed

    def around(self, lines: bytes) -> bytes:
        """Erase the region, print ``lines`` where it was, draw it again below them."""
        columns, rows = terminal_size(self._stream)
        up = screen_rows(self._widths, columns)  # a narrower window re-wraps what was drawn
        erase = b"\x1b[%dA\x1b[J" % up if up else b""
        drawn, self._widths = [], []
        states = [(key, row) for key in sorted(self._bars) for row in self._bars[key].split(b"\n")]
        for key, state in states[: max(1, rows - 2)]:
            prefix = self._prefix.get(key, b"")
            shown = len(_SGR.sub(b"", prefix).decode("utf-8", "replace"))
            bar = bar_line(state, columns - 1 - shown)
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
    """The local log files of one run (``logfiles``), opened for appending."""

    def __init__(self, directory: Path, fresh: bool = False, say: Say = lambda text: None) -> None:
        """``fresh``: a launch's new run, whose directory holds nothing yet; ``say``: where
        a note about a local copy goes."""
        self.directory = directory
        try:
            self._dir, self._made = open_run_dir(directory, fresh)
        except OSError as exc:
            raise UsageError(
                f"log directory {directory}: cannot write there ({exc.strerror}); pass "
                "--log-dir with a writable directory"
            ) from exc
        self._say = say
        self._copies: dict[int, LocalCopy] = {}
        self.paths: dict[int, Path] = {}
        self.index_paths: dict[int, Path] = {}  #: each node's index, where it has one
        #: a spare's mesh slot -> the node rank it took mid-run (its copy is named for it)
        self.seats: dict[int, int] = {}

    def open(self, node_rank: int, host: str, named: Optional[int] = None) -> int:
        """Open (or reopen) a node's file, named for ``named`` (a seated spare's node rank)
        or its own; returns its size, the offset to resume from."""
        name = node_rank if named is None else named
        path = self.directory / log_name(name, host)
        index = self.directory / log_name(name, host, ".idx")
        try:
            copy = LocalCopy(self._dir, path, index, self._say)
        except OSError as exc:
            raise UsageError(f"local log {exc.filename or path}: {exc.strerror}") from exc
        self._copies[node_rank] = copy
        self.paths[node_rank], self.index_paths[node_rank] = path, index
        if copy.shadow:
            self._say(
                f"{path} is being written by another sshddp following this run: shown as it "
                "is, and not updated here"
            )
        return copy.size()

    def seat(self, slot: int, node_rank: int, host: str) -> None:
        """The spare in mesh slot ``slot`` took ``node_rank``: its copy is the file named for
        that rank on its host (``node2-h4.log``), beside the lost host's; the one named for
        its slot goes while empty (a spare's log is empty until it is seated)."""
        if self.seats.get(slot) == node_rank:
            return
        old = self._copies.pop(slot, None)
        if old is not None:
            old.discard_if_empty(made_here=False)
            old.close()
        self.seats[slot] = node_rank
        self.open(slot, host, node_rank)

    def shadow(self, node_rank: int) -> bool:
        """Whether another process writes the node's copy (this one shows, never writes)."""
        return self._copies[node_rank].shadow

    def write_span(self, node_rank: int, piece: spans.Piece) -> None:
        """Append a piece of a span of the node's log; after its last, the span's index
        record. Bytes the copy holds already (it was cut inside the span) are skipped."""
        self._copies[node_rank].write_span(piece.offset, piece.data, piece.record)

    def index_size(self, node_rank: int) -> int:
        """The local index's size: where its follower resumes (0: none yet)."""
        return self._copies[node_rank].index_size()

    def write(self, node_rank: int, data: bytes) -> None:
        """Append ``data``; on failure the file holds an exact prefix of the node's log
        (unbuffered writes), so a later attach or ``logs`` resumes from its size."""
        self._copies[node_rank].write(data)

    def size(self, node_rank: int) -> int:
        return self._copies[node_rank].size()

    def discard_if_empty(self) -> None:
        """Remove the files and the directory this run made while they hold nothing (a
        launch that started nothing leaves no empty logs behind)."""
        for copy in self._copies.values():
            copy.discard_if_empty()
        if self._made:
            try:
                os.rmdir(self.directory)
            except OSError:  # something is in it: it stays
                pass

    def close(self) -> None:
        for copy in self._copies.values():
            copy.close()
        self._copies.clear()
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1


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
    layout: RunLayout,
    log_dir: Path,
    screen: Screen,
    ranks: Optional[frozenset[int]] = None,
    agent: bool = False,
    fresh: bool = False,
) -> tuple[NodeLogs, Console]:
    """A run's local log files (opened to append, resuming; ``fresh``: made new, for a
    launch) and its prefixed console, which shows the ranks ``ranks`` selects (``--ranks``;
    every one when None), and torchrun's agent's lines with ``agent`` or ``screen.verbose``
    (which also show every traceback whole: without them, the console shows the first
    failure's whole and later ones one line each, ``model.victims``)."""
    if ranks is not None:
        check_ranks(ranks, layout.world_size, layout.run_id)
    logs = NodeLogs(log_dir, fresh, lambda text: screen.err(f"sshddp: note: {text}"))
    stream = screen.stdout_bytes
    shown = agent or screen.verbose
    console = Console(stream, screen.color, live=_isatty(stream), agent=shown, fold=not shown)
    labels = {
        n.node_rank: f"{rank_label(n.first_rank, n.nproc)} {n.host.host}" for n in layout.nodes
    }
    width = max(len(f"[{label}]") for label in labels.values())
    console.width, console.selected = width, ranks
    for node in layout.nodes:
        logs.open(node.node_rank, node.host.host)
        log = log_name(node.node_rank, node.host.host)
        whole = shows(ranks, node.ranks)
        node_is = Writer(f"node {node.node_rank}", log)
        console.add_node(node.node_rank, labels[node.node_rank], width, whole, node_is)
        for local, rank in enumerate(node.ranks):
            own = shows(ranks, source_ranks(node.first_rank, node.nproc, local))
            rank_is = Writer(f"rank {rank}", log)
            console.add_rank(node.node_rank, local, f"{rank} {node.host.host}", width, own, rank_is)
    return logs, console


def seat_spare(
    layout: RunLayout, logs: NodeLogs, console: Console, slot: int, record: Mapping[str, Any]
) -> Optional[int]:
    """Where a spare's status ``record`` says it holds another node's rank (it was seated
    mid-run), its local copy and console lines are that node's from now on; the node rank,
    or None (not seated, or not a spare)."""
    spare = next((n for n in layout.nodes if n.node_rank == slot), None)
    seat = record.get("node_rank")
    if spare is None or not layout.spare(slot) or not isinstance(seat, int) or seat == slot:
        return None
    node = next((n for n in layout.nodes if n.node_rank == seat and not layout.spare(seat)), None)
    if node is None:
        return None
    host = spare.host.host
    logs.seat(slot, seat, host)
    _relabel(console, slot, host, node)
    return seat


def _relabel(console: Console, slot: int, host: str, node: NodeLayout) -> None:
    """The console's prefixes of mesh slot ``slot`` (on ``host``): ``node``'s ranks."""
    log, selected, width = log_name(node.node_rank, host), console.selected, console.width
    label = f"{rank_label(node.first_rank, node.nproc)} {host}"
    whole = shows(selected, node.ranks)
    console.add_node(slot, label, width, whole, Writer(f"node {node.node_rank}", log))
    for local, rank in enumerate(node.ranks):
        own = shows(selected, source_ranks(node.first_rank, node.nproc, local))
        console.add_rank(slot, local, f"{rank} {host}", width, own, Writer(f"rank {rank}", log))


def seat_spares(
    layout: RunLayout,
    logs: NodeLogs,
    console: Console,
    statuses: Mapping[int, Optional[Mapping[str, Any]]],
) -> None:
    """``seat_spare`` for every node's status record (by mesh slot) known."""
    for slot, status in statuses.items():
        if status:
            seat_spare(layout, logs, console, slot, status)


def _isatty(stream: BinaryIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
