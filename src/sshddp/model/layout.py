"""A run's layout: where its nodes are and which ranks each runs, and nothing a launch alone
needs (no environment, no command, no nonce).

It is what every command on a run shares: a launch's plan exposes it (``LaunchPlan.layout``),
and a recorded run gives it back (``RunRecord.layout``) for ``attach``, ``logs``, ``stop``,
``ps``, ``stacks`` and ``fetch``. torchrun numbers the global ranks node after node in
node-rank order (``first_ranks``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from sshddp.model.inventory import Host


@dataclass(frozen=True)
class NodeLayout:
    """One node of a run: its host, its ranks and its directories there."""

    host: Host  #: the inventory host it runs on
    node_rank: int  #: torchrun ``--node-rank`` (= the host's index in the inventory)
    nproc: int  #: processes on this node
    first_rank: int  #: global rank of local rank 0
    rundir: str  #: remote run directory (``~`` expanded on the host)
    cwd: str  #: working directory of the node's launcher on the host

    @property
    def index(self) -> int:
        """The host's position in the inventory (what the host pool keys results by)."""
        return self.host.index

    @property
    def ranks(self) -> range:
        """The node's global ranks."""
        return range(self.first_rank, self.first_rank + self.nproc)


@dataclass(frozen=True)
class RunLayout:
    """One run's nodes, where its local logs go, and how long stopping it takes."""

    run_id: str
    log_dir: str  #: local directory of this run's logs
    nodes: tuple[NodeLayout, ...]  #: every node, in the order the run lists them
    grace: float  #: seconds between SIGTERM and SIGKILL when the run is stopped
    #: the mesh slots of the spares staged with it (``--max-restarts``): their ranks are
    #: past the run's world until one takes a lost node's place mid-run, then it is shown
    #: as that node (``sinks.seat_spare``)
    spares: frozenset[int] = frozenset()

    @property
    def world_size(self) -> int:
        """The run's processes, every node's together."""
        return sum(n.nproc for n in self.nodes)

    def spare(self, slot: int) -> bool:
        """Whether mesh slot ``slot`` is a spare's."""
        return slot in self.spares

    def only(self, node_ranks: Iterable[int]) -> RunLayout:
        """The same run, with the nodes of ``node_ranks`` alone."""
        keep = set(node_ranks)
        return replace(self, nodes=tuple(n for n in self.nodes if n.node_rank in keep))


def first_ranks(nprocs: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Each node's first global rank, from its (node rank, processes): torchrun numbers the
    ranks node after node, in node-rank order, whatever order the nodes are listed in."""
    first: dict[int, int] = {}
    total = 0
    for node_rank, nproc in sorted(nprocs):
        first[node_rank], total = total, total + nproc
    return first
