"""Reading a local log for ``sshddp logs``: in bounded chunks, and its last lines found by
reading backwards from the end, so a gigabyte of log never needs a gigabyte of memory.

A line ends with ``\\n``; a last line without one counts as a line too. ``\\r`` (progress
bars redrawn in place) does not end a line. With the node's index (``model.spans``), each
piece of the log comes with the rank that wrote it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Optional

from sshddp.model import spans
from sshddp.protocol.contract import SOURCE_NODE

CHUNK = 1 << 20  #: bytes read at a time
BLOCK = 1 << 16  #: bytes read at a time when looking for the last lines


def chunks(
    path: Path, start: int = 0, size: int = CHUNK, end: Optional[int] = None
) -> Iterator[bytes]:
    """The file's bytes from ``start`` to its end (or to ``end``), ``size`` at a time."""
    with open(path, "rb") as fh:
        fh.seek(start)
        left = -1 if end is None else max(0, end - start)
        while left and (data := fh.read(size if left < 0 else min(size, left))):
            left -= len(data) if left > 0 else 0
            yield data


def tail_offset(path: Path, lines: int, block: int = BLOCK) -> int:
    """Where the file's last ``lines`` lines start (its size for 0 lines)."""
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        if lines <= 0:
            return end
        found, pos = 0, end
        while pos > 0:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step)
            cut = len(data)
            while (cut := data.rfind(b"\n", 0, cut)) >= 0:
                if pos + cut == end - 1:
                    continue  # the file's final newline ends its last line
                found += 1
                if found == lines:
                    return pos + cut + 1
        return 0


def attributed(
    path: Path,
    index: Optional[Path],
    start: int = 0,
    stop: Optional[int] = None,
    skip: Optional[set[int]] = None,
) -> Iterator[tuple[bytes, int]]:
    """The log's bytes from ``start`` (to ``stop``, else its end) with who wrote them (the
    local rank, or ``SOURCE_NODE``), a bounded piece at a time; all ``SOURCE_NODE``
    without an index, and so are the bytes past the spans the index names (a copy made
    without it, or cut inside a span): a local copy always prints whole. The sources in
    ``skip`` (``unfinished``) start at their next line: what comes before it is dropped,
    and each is taken out of ``skip`` once it is there."""
    for data, source in _attributed(path, index, start, stop):
        if skip and source in skip:
            cut = data.find(b"\n")
            if cut < 0:
                continue
            skip.discard(source)
            data = data[cut + 1 :]
        if data:
            yield data, source


def unfinished(path: Path, index: Optional[Path], start: int, look: int = 4096) -> set[int]:
    """The sources whose line is unfinished at byte ``start``: where a tail begins, a rank's
    line may have been written in spans on either side of it (a bar, a long line). Looks
    back at most ``look`` spans."""
    if start <= 0 or index is None or not index.exists():
        return set()
    found: set[int] = set()
    seen: set[int] = set()
    with open(path, "rb") as log, open(index, "rb") as idx:
        first = _first_span(idx, start)
        for number in range(min(first, idx.seek(0, os.SEEK_END) // spans.WIDTH - 1), -1, -1):
            if first - number > look:
                break
            idx.seek(number * spans.WIDTH)
            offset, length, source = spans.RECORD.unpack(idx.read(spans.WIDTH))
            if offset >= start or source in seen:
                continue
            seen.add(source)
            log.seek(min(offset + length, start) - 1)
            if log.read(1) != b"\n":
                found.add(source)
    return found


def _attributed(
    path: Path, index: Optional[Path], start: int, stop: Optional[int]
) -> Iterator[tuple[bytes, int]]:
    covered = start  # where the spans the index names end: the node's own bytes follow
    if index is not None and index.exists():
        for data, source, end in _indexed(path, index, start, stop):
            covered = end
            if data:
                yield data, source
    for data in chunks(path, max(start, covered), end=stop):
        yield data, SOURCE_NODE


def _indexed(
    path: Path, index: Path, start: int, stop: Optional[int]
) -> Iterator[tuple[bytes, int, int]]:
    """The spans the index names from ``start``, with who wrote each and where the bytes
    given so far end (the last item's: where the index stops naming the log's bytes)."""
    with open(path, "rb") as log, open(index, "rb") as idx:
        idx.seek(_first_span(idx, start) * spans.WIDTH)
        while records := spans.parse(idx.read(4096 * spans.WIDTH)):
            for offset, length, source in records:
                at, end = max(offset, start), offset + length
                if stop is not None:
                    if offset >= stop:
                        yield b"", SOURCE_NODE, stop
                        return
                    end = min(end, stop)
                log.seek(at)
                while at < end and (data := log.read(min(CHUNK, end - at))):
                    at += len(data)
                    yield data, source, at
                if at < end:  # a record past the log's end: nothing more to name
                    return


def _first_span(idx: BinaryIO, start: int) -> int:
    """The number of the record whose span holds byte ``start`` (binary search: the spans
    follow each other in order)."""
    count = idx.seek(0, os.SEEK_END) // spans.WIDTH
    low, high = 0, count
    while low < high:  # the first record that ends after start
        mid = (low + high) // 2
        idx.seek(mid * spans.WIDTH)
        offset, length, _source = spans.RECORD.unpack(idx.read(spans.WIDTH))
        if offset + length <= start:
            low = mid + 1
        else:
            high = mid
    return low


TAIL_WINDOW = 256 * 1024  #: how far back from a log's end a report's tail is looked for


def rank_tail(path: Optional[Path], lines: int) -> Optional[list[str]]:
    """The last ``lines`` lines the ranks wrote themselves (a report's tail): the node's own
    bytes, torchrun's agent's (its banner, the tracebacks of its stop), left out. None
    without an index, which alone tells the ranks' bytes from the rest."""
    index = path.with_suffix(".idx") if path is not None else None
    if path is None or index is None or not index.exists() or not path.exists():
        return None
    start = max(0, path.stat().st_size - TAIL_WINDOW)
    skip = unfinished(path, index, start)
    data = b"".join(d for d, source in attributed(path, index, start, None, skip) if source >= 0)
    text = data.decode("utf-8", "replace").removesuffix("\n")
    return [line.removesuffix("\r") for line in text.split("\n")][-lines:] if text else []
