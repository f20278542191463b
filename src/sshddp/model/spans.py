"""node.idx, read: which rank wrote each span of a node's log (``contract.INDEX_RECORD``).

Pure. A follower sends either the raw log (``R``, or no marker for an old follower) or, for a
node that keeps node.idx, each index record followed by the span of the log it names
(``I``); ``StreamReader`` turns either into ``Piece``s. ``resume_at`` finds where a local
copy of a log and its index agree, so a reconnect resumes from there.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional

from sshddp.protocol import contract

RECORD = struct.Struct(contract.INDEX_RECORD)
WIDTH = RECORD.size


@dataclass(frozen=True)
class Piece:
    """Bytes of a node's log, and who wrote them. A span arrives in as many pieces as the
    chunks it came in (so a long one costs no more memory than a chunk); its last piece
    carries its record."""

    data: bytes
    source: int  #: the local rank, or contract.SOURCE_NODE (also for a log without index)
    record: bytes = b""  #: the node.idx record of the span this piece ends; else empty
    offset: int = -1  #: where it starts in node.log; -1 for a log without index


@dataclass(frozen=True)
class _Span:
    """The span whose bytes come next: its record, where it starts and who wrote it."""

    record: bytes
    offset: int
    source: int
    length: int


def pack(offset: int, length: int, source: int) -> bytes:
    return RECORD.pack(offset, length, source)


class StreamReader:
    """Decodes a follower's stdout, chunk by chunk. ``framed``: the follower was asked for
    the index, so its first byte says which form follows."""

    def __init__(self, framed: bool) -> None:
        self.indexed: Optional[bool] = None if framed else False
        self._head = b""  # a record cut by the end of the last chunk
        self._span: Optional[_Span] = None  # the span being received
        self._got = 0  # its bytes received so far

    def feed(self, data: bytes) -> list[Piece]:
        if self.indexed is None:
            if not data:
                return []
            if data[:1] not in (b"I", b"R"):
                raise ValueError(f"the log stream starts with {data[:1]!r}, not I or R")
            self.indexed, data = data[:1] == b"I", data[1:]
        if not self.indexed:
            return [Piece(data, contract.SOURCE_NODE)] if data else []
        if self._head:
            data, self._head = self._head + data, b""
        view, at = memoryview(data), 0
        pieces: list[Piece] = []
        while True:
            span = self._span
            if span is None:
                if len(data) - at < WIDTH:
                    self._head = bytes(view[at:])
                    return pieces
                record = bytes(view[at : at + WIDTH])
                offset, length, source = RECORD.unpack(record)
                span = self._span = _Span(record, offset, source, length)
                at += WIDTH
            take = min(span.length - self._got, len(data) - at)
            if take == 0 and span.length:  # the chunk is used up inside the span
                return pieces
            done = self._got + take == span.length
            body = data if take == len(data) else bytes(view[at : at + take])
            record = span.record if done else b""
            pieces.append(Piece(body, span.source, record, span.offset + self._got))
            at += take
            self._got, self._span = (0, None) if done else (self._got + take, span)

    @property
    def pending(self) -> int:
        """Bytes of a record or span not whole yet (cut off if the stream ends now)."""
        if self._span is None:
            return len(self._head)
        return WIDTH + self._got


def resume_at(last_record: bytes, index_size: int, log_size: int) -> tuple[int, int]:
    """Where a local (log, index) pair agree: (log offset, index offset) to resume from.

    ``last_record``: the index's last whole record (b"" for none). A record whose span the
    log does not hold whole is dropped (the index is written after the log: a copy cut
    between the two holds the span, or part of it, without its record); log bytes past the
    last record's span are dropped as well, to be sent again with their record."""
    whole = index_size - index_size % WIDTH
    if not last_record or whole == 0:
        return 0, 0
    offset, length, _source = RECORD.unpack(last_record)
    if offset + length <= log_size:
        return offset + length, whole
    return offset, whole - WIDTH


def parse(records: bytes) -> list[tuple[int, int, int]]:
    """Whole records as (offset, length, source); a cut last one is left out."""
    whole = len(records) - len(records) % WIDTH
    return list(RECORD.iter_unpack(records[:whole]))
