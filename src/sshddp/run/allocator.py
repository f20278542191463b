"""The coordinator's memory allocator, set for streaming logs (glibc only; elsewhere a no-op).

A log flood passes through the coordinator as buffers of up to ``defaults.STREAM_READ``, a
few per chunk (the read, the console's copy). By default glibc gives the heap's top back to
the system as soon as 128 KiB of it is free, and gives each thread an arena of its own: a
follower per node then faults in fresh pages for nearly every buffer, and every arena keeps
its own peak. Two arenas, and a heap that keeps up to 8 MiB free before it shrinks, make a
flood faster and the coordinator smaller (measured: docs/performance.md).

A ``MALLOC_*`` variable the user set (glibc's own tunables) is left as they set it.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: (mallopt parameter, value, the environment variable that sets it at glibc's start)
SETTINGS = (
    (M_ARENA_MAX, 2, "MALLOC_ARENA_MAX"),
    (M_MMAP_THRESHOLD, 4 << 20, "MALLOC_MMAP_THRESHOLD_"),
    (M_TRIM_THRESHOLD, 8 << 20, "MALLOC_TRIM_THRESHOLD_"),
)


def wanted(environ: Mapping[str, str]) -> list[tuple[int, int]]:
    """The (parameter, value) pairs to set: those the user did not set themselves."""
    return [(param, value) for param, value, var in SETTINGS if var not in environ]


def tune(environ: Mapping[str, str]) -> bool:
    """Set ``wanted(environ)`` through glibc's ``mallopt``; whether every one took. Call it
    before the process starts threads (an arena, once made, stays)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # another C library numbers mallopt its way
        return False
    taken = [mallopt(param, value) == 1 for param, value in wanted(environ)]  # each one
    return all(taken)
