"""One failing rank, one traceback on the console: the others are its victims.

When one rank raises while the others are in a collective, each of the others dies of
"Connection closed by peer" and prints a traceback of its own: 55 console lines with plain
torch, 620 with Lightning, for one root cause. A ``Folds`` watches each console stream's
lines for Python tracebacks. The first failure's traceback is shown whole; every later
traceback, on any stream, is one line: its exception, whose failure came first, and the log
that holds it whole (the logs are never touched: this is the console's view only).

A traceback may also be one a rank printed and lived on (a handled error, logged): the
folded lines say only that another's came first, and a traceback more than ``WINDOW``
seconds after the first one shown whole starts afresh (a cascade takes seconds).

A traceback whose exception is a peer's death (``PEER_DEATH``) is only a victim's if
something else failed: the first of those is shown whole too until a real failure is known
(a network cut kills every rank with one), so at most two tracebacks are ever shown whole,
whichever stream's output reaches the console first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

HEADER = b"Traceback (most recent call last):"
#: lines inside a traceback that do not end it: its frames, and a chained one's header
_INSIDE = re.compile(rb"(\s|$|Traceback \(most recent call last\))")
#: lines after an exception's own line that go on its traceback: a chained one follows
_CHAIN = re.compile(rb"(During handling of the above exception|The above exception was the direct)")
#: lines after an exception's own line that still belong to it: a C++ error's frames
_AFTER = re.compile(rb"(\s|$|frame #\d+:|Exception raised from )")
#: exceptions a rank dies of when a peer died first (gloo, NCCL, the c10d store)
PEER_DEATH = re.compile(
    rb"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET"
    rb"|DistNetworkError|DistBackendError|NCCL communicator was aborted|ncclRemoteError"
    rb"|failed to recv, got 0 bytes|Socket Timeout|remote process exited"
)
#: what torch puts before each line a rank writes to stderr once its process group is up
_RANK_PREFIX = re.compile(rb"\[rank\d+\]: ?")
MAX_LINES = 4000  #: a "traceback" longer than this is shown as it is
WINDOW = 120.0  #: seconds after a traceback shown whole that later ones are folded


@dataclass
class _Stream:
    """One console stream's place in its output."""

    held: list[bytes] = field(default_factory=list)  #: a traceback not yet ended
    exception: Optional[bytes] = None  #: the held one's last exception line, once seen
    victim: bool = False  #: one of the held one's exceptions is a peer's death
    whole: Optional[bool] = None  #: a traceback ended: whether it (and its rest) is shown


@dataclass(frozen=True)
class Writer:
    """Who writes a console stream."""

    name: str  #: "rank 3", or "node 1" where its ranks are not told apart
    log: str  #: the local log file that holds its output whole


class Folds:
    """The console's tracebacks across every stream of one run (``Console`` holds one)."""

    def __init__(self) -> None:
        self._streams: dict[object, _Stream] = {}
        self._sources: dict[object, Writer] = {}
        self.first: Optional[str] = None  #: the stream whose failure came first (a real one)
        self.shown = 0  #: tracebacks shown whole
        self._since = 0.0  #: when the first of those was
        self._now = 0.0

    def add(self, key: object, source: Writer) -> None:
        self._sources[key] = source

    def lines(self, key: object, chunk: bytes, now: float) -> Optional[bytes]:
        """What the console shows of ``chunk`` (whole lines, newline-separated, no final
        newline) at ``now`` (seconds, monotonic): the same, but for tracebacks folded; None
        for nothing (a traceback is held). A traceback whose exception ends the chunk ends
        there: one that goes on (chained) in the next chunk is shown, or folded, as it was."""
        stream = self._streams.get(key)
        if stream is None:
            if HEADER not in chunk:  # the fast path: most output holds no traceback
                return chunk
            stream = self._streams[key] = _Stream()
        self._now = now
        out = [line for line in chunk.split(b"\n") for line in self._feed(key, stream, line)]
        if stream.exception is not None:
            out.extend(self._end(key, stream))
        if not stream.held and stream.whole is None:
            del self._streams[key]
        return b"\n".join(out) if out else None

    def flush(self, key: object) -> Optional[bytes]:
        """The held lines of a stream that ended inside a traceback, as they are."""
        stream = self._streams.pop(key, None)
        return b"\n".join(stream.held) if stream and stream.held else None

    def _feed(self, key: object, stream: _Stream, line: bytes) -> list[bytes]:
        bare = unprefixed(line)
        if stream.held:
            return self._inside(key, stream, line, bare)
        if stream.whole is not None:  # after a traceback: its C++ frames, or a chained one
            if _CHAIN.match(bare):
                stream.held.append(line)
                return []
            if _AFTER.match(bare):
                return [line] if stream.whole else []
            stream.whole = None
        if bare.startswith(HEADER):
            stream.held.append(line)
            return []
        return [line]

    def _inside(self, key: object, stream: _Stream, line: bytes, bare: bytes) -> list[bytes]:
        """A line of a held traceback (or the first after it)."""
        if stream.exception is not None:  # past an exception: its rest, a chain, or the end
            if _CHAIN.match(bare):
                stream.exception = None
            elif not _AFTER.match(bare):
                return self._end(key, stream) + self._feed(key, stream, line)
            stream.held.append(line)
            return []
        stream.held.append(line)
        if len(stream.held) >= MAX_LINES:
            held, stream.held = stream.held, []
            return held
        if not _INSIDE.match(bare):
            stream.exception = line
            stream.victim = stream.victim or PEER_DEATH.search(bare) is not None
        return []

    def _end(self, key: object, stream: _Stream) -> list[bytes]:
        """The held traceback has ended: what is shown of it."""
        held, exception = stream.held, stream.exception or b""
        if stream.whole is None:  # a chain's later part keeps its first part's fate
            stream.whole = self._whole(key, stream.victim)
        stream.held, stream.exception, stream.victim = [], None, False
        return held if stream.whole else [self._one_line(key, exception)]

    def _whole(self, key: object, victim: bool) -> bool:
        """Whether a traceback (``victim``: of a peer's death) is shown whole (and noted)."""
        if self.shown and self._now - self._since > WINDOW:
            self.first, self.shown = None, 0
        if self.first is not None or (victim and self.shown):
            return False
        if not self.shown:
            self._since = self._now
        self.shown += 1
        if not victim:
            self.first = self._source(key).name
        return True

    def _one_line(self, key: object, exception: bytes) -> bytes:
        first = f"after {self.first}'s traceback; " if self.first else ""
        note = f" ({first}this one whole in {self._source(key).log})"
        return exception.rstrip() + note.encode()

    def _source(self, key: object) -> Writer:
        return self._sources.get(key) or Writer(str(key), "the logs")


def unprefixed(line: bytes) -> bytes:
    """``line`` without torch's ``[rankN]: ``."""
    found = _RANK_PREFIX.match(line)
    return line[found.end() :] if found else line
