"""Which supervisor holds which node rank in the next attempt: node 0's choice of a spare for
a lost node, or of fewer nodes (``min_nodes``). Pure: no I/O.

Every supervisor joins the run's mesh (``peers``) with a slot: node ranks 0..N-1 first, then
spare i as slot N + i, waiting with no node rank. ``members`` lists the slots by node rank.
When a member is lost (its connection dropped or went silent), node 0 halts the attempt and,
once the others halted, seats the first spare it still hears from, in the inventory's order,
in the lost node's rank (``reseat``): the world keeps its shape, so every other node keeps
its rank and its standby torchrun. With no spare left and ``min_nodes`` set, the lost nodes
are dropped and the rest renumbered 0..n-1. Node 0 is never replaced: it holds the
rendezvous store and decides the restarts, and a lost node 0 is not heard by anyone who
could seat another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence


@dataclass(frozen=True)
class Seating:
    """The next attempt's nodes, or why there is none."""

    members: tuple[int, ...] = ()  #: the slots by node rank
    replaced: tuple[int, ...] = ()  #: the node ranks a spare took
    taken: tuple[str, ...] = ()  #: what the reason adds: "h4 took its place", ...
    refusal: str = ""  #: why the run cannot go on ("" when it can)


def reseat(
    members: Sequence[int],
    lost: Collection[int],
    heard: Collection[int],
    spares: Sequence[int],
    min_nodes: int,
    names: Sequence[str],
) -> Seating:
    """The nodes of the next attempt once the slots ``lost`` are gone: each lost member's
    rank goes to the first spare slot of ``spares`` that node 0 ``heard`` and that holds no
    rank; without one, the lost are dropped when at least ``min_nodes`` remain. ``names``:
    the hosts by slot, for the words."""
    if members and members[0] in lost:
        return Seating(refusal=f"node 0 ({_host(names, members[0])}) {NODE_0_LOST}")
    free = [s for s in spares if s in heard and s not in members and s not in lost]
    seats, replaced, taken = list(members), [], []
    for rank, slot in enumerate(members):
        if slot not in lost or not free:
            continue
        seats[rank] = spare = free.pop(0)
        replaced.append(rank)
        skipped = _skipped(spare, spares, members, lost, heard, names)
        taken.append(f"{_host(names, spare)} took its place{skipped}")
    gone = [r for r, slot in enumerate(seats) if slot in lost]
    if not gone:
        return Seating(tuple(seats), tuple(replaced), tuple(taken))
    left = len(seats) - len(gone)
    why = f"node(s) {', '.join(map(str, gone))} cannot be reached and " + no_spare(
        members, lost, heard, spares, names
    )
    if min_nodes <= 0:
        return Seating(refusal=why)
    if left < min_nodes:
        return Seating(refusal=f"{why}, and {left} node(s) are fewer than min_nodes {min_nodes}")
    kept = tuple(slot for slot in seats if slot not in lost)
    shrink = f"the run goes on with {left} node(s) (min_nodes {min_nodes}): {why}"
    return Seating(kept, tuple(replaced), (*taken, shrink))


NODE_0_LOST = "is lost: node 0 is not replaced (it holds the rendezvous and decides restarts)"


def no_spare(
    members: Sequence[int],
    lost: Collection[int],
    heard: Collection[int],
    spares: Sequence[int],
    names: Sequence[str],
) -> str:
    """Why no spare takes a lost node's place: each spare named, and why it was not used."""
    skipped = [f"spare {_host(names, s)} {_unusable(s, members, lost, heard)}" for s in spares]
    return "no spare can take its place" + (f" ({'; '.join(skipped)})" if skipped else "")


def _skipped(
    chosen: int,
    spares: Sequence[int],
    members: Sequence[int],
    lost: Collection[int],
    heard: Collection[int],
    names: Sequence[str],
) -> str:
    """The spares ahead of ``chosen`` that could not be used, named."""
    ahead = [s for s in spares[: list(spares).index(chosen)] if s not in members]
    bad = [s for s in ahead if s in lost or s not in heard]
    told = "; ".join(
        f"spare {_host(names, s)} skipped: {_unusable(s, members, lost, heard)}" for s in bad
    )
    return f" ({told})" if told else ""


def _unusable(
    slot: int, members: Sequence[int], lost: Collection[int], heard: Collection[int]
) -> str:
    if slot in members:
        return "took another node's place already"
    if slot in lost or slot not in heard:
        return "unreachable (not connected to node 0's supervisor)"
    return "taken"


def _host(names: Sequence[str], slot: int) -> str:
    return names[slot] if 0 <= slot < len(names) else "?"
