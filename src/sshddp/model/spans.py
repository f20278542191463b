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

from sshddp.remote import contract

RECORD = struct.Struct(contract.INDEX_RECORD)
WIDTH = RECORD.size


@dataclass(frozen=True)
class Piece:
    """Bytes of a node's log, and who wrote them."""

    data: bytes
    source: int  #: the local rank, or contract.SOURCE_NODE (also for a log without index)
    record: bytes = b""  #: its node.idx record; empty for a log without one
    offset: int = -1  #: where it starts in node.log; -1 for a log without index


def pack(offset: int, length: int, source: int) -> bytes:
    return RECORD.pack(offset, length, source)


class StreamReader:
    """Decodes a follower's stdout, chunk by chunk. ``framed``: the follower was asked for
    the index, so its first byte says which form follows."""

    def __init__(self, framed: bool) -> None:
        self.indexed: Optional[bool] = None if framed else False
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Piece]:
        if self.indexed is None:
            if not data:
                return []
            if data[:1] not in (b"I", b"R"):
                raise ValueError(f"the log stream starts with {data[:1]!r}, not I or R")
            self.indexed, data = data[:1] == b"I", data[1:]
        if not self.indexed:
            return [Piece(data, contract.SOURCE_NODE)] if data else []
        self._buf += data
        pieces = []
        at = 0
        while len(self._buf) - at >= WIDTH:
            offset, length, source = RECORD.unpack_from(self._buf, at)
            if len(self._buf) - at - WIDTH < length:
                break
            record = bytes(self._buf[at : at + WIDTH])
            body = bytes(self._buf[at + WIDTH : at + WIDTH + length])
            pieces.append(Piece(body, source, record, offset))
            at += WIDTH + length
        del self._buf[:at]
        return pieces

    @property
    def pending(self) -> int:
        """Bytes of a record or span not whole yet (cut off if the stream ends now)."""
        return len(self._buf)


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
