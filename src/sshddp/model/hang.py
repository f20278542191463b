"""Pure: the report of a run a watchdog found hung, from what each node recorded then
(``contract.HangRecord``): the watchdog's finding, the stacks grouped (``model.stacks``,
the odd ones out first), and the NCCL flight recorder's dumps."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from sshddp.model import stacks
from sshddp.model.escape import visible
from sshddp.model.flight import RankFlight, findings
from sshddp.model.stacks import HostStacks
from sshddp.protocol import contract
from sshddp.protocol.contract import HangRecord, ThreadRecord


@dataclass(frozen=True)
class NodeHang:
    """One node's hang record, or why there is none."""

    node_rank: int
    host: str
    record: Optional[HangRecord] = field(default=None, compare=False)
    error: str = ""  #: the host could not be asked; "" with no record: it recorded nothing


def as_stacks(hangs: Sequence[NodeHang]) -> list[HostStacks]:
    """The stacks each node recorded, as ``sshddp stacks`` collects them."""
    return [
        HostStacks(h.node_rank, h.host, h.record["stacks"])
        if h.record is not None
        else HostStacks(h.node_rank, h.host, error=h.error or "it recorded no stacks")
        for h in hangs
    ]


def finding(hangs: Sequence[NodeHang]) -> Optional[HangRecord]:
    """The record that says what the watchdog found: node 0's (it decides), else any."""
    found = [h.record for h in sorted(hangs, key=lambda h: h.node_rank) if h.record]
    return found[0] if found else None


#: Where library code lives: a frame there says little of why a rank stands where it does.
_LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python3[.\d]*[/\\]|^<")


def where(threads: Sequence[ThreadRecord]) -> str:
    """Where a process stands: its first thread's innermost frame of the user's own code
    (not torch's, not the standard library's) and the frame that called it, innermost
    first; its innermost Python frame when it has no code of the user's."""
    frames = [f for f in (threads[0]["frames"] if threads else []) if f["file"] and not f["native"]]
    own = [k for k, f in enumerate(frames) if not _LIBRARY.search(f["file"])]
    if not frames:
        return "no Python frame"
    at = own[-1] if own else len(frames) - 1
    shown = [frames[at]] + ([frames[at - 1]] if at > 0 and at - 1 in own else [])
    said = [f"{f['func']} ({os.path.basename(f['file'])}, line {f['line']})" for f in shown]
    return "in " + ", called from ".join(said)


def culprits(hangs: Sequence[NodeHang]) -> tuple[Optional[int], str]:
    """A hung run's root cause as its stacks say: the odd ones out among the ranks (their
    ranks, hosts, nodes and where they stand), and the node of the first; (None, "") when no
    rank stands apart."""
    ranks = [g for g in stacks.group(as_stacks(hangs)) if g.role == contract.RANK]
    odd = [g for g in ranks if g.odd]
    if not odd:
        return None, ""
    said = [
        f"{_who(g)} {_plural(len(g.members), 'stands', 'stand')} apart {where(g.threads)}"
        for g in odd
    ]
    rest = sum(len(g.members) for g in ranks if not g.odd)
    others = f"the other {rest} {_plural(rest, 'rank waits', 'ranks wait')} elsewhere"
    text = "; ".join(said) + f", while {others} (stacks above)"
    return odd[0].members[0].node_rank, text


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _who(g: stacks.Group) -> str:
    """``rank 3 on h2 (node 1)``, ``ranks 2-3 on h2 (node 1)``."""
    ranks = [m.process["rank"] for m in g.members if m.process["rank"] is not None]
    hosts = ",".join(dict.fromkeys(m.host for m in g.members))
    nodes = stacks.ranges(m.node_rank for m in g.members)
    many = len(ranks) > 1
    return f"rank{'s' if many else ''} {stacks.ranges(ranks)} on {hosts} (node {nodes})"


def flight_lines(hangs: Sequence[NodeHang]) -> list[str]:
    """What the NCCL flight recorder's dumps say (GPU hosts), then where the dumps are."""
    ranks = [
        RankFlight(h.host, record)
        for h in hangs
        if h.record is not None
        for record in h.record.get("flight", [])  # a record of an older sshddp has none
    ]
    lines = ["NCCL flight recorder: " + line for line in findings(ranks)]
    for h in hangs:
        late = h.record.get("flight_late", []) if h.record else []
        if late:
            lines.append(
                f"NCCL flight recorder: rank(s) {stacks.ranges(late)} on {h.host} were asked"
                f" for a dump and wrote none in {contract.FLIGHT_WAIT:g} s"
                " (a rank busy in Python code may not get to it)"
            )
    for h in hangs:
        for path in h.record["nccl"] if h.record else ():
            lines.append(f"NCCL flight recorder dump on {h.host}: {path}")
    return lines


def render(run_id: str, hangs: Sequence[NodeHang]) -> str:
    """The hang report: what was found and when, then the stacks, odd ones out first;
    whatever came from the hosts shown with its control characters escaped."""
    first = finding(hangs)
    if first is None:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(first["at"]))
    what = "init" if first["kind"] == contract.HANG_INIT else "stall"
    then = "stopped the run" if first["action"] == contract.ON_STALL_STOP else "let it go on"
    nodes = as_stacks(hangs)
    groups = stacks.group(nodes)
    lines = [
        f"sshddp: run {run_id}: the {what} watchdog fired at {when} and {then}:",
        f"  {first['reason']}",
        f"stacks taken then: {stacks.summary(nodes, groups)}",
        "",
        stacks.render(groups, stacks.without_stacks(nodes)).rstrip("\n"),
    ]
    for h in hangs:
        if h.record is None and h.error:
            lines.append(f"node {h.node_rank} ({h.host}): no stacks: {h.error}")
        elif h.record is not None and h.record["stacks"]["note"]:
            lines.append(f"node {h.node_rank} ({h.host}): {h.record['stacks']['note']}")
    lines += flight_lines(hangs)
    return visible("\n".join(lines), multiline=True) + "\n"
