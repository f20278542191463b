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
could seat another. A node whose rank died of a hardware error (``blamed``) is replaced as a
lost one is, and a spare whose look at its health just failed (``unhealthy``) is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Optional, Sequence


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
    blamed: Collection[int] = (),
    unhealthy: Optional[Mapping[int, str]] = None,
) -> Seating:
    """The nodes of the next attempt once the slots ``lost`` are gone: each lost member's
    rank goes to the first spare slot of ``spares`` that node 0 ``heard``, that holds no
    rank and that is not ``unhealthy`` (slot: what its look found); without one, the lost
    are dropped when at least ``min_nodes`` remain. ``blamed``: those of ``lost`` whose rank
    died of a hardware error (the words differ). ``names``: the hosts by slot."""
    if members and members[0] in lost:
        said = NODE_0_BLAMED if members[0] in blamed else NODE_0_LOST
        return Seating(refusal=f"node 0 ({_host(names, members[0])}) {said}")
    sick = dict(unhealthy or {})
    out = _Out(members, lost, heard, sick)
    free = [s for s in spares if out.usable(s)]
    seats, replaced, taken = list(members), [], []
    for rank, slot in enumerate(members):
        if slot not in lost or not free:
            continue
        seats[rank] = spare = free.pop(0)
        replaced.append(rank)
        skipped = _skipped(spare, spares, out, names)
        taken.append(f"{_host(names, spare)} took its place{skipped}")
    gone = [r for r, slot in enumerate(seats) if slot in lost]
    if not gone:
        return Seating(tuple(seats), tuple(replaced), tuple(taken))
    left = len(seats) - len(gone)
    how = _gone_words([members[r] for r in gone], blamed)
    why = f"node(s) {', '.join(map(str, gone))} {how} and " + no_spare(
        members, lost, heard, spares, names, sick
    )
    if min_nodes <= 0:
        return Seating(refusal=why)
    if left < min_nodes:
        return Seating(refusal=f"{why}, and {left} node(s) are fewer than min_nodes {min_nodes}")
    kept = tuple(slot for slot in seats if slot not in lost)
    shrink = f"the run goes on with {left} node(s) (min_nodes {min_nodes}): {why}"
    return Seating(kept, tuple(replaced), (*taken, shrink))


NODE_0_LOST = "is lost: node 0 is not replaced (it holds the rendezvous and decides restarts)"
NODE_0_BLAMED = (
    "died of a hardware error: node 0 is not replaced (it holds the rendezvous and decides "
    "restarts)"
)


@dataclass(frozen=True)
class _Out:
    """What keeps a spare from a node's place."""

    members: Sequence[int]
    lost: Collection[int]
    heard: Collection[int]
    sick: Mapping[int, str]

    def usable(self, slot: int) -> bool:
        return self.unusable(slot) == ""

    def unusable(self, slot: int) -> str:
        """Why the spare in ``slot`` cannot take a node's place ("": it can)."""
        if slot in self.members:
            return "took another node's place already"
        if slot in self.lost or slot not in self.heard:
            return "unreachable (not connected to node 0's supervisor)"
        if slot in self.sick:
            return f"failed its health check: {self.sick[slot]}"
        return ""


def no_spare(
    members: Sequence[int],
    lost: Collection[int],
    heard: Collection[int],
    spares: Sequence[int],
    names: Sequence[str],
    unhealthy: Optional[Mapping[int, str]] = None,
) -> str:
    """Why no spare takes a lost node's place: each spare named, and why it was not used."""
    out = _Out(members, lost, heard, dict(unhealthy or {}))
    skipped = [f"spare {_host(names, s)} {out.unusable(s) or 'taken'}" for s in spares]
    return "no spare can take its place" + (f" ({'; '.join(skipped)})" if skipped else "")


def _skipped(chosen: int, spares: Sequence[int], out: _Out, names: Sequence[str]) -> str:
    """The spares ahead of ``chosen`` that could not be used, named."""
    ahead = [s for s in spares[: list(spares).index(chosen)] if s not in out.members]
    told = "; ".join(
        f"spare {_host(names, s)} skipped: {out.unusable(s)}" for s in ahead if out.unusable(s)
    )
    return f" ({told})" if told else ""


def _gone_words(slots: Sequence[int], blamed: Collection[int]) -> str:
    """How the nodes in ``slots`` went: out of reach, or a hardware error."""
    hardware = [s for s in slots if s in blamed]
    if not hardware:
        return "cannot be reached"
    if len(hardware) == len(slots):
        return "died of a hardware error"
    return "cannot be reached or died of a hardware error"


def _host(names: Sequence[str], slot: int) -> str:
    return names[slot] if 0 <= slot < len(names) else "?"
