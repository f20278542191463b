"""--tty: when the user's terminal is resized (SIGWINCH), every node's pty gets its new size.

A thread does the calls (one short SSH call a node, ``remote/node/winsize.py``), so the signal
handler only sets a flag; a window dragged wider sends many signals, and only the size it
settles on is sent.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import BinaryIO, Optional

from sshddp.hosts import calls
from sshddp.run.runstate import LaunchState, RunState
from sshddp.run.sinks import terminal_size

SETTLE = 0.2  #: seconds a resize waits for the next one before the hosts are told


@contextmanager
def forward_resizes(state: LaunchState, stream: BinaryIO) -> Iterator[None]:
    """While in the block, pass the size of the terminal ``stream`` is on to the nodes'
    ptys whenever it changes (a run launched with --tty; else nothing)."""
    if not state.plan.tty or threading.current_thread() is not threading.main_thread():
        yield
        return
    changed, done = threading.Event(), threading.Event()

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        changed.set()

    def forward() -> None:
        while not done.is_set():
            if not changed.wait(0.5):
                continue
            while changed.is_set():  # wait for the size to settle
                changed.clear()
                time.sleep(SETTLE)
            _resize(state, *terminal_size(stream, sys.stderr))

    previous = signal.signal(signal.SIGWINCH, handler)
    threading.Thread(target=forward, name="sshddp-winch", daemon=True).start()
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)
        done.set()


def _resize(state: RunState, columns: int, rows: int) -> None:
    """Tell every node; a node that cannot be told keeps its old size (nothing else to do)."""
    state.pool.map(
        lambda n: calls.resize_node(state.transport(n), n.rundir, columns, rows),
        state.layout.nodes,
    )
