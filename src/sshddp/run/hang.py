"""What a run's watchdogs recorded when it hung, read back from every node at once
(``remote/node/host_hang.py``): for the launch's report and for ``sshddp stacks`` of a run that
ended hung. The report itself is pure (``model.hang``)."""

from __future__ import annotations

from typing import Optional

from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.hang import NodeHang
from sshddp.model.layout import NodeLayout
from sshddp.protocol.contract import HangRecord
from sshddp.run.registry import RunRecord


def collect(record: RunRecord, ssh: SshOptions, fanout: int) -> list[NodeHang]:
    """Every node's hang record (or why it could not be read), by node rank."""
    nodes = list(record.layout().nodes)
    with HostPool([n.host for n in nodes], ssh, fanout) as pool:
        errors = pool.connect_all()

        def ask(n: NodeLayout) -> Optional[HangRecord]:
            return calls.node_hang(pool.transport(n), n.rundir)

        outcomes = pool.map(ask, [n for n in nodes if errors[n.index] is None])
    hangs = []
    for n in nodes:
        err, outcome = errors[n.index], outcomes.get(n.index)
        if err is not None:
            hangs.append(NodeHang(n.node_rank, n.host.host, error=err.message))
        elif outcome is None or outcome.error is not None:
            why = str(outcome.error if outcome else "no answer")
            hangs.append(NodeHang(n.node_rank, n.host.host, error=why))
        else:
            hangs.append(NodeHang(n.node_rank, n.host.host, outcome.value))
    return hangs
