"""Pure: which rank never entered which collective, from the ranks' NCCL flight recorder
dumps (``remote/node/host_flight.py`` sums each one up on its host).

Every rank numbers the collectives of a process group in the order it enqueues them, so
the ranks of a hung group compare directly: a rank whose last enqueued collective is
behind the others' never entered the one they wait in (it is stuck somewhere else: its
stack says where); the ranks that entered it and never saw it complete wait for that rank.
When every rank completed every collective it enqueued, the hang is outside NCCL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from sshddp.model.stacks import ranges
from sshddp.protocol.contract import FlightEntry, FlightRecord


@dataclass(frozen=True)
class RankFlight:
    """One rank's dump summary and the host it came from."""

    host: str
    record: FlightRecord


def findings(ranks: Sequence[RankFlight]) -> list[str]:
    """One line per finding, per process group, the default group first."""
    groups = sorted({pg for r in ranks for pg in r.record["groups"]}, key=_group_order)
    lines: list[str] = []
    for pg in groups:
        lines += _group(pg, [r for r in ranks if pg in r.record["groups"]])
    return lines


def _group(pg: str, ranks: list[RankFlight]) -> list[str]:
    status = {r.record["rank"]: r.record["groups"][pg] for r in ranks}
    name = _name(pg, ranks)
    top = max(s["enqueued"] for s in status.values())
    behind = sorted(r for r, s in status.items() if s["enqueued"] < top)
    waiting = sorted(r for r, s in status.items() if s["enqueued"] == top and s["completed"] < top)
    if top < 1:
        return [f"{name}: no collective enqueued yet on {_ranks(sorted(status))}"]
    if not behind and not waiting:
        return [
            f"{name}: {_ranks(sorted(status))} completed every collective enqueued"
            f" (up to #{top}): the hang is outside NCCL"
        ]
    lines = []
    op = _describe(pg, top, ranks)
    for r in behind:
        last = _describe(pg, status[r]["enqueued"], [x for x in ranks if x.record["rank"] == r])
        lines.append(
            f"{name}: rank {r} ({_host(r, ranks)}) never entered collective #{top} {op};"
            f" its last was #{status[r]['enqueued']} {last}"
        )
    if waiting:
        lines.append(f"{name}: {_ranks(waiting)} wait in collective #{top} {op}")
    return lines


def _describe(pg: str, seq: int, ranks: Sequence[RankFlight]) -> str:
    """The collective ``seq`` of group ``pg`` as the first rank that recorded it says it."""
    if seq < 1:
        return "(none)"
    entry = _entry(pg, seq, ranks)
    if entry is None:
        return "(not in the dumps)"
    where = f" called at {entry['where']}" if entry["where"] else ""
    return f"{entry['op']} {entry['sizes']} ({entry['state']}){where}"


def _entry(pg: str, seq: int, ranks: Sequence[RankFlight]) -> Optional[FlightEntry]:
    for r in sorted(ranks, key=lambda x: x.record["rank"]):
        for e in r.record["last"]:
            if e["pg"] == pg and e["seq"] == seq:
                return e
    return None


def _name(pg: str, ranks: Sequence[RankFlight]) -> str:
    desc = next(
        (r.record["groups"][pg]["desc"] for r in ranks if r.record["groups"][pg]["desc"]), ""
    )
    return f"process group {pg}" + (f" ({desc})" if desc else "")


def _host(rank: int, ranks: Sequence[RankFlight]) -> str:
    return next(r.host for r in ranks if r.record["rank"] == rank)


def _group_order(pg: str) -> tuple[int, str]:
    return (int(pg), pg) if pg.isdigit() else (1 << 30, pg)


def _ranks(numbers: Sequence[int]) -> str:
    return ("rank " if len(numbers) == 1 else "ranks ") + ranges(numbers)
