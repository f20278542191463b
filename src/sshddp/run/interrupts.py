"""Ctrl-C while a run may be running: counted when it comes, acted on where that is safe.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. In the instant
after the nodes start, that was inside the boot's fan-out or before the followers' loop,
and the launch left with exit 130 while the run went on. So from the moment a node may
start (``Interrupts.defer``) until the command ends, SIGINT only counts; the follow loop
reads the count and stops the run (a second one kills at once). A Ctrl-C after the run's
end is known, or after ``--detach`` handed it off, changes nothing. Before that moment (the
preflight), Ctrl-C raises as usual: nothing has started, and the launch ends.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Optional


class Interrupts:
    """How many times Ctrl-C came, and whether it still raises."""

    def __init__(self) -> None:
        self.count = 0
        self.raising = True  #: until ``defer``: Ctrl-C raises KeyboardInterrupt
        self.event = threading.Event()  #: set at the first one: waits can end early

    def _on_sigint(self, signum: int, frame: Optional[FrameType]) -> None:
        self.count += 1
        self.event.set()
        if self.raising:
            raise KeyboardInterrupt

    def defer(self) -> None:
        """From now on Ctrl-C only counts, for the rest of the command: a run that may have
        started is stopped by whoever reads the count (or, once handed off or ended, goes
        its way), never left behind by an exception."""
        self.raising = False

    def install(self) -> Interrupts:
        """Take over SIGINT for the rest of the command (``cli.app.run`` restores the
        previous handler for in-process callers). Outside the main thread (in-process
        tests) signals cannot be caught, and nothing changes."""
        try:
            signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            pass
        return self

    def deferred(self) -> Interrupts:
        """Installed, and only counting from the start."""
        self.defer()
        return self.install()
