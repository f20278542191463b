"""What a run's end implies for its hosts: which one it puts in quarantine, and why.

A host is quarantined when a run ends because of the node, never because of the user's
code: its node was lost (the host went down or was cut off: the coordinator's follow or the
supervisors' heartbeat say so), its host could not be reached at launch (a connection that
failed, not a key or a login refused), it was the only node that never joined the world
(the init watchdog), or one of its ranks died of a hardware error (``HARDWARE``, in
``protocol/hardware.py``: the supervisors read it too). A rank's own Python exception,
Ctrl-C, ``sshddp stop`` and a stall of the ranks' code quarantine nobody.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from sshddp.model.checks import HostReport, Status
from sshddp.model.escape import visible
from sshddp.model.state import PEER_PREFIX, NodeResult, NodeState, RunResult
from sshddp.protocol.contract import SPARE_UNHEALTHY
from sshddp.protocol.hardware import first_hardware_error

#: What a launch's connection error says when the host itself was not there (a login or a
#: host key refused is the user's to fix, not the host's).
_NOT_THERE = (
    "timed out connecting",
    "connection refused",
    "no SSH server answered",
    "cannot connect:",
)
#: doctor's checks whose failure is the host's health, not its set-up (docs/health.md)
HEALTH_CHECKS = ("health", "gpu_health", "xid", "ib", "dcgm")
#: a health: command the shell could not find or run: the inventory's to fix, not the host
_UNRUNNABLE = re.compile(r"` exited 12[67]:")
_PEER_LOST = re.compile(r"^node (\d+) \(.*?\) lost\b")
#: node 0's reason for a restart after a lost node: ``node 2 (h3) lost (no heartbeat...)``
_LOST_MIDRUN = re.compile(r"(?:^|; (?:then )?)node \d+ \(([^()]+)\) lost \(")
#: node 0's reason for a restart after a rank died of a hardware error:
#: ``node 2 (h3): rank 4 died of a hardware error (uncorrectable ECC error): `...```
_HARDWARE_MIDRUN = re.compile(
    r"(?:^|; )node \d+ \(([^()]+)\): (?:rank \d+|a rank) died of a hardware error \(([^()]+)\)"
)
_NEVER_JOINED = re.compile(
    r"node (\d+) \([^)]*\): (?:never reported|[^;]*never called init_process_group)"
)
_WORLD_FORMED_NOT = "the world did not form"


@dataclass(frozen=True)
class Verdict:
    """Why a run's end puts one host in quarantine."""

    host: str  #: the host as the inventory names it
    reason: str  #: lost, unreachable at launch, never joined, or the hardware error's name
    evidence: str  #: what said so (the node's reason, the matching log line)


# --- what a run's end implies -----------------------------------------------------------------


def verdicts(result: RunResult, tails: Mapping[int, Sequence[str]]) -> list[Verdict]:
    """The hosts a run's end quarantines; ``tails``: the last lines of each failed node's
    log by node rank. None when the user ended the run (Ctrl-C, ``stop``)."""
    if result.interrupted or result.detached:
        return []
    found = {v.host: v for v in _replaced(result.nodes)}
    if result.ok:
        return list(found.values())
    for node in result.nodes:
        verdict = _node_verdict(node, tails.get(node.node_rank, ()))
        if verdict is not None:
            found.setdefault(verdict.host, verdict)
    hosts = {n.node_rank: n for n in result.nodes}
    for rank, evidence in _named_by_peers(result.nodes):
        lost = hosts.get(rank)
        if lost is not None and (lost.state.unanswered or lost.state is NodeState.LOST):
            found.setdefault(lost.host, Verdict(lost.host, "lost", evidence))
    never = _only_never_joined(result)
    if never is not None:
        found.setdefault(never.host, Verdict(never.host, "never joined", never.reason))
    return list(found.values())


def _replaced(nodes: Sequence[NodeResult]) -> list[Verdict]:
    """The hosts lost mid-run, or whose rank died of a hardware error, whose node a spare
    took (or the run went on without), as node 0's reasons for a restart name them: their
    node rank is another host's now; and the spares that failed their health check when
    node 0 needed them, as their own records say."""
    out = []
    for node in nodes:
        for why in node.earlier:
            out += [Verdict(m.group(1), "lost", why) for m in _LOST_MIDRUN.finditer(why)]
            out += [Verdict(m[1], m[2], why) for m in _HARDWARE_MIDRUN.finditer(why)]
        if node.reason.startswith(SPARE_UNHEALTHY):  # a spare's look when it was needed
            sick = node.reason[len(SPARE_UNHEALTHY) :].split("; ")[0]
            out.append(Verdict(node.host, "failed its health check", sick))
    return out


def _node_verdict(node: NodeResult, tail: Sequence[str]) -> Optional[Verdict]:
    if node.state is NodeState.LOST:
        return Verdict(node.host, "lost", node.reason or "lost")
    if node.state is NodeState.FAILED:
        hit = hardware_error(tail)
        if hit is not None:
            return Verdict(node.host, hit[0], hit[1])
    return None


def hardware_error(lines: Sequence[str]) -> Optional[tuple[str, str]]:
    """The first hardware fault a log's lines show (its name, the line), else None."""
    hit = first_hardware_error(lines)
    return None if hit is None else (hit[0], visible(hit[1])[:200])


def _named_by_peers(nodes: Sequence[NodeResult]) -> list[tuple[int, str]]:
    """The nodes the supervisors lost, as their stopped nodes' reasons name them."""
    out = []
    for n in nodes:
        if n.state is NodeState.STOPPED and n.reason.startswith(PEER_PREFIX):
            said = n.reason[len(PEER_PREFIX) :]
            match = _PEER_LOST.match(said)
            if match:
                out.append((int(match.group(1)), said))
    return out


def _only_never_joined(result: RunResult) -> Optional[NodeResult]:
    """The one node the init watchdog says never joined, when every other one did."""
    if not result.hung:
        return None
    for n in result.nodes:
        if n.state is NodeState.STALLED and n.reason.startswith(_WORLD_FORMED_NOT):
            ranks = {int(m.group(1)) for m in _NEVER_JOINED.finditer(n.reason)}
            if len(ranks) == 1 and len(result.nodes) > 1:
                node = next((x for x in result.nodes if x.node_rank in ranks), None)
                return None if node is None else replace(node, reason=n.reason)
    return None


def bad_at_launch(reports: Sequence[HostReport]) -> list[Verdict]:
    """The hosts a launch's preflight could not connect to (not a refused login or key),
    and those that failed a health check (the inventory's ``health:`` command, a GPU's or
    a port's: docs/health.md)."""
    out = []
    for r in reports:
        ssh = r.get("ssh")
        if ssh is not None and ssh.status is Status.FAIL and not_there(ssh.message):
            out.append(Verdict(r.host.host, "unreachable at launch", ssh.message))
            continue
        sick = [f for f in (r.get(name) for name in HEALTH_CHECKS) if f and f.status is Status.FAIL]
        if sick and the_hosts_fault(sick[0].message):
            out.append(Verdict(r.host.host, "failed its health check", sick[0].message))
    return out


def the_hosts_fault(health_failure: str) -> bool:
    """A failed health check says something of the host, not of the inventory: not a
    ``health:`` command the shell could not find or run (exit 126, 127)."""
    return not _UNRUNNABLE.search(health_failure)


def not_there(message: str) -> bool:
    """A connection's error says the host was not there (not a login or a key refused)."""
    return any(marker in message for marker in _NOT_THERE)
