"""``sshddp ps``: the runs this machine launched, each node's state, and how long each ran.

A finished run comes from the registry and costs no connection. Unfinished runs are asked
all at once: every distinct host once (one connection, however many runs it holds), then
every node's status over those connections, at most ``fanout`` at a time, each given its
window (the connect timeout plus ``ANSWER_WINDOW``) from when its turn came. A host that
has not answered within it is named, and its nodes show as unreachable: one hung host
costs one window, not one per run, and a host still waiting for its turn (256 hosts, 32
at a time) is never named. A run found ended is recorded at once, so no ps asks about it again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

from sshddp.errors import SshddpError, StateError
from sshddp.hosts import calls
from sshddp.hosts.pool import Outcome, open_transport
from sshddp.hosts.transport import SshOptions, Transport
from sshddp.model.state import NodeState, with_replaced
from sshddp.protocol.contract import ExitRecord
from sshddp.run import registry
from sshddp.run.quarantine import ends as quarantine_ends
from sshddp.run.registry import NodeRecord, RunRecord

ANSWER_WINDOW = 10.0  #: seconds past the connect timeout that ps waits for every answer

T = TypeVar("T", bound=Hashable)
R = TypeVar("R")
HostKey = tuple[Optional[str], str, Optional[str], Optional[int]]  #: config, host, user, port
NodeKey = tuple[str, int]  #: run id, node rank


@dataclass(frozen=True)
class PsRow:
    """One run as ``sshddp ps`` shows it."""

    run_id: str
    started: float  #: epoch seconds
    duration: Optional[float]  #: seconds until its end (until now while it goes on); None: unknown
    hosts: tuple[str, ...]  #: by node rank
    states: tuple[ExitRecord, ...]  #: every node's state, read live or recorded
    root_cause: str  #: the earliest node to fail or be lost, in words
    finished: bool  #: every node has ended (its end is recorded)
    launching: bool = False  #: its launch is still in its preflight: no node started yet
    nprocs: tuple[int, ...] = ()  #: every node's count of ranks
    #: bytes of the code that left this machine, and each host's source (the hand-off)
    code_delivery: Optional[Mapping[str, Any]] = None
    spares: frozenset[int] = frozenset()  #: the spares' node ranks (their slots)

    def node_text(self, i: int) -> str:
        """``1:running`` and, for a running node, ``(2/4 joined, quiet 12s)``: how many of
        its ranks are through init_process_group, how long since it last wrote output, and
        ``working`` when its ranks were seen working since (``--stall-timeout`` samples)."""
        s = self.states[i]
        text = f"{i}:{NodeState.of(s.get('state')).value}"
        if "joined" not in s:
            return text
        of = f"/{self.nprocs[i]}" if i < len(self.nprocs) else ""
        attempt = f", attempt {s['attempt']}/{s.get('attempts')}" if "attempt" in s else ""
        quiet = s.get("quiet", 0)
        working = ", working" if s.get("still", quiet) + 1 < quiet else ""  # node_progress
        return text + f"({s['joined']}{of} joined, quiet {quiet:.0f}s{working}{attempt})"

    def to_json(self) -> dict[str, Any]:
        """The row as ``ps --json`` prints it (docs/runs.md, "sshddp ps --json")."""
        took = seats(self.states, self.spares)
        nodes = [
            {
                "node_rank": rank,
                "host": host,
                "state": NodeState.of(s.get("state")).value,
                "reason": s.get("reason") or "",
                "returncode": s.get("returncode"),
                "ended": s.get("ended"),
                "joined": s.get("joined"),
                "quiet": s.get("quiet"),
                "still": s.get("still"),
                "attempt": s.get("attempt"),
                "attempts": s.get("attempts"),
                "took": took.get(rank),
                "replaced_by": next((self.hosts[i] for i, t in took.items() if t == rank), None),
            }
            for rank, (host, s) in enumerate(zip(self.hosts, self.states))
        ]
        return {
            "run_id": self.run_id,
            "started": self.started,
            "duration": self.duration,
            "finished": self.finished,
            "launching": self.launching,
            "root_cause": self.root_cause,
            "code_delivery": None if self.code_delivery is None else dict(self.code_delivery),
            "nodes": nodes,
        }


def seats(states: Sequence[ExitRecord], spares: frozenset[int]) -> dict[int, int]:
    """Each spare (``spares``: their places in ``states``, the nodes' records in node-rank
    order) that took a lost node's rank mid-run: the node rank its record says it holds."""
    found = {}
    for i, state in enumerate(states):
        seat = state.get("node_rank") if i in spares else None
        if isinstance(seat, int) and not isinstance(seat, bool) and seat != i:
            found[i] = seat
    return found


@dataclass(frozen=True)
class PsReport:
    rows: list[PsRow]
    #: what ps could not do (malformed records, hosts that did not answer), and the hosts
    #: the ends it learned of quarantined
    notes: list[str]


def ps(
    show_all: bool,
    ssh_of: Callable[[RunRecord], SshOptions],
    fanout: int,
    timeout: float,
    only: Optional[str] = None,
) -> PsReport:
    """Every run (``show_all``) or every unfinished one, or only run ``only`` (finished or
    not); ``ssh_of`` says how to reach a recorded run's hosts, ``timeout`` is the connect
    timeout."""
    records, notes = registry.all_runs()
    if only is not None:
        records, show_all = [r for r in records if r.run_id == only], True
    rows: list[PsRow] = []
    todo: list[RunRecord] = []
    for record in records:
        if record.finished:
            if show_all:
                rows.append(_row(record, [_end_json(e) for e in record.result or ()], True))
        elif record.launching:
            if not registry.drop_if_abandoned(record.run_id):
                rows.append(_launching_row(record))
        else:
            todo.append(record)
    answers, silent = ask(todo, ssh_of, fanout, timeout + ANSWER_WINDOW)
    for record in todo:
        states = [answers[(record.run_id, n.node_rank)] for n in record.nodes]
        ranks, hosts = [n.node_rank for n in record.nodes], [n.host.host for n in record.nodes]
        states = with_replaced(ranks, hosts, states)  # a spare took a lost node's place
        finished = all(NodeState.of(s.get("state")).final for s in states)
        if finished:
            notes += _record(record, states)
        rows.append(_row(record, states, finished))
    return PsReport(sorted(rows, key=lambda r: r.started), notes + silent)


def _record(record: RunRecord, states: list[ExitRecord]) -> list[str]:
    try:
        ended = registry.record_end(record.run_id, lambda r: r.ended_from(states))
    except StateError as exc:
        return [f"run {record.run_id}: its end is not recorded: {exc.message}"]
    return [
        f"run {record.run_id}: {line.removeprefix('sshddp: ')}"
        for line in quarantine_ends.after_record(ended)
    ]


def _end_json(end: registry.NodeEnd) -> ExitRecord:
    record: ExitRecord = {"state": end.state, "reason": end.reason, "returncode": end.returncode}
    if end.ended is not None:
        record["ended"] = end.ended
    if end.seat is not None:  # a spare that took a lost node's rank
        record["node_rank"] = end.seat
    return record


def _row(record: RunRecord, states: Sequence[ExitRecord], finished: bool) -> PsRow:
    hosts = tuple(n.host.host for n in record.nodes)
    if finished:
        ended = record.ended or max((s.get("ended") or 0 for s in states), default=0)
        duration = ended - record.created if ended else None
    else:
        duration = time.time() - record.created
    return PsRow(
        record.run_id,
        record.created,
        duration,
        hosts,
        tuple(states),
        record.cause or root_cause(states, hosts),
        finished,
        nprocs=tuple(n.nproc for n in record.nodes),
        code_delivery=record.code_delivery,
        spares=record.layout().spares,
    )


def _launching_row(record: RunRecord) -> PsRow:
    pid = record.launcher.pid if record.launcher else "?"
    state: ExitRecord = {"state": NodeState.PENDING.value, "reason": f"being launched (pid {pid})"}
    hosts = tuple(n.host.host for n in record.nodes)
    duration = time.time() - record.created
    states = tuple(state for _ in record.nodes)
    return PsRow(record.run_id, record.created, duration, hosts, states, "", False, True)


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
    if NodeState.of(s.get("state")) is NodeState.STALLED:
        # The node that stopped first is not the one that hung: the odd ones out of the
        # stacks are, and only the report (launch, attach) reads them. Blame no node here.
        return f"stalled: {s.get('reason', '')}".rstrip(": ")
    return f"node {i} ({hosts[i]}) {s.get('state')}: {s.get('reason', '')}".rstrip(": ")


# --- asking every host at once, each within its window --------------------------------------


def ask(
    records: Sequence[RunRecord],
    ssh_of: Callable[[RunRecord], SshOptions],
    fanout: int,
    window: float,
) -> tuple[dict[NodeKey, ExitRecord], list[str]]:
    """Every node's status; and a note for each host that did not answer within ``window``
    seconds (its nodes are unreachable)."""
    answers: dict[NodeKey, ExitRecord] = {}
    hosts: dict[HostKey, Transport] = {}
    items: dict[NodeKey, tuple[HostKey, NodeRecord]] = {}
    for record in records:
        try:
            ssh = ssh_of(record)
        except SshddpError as exc:
            for n in record.nodes:
                answers[(record.run_id, n.node_rank)] = _unreachable(exc.message)
            continue
        for n in record.nodes:
            key = (ssh.ssh_config, n.host.host, n.host.user, n.host.port)
            if key not in hosts:
                hosts[key] = open_transport(n.host, ssh)
            items[(record.run_id, n.node_rank)] = (key, n)
    connected = bounded_map(lambda k: hosts[k].connect(), list(hosts), fanout, window)
    ready = [k for k, (host, _) in items.items() if _ok(connected.get(host))]

    def status(k: NodeKey) -> ExitRecord:
        host, node = items[k]
        return calls.read_node(hosts[host], node.rundir, 0, "status")

    statuses = bounded_map(status, ready, fanout, window)
    silent: set[HostKey] = set()
    for k, (host, _) in items.items():
        link = connected.get(host)
        outcome = statuses.get(k) if link is not None and link.ok else link
        if outcome is None:
            silent.add(host)
            answers[k] = _unreachable(f"{hosts[host].label} did not answer within {window:.0f} s")
        elif outcome.error is not None:
            answers[k] = _unreachable(_message(outcome.error))
        else:
            answers[k] = outcome.value or _unreachable("no answer")
    _close(hosts, silent)
    return answers, _notes(hosts, connected, silent, window)


def _notes(
    hosts: dict[HostKey, Transport],
    connected: dict[HostKey, Outcome[None]],
    silent: set[HostKey],
    window: float,
) -> list[str]:
    """One line per host that could not be asked: which, and why."""
    notes = []
    for key in sorted(hosts, key=str):
        outcome = connected.get(key)
        if key in silent:
            notes.append(f"{hosts[key].label} did not answer within {window:.0f} s")
        elif outcome is not None and outcome.error is not None:
            notes.append(_message(outcome.error))
    return [f"{note}; its nodes show as unreachable" for note in notes]


def _ok(outcome: Optional[Outcome[Any]]) -> bool:
    return outcome is not None and outcome.ok


def _unreachable(reason: str) -> ExitRecord:
    record: ExitRecord = {"state": NodeState.UNREACHABLE.value, "reason": reason}
    return record


def _message(error: BaseException) -> str:
    return error.message if isinstance(error, SshddpError) else f"{type(error).__name__}: {error}"


def _close(hosts: dict[HostKey, Transport], silent: set[HostKey]) -> None:
    """Close the connections that answered; a silent one is left to its daemon thread."""
    for key, transport in hosts.items():
        if key not in silent:
            try:
                transport.close()
            except Exception:  # closing a broken connection may fail; it is gone anyway
                pass


def bounded_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int, window: float
) -> dict[T, Outcome[R]]:
    """``fn`` over ``items``, ``workers`` at a time, each item given ``window`` seconds from
    when its turn came: the outcomes by item, without those that took longer. A worker stuck
    on one (a hung host) is given up on and another takes its place, so a hung host costs
    one window, and an item that waited for its turn (256 hosts, 32 at a time) is never
    named as not answering. The threads are daemons: one stuck on a hung host never keeps
    the process alive."""
    return _Turns(fn, items, window).run(workers)


class _Turns(Generic[T, R]):
    """``bounded_map``'s workers and their items' turns."""

    def __init__(self, fn: Callable[[T], R], items: Sequence[T], window: float) -> None:
        self.fn, self.window, self.count = fn, window, len(items)
        self.todo: queue.SimpleQueue[T] = queue.SimpleQueue()
        for item in items:
            self.todo.put(item)
        self.done: dict[T, Outcome[R]] = {}
        self.began: dict[T, float] = {}  #: when each item's turn came
        self.given_up: set[T] = set()
        self.cond = threading.Condition()

    def run(self, workers: int) -> dict[T, Outcome[R]]:
        for _ in range(min(max(1, workers), self.count)):
            self._spawn()
        with self.cond:
            while len(self.done) + len(self.given_up) < self.count:
                self.cond.wait(self._give_up_late())
            return dict(self.done)

    def _give_up_late(self) -> float:
        """Give up on the items past their window (a worker takes each one's place); the
        seconds until the next one's window ends."""
        now = time.monotonic()
        waits = []
        for item, t in self.began.items():
            if item in self.done or item in self.given_up:
                continue
            if now - t >= self.window:
                self.given_up.add(item)
                self._spawn()
            else:
                waits.append(t + self.window - now)
        return max(0.01, min(waits, default=self.window))

    def _spawn(self) -> None:
        threading.Thread(target=self._work, daemon=True, name="ps").start()

    def _work(self) -> None:
        while True:
            try:
                item = self.todo.get_nowait()
            except queue.Empty:
                return
            with self.cond:
                self.began[item] = time.monotonic()
            try:
                outcome: Outcome[R] = Outcome(value=self.fn(item))
            except Exception as exc:  # collected per item, reported by the caller
                outcome = Outcome(error=exc)
            with self.cond:
                late = item in self.given_up
                if not late:
                    self.done[item] = outcome
                self.cond.notify_all()
            if late:  # another worker took this one's place
                return
