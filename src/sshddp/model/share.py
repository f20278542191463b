"""What goes from host to host. ``--share``: which files of the ranks' working directory
node 0 hands to the other nodes before the ranks start, and what a launch without it warns
about; and the hand-off tree of a payload every host needs (the ``--workdir`` archive,
sync's uv).

Every node reports what it found once it staged (``remote/node/host_share.py``'s ``look``: the
working directory's top-level files, names and sizes, and each shared path's size and
SHA-256); this module decides from those reports alone. A shared path whose copy on a node
already has node 0's digest is skipped there; one node 0 lacks is left alone everywhere (a
first run has no checkpoint yet).

The hand-off tree (``tree``), who gets a payload from whom: the hosts that keep the payload
already (the same SHA-256, from an earlier launch) are the first sources, and receive
nothing; when none does, the first host that needs it gets it from this machine, the one
copy that leaves it. Every other host gets it from a host that has it, breadth first, each
host handing it on to at most ``fanout`` others: a host sends at most ``fanout`` copies, and
256 hosts are 4 levels below the first at a fan-out of 4 (docs/design.md says why that
shape). A host that cannot get it from its source gets it from this machine instead: the
tree says where each copy should come from, not that it will.
"""

from __future__ import annotations

import posixpath
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

SHOWN = 5  #: files a warning names; then it counts the rest
_DIGITS = re.compile(r"[0-9]+")

#: One node's report (``remote/node/host_share.py``'s ``look``), None when the node did not send
# one.
Look = Optional[Mapping[str, Any]]


def share_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be shared (absolute, or escaping the working directory with
    ``..``), or None."""
    if not path or "\0" in path:
        return "expected a file path relative to the ranks' working directory"
    if path.startswith(("/", "~")):
        return "is absolute; give it relative to the ranks' working directory (snapshot.pt)"
    norm = posixpath.normpath(path)
    if norm == "." or norm == ".." or norm.startswith("../"):
        return "leaves the ranks' working directory; give a file inside it (snapshot.pt)"
    return None


def normalized(paths: Sequence[str]) -> tuple[str, ...]:
    """The shared paths, normalized (``./a//b`` is ``a/b``), each once, in order."""
    return tuple(dict.fromkeys(posixpath.normpath(p) for p in paths))


@dataclass(frozen=True)
class Transfer:
    """One shared file that some nodes lack, or hold in another version."""

    path: str  #: relative to the working directory
    size: int  #: bytes of node 0's copy
    sha256: str  #: node 0's copy's digest: what every receiver must end up with
    to: tuple[int, ...]  #: node ranks that fetch it from node 0


@dataclass(frozen=True)
class Decision:
    """What ``--share`` does before the ranks start."""

    transfers: tuple[Transfer, ...]  #: files to send, and to whom
    notes: tuple[str, ...]  #: what the user should know (a path node 0 lacks)
    problems: tuple[str, ...]  #: why the launch cannot go on (node 0's path is no file)
    same: tuple[str, ...] = ()  #: paths whose node 0 copy every node holds already


def decide(paths: Sequence[str], looks: Sequence[Look]) -> Decision:
    """From every node's report (node rank order), what to send where."""
    first = _shares(looks[0])
    transfers: list[Transfer] = []
    notes: list[str] = []
    problems: list[str] = []
    same: list[str] = []
    for path in paths:
        mine = first.get(path)
        if mine is None:
            notes.append(f"--share {path}: not on node 0, so not shared (a first run has none)")
        elif mine.get("error"):
            problems.append(f"--share {path}: on node 0, {mine['error']}")
        else:
            lacking = tuple(
                rank
                for rank, look in enumerate(looks[1:], 1)
                if (_shares(look).get(path) or {}).get("sha256") != mine["sha256"]
            )
            if lacking:
                transfers.append(Transfer(path, int(mine["size"]), str(mine["sha256"]), lacking))
            else:
                same.append(path)
    return Decision(tuple(transfers), tuple(notes), tuple(problems), tuple(same))


def _shares(look: Look) -> Mapping[str, Any]:
    return (look or {}).get("share") or {}


def _files(look: Look) -> dict[str, int]:
    return {str(name): int(size) for name, size in (look or {}).get("files") or ()}


def _shape(name: str) -> str:
    """A name with its numbers blanked: per-rank files (rank0.pt, rank1.pt) share one."""
    return _DIGITS.sub("#", name)


def unshared(looks: Sequence[Look], shared: Sequence[str]) -> list[tuple[str, int, list[int]]]:
    """Top-level files node 0's working directory holds and some other node's lacks, with
    their size and the node ranks lacking them: what ranks that load rank 0's checkpoint
    would miss there. Per-rank files (every node holds one of the same shape) are not
    counted, nor are shared paths. A node whose listing was cut short (over the cap)
    lacks only names that sort before its last one."""
    first = _files(looks[0])
    others = [(rank, _files(look), look) for rank, look in enumerate(looks[1:], 1) if look]
    if not first or not others:
        return []
    shapes = set.intersection(*({_shape(n) for n in _files(look)} for look in looks if look))
    found = []
    for name in sorted(set(first) - set(shared)):
        lacking = [rank for rank, files, look in others if _lacks(files, look, name)]
        if lacking and _shape(name) not in shapes:
            found.append((name, first[name], lacking))
    return found


def _lacks(files: dict[str, int], look: Mapping[str, Any], name: str) -> bool:
    if name in files:
        return False
    return not look.get("more") or (bool(files) and name < max(files))


def unshared_warning(found: list[tuple[str, int, list[int]]], hosts: Sequence[str]) -> str:
    """The warning for ``unshared``'s files (not empty), naming them and the fix."""
    names = [f"{name} ({size_text(size)})" for name, size, _ in found[:SHOWN]]
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    lacking = sorted({rank for _, _, ranks in found for rank in ranks})
    where = ", ".join(f"node {r} ({hosts[r]})" for r in lacking)
    return (
        f"node 0 ({hosts[0]}) has files in the ranks' working directory that {where} "
        f"lack{'s' if len(lacking) == 1 else ''}: {', '.join(names)}{more}. If every rank "
        "loads them (a checkpoint rank 0 saved), the other nodes start without them; hand "
        f"them on from node 0 before the ranks start with --share {found[0][0]} (repeatable; "
        "or `share:` under `defaults:` in the inventory)"
    )


def size_text(size: int) -> str:
    if size < 1000:
        return f"{size} B"
    value, unit = size / 1000, "kB"
    for bigger in ("MB", "GB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


LAPTOP = -1  #: the source that is this machine


@dataclass(frozen=True)
class Route:
    """Where one host that needs the payload gets it."""

    node: int  #: the host's position in the plan (its node rank)
    source: int  #: the position of the host it gets it from, or LAPTOP


@dataclass(frozen=True)
class Tree:
    """Every host's route, in an order where each source comes before those it serves."""

    routes: tuple[Route, ...]
    kept: tuple[int, ...]  #: hosts that keep the payload already: nothing sent to them

    def children(self, node: int) -> tuple[int, ...]:
        """The hosts ``node`` hands the payload on to."""
        return tuple(r.node for r in self.routes if r.source == node)

    def depth(self) -> int:
        """Hand-offs from the first source to the deepest host (0: nothing to send)."""
        source = {r.node: r.source for r in self.routes}
        deepest = 0
        for route in self.routes:
            hops, at = 1, route.source
            while at in source:
                hops, at = hops + 1, source[at]
            deepest = max(deepest, hops)
        return deepest


def tree(have: Sequence[bool], fanout: int) -> Tree:
    """The routes for hosts whose kept copies are ``have`` (plan order), each host handing
    the payload on to at most ``fanout`` (>= 1) others."""
    fanout = max(1, fanout)
    kept = [i for i, held in enumerate(have) if held]
    need = [i for i, held in enumerate(have) if not held]
    routes: list[Route] = []
    if not kept and need:
        kept_first = need.pop(0)
        routes.append(Route(kept_first, LAPTOP))
        sources = deque([kept_first])
    else:
        sources = deque(kept)
    slots = dict.fromkeys(sources, fanout)
    for node in need:
        while slots[sources[0]] == 0:
            sources.popleft()
        parent = sources[0]
        slots[parent] -= 1
        routes.append(Route(node, parent))
        sources.append(node)
        slots[node] = fanout
    return Tree(tuple(routes), tuple(kept))


@dataclass(frozen=True)
class Delivery:
    """How a payload reached the hosts, once it did: what ``-v`` and ``--json`` say. Hosts
    are named by their labels (``node 0 (h1)`` in a launch, ``h1`` in a sync)."""

    size: int  #: bytes of the payload
    from_laptop: int  #: bytes of it that left this machine
    got: Mapping[int, int]  #: each host that received it: where from (a host or LAPTOP)
    kept: tuple[int, ...]  #: hosts that kept it already
    fallbacks: Mapping[int, str]  #: hosts that got it from this machine after all: why
    what: str = "code"  #: what the payload is, as a line names it (``code``, ``uv 0.9.5``)
    earlier: str = "launch"  #: what left the kept copies (``launch``, ``sync``)

    def ratio(self) -> float:
        """Bytes that left this machine per byte of the payload."""
        return self.from_laptop / self.size if self.size else 0.0

    def record(
        self, hosts: Sequence[str], labels: Optional[Sequence[str]] = None
    ) -> dict[str, object]:
        """The ``--json`` record: bytes, and each host's source by its label."""
        labels = labels or node_labels(hosts)
        return {
            "size": self.size,
            "from_laptop": self.from_laptop,
            "kept": [hosts[i] for i in self.kept],
            "got": {hosts[i]: source_name(s, labels) for i, s in sorted(self.got.items())},
            "fallbacks": {hosts[i]: why for i, why in sorted(self.fallbacks.items())},
        }

    def lines(self, labels: Sequence[str]) -> list[str]:
        """The ``-v`` trace's lines: who got the payload from whom, and the bytes."""
        said = [
            f"{labels[i]} got it from {source_name(s, labels)}" for i, s in sorted(self.got.items())
        ]
        said += [f"{labels[i]} kept it from an earlier {self.earlier}" for i in self.kept]
        said.append(
            f"{self.from_laptop} bytes left this machine for {self.size} bytes of {self.what} "
            f"({self.ratio():.2f}x)"
        )
        return said


def node_labels(hosts: Sequence[str]) -> list[str]:
    """A launch's labels of its hosts: ``node N (HOST)``."""
    return [f"node {i} ({host})" for i, host in enumerate(hosts)]


def source_name(source: int, labels: Sequence[str]) -> str:
    """``this machine``, or the source's label."""
    return "this machine" if source == LAPTOP else labels[source]


def fallback_note(
    node: int, source: int, labels: Sequence[str], why: Optional[str], what: str = "code"
) -> str:
    """The note when a host could not get the payload from its source in the tree."""
    return (
        f"{labels[node]} could not get the {what} from {source_name(source, labels)}: {why}; "
        "sent from this machine instead"
    )
