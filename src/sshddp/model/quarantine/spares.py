"""Spares at launch: which spare takes which bad node's place, before anything starts.

Pure: given the run's hosts (node rank = ``Host.index``), why each bad one is bad
(unreachable, quarantined) and why each spare cannot be used, ``choose`` gives every node
its host, the swaps made, and the nodes no spare could fill with the spares tried for each.
A spare takes a node only with the same process count, so the run's ranks stay as planned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sshddp.model.inventory import Host


@dataclass(frozen=True)
class Swap:
    """A spare that took a bad node's place."""

    node_rank: int  #: the node whose host changed
    old: Host  #: the inventory's host, left out of the run
    new: Host  #: the spare, now with ``index == node_rank``
    why: str  #: why ``old`` was left out ("unreachable (connection refused)")

    def line(self) -> str:
        """The launch banner's line for this swap."""
        return (
            f"sshddp: node {self.node_rank}: {self.old.host} {self.why}; "
            f"spare {self.new.host} takes its place"
        )


@dataclass(frozen=True)
class Unfilled:
    """A bad node no spare could take: the run ends as without spares."""

    node_rank: int  #: the node
    host: Host  #: its host, which stays in the run (the launch then fails through it)
    why: str  #: why the host is bad
    tried: tuple[tuple[str, str], ...]  #: (spare, why it was not used) for every spare

    def line(self) -> str:
        """One line: the node, why its host is bad, and each spare and why it was not used."""
        tried = "; ".join(f"spare {name} {why}" for name, why in self.tried)
        return (
            f"sshddp: node {self.node_rank}: {self.host.host} {self.why}; no spare can take its "
            f"place ({tried or 'no spares'})"
        )


@dataclass(frozen=True)
class Choice:
    """Every node's host after the swaps."""

    hosts: tuple[Host, ...]  #: hosts[i].index == i: the run's hosts, spares in place
    swaps: tuple[Swap, ...] = ()  #: the swaps made, by node rank
    unfilled: tuple[Unfilled, ...] = ()  #: bad nodes that kept their host


def choose(
    hosts: Sequence[Host],
    bad: Mapping[int, str],
    spares: Sequence[Host],
    spare_bad: Mapping[str, str],
) -> Choice:
    """Fill each bad node (``bad``: node rank -> why) with the first usable spare in the
    inventory's order; ``spare_bad``: spare host name -> why it cannot be used. A spare
    fills one node at most, and only a node with its process count."""
    new = list(hosts)
    used: dict[str, int] = {}
    swaps, unfilled = [], []
    for rank in sorted(bad):
        old = hosts[rank]
        tried = tuple((s.host, _unusable(s, old, spare_bad, used)) for s in spares)
        pick = next((s for s, (_, why) in zip(spares, tried) if not why), None)
        if pick is None:
            unfilled.append(Unfilled(rank, old, bad[rank], tried))
            continue
        used[pick.host] = rank
        new[rank] = replace(pick, index=rank)
        swaps.append(Swap(rank, old, new[rank], bad[rank]))
    return Choice(tuple(new), tuple(swaps), tuple(unfilled))


def _unusable(
    spare: Host, node: Host, spare_bad: Mapping[str, str], used: Mapping[str, int]
) -> str:
    """Why ``spare`` cannot take ``node``'s place ('' when it can)."""
    if spare.host in spare_bad:
        return spare_bad[spare.host]
    if spare.host in used:
        return f"already takes node {used[spare.host]}"
    if spare.procs != node.procs:
        return f"runs {spare.procs} process(es), node {node.index} {node.procs}"
    return ""
