"""Following a run: one thread per node streams its log into the local file and the console,
reconnecting when the connection drops, until every node has ended (or we detach).

The first failure a follower sees becomes the run's root cause and starts the teardown.
Ctrl-C stops the run (a second one kills at once); ``watch_only`` (``logs --follow``) never
stops anything and leaves on Ctrl-C.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from sshddp import defaults, trace
from sshddp.errors import LogWriteFailed, SshddpError
from sshddp.hosts import calls
from sshddp.hosts.transport import Transport
from sshddp.model.layout import NodeLayout
from sshddp.model.state import NodeState, RunResult
from sshddp.protocol.contract import ExitRecord
from sshddp.run.interrupts import Interrupts
from sshddp.run.nodefeed import NodeFeed
from sshddp.run.runstate import RunState
from sshddp.run.sinks import seat_spare
from sshddp.run.teardown import Teardown

RETRY_PAUSE = 0.5  # seconds between reconnect attempts


class Followers:
    """The followers of one run's nodes."""

    def __init__(
        self,
        state: RunState,
        teardown: Teardown,
        reconnect_window: float = defaults.RECONNECT_WINDOW,
        watch_only: bool = False,
        interrupts: Optional[Interrupts] = None,
    ) -> None:
        self.state = state
        self.teardown = teardown
        self.reconnect_window = reconnect_window
        self.watch_only = watch_only  # logs --follow: never stop the run, Ctrl-C just leaves
        # Counted while deferred (``Interrupts.deferred``); one that came before this loop
        # (during the boot) is acted on at its first turn.
        self.interrupts = interrupts or Interrupts()

    def run(self) -> RunResult:
        """Stream every node until all have finished (or we detach); Ctrl-C stops the run."""
        state = self.state
        threads = [
            threading.Thread(target=self._follow, args=(n,), daemon=True, name=f"n{n.node_rank}")
            for n in state.layout.nodes
        ]
        for t in threads:
            t.start()
        handled = 0
        while any(t.is_alive() for t in threads) and not state.detached.is_set():
            try:
                threads[0].join(0.1) if threads[0].is_alive() else time.sleep(0.05)
            except KeyboardInterrupt:  # not deferred: the same as a counted one
                self.interrupts.count += 1
            while handled < self.interrupts.count and not state.detached.is_set():
                handled += 1
                if self.watch_only:
                    state.detached.set()
                else:
                    self._interrupted(handled)
        if state.detached.is_set():
            trace.log.info("follow: detached: %s", _why_detached(state, self.watch_only))
        else:
            self.teardown.wait()
        return state.result(bool(handled) and not self.watch_only)

    def _interrupted(self, count: int) -> None:
        layout = self.state.layout
        if count == 1:
            self.state.console.message(
                f"sshddp: Ctrl-C: stopping run {layout.run_id} on every host "
                f"(SIGTERM, SIGKILL after {layout.grace:g} s; Ctrl-C again to kill now)"
            )
        else:
            self.state.console.message("sshddp: killing every process of the run now")
        self.teardown.request(count > 1, "interrupted by the user (Ctrl-C)")

    def _follow(self, node: NodeLayout) -> None:
        """Follow one node to its end, reconnecting for up to ``reconnect_window``."""
        state = self.state
        transport = state.transport(node)
        deadline: Optional[float] = None
        error: Optional[BaseException] = None
        while not state.detached.is_set():
            try:
                record = self._stream(transport, node)
            except LogWriteFailed as exc:  # our disk, not the host: the run goes on without us
                state.log_error = exc.message
                state.detached.set()
                return
            except Exception as exc:  # any failure of the stream: reconnect and resume
                record, error = None, exc
            if record is not None:
                self._done(node, record)
                return
            if state.cause is not None:  # its Slurm job ended: there is nothing to reach
                self._unreachable(node, error, state.cause)
                return
            _trace(node, "cut: %s", error or "the stream ended without an exit record")
            if deadline is None and not state.detached.is_set():
                state.console.message(
                    f"sshddp: lost the connection to node {node.node_rank} ({node.host.host}); "
                    f"reconnecting for up to {self.reconnect_window:g} s (the run goes on there)"
                )
            deadline = deadline or time.monotonic() + self.reconnect_window
            if time.monotonic() > deadline:
                self._unreachable(node, error)
                return
            time.sleep(RETRY_PAUSE)
            _reset(transport)
            _trace(node, "reconnecting")
        state.console.flush_node(node.node_rank)

    def _stream(self, transport: Transport, node: NodeLayout) -> Optional[ExitRecord]:
        """Follow one node's log from the local copy's size; its exit record, or None if cut.

        The first stream is the tail of the node's launch session; a reconnect starts a
        follower from the local copy's size."""
        state, rank = self.state, node.node_rank
        session = state.sessions.pop(node.index, None)
        feed = NodeFeed(state.logs, state.console, rank, first=_seating(state, transport, node))
        if session is not None:
            proc, early = session.take_stream()
            feed.feed(early)
        else:
            logs = state.logs
            proc = calls.follow_node(transport, node.rundir, logs.size(rank), logs.index_size(rank))
        try:
            while not state.detached.is_set():
                chunk = proc.read(defaults.STREAM_READ)
                if not chunk:
                    break
                feed.feed(chunk)
            if state.detached.is_set():
                return None
            record = calls.status_record(proc.read_stderr())
            proc.wait()
        finally:
            proc.close()
        return record

    def _done(self, node: NodeLayout, record: ExitRecord) -> None:
        state = self.state
        state.console.flush_node(node.node_rank)
        with state.lock:
            result = state.results[node.node_rank]
            result.apply(record)
            first = result.state.bad and state.claim_root_cause(node.node_rank)
        _trace(node, "ended %s", result.state.value)
        if first and not self.watch_only:
            self.teardown.request(
                False, f"node {node.node_rank} ({node.host.host}) {result.state.value}"
            )

    def _unreachable(
        self, node: NodeLayout, error: Optional[BaseException], ended: Optional[str] = None
    ) -> None:
        """The node cannot be reached; ``ended``: because its Slurm job ended (so it is
        lost, not merely out of reach)."""
        state = self.state
        state.console.flush_node(node.node_rank)
        with state.lock:
            result = state.results[node.node_rank]
            result.state = NodeState.UNREACHABLE if ended is None else NodeState.LOST
            result.reason = _message(error) if error else "lost contact with the host"
            if ended is not None:
                result.reason = f"ended with its job: {ended}"
        _trace(node, "given up: %s", result.reason)


def _seating(
    state: RunState, transport: Transport, node: NodeLayout
) -> Optional[Callable[[], None]]:
    """For a spare not yet seated: what its follower does at its first bytes (it was seated
    mid-run: its log is empty until then): learn from its host which node rank it took
    (one status call), so its copy and lines are that node's from there on."""
    if not state.layout.spare(node.node_rank) or node.node_rank in state.logs.seats:
        return None

    def seat() -> None:
        try:
            record = calls.read_node(transport, node.rundir, 0, "status")
        except Exception as exc:  # shown as its slot, as before: the bytes are the same
            _trace(node, "its seat is not known: %s", exc)
            return
        took = seat_spare(state.layout, state.logs, state.console, node.node_rank, record)
        _trace(node, "seated as node %s", took)

    return seat


def _trace(node: NodeLayout, what: str, *args: object) -> None:
    if trace.on():
        trace.log.info("follow node %d (%s): " + what, node.node_rank, node.host.host, *args)


def _why_detached(state: RunState, watch_only: bool) -> str:
    if state.log_error:
        return f"the local log cannot be written ({state.log_error})"
    if watch_only:
        return "Ctrl-C while only watching (logs --follow)"
    return "Ctrl-\\, SIGHUP, or --detach: the run goes on"


def _reset(transport: Transport) -> None:
    """Drop a broken connection so the next command reconnects."""
    try:
        transport.close()
    except Exception:  # a dead connection may fail to close; it is gone anyway
        pass


def _message(error: BaseException) -> str:
    if isinstance(error, SshddpError):
        return error.message
    return f"{type(error).__name__}: {error}"
