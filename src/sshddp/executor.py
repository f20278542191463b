"""Runs a ``LaunchPlan``: boot every node, follow every node's log, stop all on any failure.

One thread per node follows its log; a shared stop decision (``_stopping``) makes teardown
happen once, in parallel, whichever thread or signal triggers it. Per-node outcomes are data
(``NodeResult``); nothing here prints except through the console sink.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from sshddp import ops, scripts
from sshddp.bundle import Payload
from sshddp.cluster import Cluster, Outcome
from sshddp.errors import LogWriteFailed, SshddpError
from sshddp.plan import LaunchPlan, NodePlan
from sshddp.sessions import HostSession
from sshddp.sinks import Console, NodeLogs
from sshddp.transport import Transport

RECONNECT_WINDOW = 30.0  # seconds a follower keeps trying to reach a host that dropped


class NodeState(str, Enum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"  #: the node's supervisor vanished (host down, processes killed)
    UNREACHABLE = "unreachable"  #: we lost contact; the node may still be running

    @property
    def final(self) -> bool:
        return self in (NodeState.SUCCEEDED, NodeState.FAILED, NodeState.STOPPED, NodeState.LOST)


@dataclass
class NodeResult:
    """What became of one node."""

    node_rank: int
    host: str
    state: NodeState = NodeState.PENDING
    returncode: Optional[int] = None
    signal: Optional[str] = None
    reason: str = ""
    ended: Optional[float] = None
    log_path: Optional[Path] = None

    def apply(self, record: dict[str, Any]) -> None:
        """Take a node's exit record (exit.json) as its final state."""
        self.state = NodeState(record.get("state", "lost"))
        self.returncode = record.get("returncode")
        self.signal = record.get("signal")
        self.reason = record.get("reason") or ""
        self.ended = record.get("ended")


@dataclass
class RunResult:
    """The outcome of a run: every node, and which one failed first."""

    run_id: str
    nodes: list[NodeResult]
    root_cause: Optional[int] = None  #: node rank of the first failure
    interrupted: bool = False
    detached: bool = False
    log_dir: Optional[Path] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(n.state is NodeState.SUCCEEDED for n in self.nodes)


class Executor:
    """Starts and follows one run on its cluster."""

    def __init__(
        self,
        plan: LaunchPlan,
        cluster: Cluster,
        logs: NodeLogs,
        console: Console,
        reconnect_window: float = RECONNECT_WINDOW,
        watch_only: bool = False,
    ) -> None:
        self.plan = plan
        self.watch_only = watch_only  # logs --follow: never stop the run, Ctrl-C just leaves
        self.cluster = cluster
        self.logs = logs
        self.console = console
        self.reconnect_window = reconnect_window
        self.results = {
            n.node_rank: NodeResult(n.node_rank, n.host.host, log_path=None) for n in plan.nodes
        }
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._stopping: Optional[bool] = None  # None, False (graceful) or True (force)
        self._root_cause: Optional[int] = None
        self._detach = threading.Event()
        self._stop_threads: list[threading.Thread] = []
        self._sessions: dict[int, HostSession] = {}  #: launch sessions not yet streaming
        self._log_error: Optional[str] = None  #: why we detached: a local log stopped taking bytes

    def transport(self, node: NodePlan) -> Transport:
        return self.cluster.transports[node.host.index]

    # ------------------------------------------------------------------ boot

    def boot(
        self, payload: Payload, sessions: dict[int, HostSession],
        unreachable: Optional[dict[int, BaseException]] = None,
    ) -> bool:  # fmt: skip
        """Stage the code on every node, then start them all; nothing starts anywhere unless
        every node staged. On a failure to start, stop the nodes that started.

        Node 0 goes first: its probe must let go of the rendezvous port before any node's
        torchrun could reach that listener instead of node 0's store.
        """
        self._sessions = dict(sessions)
        supervisor, rank_shim = scripts.supervisor_source(), scripts.rank_source()
        for node in self.plan.nodes:
            self.results[node.node_rank].state = NodeState.STARTING

        def session_of(node: NodePlan) -> HostSession:
            session = self._sessions.get(node.host.index)
            if session is None:
                error = (unreachable or {}).get(node.host.index)
                raise error or SshddpError(f"{node.host.host}: no session")
            return session

        def go(node: NodePlan) -> HostSession:
            session = session_of(node)
            session.go(self._boot_args(node, payload, supervisor, rank_shim), payload.data)
            session.answer("release")
            return session

        def stage(node: NodePlan) -> Optional[str]:
            session = session_of(node) if node is first else go(node)
            answer = session.answer("stage")
            return None if answer.get("ok") else str(answer.get("error"))

        def start(node: NodePlan) -> Optional[str]:
            session = session_of(node)
            session.start(True)
            return self._booted(node, session.answer("start"))

        first = self.plan.nodes[0]
        opened = self.cluster.map(go, [first])[0]
        staged: list[Outcome[Optional[str]]] = [Outcome(error=opened.error)]
        if opened.ok:
            staged = self.cluster.map(stage, self.plan.nodes)
        if all(o.ok and o.value is None for o in staged):
            self._settle(self.cluster.map(start, self.plan.nodes))
        else:
            self._settle(staged, not_started=True)
            staged_ok = [self._sessions[n.host.index] for n, o in zip(self.plan.nodes, staged)
                         if o.ok and o.value is None]  # fmt: skip
            self.cluster.map(HostSession.discard, staged_ok)
        if self._root_cause is None:
            return True
        self.close_sessions()  # a staged node that was not started removes what it staged
        failed = self.results[self._root_cause]
        self.stop_all(False, f"node {failed.node_rank} ({failed.host}) failed to start")
        self.wait_stopped()
        return False

    def _settle(
        self, outcomes: Sequence[Outcome[Optional[str]]], not_started: bool = False
    ) -> None:
        """Each node's state after staging (``not_started``) or starting: running, failed
        with why, or not started because another node failed. ``outcomes`` is in node order
        and shorter when later nodes were never asked."""
        nodes = self.plan.nodes
        failed = [n for n, o in zip(nodes, outcomes) if not o.ok or o.value]
        for i, node in enumerate(nodes):
            outcome = outcomes[i] if i < len(outcomes) else None
            result = self.results[node.node_rank]
            if outcome is not None and (not outcome.ok or outcome.value):
                result.state = NodeState.FAILED
                result.reason = outcome.value or _message(outcome.error)
                if self._root_cause is None:
                    self._root_cause = node.node_rank
            elif not_started and failed:
                result.state = NodeState.STOPPED
                result.reason = (f"not started: node {failed[0].node_rank} "
                                 f"({failed[0].host.host}) could not be staged")  # fmt: skip
            else:
                result.state = NodeState.RUNNING

    def close_sessions(self) -> None:
        """End the launch sessions that no follower took over (the run goes on)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()

    def _peers(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "nnodes": len(plan.nodes),
            "addr": plan.rdzv_addr,
            "port": plan.peer_port,
            "timeout": plan.heartbeat_timeout,
            "hosts": [n.host.host for n in plan.nodes],
        }

    def _boot_args(
        self, node: NodePlan, payload: Payload, supervisor: str, rank_shim: str
    ) -> dict[str, Any]:
        code = self.plan.code
        return {
            "rundir": node.rundir,
            "spec": {"run_id": self.plan.run_id, "node_rank": node.node_rank,
                     "argv": list(node.argv), "cwd": node.cwd, "grace": self.plan.grace,
                     "mark": node.mark, "peers": self._peers(), "tty": self.plan.tty},
            "env": dict(node.env),
            "payload": payload.header(),
            "supervisor": supervisor,
            "rank": rank_shim,
            "remote_script": code.target if code.kind == "remote" else None,
        }  # fmt: skip

    def _booted(self, node: NodePlan, answer: dict[str, Any]) -> Optional[str]:
        """None when the node's torchrun started, else why not."""
        if not answer.get("ok"):
            return str(answer.get("error"))
        state = answer.get("state") or {}
        if state.get("state") not in (None, "running"):
            self.results[node.node_rank].apply(state)
            return str(state.get("reason") or "torchrun did not start")
        return None

    # ------------------------------------------------------------------ follow

    def follow(self) -> RunResult:
        """Stream every node until all have finished (or we detach); Ctrl-C stops the run."""
        threads = [
            threading.Thread(
                target=self._follow_node, args=(n,), daemon=True, name=f"n{n.node_rank}"
            )
            for n in self.plan.nodes
        ]
        for t in threads:
            t.start()
        interrupted = 0
        while any(t.is_alive() for t in threads) and not self._detach.is_set():
            try:
                threads[0].join(0.1) if threads[0].is_alive() else time.sleep(0.05)
            except KeyboardInterrupt:
                if self.watch_only:
                    self.detach()
                    break
                interrupted += 1
                self._on_interrupt(interrupted)
        if not self._detach.is_set():
            self.wait_stopped()
        return self.result(bool(interrupted))

    def detach(self) -> None:
        """Leave the run going: followers stop, supervisors keep the run alive."""
        self._detach.set()

    def _on_interrupt(self, count: int) -> None:
        if count == 1:
            self.console.message(
                f"sshddp: Ctrl-C: stopping run {self.plan.run_id} on every host "
                f"(SIGTERM, SIGKILL after {self.plan.grace:g} s; Ctrl-C again to kill now)"
            )
        else:
            self.console.message("sshddp: killing every process of the run now")
        self.stop_all(count > 1, "interrupted by the user (Ctrl-C)")

    def _follow_node(self, node: NodePlan) -> None:
        rank = node.node_rank
        transport = self.transport(node)
        deadline: Optional[float] = None
        error: Optional[BaseException] = None
        while not self._detach.is_set():
            try:
                record = self._stream(transport, node)
            except LogWriteFailed as exc:  # our disk, not the host: the run goes on without us
                self._log_error = exc.message
                self.detach()
                return
            except Exception as exc:  # any failure of the stream: reconnect and resume
                record, error = None, exc
            if record is not None:
                self._node_done(node, record)
                return
            if deadline is None and not self._detach.is_set():
                self.console.message(
                    f"sshddp: lost the connection to node {rank} ({node.host.host}); "
                    f"reconnecting for up to {self.reconnect_window:g} s (the run goes on there)"
                )
            deadline = deadline or time.monotonic() + self.reconnect_window
            if time.monotonic() > deadline:
                self._unreachable(node, error)
                return
            time.sleep(0.5)
            _reset(transport)
        self.console.flush_node(rank)

    def _stream(self, transport: Transport, node: NodePlan) -> Optional[dict[str, Any]]:
        """Follow one node's log from the local copy's size; its exit record, or None if cut.

        The first stream is the tail of the node's launch session; a reconnect starts a
        follower from the local copy's size."""
        rank = node.node_rank
        session = self._sessions.pop(node.host.index, None)
        if session is not None:
            proc, early = session.take_stream()
            self.logs.write(rank, early)
            self.console.write(rank, early)
        else:
            offset = self.logs.size(rank)
            proc = ops.start_script(transport, "follow", {"rundir": node.rundir, "offset": offset})
        try:
            while not self._detach.is_set():
                chunk = proc.read(1 << 20)
                if not chunk:
                    break
                self.logs.write(rank, chunk)
                self.console.write(rank, chunk)
            if self._detach.is_set():
                return None
            record = ops.status_record(proc.read_stderr())
            proc.wait()
        finally:
            proc.close()
        return record

    def _node_done(self, node: NodePlan, record: dict[str, Any]) -> None:
        self.console.flush_node(node.node_rank)
        with self._lock:
            result = self.results[node.node_rank]
            result.apply(record)
            failed = result.state in (NodeState.FAILED, NodeState.LOST)
            first = failed and self._root_cause is None and self._stopping is None
            if first:
                self._root_cause = node.node_rank
        if first and not self.watch_only:
            self.stop_all(False, f"node {node.node_rank} ({node.host.host}) {result.state.value}")

    def _unreachable(self, node: NodePlan, error: Optional[BaseException]) -> None:
        self.console.flush_node(node.node_rank)
        with self._lock:
            result = self.results[node.node_rank]
            result.state = NodeState.UNREACHABLE
            result.reason = _message(error) if error else "lost contact with the host"

    # ------------------------------------------------------------------ teardown

    def stop_all(self, force: bool, reason: str) -> None:
        """Stop every unfinished node, in the background; idempotent, force escalates."""
        with self._stop_lock:
            if self._stopping is True or (self._stopping is False and not force):
                return
            self._stopping = force
            nodes = [n for n in self.plan.nodes if not self.results[n.node_rank].state.final]
            thread = threading.Thread(target=self._stop_nodes, args=(nodes, force, reason),
                                      daemon=True)  # fmt: skip
            self._stop_threads.append(thread)
        thread.start()

    def _stop_nodes(self, nodes: Sequence[NodePlan], force: bool, reason: str) -> None:
        def stop(node: NodePlan) -> dict[str, Any]:
            return ops.stop_node(self.transport(node), node.rundir, force, reason)

        self.cluster.map(stop, nodes)

    def wait_stopped(self) -> None:
        for thread in list(self._stop_threads):
            thread.join()

    def result(self, interrupted: bool) -> RunResult:
        for rank, path in self.logs.paths.items():
            self.results[rank].log_path = path
        return RunResult(
            run_id=self.plan.run_id,
            nodes=[self.results[n.node_rank] for n in self.plan.nodes],
            root_cause=self._root_cause,
            interrupted=interrupted,
            detached=self._detach.is_set(),
            log_dir=self.logs.directory,
            extra={"log_error": self._log_error} if self._log_error else {},
        )


def _reset(transport: Transport) -> None:
    """Drop a broken connection so the next command reconnects."""
    try:
        transport.close()
    except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is gone anyway
        pass


def _message(error: Optional[BaseException]) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, SshddpError):
        return error.message
    return f"{type(error).__name__}: {error}"
