"""Which ranks the console shows (``--ranks 0,3-5``), and how a node's lines are labelled.

Pure. The syntax is a Slurm hostlist's bracket ranges (``0,3-5``), read the same way
(``model.slurm``'s ranges), but of plain numbers: no brackets, no zero padding, no names.
A line's global rank is known when the node runs one rank, and on a node that tells its
ranks apart (node.idx: ``model.spans``): the node's first rank plus the local rank that wrote
it. Lines of torchrun itself, and every line of a node that cannot tell its ranks apart
(``--tty``, ``--launcher node``), are labelled by the node's ranks (``[4-7 h3]``) and shown
when ``--ranks`` names any of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Optional

from sshddp.errors import UsageError

MAX_RANK = 1 << 20  #: far beyond any run; a typo like 0-99999999 is refused, not expanded
_PART = re.compile(r"(\d+)(?:-(\d+))?")


def parse_ranks(text: str, option: str = "--ranks") -> frozenset[int]:
    """``"0,3-5"`` -> ``{0, 3, 4, 5}``; a clear error naming the bad part otherwise."""
    ranks: set[int] = set()
    for part in text.split(","):
        match = _PART.fullmatch(part.strip())
        if match is None:
            raise UsageError(
                f"{option} {text}: {part.strip()!r} is not a rank or a range; expected "
                "comma-separated ranks and LOW-HIGH ranges, as in 0 or 0,3-5"
            )
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low or high > MAX_RANK:
            why = "goes down (LOW-HIGH needs LOW <= HIGH)" if high < low else "is too large"
            raise UsageError(f"{option} {text}: the range {part.strip()!r} {why}")
        ranks.update(range(low, high + 1))
    return frozenset(ranks)


def check_ranks(selection: frozenset[int], world_size: int, run_id: str) -> None:
    """Refuse a selection with a rank the run does not have."""
    outside = sorted(r for r in selection if r >= world_size)
    if outside:
        raise UsageError(
            f"--ranks: run {run_id} has ranks 0-{world_size - 1}; there is no rank {outside[0]}"
        )


def rank_label(first_rank: int, nproc: int) -> str:
    """How a node's console lines name their rank: ``3``, or ``4-7`` for a node whose
    lines could come from any of its ranks."""
    return str(first_rank) if nproc == 1 else f"{first_rank}-{first_rank + nproc - 1}"


def source_ranks(first_rank: int, nproc: int, source: int) -> range:
    """The global ranks a line may be from: its own, for a local rank's line (``source``);
    any of the node's for the node's own (``contract.SOURCE_NODE``, or out of range)."""
    if 0 <= source < nproc:
        return range(first_rank + source, first_rank + source + 1)
    return range(first_rank, first_rank + nproc)


def shows(selection: Optional[frozenset[int]], ranks: Iterable[int]) -> bool:
    """Whether a node running ``ranks`` is shown: no selection, or one of them is selected."""
    return selection is None or any(r in selection for r in ranks)
