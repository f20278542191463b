"""While a launch with ``--max-restarts`` follows its run: says on the console when every
node starts again (the supervisors restart the run on their own; node.log holds only the
ranks' bytes). A recorded run does not say whether it may restart: ``attach`` says nothing.

Node 0's status (``follow``'s, one short call a second) carries the attempt it runs and why
each earlier one ended: the supervisors restart every node together, so node 0 speaks for
all of them.
"""

from __future__ import annotations

import threading

from sshddp.hosts import calls
from sshddp.model.report import attempt_line
from sshddp.run.runstate import RunState

EVERY = 1.0  #: seconds between looks at node 0's attempt


class AttemptWatch:
    """A thread, for the ``with`` block, that prints ``sshddp: attempt 2 of 3: ...; restarting
    every node``."""

    def __init__(self, state: RunState, every: float = EVERY) -> None:
        self.state = state
        self.every = every
        self.seen = 1  #: the attempts said so far
        self.done = threading.Event()

    def __enter__(self) -> AttemptWatch:
        if self.state.layout.nodes:
            threading.Thread(target=self._watch, daemon=True, name="attempts").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()

    def _watch(self) -> None:
        node = self.state.layout.nodes[0]
        while not self.done.wait(self.every):
            try:
                status = calls.read_node(self.state.transport(node), node.rundir, 0, "status")
            except Exception:  # unreachable for now: its follower says so, and reconnects
                continue
            self.tell(status.get("attempt"), status.get("attempts"), status.get("earlier"))

    def tell(self, attempt: object, attempts: object, earlier: object) -> None:
        """Print a line for every attempt not said yet."""
        if not isinstance(attempt, int) or not isinstance(earlier, list):
            return
        while self.seen < attempt and self.seen <= len(earlier):
            self.seen += 1
            why = str(earlier[self.seen - 2])
            self.state.console.message(attempt_line(self.seen, attempts, why))
