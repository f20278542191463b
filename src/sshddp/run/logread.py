"""Reading a local log for ``sshddp logs``: in bounded chunks, and its last lines found by
reading backwards from the end, so a gigabyte of log never needs a gigabyte of memory.

A line ends with ``\\n``; a last line without one counts as a line too. ``\\r`` (progress
bars redrawn in place) does not end a line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

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
