"""The straggler of a coupled run, from where each rank's time goes.

Pure. In a run whose ranks all-reduce every step (DDP), every rank steps at the same rate,
the straggler's: rates cannot tell it. Its stacks can: the others wait for it inside the
collective while it works elsewhere (``remote/calls/waits.py`` classifies each sample of a
rank's stacks, ``node_sampler`` takes one a second, ``node_top`` sends the last WINDOW
seconds). Over that window a rank is the straggler when:
- every rank of the run has at least MIN_SAMPLES samples (a judgement on fewer is noise),
- the other ranks wait in collectives at least OTHERS_WAIT of their samples (their median:
  they do wait for someone), and
- it waits at least GAP less than that median (a clear gap, not sampling noise: with 20
  samples a rank's share wavers by about 0.1).
In a balanced run every rank waits about as much as the others, so nobody is named.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

MIN_SAMPLES = 8
OTHERS_WAIT = 0.5
GAP = 0.4


@dataclass(frozen=True)
class Waits:
    """One rank's stack samples over the window."""

    samples: int
    waiting: int  #: of them, inside a collective
    where: str  #: where its working samples were most often ("" when none worked)

    @property
    def share(self) -> float:
        """The share of its samples it waited in collectives."""
        return self.waiting / self.samples if self.samples else 0.0


@dataclass(frozen=True)
class Straggler:
    """A rank the others wait for, with the evidence."""

    rank: int
    host: str
    waits: float  #: its share of samples in collectives
    others: float  #: the other ranks' median share
    where: str  #: where it spends its time


def waits_of(points: list[list[Any]]) -> Optional[Waits]:
    """A rank's window from its node's answer, [[when, waiting, where], ...]; None for none."""
    if not points:
        return None
    waiting = sum(1 for p in points if p[1])
    working = Counter(str(p[2]) for p in points if not p[1] and p[2])
    where = working.most_common(1)[0][0] if working else ""
    return Waits(len(points), waiting, where)


def judge(ranks: Sequence[tuple[int, str, Optional[Waits]]]) -> list[Straggler]:
    """The ranks (rank, host, window) the others wait for; none when the evidence is thin
    or the gap unclear (the module's thresholds)."""
    known = [(r, h, w) for r, h, w in ranks if w is not None and w.samples >= MIN_SAMPLES]
    if len(ranks) < 2 or len(known) < len(ranks):
        return []
    shares = {rank: w.share for rank, _, w in known}
    found = []
    for rank, host, w in known:
        others = statistics.median(s for r, s in shares.items() if r != rank)
        if others >= OTHERS_WAIT and w.share <= others - GAP:
            found.append(Straggler(rank, host, w.share, others, w.where))
    return found


def line(found: list[Straggler]) -> str:
    """``straggler: rank 4 on h3 waits 2% of its time in collectives, the others 85%; it
    spends its time at train.py:13 (time.sleep(0.2))``."""
    parts = []
    for s in found:
        said = f"rank {s.rank} on {s.host} waits {s.waits:.0%} of its time in collectives, "
        said += f"the others {s.others:.0%}"
        if s.where:
            said += f"; it spends its time at {s.where}"
        parts.append(said)
    return "straggler: " + "; ".join(parts) if parts else ""
