"""``sshddp top``: one snapshot of every node of a run and every rank on it, each node asked
once over its connection (``remote/node_top.py``), in parallel through the host pool; the
rows and the slow one are worked out by ``model.top``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from sshddp import defaults
from sshddp.errors import HostUnreachable, RunNotRunning
from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model import top
from sshddp.model.layout import NodeLayout
from sshddp.model.top import NodeRow, RankRow
from sshddp.remote import contract
from sshddp.remote.contract import TopRecord
from sshddp.run.registry import RunRecord

TAIL = 2048  #: bytes of each rank's latest output asked for (its progress bar)


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
    nodes = [n for n in record.layout().nodes if node is None or n.node_rank == node]
    errors = pool.connect_all()

    def ask(n: NodeLayout) -> TopRecord:
        return calls.node_top(pool.transport(n), n.rundir, TAIL)

    outcomes = pool.map(ask, [n for n in nodes if errors[n.index] is None])
    rows: list[NodeRow] = []
    ranks: list[RankRow] = []
    for n in nodes:
        err, outcome = errors[n.index], outcomes.get(n.index)
        if err is not None or outcome is None or outcome.value is None:
            why = err.message if err is not None else str(outcome.error if outcome else "no answer")
            rows.append(NodeRow(n.node_rank, n.host.host, "?", None, error=why))
            continue
        answer = outcome.value
        row = NodeRow(n.node_rank, n.host.host, answer["state"], answer["sample"])
        rows.append(row)
        ranks += top.rank_rows(row, answer["tails"], answer["now"], answer.get("history"))
    ranks = top.flag_slow(sorted(ranks, key=lambda r: r.rank))
    return Snapshot(record.run_id, at, top.idle_gpus(rows), ranks)


def open_pool(record: RunRecord, ssh: SshOptions, fanout: int, node: Optional[int]) -> HostPool:
    """The pool of the asked nodes' hosts, kept open across a live view's refreshes."""
    nodes = [n for n in record.layout().nodes if node is None or n.node_rank == node]
    return HostPool([n.host for n in nodes], ssh, fanout)


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
