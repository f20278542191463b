"""Pure: a run's stacks, grouped, ordered and rendered, for ``sshddp stacks`` (and any report
that shows where a run's processes stand).

Processes whose threads stand at the same places (file, line and function of every Python
frame; thread ids, names and native frames aside) collapse into one group, headed by the
ranks and hosts that share it. Files are compared by base name: the same code lives at
different paths on different nodes (each node's run directory, home directories, virtualenv
locations). A group reads like ``ranks 0-2,4-5 on h1,h2,h3 (5 ranks)``. Ranks come first,
the smallest groups first: a rank group smaller than the largest one is marked as an odd
one out, since a lone rank in a different place is usually the culprit. Then the workers
the ranks started, then the torchrun agents or node launchers (the node's one process
under ``--launcher node``, whose workers are ranks once they joined the world). Frames read
as a Python traceback reads: file, line and function, innermost last, with the source line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import FrameRecord, NodeStacks, ProcessStacks, ThreadRecord

ROLE_ORDER = (contract.RANK, contract.WORKER, contract.AGENT, contract.LAUNCHER, contract.OTHER)
StackKey = tuple[tuple[tuple[str, int, str], ...], ...]


@dataclass(frozen=True)
class HostStacks:
    """One node's answer to ``stacks``, or why there is none."""

    node_rank: int
    host: str
    record: Optional[NodeStacks] = field(default=None, compare=False)
    error: str = ""  #: the host could not be asked (unreachable, the call failed)


@dataclass(frozen=True)
class Member:
    """One process of a group."""

    node_rank: int
    host: str
    process: ProcessStacks = field(compare=False)

    @property
    def order(self) -> tuple[int, int, int]:
        rank = self.process["rank"]
        return (-1 if rank is None else rank, self.node_rank, self.process["pid"])

    def label(self) -> str:
        """``rank 3 on h2``, ``worker of rank 3 on h2 (pid 812)``, ``torchrun agent of
        node 1 on h2 (pid 790)``."""
        p = self.process
        pid = f"pid {p['pid']}"
        if p["role"] == contract.RANK:
            return f"rank {p['rank']} on {self.host} ({pid})"
        if p["role"] == contract.WORKER:
            return f"worker of rank {p['rank']} on {self.host} ({pid})"
        if p["role"] == contract.AGENT:
            return f"torchrun agent of node {self.node_rank} on {self.host} ({pid})"
        if p["role"] == contract.LAUNCHER:
            return f"node launcher of node {self.node_rank} on {self.host} ({pid})"
        return f"process of node {self.node_rank} on {self.host} ({pid})"


@dataclass(frozen=True)
class Group:
    """Processes of one role whose stacks are the same."""

    role: str
    members: tuple[Member, ...]
    odd: bool = False  #: a rank group smaller than the largest: look here first

    @property
    def threads(self) -> list[ThreadRecord]:
        """The stacks shown for the group: the first member's that has native frames (py-spy
        read it), else the first member's."""
        for member in self.members:
            if member.process["source"] == "py-spy":
                return member.process["threads"]
        return self.members[0].process["threads"]

    def header(self) -> str:
        """``ranks 0-2,4-5 on h1,h2,h3 (5 ranks)`` and the like."""
        n = len(self.members)
        hosts = ",".join(dict.fromkeys(m.host for m in sorted(self.members, key=_by_node)))
        ranks = [m.process["rank"] for m in self.members if m.process["rank"] is not None]
        nodes = sorted({m.node_rank for m in self.members})
        count = f"({n} {_plural(n, 'process', 'processes')})"
        if self.role == contract.RANK:
            text = f"{_plural(n, 'rank', 'ranks')} {ranges(ranks)} on {hosts} "
            return text + f"({n} {_plural(n, 'rank', 'ranks')})"
        if self.role == contract.WORKER:
            of = _plural(len(set(ranks)), "rank", "ranks")
            pids = ", ".join(str(m.process["pid"]) for m in self.members[:8])
            more = ", ..." if n > 8 else ""
            return f"{_plural(n, 'worker', 'workers')} of {of} {ranges(ranks)} on {hosts} " + (
                f"({n} {_plural(n, 'process', 'processes')}: pid {pids}{more})"
            )
        if self.role in (contract.AGENT, contract.LAUNCHER):
            of = _plural(len(nodes), "node", "nodes")
            one, many = _NODE_PROCESSES[self.role]
            return f"{_plural(n, one, many)} of {of} {ranges(nodes)} on {hosts} {count}"
        of = _plural(len(nodes), "node", "nodes")
        return f"{_plural(n, 'other process', 'other processes')} of {of} {ranges(nodes)} on " + (
            f"{hosts} {count}"
        )


#: What the node's own process is called, by its role: torchrun, or a node launcher.
_NODE_PROCESSES = {
    contract.AGENT: ("torchrun agent", "torchrun agents"),
    contract.LAUNCHER: ("node launcher process", "node launcher processes"),
}


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _by_node(member: Member) -> tuple[int, int]:
    return member.node_rank, member.process["pid"]


def ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 4, 5]`` -> ``"0-2,4-5"``; runs of two stay ``"4-5"``."""
    parts: list[str] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        if run and n != run[-1] + 1:
            parts.append(_run(run))
            run = []
        run.append(n)
    if run:
        parts.append(_run(run))
    return ",".join(parts)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def stack_key(threads: Sequence[ThreadRecord]) -> StackKey:
    """What makes two processes' stacks the same: the Python frames of every thread (file
    base name, line, function), in any thread order; ids, names, states and native frames
    left out."""
    return tuple(
        sorted(
            tuple(
                (os.path.basename(f["file"]), f["line"], f["func"])
                for f in t["frames"]
                if not f["native"]
            )
            for t in threads
        )
    )


def members(nodes: Sequence[HostStacks]) -> list[Member]:
    """Every process of every node that answered, ranks first, in rank order."""
    found = [
        Member(h.node_rank, h.host, p)
        for h in nodes
        if h.record is not None
        for p in h.record["processes"]
    ]
    return sorted(found, key=lambda m: (ROLE_ORDER.index(_role(m)), m.order))


def _role(member: Member) -> str:
    role = member.process["role"]
    return role if role in ROLE_ORDER else contract.OTHER


def group(nodes: Sequence[HostStacks]) -> list[Group]:
    """The processes that have stacks, grouped; ranks first, the smallest groups first."""
    by_key: dict[tuple[str, StackKey], list[Member]] = {}
    for member in members(nodes):
        if member.process["threads"]:
            key = (_role(member), stack_key(member.process["threads"]))
            by_key.setdefault(key, []).append(member)
    largest = max((len(ms) for (role, _), ms in by_key.items() if role == contract.RANK), default=0)
    groups = [
        Group(role, tuple(ms), odd=role == contract.RANK and len(ms) < largest)
        for (role, _), ms in by_key.items()
    ]
    return sorted(
        groups, key=lambda g: (ROLE_ORDER.index(g.role), len(g.members), g.members[0].order)
    )


def without_stacks(nodes: Sequence[HostStacks]) -> list[Member]:
    """The processes that have no stack (each says why in its ``error``)."""
    return [m for m in members(nodes) if not m.process["threads"]]


def render_frame(frame: FrameRecord) -> list[str]:
    if frame["native"]:
        where = os.path.basename(frame["file"]) or "?"
        where += f":{frame['line']}" if frame["line"] else ""
        return [f"  [native] {frame['func']} ({where})"]
    if not frame["file"]:
        return [f"  {frame['func']}"]
    line = f'  File "{frame["file"]}", line {frame["line"] or "?"}, in {frame["func"]}'
    return [line, f"    {frame['code']}"] if frame["code"] else [line]


def render_threads(threads: Sequence[ThreadRecord]) -> list[str]:
    """Every thread's stack, innermost frame last, as a traceback prints it."""
    lines = []
    for k, thread in enumerate(threads, 1):
        about = [f"Thread {k} of {len(threads)}"]
        if thread["name"]:
            about.append(f'"{thread["name"]}"')
        if thread["status"]:
            about.append(thread["status"])
        lines.append(", ".join(about) + " (most recent call last):")
        for frame in thread["frames"]:
            lines.extend(render_frame(frame))
    return lines


def render(groups: Sequence[Group], missing: Sequence[Member]) -> str:
    """The whole text ``sshddp stacks`` prints: every group, then what has no stack."""
    blocks = []
    for g in groups:
        title = f"odd one out: {g.header()}" if g.odd else g.header()
        blocks.append("\n".join([f"=== {title} ===", *render_threads(g.threads)]))
    if missing:
        lines = [
            f"=== no stack ({len(missing)} {_plural(len(missing), 'process', 'processes')}) ==="
        ]
        lines += [f"  {m.label()}: {m.process['error'] or 'no dump'}" for m in missing]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n" if blocks else ""


def summary(nodes: Sequence[HostStacks], groups: Sequence[Group]) -> str:
    """One line: what was collected, from how many hosts, in how many groups."""
    found = members(nodes)
    ranks = [m for m in found if m.process["role"] == contract.RANK]
    hosts = {m.host for m in ranks}
    rank_groups = [g for g in groups if g.role == contract.RANK]
    odd = sum(g.odd for g in rank_groups)
    text = (
        f"{len(ranks)} {_plural(len(ranks), 'rank', 'ranks')} on {len(hosts)} "
        f"{_plural(len(hosts), 'host', 'hosts')} in {len(rank_groups)} "
        f"{_plural(len(rank_groups), 'group', 'groups')}"
    )
    if odd:
        text += f", {odd} odd {_plural(odd, 'one', 'ones')} out"
    others = len(found) - len(ranks)
    if others:
        text += f"; {others} other {_plural(others, 'process', 'processes')} of the run"
    return text


def dump_name(node: HostStacks, process: ProcessStacks) -> str:
    """The saved dump's file name: ``rank3-node1-h2-pid812.txt`` and the like."""
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in node.host)
    where = f"node{node.node_rank}-{host}-pid{process['pid']}.txt"
    if process["role"] == contract.RANK:
        return f"rank{process['rank']}-{where}"
    if process["role"] == contract.WORKER:
        return f"rank{process['rank']}-worker-{where}"
    named = {contract.AGENT: "agent", contract.LAUNCHER: "launcher"}
    return f"{named.get(process['role'], 'other')}-{where}"


def dump_text(node: HostStacks, process: ProcessStacks, when: str) -> str:
    """A saved dump: who and when, every thread's stack, then the dump as it was written."""
    member = Member(node.node_rank, node.host, process)
    local = process["local_rank"]
    lines = [
        member.label() + (f", local rank {local}" if local is not None else ""),
        f"command: {process['cmdline']}",
        f"collected: {when}, by {process['source'] or 'nothing'}",
    ]
    if process["error"]:
        lines.append(f"note: {process['error']}")
    lines += ["", *render_threads(process["threads"])]
    if process["raw"]:
        lines += ["", f"--- as {process['source'] or 'the process'} wrote it ---", process["raw"]]
    return "\n".join(lines).rstrip("\n") + "\n"


def json_doc(
    run_id: str, nodes: Sequence[HostStacks], groups: Sequence[Group], **about: Any
) -> dict[str, Any]:
    """What ``sshddp stacks --json`` prints (docs/hangs.md: "stacks --json")."""
    return {
        "run_id": run_id,
        **about,
        "nodes": [
            {"node_rank": h.node_rank, "host": h.host, "error": h.error, **(h.record or {})}
            for h in nodes
        ],
        "groups": [
            {
                "role": g.role,
                "header": g.header(),
                "odd": g.odd,
                "members": [
                    {
                        "node_rank": m.node_rank,
                        "host": m.host,
                        "pid": m.process["pid"],
                        "rank": m.process["rank"],
                    }
                    for m in g.members
                ],
                "threads": g.threads,
            }
            for g in groups
        ],
    }
