"""One run's live state on the coordinator, shared by its phases: boot, follow, teardown.

Like torch elastic's ``WorkerGroup``, one small object the phases read and update: every
node's result, the first failure, how far teardown has gone, and whether we detached. Each
phase is its own module (``boot``, ``follow``, ``teardown``); ``coordinator`` sequences them.
What every phase reads of the run is its layout; a launch's boot reads its plan too
(``LaunchState``).
"""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import Optional

from sshddp.hosts.pool import HostPool
from sshddp.hosts.session import HostSession
from sshddp.hosts.transport import Transport
from sshddp.model.layout import NodeLayout, RunLayout
from sshddp.model.leftout import LeftOut
from sshddp.model.plan import LaunchPlan
from sshddp.model.state import NodeResult, RunResult
from sshddp.run.sinks import Console, NodeLogs


class StopLevel(IntEnum):
    """How hard teardown was asked to stop the run; it only ever goes up."""

    NONE = 0  #: nobody asked
    GRACEFUL = 1  #: SIGTERM, then SIGKILL after the grace period
    FORCE = 2  #: SIGKILL now


class RunState:
    """What the coordinator knows of one run while it boots, follows or stops it."""

    def __init__(self, layout: RunLayout, pool: HostPool, logs: NodeLogs, console: Console) -> None:
        self.layout = layout
        self.pool = pool
        self.logs = logs
        self.console = console
        self.results = {n.node_rank: NodeResult(n.node_rank, n.host.host) for n in layout.nodes}
        self.sessions: dict[int, HostSession] = {}  #: launch sessions not yet streaming
        self.root_cause: Optional[int] = None  #: node rank of the first failure
        self.stop_level = StopLevel.NONE
        self.log_error: Optional[str] = None  #: why we detached: a local log stopped growing
        self.cause: Optional[str] = None  #: what ended the run from outside (its Slurm job)
        self.detached = threading.Event()  #: followers stop; the supervisors keep the run
        self.left_out: list[LeftOut] = []  #: files some host did not get (the report's hints)
        self.lock = threading.Lock()

    def transport(self, node: NodeLayout) -> Transport:
        return self.pool.transport(node)

    def claim_root_cause(self, node_rank: int) -> bool:
        """Make ``node_rank`` the run's root cause if no failure (and no stop) came first.
        Call with ``lock`` held."""
        if self.root_cause is not None or self.stop_level is not StopLevel.NONE:
            return False
        self.root_cause = node_rank
        return True

    def close_sessions(self) -> None:
        """End the launch sessions that no follower took over (the run goes on); a node
        that was never started is gone from its host, with all it made, once this returns."""
        sessions, self.sessions = self.sessions, {}
        nodes = [n for n in self.layout.nodes if n.index in sessions]
        self.pool.map(lambda n: sessions[n.index].end(), nodes)

    def result(self, interrupted: bool) -> RunResult:
        for rank, path in self.logs.paths.items():
            if rank in self.results:  # logs of nodes not followed (gone, unreachable) too
                self.results[rank].log_path = path
        return RunResult(
            run_id=self.layout.run_id,
            nodes=[self.results[n.node_rank] for n in self.layout.nodes],
            root_cause=self.root_cause,
            interrupted=interrupted,
            detached=self.detached.is_set(),
            log_dir=self.logs.directory,
            log_error=self.log_error,
            cause=self.cause,
            left_out=tuple(self.left_out),
        )


class LaunchState(RunState):
    """A launch's run: its state, and the plan its boot carries out."""

    def __init__(self, plan: LaunchPlan, pool: HostPool, logs: NodeLogs, console: Console) -> None:
        super().__init__(plan.layout, pool, logs, console)
        self.plan = plan  #: node 0 may pick the port in the preflight: then the plan changes
