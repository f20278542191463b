"""Stopping every node of a run: once, in parallel, whichever thread or signal asks first.

A request only escalates (graceful, then forced); each one stops the nodes not yet ended,
in a background thread, through each host's ``stop`` call: the node's supervisor signals
exactly its own processes. Nothing is killed by name.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sshddp import trace
from sshddp.hosts import calls
from sshddp.model.layout import NodeLayout
from sshddp.protocol.contract import StopAnswer
from sshddp.run.runstate import RunState, StopLevel


class Teardown:
    """Stops one run's nodes on request; idempotent, and ``force`` escalates."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def request(self, force: bool, reason: str) -> None:
        """Stop every unfinished node, in the background."""
        state = self.state
        level = StopLevel.FORCE if force else StopLevel.GRACEFUL
        with self._lock:
            with state.lock:
                if state.stop_level >= level:
                    return
                state.stop_level = level
            nodes = [n for n in state.layout.nodes if not state.results[n.node_rank].state.final]
            trace.log.info(
                "teardown: %s stop of %d node(s), because %s",
                level.name.lower(),
                len(nodes),
                reason,
            )
            thread = threading.Thread(
                target=self._stop_nodes, args=(nodes, force, reason), daemon=True
            )
            self._threads.append(thread)
        thread.start()

    @property
    def requested(self) -> bool:
        return self.state.stop_level is not StopLevel.NONE

    def _stop_nodes(self, nodes: Sequence[NodeLayout], force: bool, reason: str) -> None:
        def stop(node: NodeLayout) -> StopAnswer:
            return calls.stop_node(self.state.transport(node), node.rundir, force, reason)

        with trace.phase("teardown"):
            self.state.pool.map(stop, nodes)

    def wait(self) -> None:
        """Until every stop asked for so far has been carried out on every host."""
        for thread in list(self._threads):
            thread.join()
