"""What the console shows of one node's output: whole lines, and the latest state of a progress
bar that redraws its line with ``\\r`` (tqdm's).

Pure. A line is shown once its newline arrives, as a terminal would leave it: the last part
after a ``\\r`` that has something visible in it (a bar's final state, or the message that
``tqdm.write`` printed over it). The unfinished line, while it holds a ``\\r``, is a live bar:
the console shows its latest state, redrawn in place on a terminal, and at most every few
seconds when piped (``Sparse``). The log files keep every byte; this is the console's view.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Optional

_CR_LINE = re.compile(rb"[^\n]*\r[^\n]*")  # a line that a \r redraws
_COMPACT = 4096  #: an unfinished line longer than this with a \r is cut to its last states
_HIDDEN = re.compile(rb"\x1b\[[0-9;:]*[mK]")  # colour and erase: a bar line drops them


def last_state(line: bytes) -> bytes:
    """What a terminal leaves of ``line`` after its ``\\r`` redraws: its last part with
    something visible in it (a bar cleared by spaces shows what was written over it)."""
    for part in reversed(line.split(b"\r")):
        if part.strip():
            return part
    return b""


def settle(lines: bytes) -> bytes:
    """``lines`` (newline-separated) with each line that a ``\\r`` redraws as its last state.
    Lines without one are not touched (one C-level search for most output)."""
    if b"\r" not in lines:
        return lines
    return _CR_LINE.sub(lambda m: last_state(m.group()), lines)


@dataclass(frozen=True)
class Update:
    """What one chunk of a node's output changes on the console."""

    lines: Optional[bytes]  #: finished lines, settled, newline-separated; None: none finished
    bar: Optional[bytes]  #: the unfinished line's latest state if a ``\r`` redraws it


class LineState:
    """One node's unfinished line, held until its newline."""

    def __init__(self, max_partial: int = 64 * 1024) -> None:
        self.partial = b""
        self._max = max_partial

    def feed(self, data: bytes) -> Update:
        buf = self.partial + data if self.partial else data
        head, sep, rest = buf.rpartition(b"\n")
        if len(rest) > self._max:  # a huge line without newline: show it in pieces
            head, sep, rest = buf, b"\n", b""
        bar = None
        if b"\r" in rest:
            bar = last_state(rest)
            if len(rest) > _COMPACT:  # a bar redrawn for hours: keep what can still show
                cut = rest.rfind(b"\r")
                rest = b"\r" + last_state(rest[:cut]) + rest[cut:]
        self.partial = rest
        return Update(settle(head) if sep else None, bar)

    def finish(self) -> Optional[bytes]:
        """The unterminated last line as a finished one (its node printed no newline)."""
        rest, self.partial = self.partial, b""
        return settle(rest) if rest else None


def bar_line(state: bytes, columns: int) -> bytes:
    """A bar's state as one terminal line of at most ``columns`` characters: colours and
    tabs dropped (a cut could leave a colour on). A longer one loses its middle, so that it
    never wraps and both ends stay: a bar's name and percentage, and its count and rate."""
    text = _HIDDEN.sub(b"", state).replace(b"\t", b" ").decode("utf-8", "replace").rstrip()
    if len(text) > columns:
        head = max(columns, 0) // 2
        tail = max(columns - head - 1, 0)
        text = text[:head] + "…" + text[len(text) - tail :] if columns > 1 else text[:columns]
    return text.encode("utf-8")


def screen_rows(widths: list[int], columns: int) -> int:
    """The rows that lines of ``widths`` characters take on a terminal ``columns`` wide: a
    window made narrower re-wraps the lines already drawn (tmux and most terminals do)."""
    return sum(max(1, -(-width // max(columns, 1))) for width in widths)


class Sparse:
    """When piped, a bar's state is printed at most every ``every`` seconds per node (its
    first state at once); its final state comes as the finished line."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last: dict[Hashable, float] = {}

    def due(self, key: Hashable, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            return False
        self._last[key] = now
        return True

    def done(self, key: Hashable) -> None:
        """The node's bar line ended: its next bar shows at once."""
        self._last.pop(key, None)
