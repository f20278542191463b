"""The supervisor's one queue of events, and the pipe its loop sleeps on.

The peers' reader threads, the watchdog's threads and the supervisor's signal handlers only
``post`` events (``node_events``); the supervisor's loop alone ``take``s them. A post writes a
byte to the wakeup pipe, which the loop watches with the node's output, so an idle node
costs its host one wakeup a second, not fifty. ``collections.deque`` appends are atomic, so a
signal handler may post too (a ``queue.Queue`` could deadlock on its own lock there).
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections import deque
from types import FrameType
from typing import Any, Optional


class Inbox:
    """Events for the supervisor's loop, and the wakeup pipe (once ``open``)."""

    def __init__(self) -> None:
        self.events: deque[Any] = deque()
        self.fd: Optional[int] = None  #: the pipe's read end; None: the loop polls
        self._write: Optional[int] = None

    def open(self) -> None:
        """Make the wakeup pipe, and signals write to it too (SIGCHLD included: torchrun
        exited). Only the main thread can: elsewhere (in-process tests) the loop polls."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            signal.signal(signal.SIGCHLD, _ignore)
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(read)
            os.close(write)
            return
        self.fd, self._write = read, write

    def post(self, event: Any) -> None:
        """Queue ``event`` and wake the loop (any thread, or a signal handler)."""
        self.events.append(event)
        if self._write is None:
            return
        try:
            os.write(self._write, b"!")
        except OSError:  # the pipe is full: the loop is awake already
            pass

    def take(self) -> list[Any]:
        """Every event posted so far, oldest first."""
        taken = []
        while True:
            try:
                taken.append(self.events.popleft())
            except IndexError:
                return taken

    def sleep(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a post (where no output is watched)."""
        if self.fd is None:
            time.sleep(timeout)
            return
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                os.read(self.fd, 4096)
            except OSError:
                pass


def _ignore(signum: int, frame: Optional[FrameType]) -> None:
    pass
