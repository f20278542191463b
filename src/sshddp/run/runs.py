"""Existing runs, from any terminal: their logs, and stopping them (``ps`` is in ``ps``).

Each reads a ``RunRecord`` from the registry for the hosts and run directories, then asks the
hosts (whose supervisors own the runs) for the live state and the log bytes the local copy
lacks. Whoever learns that a run ended records it. ``attach`` is in ``coordinator``: it
follows a run like a launch does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from sshddp.errors import (
    Interrupted,
    LogWriteFailed,
    RunGone,
    RunNotFound,
    StateError,
    UsageError,
)
from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.escape import TerminalStream
from sshddp.model.layout import NodeLayout, RunLayout
from sshddp.model.report import attempt_marks, replacement
from sshddp.model.state import NodeState
from sshddp.protocol.contract import ExitRecord, StopAnswer
from sshddp.run import coordinator, logread, registry
from sshddp.run.interrupts import Interrupts
from sshddp.run.nodefeed import NodeFeed
from sshddp.run.quarantine import ends as quarantine_ends
from sshddp.run.registry import RunRecord
from sshddp.run.runstate import RunState
from sshddp.run.sinks import Console, NodeLogs, Screen, open_sinks, seat_spare


def started(record: RunRecord) -> RunRecord:
    """``record``, once its launch let its nodes start. Before that there is nothing on
    the hosts to attach to, read or stop: a ``UsageError`` while the launch goes on, and
    ``RunNotFound`` (the record dropped) if it died first."""
    launcher = record.launcher
    if launcher is None:
        return record
    if registry.drop_if_abandoned(record.run_id):
        raise RunNotFound(f"no run {record.run_id!r}: its launch ended before any node started")
    raise UsageError(
        f"run {record.run_id} is still being launched (pid {launcher.pid}): no node has "
        "started yet. Try again in a moment, or interrupt the launch in its terminal "
        f"(Ctrl-C, or `kill -INT {launcher.pid}`): nothing will have started"
    )


@dataclass(frozen=True)
class NodeStop:
    """What ``stop`` did on one node: its answer, or why it could not reach it."""

    node: NodeLayout
    answer: Optional[StopAnswer] = None
    error: str = ""  #: the node was NOT stopped, and why

    def outcome(self) -> str:
        """How the node ended, as its exit record says: a node that ended by itself while
        the stop was on its way is not said to be stopped."""
        assert self.answer is not None
        state = NodeState.of(self.answer.get("state")).value
        if self.answer.get("already"):
            return f"was already {state}"
        if state == NodeState.STOPPED.value:
            return "stopped"
        return f"{state} (it ended by itself before the stop reached it)"


def stop(record: RunRecord, ssh: SshOptions, fanout: int, force: bool) -> list[NodeStop]:
    """Stop every node of the run (SIGTERM, grace, SIGKILL; at once with ``force``)."""
    layout = record.layout()
    with HostPool([n.host for n in layout.nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        reachable = [n for n in layout.nodes if errors[n.index] is None]

        def stop_one(node: NodeLayout) -> StopAnswer:
            why = "stopped with `sshddp stop`"
            return calls.stop_node(pool.transport(node), node.rundir, force, why)

        outcomes = pool.map(stop_one, reachable)
    done = []
    for node in layout.nodes:
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


def record_if_ended(record: RunRecord, states: list[Optional[ExitRecord]]) -> list[str]:
    """Keep the run's end in the registry once every node's state is final (in node rank
    order; None: unknown); the lines to say: a warning when the registry cannot take it,
    the hosts its end quarantined."""
    if any(s is None or not NodeState.of(s.get("state")).final for s in states):
        return []
    known = [s for s in states if s is not None]
    try:
        ended = registry.record_end(record.run_id, lambda r: r.ended_from(known))
    except StateError as exc:
        return [f"sshddp: warning: the run's end is not recorded: {exc.message}"]
    return quarantine_ends.after_record(ended)


def show_logs(
    record: RunRecord,
    ssh: SshOptions,
    fanout: int,
    screen: Screen,
    node: Optional[int],
    tail: Optional[int],
    follow: bool,
    ranks: Optional[frozenset[int]] = None,
) -> None:
    """Bring the local copies up to date from the hosts, print them, and (``follow``) keep
    printing until the run ends; the ranks ``ranks`` selects (all: None). A node out of
    reach shows its local copy, with a note; so does a node whose run directory is gone
    from its host (it is not followed)."""
    layout = record.layout()
    # a spare may hold node K's rank: which one, its host says (``_fetch``)
    nodes = [n for n in layout.nodes if node in (None, n.node_rank) or layout.spare(n.node_rank)]
    with HostPool([n.host for n in layout.nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        logs, console = open_sinks(layout, Path(record.log_dir), screen, ranks, agent=True)
        try:
            reachable = [n for n in nodes if errors[n.index] is None]
            fetched = pool.map(lambda n: _fetch(pool, layout, n, logs, console), reachable)
            for outcome in fetched.values():  # a local copy cut short must not print as whole
                if isinstance(outcome.error, LogWriteFailed):
                    raise outcome.error
            states = {n.node_rank: fetched[n.index].value for n in reachable}
            nodes = [n for n in nodes if node in (None, logs.seats.get(n.node_rank, n.node_rank))]
            if node is None:
                for line in record_if_ended(record, [states.get(n.node_rank) for n in nodes]):
                    screen.err(line)
            gone = {r for r, s in states.items() if s and s.get("state") == NodeState.GONE.value}
            _say_missing(screen, nodes, errors, gone)
            marks = {n.node_rank: _marks(layout, logs, n, states.get(n.node_rank)) for n in nodes}
            _print_logs(screen, console, logs, nodes, tail, single=node is not None, marks=marks)
            live = [n.node_rank for n in reachable if n.node_rank not in gone]
            if follow and live:
                _watch(RunState(layout.only(live), pool, logs, console))
            elif follow and gone and not record.end_known:
                raise RunGone(
                    f"run {record.run_id}: nothing to follow: its run directories are gone "
                    "from its hosts, and this machine never recorded how it ended"
                )
        except KeyboardInterrupt:  # before the follow began: said as during it
            if not follow:
                raise
            raise _stopped_following(record.run_id) from None
        finally:
            logs.close()


def _watch(state: RunState) -> None:
    """Follow the live nodes until they end; Ctrl-C leaves them running (exit 130)."""
    interrupts = Interrupts().deferred()
    coordinator.watch(state, interrupts)
    if interrupts.count:
        raise _stopped_following(state.layout.run_id)


def _stopped_following(run_id: str) -> Interrupted:
    """What Ctrl-C during ``logs --follow`` says, whenever it comes and wherever the output
    goes."""
    return Interrupted(
        f"stopped following run {run_id}; it goes on (`sshddp logs -f {run_id}` follows it again)"
    )


def _say_missing(
    screen: Screen,
    nodes: list[NodeLayout],
    errors: Mapping[int, Optional[Exception]],
    gone: set[int],
) -> None:
    for n in nodes:
        name = f"node {n.node_rank} ({n.host.host})"
        if errors[n.index] is not None:
            screen.err(
                f"sshddp: {name} unreachable; showing the local copy only: {errors[n.index]}"
            )
        elif n.node_rank in gone:
            screen.err(
                f"sshddp: {name}: its run directory is gone from the host (retention removes "
                "the oldest finished runs); showing the local copy only"
            )


def _marks(
    layout: RunLayout, logs: NodeLogs, node: NodeLayout, status: Optional[ExitRecord]
) -> list[tuple[int, str]]:
    """Where each attempt starts in the node's log, and the line ``logs`` prints there; a
    spare seated mid-run is named as the node it holds, from its first byte."""
    seat = logs.seats.get(node.node_rank)
    if seat is None:
        return attempt_marks(f"node {node.node_rank} ({node.host.host})", status or {})
    lost = next(n.host.host for n in layout.nodes if n.node_rank == seat)
    named = replacement(seat, node.host.host, lost, (status or {}).get("attempt"))
    return [(0, f"sshddp: {named}")]


def _fetch(
    pool: HostPool, layout: RunLayout, node: NodeLayout, logs: NodeLogs, console: Console
) -> ExitRecord:
    """Append what the local copy lacks; the node's status. A copy another sshddp is
    writing is left to it: only the status is read. A spare seated mid-run is first named
    as the node it holds (its status says which): its copy is that node's."""
    rank = node.node_rank
    transport = pool.transport(node)
    if layout.spare(rank):
        status = calls.read_node(transport, node.rundir, 0, "status")
        seat_spare(layout, logs, console, rank, status)
    if logs.shadow(rank):
        return calls.read_node(pool.transport(node), node.rundir, 0, "status")
    feed = NodeFeed(logs, None, rank)
    size, index = logs.size(rank), logs.index_size(rank)
    return calls.read_node(pool.transport(node), node.rundir, size, "fetch", feed.feed, index)


def _print_logs(
    screen: Screen,
    console: Console,
    logs: NodeLogs,
    nodes: list[NodeLayout],
    tail: Optional[int],
    single: bool,
    marks: Optional[Mapping[int, list[tuple[int, str]]]] = None,
) -> None:
    """Stream each node's local copy (from its last ``tail`` lines): never the whole file in
    memory. One node alone prints raw, byte for byte, unless the output is a terminal.
    Where an attempt starts (``marks``: offset, line), sshddp's line says so (on stderr
    for one node alone: stdout stays the node's bytes)."""
    raw = single and not _isatty(screen.stdout_bytes)
    shown = TerminalStream()  # one node on a terminal
    for node in nodes:
        rank, path = node.node_rank, logs.paths[node.node_rank]
        start = 0 if tail is None else logread.tail_offset(path, tail)
        cuts = [(o, line) for o, line in (marks or {}).get(rank, []) if o >= start]
        index = logs.index_paths.get(rank)
        skip = logread.unfinished(path, index, start) if tail is not None else set()
        for end, line in [*cuts, (None, "")]:
            for chunk, source in logread.attributed(path, index, start, end, skip):
                if not single:
                    console.write(rank, chunk, source)
                    continue
                if not _write(screen.stdout_bytes, chunk if raw else shown.feed(chunk)):
                    return  # the reader went away (`| head`)
            if end is None:
                break
            if not single:
                console.flush_node(rank)
            (screen.err if single else console.message)(line)
            start, skip = end, set()  # an attempt's first line is whole
        if not single:
            console.flush_node(rank)
    if not raw:
        _write(screen.stdout_bytes, shown.end())


def _write(stream: BinaryIO, data: bytes) -> bool:
    try:
        stream.write(data)
        stream.flush()
    except (BrokenPipeError, ValueError):
        return False
    return True


def _isatty(stream: BinaryIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
