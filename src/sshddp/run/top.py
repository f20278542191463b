"""``sshddp top``: one snapshot of every node of a run and every rank on it, each node asked
once over its connection (``remote/calls/node_top.py``), in parallel through the host pool; the
rows and the slow one are worked out by ``model.top``. A live view (``LiveTop``) asks once
per node and keeps the call open: the node sends a record a second, so an hours-long view
costs each host one process, not one Python start a second.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from typing import Optional, Union

from sshddp import defaults
from sshddp.errors import HostUnreachable, RunNotRunning, SshddpError
from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import RemoteProcess, SshOptions
from sshddp.model import top
from sshddp.model.layout import NodeLayout, RunLayout
from sshddp.model.report import replacement
from sshddp.model.top import NodeRow, RankRow
from sshddp.protocol import contract
from sshddp.protocol.contract import TopRecord
from sshddp.run.registry import RunRecord

TAIL = 2048  #: bytes of each rank's latest output asked for (its progress bar)
REFRESH = 1.0  #: seconds between a live view's records (the hosts sample once a second)
STALE = 5.0  #: seconds without a record after which a live view says so


@dataclass(frozen=True)
class Snapshot:
    """Every asked node's row, and every rank's (the slow ones flagged)."""

    run_id: str
    at: float  #: when it was taken (epoch seconds)
    nodes: list[NodeRow]
    ranks: list[RankRow]


def snapshot(
    record: RunRecord, ssh: SshOptions, fanout: int, node: Optional[int], pool: HostPool
) -> Snapshot:
    """Ask every node of the run (or node ``node`` only) for its latest sample."""
    at = time.time()
    nodes = asked(record, node)
    errors = pool.connect_all()

    def ask(n: NodeLayout) -> TopRecord:
        return calls.node_top(pool.transport(n), n.rundir, TAIL)

    outcomes = pool.map(ask, [n for n in nodes if errors[n.index] is None])
    answers: dict[int, Answer] = {}
    for n in nodes:
        err, outcome = errors[n.index], outcomes.get(n.index)
        if err is not None or outcome is None or outcome.value is None:
            why = err.message if err is not None else str(outcome.error if outcome else "no answer")
            answers[n.index] = why
        else:
            answers[n.index] = outcome.value
    return _snapshot(record.layout(), at, nodes, answers, node)


#: a node's record, or why there is none
Answer = Union[TopRecord, str]


def asked(record: RunRecord, node: Optional[int]) -> list[NodeLayout]:
    """The run's nodes that a view asks: all, or node ``node`` only, and the spares (one
    may hold node ``node``'s rank: its answer says)."""
    layout = record.layout()
    return [n for n in layout.nodes if node in (None, n.node_rank) or layout.spare(n.node_rank)]


def _snapshot(
    layout: RunLayout,
    at: float,
    nodes: list[NodeLayout],
    answers: dict[int, Answer],
    only: Optional[int] = None,
) -> Snapshot:
    """The rows of the answers; a spare seated mid-run in the rank it holds, named by a
    line (the lost host's row gone); ``only``: node ``only``'s rows alone."""
    seats = _seats(layout, nodes, answers)
    rows: list[NodeRow] = []
    ranks: list[RankRow] = []
    for n in nodes:
        rank = seats.get(n.node_rank, n.node_rank)
        if only not in (None, rank) or (n.node_rank in seats.values() and rank == n.node_rank):
            continue  # not asked for, or a lost node whose rank a spare holds
        answer = answers.get(n.index, "no answer")
        if isinstance(answer, str):
            rows.append(NodeRow(rank, n.host.host, "?", None, error=answer))
            continue
        row = NodeRow(rank, n.host.host, answer["state"], answer["sample"])
        if n.node_rank in seats:
            lost = next(m.host.host for m in layout.nodes if m.node_rank == rank)
            row = replace(row, replaced=replacement(rank, n.host.host, lost, answer.get("attempt")))
        rows.append(row)
        ranks += top.rank_rows(
            row, answer["tails"], answer["now"], answer.get("history"), answer.get("waits")
        )
    ranks = top.flag_slow(sorted(ranks, key=lambda r: r.rank))
    rows.sort(key=lambda r: r.node_rank)
    return Snapshot(layout.run_id, at, top.idle_gpus(rows), ranks)


def _seats(
    layout: RunLayout, nodes: list[NodeLayout], answers: dict[int, Answer]
) -> dict[int, int]:
    """Each spare's slot -> the run's node rank it took mid-run, as its answer says."""
    seats = {}
    for n in nodes:
        answer = answers.get(n.index)
        seat = answer.get("node_rank") if isinstance(answer, dict) else None
        if layout.spare(n.node_rank) and isinstance(seat, int) and 0 <= seat != n.node_rank:
            seats[n.node_rank] = seat
    return seats


class LiveTop:
    """A live view's streams: one open ``node_top`` call per asked node, each node's latest
    record kept by its reader thread. A node whose stream ended (or that sent nothing for
    STALE seconds) shows why in its row, and is called again at the next look."""

    def __init__(self, record: RunRecord, pool: HostPool, node: Optional[int]) -> None:
        self.run_id, self.pool, self.nodes = record.run_id, pool, asked(record, node)
        self.layout, self.only = record.layout(), node
        self.lock = threading.Condition()
        self.latest: dict[int, tuple[float, Answer]] = {}  #: when it came, and what
        self.streams: dict[int, RemoteProcess] = {}
        self.closing = False

    def __enter__(self) -> LiveTop:
        """Every node's stream opened, and its first record in (or STALE seconds gone)."""
        self.pool.map(self._open, self.nodes)
        with self.lock:
            self.lock.wait_for(lambda: len(self.latest) == len(self.nodes), STALE)
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.closing = True
            streams = list(self.streams.values())
        for proc in streams:
            proc.close()  # its stdin ends: the host's node_top ends

    def snapshot(self) -> Snapshot:
        """The latest record of every node; a node with no open stream is called again."""
        now = time.monotonic()
        with self.lock:
            dead = [n for n in self.nodes if n.index not in self.streams]
        for n in dead:
            self._open(n)
        answers: dict[int, Answer] = {}
        with self.lock:
            for n in self.nodes:
                came, answer = self.latest.get(n.index, (now, "no sample yet"))
                stale = not isinstance(answer, str) and now - came > STALE
                answers[n.index] = f"no sample for {now - came:.0f} s" if stale else answer
        return _snapshot(self.layout, time.time(), self.nodes, answers, self.only)

    def _open(self, n: NodeLayout) -> None:
        try:
            transport = self.pool.transport(n)
            transport.connect()
            proc = calls.watch_top(transport, n.rundir, TAIL, REFRESH)
        except SshddpError as exc:
            with self.lock:
                self.latest[n.index] = (time.monotonic(), exc.message)
            return
        with self.lock:
            self.streams[n.index] = proc
        threading.Thread(target=self._read, args=(n, proc), daemon=True).start()

    def _read(self, n: NodeLayout, proc: RemoteProcess) -> None:
        why = "its stream ended"
        pending = b""
        try:
            while chunk := proc.read():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    with self.lock:
                        self.latest[n.index] = (time.monotonic(), json.loads(line))
                        self.lock.notify_all()
        except (SshddpError, OSError, ValueError) as exc:
            why = f"its stream failed: {getattr(exc, 'message', None) or exc}"
        finally:
            proc.close()
            with self.lock:
                self.streams.pop(n.index, None)
                if not self.closing:
                    self.latest[n.index] = (time.monotonic(), why)


def open_pool(record: RunRecord, ssh: SshOptions, fanout: int, node: Optional[int]) -> HostPool:
    """The pool of the asked nodes' hosts, kept open across a live view's refreshes."""
    return HostPool([n.host for n in asked(record, node)], ssh, fanout)


def check_live(got: Snapshot) -> None:
    """Raise as ``stacks`` does when there is nothing to show: every node has ended
    (RunNotRunning), or none that may still run could be reached (HostUnreachable)."""
    live = (contract.STARTING, contract.RUNNING)
    if any(n.state in live for n in got.nodes):
        return
    failed = [n for n in got.nodes if n.error]
    if failed:
        raise HostUnreachable(
            failed[0].host,
            "no samples: " + "; ".join(f"node {n.node_rank} ({n.host}): {n.error}" for n in failed),
        )
    ends = ", ".join(f"node {n.node_rank} ({n.host}) {n.state}" for n in got.nodes)
    raise RunNotRunning(
        f"run {got.run_id} is not running ({ends}): it has no samples to show; "
        f"`sshddp logs {got.run_id}` shows its output"
    )


_ = defaults  # the fan-out's default comes with the shared ssh options
