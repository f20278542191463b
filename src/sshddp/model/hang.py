"""Pure: the report of a run a watchdog found hung, from what each node recorded then
(``contract.HangRecord``): the watchdog's finding, the stacks grouped (``model.stacks``,
the odd ones out first), and the NCCL flight recorder's dumps."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from sshddp.model import stacks
from sshddp.model.escape import visible
from sshddp.model.flight import RankFlight, findings
from sshddp.model.stacks import HostStacks
from sshddp.remote import contract
from sshddp.remote.contract import HangRecord


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
