"""What the console shows of one stream's output: whole lines, and the latest state of a
progress bar that redraws its line with ``\\r`` (tqdm's), or of a live display that redraws
the rows above by moving the cursor up (rich's, as Lightning's RichProgressBar draws it).

Pure. A line is shown once its newline arrives, as a terminal would leave it: the last part
after a ``\\r`` that has something visible in it (a bar's final state, or the message that
``tqdm.write`` printed over it). The unfinished line, while it holds a ``\\r``, is a live bar:
the console shows its latest state, redrawn in place on a terminal, and at most every few
seconds when piped (``Sparse``). Rows that a cursor-up can still reach are live too, and
finish (once) when it no longer can. The log files keep every byte; this is the console's
view.
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
    #: the live rows' latest states, newline-separated: the unfinished line if a ``\\r``
    #: redraws it, and the rows above it that a cursor-up can still redraw
    bar: Optional[bytes]


class LineState:
    """One stream's rows that can still change: the unfinished line, held until its
    newline, and the rows above it that the stream redraws by moving the cursor up.

    Most streams never move the cursor up, and each newline finishes its line (``_plain``).
    One that does is followed as a terminal would show it: a row is finished once no
    cursor-up can reach it again. Within a live display (rich's, between ``ESC[?25l`` and
    ``ESC[?25h``: the cursor hidden) that is once a redraw (a ``\\r``, then its cursor-ups)
    starts below it; elsewhere (tqdm's nested bars), once it is further up than the stream
    has ever moved.
    """

    def __init__(self, max_partial: int = 64 * 1024) -> None:
        self._max = max_partial
        self._reset()

    def _reset(self) -> None:
        self.rows = [b""]  #: the rows that can still change; the cursor is on ``rows[cur]``
        self.cur = 0
        self.reach = 0  #: the most rows the stream moved up at once, outside a live display
        self.live = False  #: within a live display
        self._framing = False  # a \r in a live display: a redraw may be starting
        self._open = b""  # an escape sequence cut short at the end of the last chunk

    def _cut(self, data: bytes) -> bytes:
        """``data`` without an escape sequence it ends in the middle of, held for the next
        chunk: a cursor-up cut in two would otherwise go unseen."""
        self._open = b""
        tail = data.rfind(b"\x1b", -16)
        if tail >= 0 and _OPEN.fullmatch(data, tail):
            data, self._open = data[:tail], data[tail:]
        return data

    @property
    def partial(self) -> bytes:
        """What is held of the rows not finished yet."""
        return b"\n".join(self.rows)

    def feed(self, data: bytes) -> Update:
        data = self._cut(self._open + data if self._open else data)
        if len(self.rows) == 1 and not (self.reach or self.live) and not _moves(data):
            return self._plain(data)
        done: list[bytes] = []
        for i, token in enumerate(_TOKENS.split(data)):
            if i % 2:
                self._control(token, done)
            elif token:
                self._text(token, done)
        return Update(b"\n".join(done) if done else None, self._shown())

    def finish(self) -> Optional[bytes]:
        """The rows still held, as finished lines (their node printed no newline)."""
        self.rows[self.cur] += self._open
        rows = self.rows
        while rows and not _visible(last_state(rows[-1])):  # blank (an erased row): none
            rows = rows[:-1]
        self._reset()
        return b"\n".join(map(settle, rows)) if rows else None

    def _plain(self, data: bytes) -> Update:
        buf = self.rows[0] + data if self.rows[0] else data
        head, sep, rest = buf.rpartition(b"\n")
        if len(rest) > self._max:  # a huge line without newline: show it in pieces
            head, sep, rest = buf, b"\n", b""
        bar = None
        if b"\r" in rest:
            bar = last_state(rest)
            rest = _compact(rest)
        self.rows[0] = rest
        return Update(settle(head) if sep else None, bar)

    def _control(self, token: bytes, done: list[bytes]) -> None:
        if token == b"\n":
            self._newline(done)
        elif token == _HIDE:
            self.live = True
        elif token == _SHOW:  # the live display ended: what it left stays
            self.live = self._framing = False
            self.reach = 0
            self._finish_above(done)
        elif token.endswith(b"A"):
            self._up(min(int(token[2:-1] or b"1"), _MAX_ROWS))
        else:  # \r or an erase: part of the row's state
            self.rows[self.cur] += token
            self._framing = self._framing or (self.live and token == b"\r")

    def _text(self, text: bytes, done: list[bytes]) -> None:
        if self._framing:  # a redraw starts here: nothing above it is redrawn again
            self._framing = False
            self._finish_above(done)
        self.rows[self.cur] = row = _compact(self.rows[self.cur] + text)
        if len(row) > self._max:  # a huge line without newline: show it in pieces
            self._newline(done)

    def _newline(self, done: list[bytes]) -> None:
        if self._framing:
            self._framing = False
            self._finish_above(done)
        self.cur += 1
        if self.cur == len(self.rows):
            self.rows.append(b"")
        else:  # back onto a row drawn before: what comes is drawn over it
            self.rows[self.cur] += b"\r"
        while self.cur > min(_MAX_ROWS if self.live else self.reach, _MAX_ROWS - 1):
            self._finish(done)
        del self.rows[_MAX_ROWS:]  # rows below the cursor, past the most kept

    def _up(self, n: int) -> None:
        if not self.live:
            self.reach = max(self.reach, n)
        if n > self.cur:  # up into rows already finished: they are drawn again
            self.rows[:0] = [b""] * (n - self.cur)
            self.cur = n
        self.cur -= n
        self.rows[self.cur] += b"\r"

    def _finish(self, done: list[bytes]) -> None:
        done.append(settle(self.rows.pop(0)))
        self.cur -= 1

    def _finish_above(self, done: list[bytes]) -> None:
        while self.cur > 0:
            self._finish(done)

    def _shown(self) -> Optional[bytes]:
        """The held rows' states; None for an unfinished line that no ``\\r`` redraws, or
        when they show nothing."""
        if len(self.rows) == 1 and b"\r" not in self.rows[0]:
            return None
        # In a live display, the cursor's row, erased to be drawn again, shows what it held
        # until its new state comes (a redraw may arrive in two pieces, the row blank between).
        states = [
            _drawn(row) if self.live and i == self.cur else last_state(row)
            for i, row in enumerate(self.rows)
        ]
        while states and not _visible(states[-1]):
            states.pop()  # blank rows below the display (or a bar cleared): nothing to show
        return b"\n".join(states) if states else None


_MOVES = re.compile(rb"\x1b\[[0-9]*A|\x1b\[\?25l")  # the cursor moved up, or hidden
_TOKENS = re.compile(rb"(\n|\r|\x1b\[[0-9]*A|\x1b\[\?25[lh]|\x1b\[[0-2]?K)")
_OPEN = re.compile(rb"\x1b(?:\[[0-9;:?]*)?")  # the start of a CSI sequence, unfinished
_HIDE, _SHOW = b"\x1b[?25l", b"\x1b[?25h"
_MAX_ROWS = 32  #: rows a stream keeps redrawable: a taller display scrolls as lines


def _moves(data: bytes) -> bool:
    """Whether ``data`` moves the cursor up or hides it (one memchr for most output)."""
    return b"\x1b[" in data and _MOVES.search(data) is not None


def _visible(state: bytes) -> bool:
    return bool(_HIDDEN.sub(b"", state).strip())


def _drawn(row: bytes) -> bytes:
    """The last state of ``row`` with something visible in it (b"": none)."""
    for part in reversed(row.split(b"\r")):
        if _visible(part):
            return part
    return b""


def _compact(row: bytes) -> bytes:
    """A row a ``\\r`` redraws, cut to its last states once long (a bar redrawn for hours)."""
    if len(row) <= _COMPACT or b"\r" not in row:
        return row
    cut = row.rfind(b"\r")
    return b"\r" + last_state(row[:cut]) + row[cut:]


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
