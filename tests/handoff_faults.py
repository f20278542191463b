"""Faults of the hand-off's servers: the fork of one host's session, SIGKILLed as it
appears (tests/integration/test_handoff.py, test_share_tree.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def kill_server(rundirs: str, done: threading.Event) -> list[int]:
    """SIGKILL the hand-off server of the session whose command line names ``rundirs``:
    the fork of that session (same command line, the session its parent), as soon as it
    appears; the pids killed."""
    killed: list[int] = []
    while not done.is_set() and not killed:
        for name in os.listdir("/proc"):
            pid = int(name) if name.isdigit() else 0
            if pid and rundirs in _cmdline(pid) and rundirs in _cmdline(_ppid(pid)):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.005)
    return killed


@contextlib.contextmanager
def killing_server(rundirs: str) -> Iterator[list[int]]:
    """While the block runs, ``kill_server`` watches for the server of ``rundirs``'s
    session; the pids it killed (filled once the block ends)."""
    done = threading.Event()
    killed: list[int] = []
    killer = threading.Thread(target=lambda: killed.extend(kill_server(rundirs, done)))
    killer.start()
    try:
        yield killed
    finally:
        done.set()
        killer.join()
