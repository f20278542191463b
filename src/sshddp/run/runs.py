"""Existing runs, from any terminal: their live states (ps), their logs, stopping them.

Each reads a ``RunRecord`` from the registry for the hosts and run directories, then asks the
hosts (whose supervisors own the runs) for the live state and the log bytes the local copy
lacks. ``attach`` is in ``coordinator``: it follows a run like a launch does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from sshddp.errors import LogWriteFailed
from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.plan import NodePlan
from sshddp.model.state import NodeState
from sshddp.remote.contract import ExitRecord, StopAnswer
from sshddp.run import coordinator, registry
from sshddp.run.registry import RunRecord
from sshddp.run.runstate import RunState
from sshddp.run.sinks import Console, NodeLogs, Screen, open_sinks


@dataclass(frozen=True)
class PsRow:
    """One run as ``sshddp ps`` shows it."""

    run_id: str
    started: float
    duration: float  #: seconds, until now for a run still going
    states: tuple[ExitRecord, ...]  #: every node's state, read live or recorded
    root_cause: str  #: the earliest node to fail or be lost, in words


def ps_rows(
    show_all: bool,
    ssh_of: Callable[[RunRecord], SshOptions],
    fanout: int,
    only: Optional[str] = None,
) -> list[PsRow]:
    """The runs this machine launched (or only run ``only``, finished or not): unfinished
    ones read live, others as recorded. ``ssh_of`` says how to reach a recorded run's hosts."""
    rows = []
    for record in registry.all_runs():
        if only is not None and record.run_id != only:
            continue
        recorded = record.result or ()
        finished = bool(recorded) and all(NodeState.of(e.state).final for e in recorded)
        if finished and not (show_all or only):
            continue
        if finished:
            states: list[ExitRecord] = [{"state": e.state, "reason": e.reason} for e in recorded]
        else:
            states = node_states(record, ssh_of(record), fanout)
        hosts = [n.host.host for n in record.nodes]
        ended = max((s.get("ended") or 0 for s in states), default=0)
        live = any(not NodeState.of(s.get("state")).final for s in states)
        duration = (time.time() if live else ended or time.time()) - record.created
        cause = record.cause or root_cause(states, hosts)
        rows.append(PsRow(record.run_id, record.created, duration, tuple(states), cause))
    return rows


def node_states(record: RunRecord, ssh: SshOptions, fanout: int) -> list[ExitRecord]:
    """Each node's status, read live from its host (or why it could not be)."""
    plan = record.plan()
    with HostPool([n.host for n in plan.nodes], ssh, fanout) as pool:
        errors = pool.connect_all()

        def status(node: NodePlan) -> ExitRecord:
            err = errors[node.index]
            if err is not None:
                return {"state": NodeState.UNREACHABLE.value, "reason": err.message}
            return calls.read_node(pool.transport(node), node.rundir, 0, "status")

        outcomes = pool.map(status, plan.nodes)
    states: list[ExitRecord] = []
    for node in plan.nodes:
        outcome = outcomes[node.index]
        if outcome.value:
            states.append(outcome.value)
        else:
            states.append({"state": NodeState.UNKNOWN.value, "reason": str(outcome.error)})
    return states


def root_cause(states: Sequence[ExitRecord], hosts: Sequence[str]) -> str:
    """The earliest node to fail or be lost, in words."""
    bad = [
        (s.get("ended") or float("inf"), i, s)
        for i, s in enumerate(states)
        if NodeState.of(s.get("state")).bad
    ]
    if not bad:
        return ""
    _, i, s = min(bad, key=lambda t: (t[0], t[1]))
    return f"node {i} ({hosts[i]}) {s.get('state')}: {s.get('reason', '')}".rstrip(": ")


@dataclass(frozen=True)
class NodeStop:
    """What ``stop`` did on one node: its answer, or why it could not reach it."""

    node: NodePlan
    answer: Optional[StopAnswer] = None
    error: str = ""  #: the node was NOT stopped, and why


def stop(record: RunRecord, ssh: SshOptions, fanout: int, force: bool) -> list[NodeStop]:
    """Stop every node of the run (SIGTERM, grace, SIGKILL; at once with ``force``)."""
    plan = record.plan()
    with HostPool([n.host for n in plan.nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        reachable = [n for n in plan.nodes if errors[n.index] is None]

        def stop_one(node: NodePlan) -> StopAnswer:
            why = "stopped with `sshddp stop`"
            return calls.stop_node(pool.transport(node), node.rundir, force, why)

        outcomes = pool.map(stop_one, reachable)
    done = []
    for node in plan.nodes:
        err, outcome = errors[node.index], outcomes.get(node.index)
        if err is not None:
            done.append(
                NodeStop(node, error=err.message + (f"\n  fix: {err.hint}" if err.hint else ""))
            )
        elif outcome is None or not outcome.ok:
            done.append(NodeStop(node, error=str(outcome.error if outcome else "no answer")))
        else:
            done.append(NodeStop(node, answer=outcome.value))
    return done


def show_logs(
    record: RunRecord,
    ssh: SshOptions,
    fanout: int,
    screen: Screen,
    node: Optional[int],
    tail: Optional[int],
    follow: bool,
) -> None:
    """Bring the local copies up to date from the hosts, print them, and (``follow``) keep
    printing until the run ends. A node out of reach shows its local copy, with a note."""
    plan = record.plan()
    nodes = [n for n in plan.nodes if node is None or n.node_rank == node]
    with HostPool([n.host for n in plan.nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        logs, console = open_sinks(plan, Path(record.log_dir), screen.stdout_bytes, screen.color)
        try:
            reachable = [n for n in nodes if errors[n.index] is None]
            fetched = pool.map(lambda n: _fetch(pool, n, logs), reachable)
            for outcome in fetched.values():  # a local copy cut short must not print as whole
                if isinstance(outcome.error, LogWriteFailed):
                    raise outcome.error
            for n in nodes:
                if errors[n.index] is not None:
                    screen.err(
                        f"sshddp: node {n.node_rank} ({n.host.host}) unreachable; showing "
                        f"the local copy only: {errors[n.index]}"
                    )
            _print_logs(screen, console, logs, nodes, tail, single=node is not None)
            if follow:
                sub = replace(plan, nodes=tuple(reachable))
                coordinator.watch(RunState(sub, pool, logs, console))
        finally:
            logs.close()


def _fetch(pool: HostPool, node: NodePlan, logs: NodeLogs) -> ExitRecord:
    """Append what the local copy lacks; the node's status."""
    rank = node.node_rank
    return calls.read_node(
        pool.transport(node), node.rundir, logs.size(rank), "fetch", lambda d: logs.write(rank, d)
    )


def _print_logs(
    screen: Screen,
    console: Console,
    logs: NodeLogs,
    nodes: list[NodePlan],
    tail: Optional[int],
    single: bool,
) -> None:
    for node in nodes:
        data = logs.paths[node.node_rank].read_bytes()
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        if single:
            screen.stdout_bytes.write(data)
            screen.stdout_bytes.flush()
        else:
            console.write(node.node_rank, data)
            console.flush_node(node.node_rank)
