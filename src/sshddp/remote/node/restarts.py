"""Restarts of the whole run (``--max-restarts N``), decided by the supervisors.

torchrun itself never restarts (it gets ``--max-restarts 0``): with the static rendezvous
one node's torchrun restarting alone hangs or fails. Instead a node whose torchrun failed
while attempts remain tells node 0's supervisor (a ``fail`` message, ``peer_messages``).
Node 0 decides (``refusal``, and ``node_events.RestartDecider``: pure): none may have
ended for good, else the run ends as it did without restarts; a node node 0 no longer hears
from is lost, and a waiting spare takes its place (``seats``), else the run ends. Then
every supervisor stops its node's processes (``halt``: the usual stop, torchrun's group and
every process carrying the node's mark, workers included), and says so (``halted``; a node
that failed has stopped already). Once every node still there has, node 0 says ``again``
(attempt k + 1) and every node starts a fresh torchrun: the same node ranks (a spare in a
lost node's), the same rendezvous endpoint, a fresh rendezvous round (torchrun's TCP store
binds its port with SO_REUSEADDR, so node 0's new store takes the port at once).

node.log stays exactly what the ranks wrote; RUNDIR/attempts.json (``AttemptsRecord``)
says where each attempt starts in it and why the one before ended. Every process of
attempt k carries SSHDDP_ATTEMPT=k.
"""

from __future__ import annotations

import os
import re
import time
from typing import Collection, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import AttemptRecord, ExitRecord, SpecRecord
from sshddp.protocol.hardware import first_hardware_error
from sshddp.remote.common import atomic_write_json, listdir, unlink
from sshddp.remote.node.host_attempts import summary
from sshddp.remote.node.output import NodeOutput

WAIT_TICK = 0.05  #: seconds between looks while a node waits for node 0's word
TAIL_BYTES = 64 * 1024  #: how much of an attempt's end is read for torchrun's failure summary
HARDWARE_LINE = 200  #: characters of the line that shows a hardware fault, quoted
_RANK_RE = re.compile(rb"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)")
_EXIT_RE = re.compile(rb"exitcode\s*:\s*(-?\d+)")


def refusal(
    attempt: int,
    max_attempts: int,
    ended: Collection[int],
    abort: Optional[str],
) -> str:
    """Why a failure in ``attempt`` does not restart the run ("" when it does). ``ended``:
    the node ranks that ended for good (a lost node is not among them: whether a spare
    takes its place is ``seats.reseat``'s)."""
    if attempt >= max_attempts:
        return f"no attempts left ({max_attempts} made)"
    if abort is not None:
        return f"the run is stopping: {abort}"
    if ended:
        return "node(s) " + ", ".join(str(r) for r in sorted(ended)) + " ended already"
    return ""


def failure_text(log: str, offset: int, reason: str) -> str:
    """What failed, from torchrun's failure summary at the end of the attempt's output
    (``rank 5 exited with code 1``); else ``reason`` (torchrun's own exit)."""
    tail = _tail(log, offset)
    rank, code = _root_cause(tail)
    if rank is None or code is None:
        return reason
    return f"rank {rank} exited with code {code}"


def hardware_text(log: str, offset: int) -> str:
    """Where the attempt's output shows a hardware fault (``hardware.HARDWARE``): which rank
    died of which, and the line that says so (``rank 4 died of a hardware error (uncorrectable
    ECC error): `...```); else "". The rank is torchrun's root cause, where it names one."""
    tail = _tail(log, offset)
    hit = first_hardware_error(tail.decode("utf-8", "replace").splitlines())
    if hit is None:
        return ""
    rank = _root_cause(tail)[0]
    who = f"rank {rank}" if rank is not None else "a rank"
    line = "".join(c if c.isprintable() else "?" for c in hit[1])[:HARDWARE_LINE]
    return f"{who} died of a hardware error ({hit[0]}): `{line}`"


def _tail(log: str, offset: int) -> bytes:
    """The attempt's output from ``offset``: its last TAIL_BYTES."""
    try:
        with open(log, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, size - TAIL_BYTES))
            return fh.read()
    except OSError:
        return b""


def _root_cause(tail: bytes) -> tuple[Optional[int], Optional[int]]:
    """torchrun's failure summary in ``tail``: the root cause's rank and exit code."""
    start = tail.rfind(b"Root Cause")
    if start < 0:
        return None, None
    rank, code = _RANK_RE.search(tail, start), _EXIT_RE.search(tail, start)
    return (
        int(rank.group(1)) if rank else None,
        int(code.group(1)) if code else None,
    )


class Restarts:
    """A node's attempts: which one runs, where each starts in node.log and why the one
    before ended (attempts.json). What happens between them is the supervisor's loop's
    (``node_events``)."""

    def __init__(self, rundir: str, spec: SpecRecord) -> None:
        self.rundir = rundir
        self.max_attempts = 1 + max(0, int(spec.get("restarts") or 0))
        self.attempt = 1
        self.history: list[AttemptRecord] = []

    @property
    def enabled(self) -> bool:
        return self.max_attempts > 1

    def failure(self, reason: str) -> str:
        """What failed in the current attempt (``failure_text`` of its output)."""
        log = os.path.join(self.rundir, contract.LOG)
        offset = self.history[-1]["offset"] if self.history else 0
        return failure_text(log, offset, reason)

    def hardware(self) -> str:
        """Where the current attempt's output shows a hardware fault: in words, else ""."""
        log = os.path.join(self.rundir, contract.LOG)
        return hardware_text(log, self.history[-1]["offset"] if self.history else 0)

    def begin(
        self, output: NodeOutput, spec: SpecRecord, go: Optional[tuple[int, str]], node_rank: int
    ) -> None:
        """Record the start of the next attempt (``go``: which, and why; None: the first),
        run as ``node_rank``, and give it a fresh output."""
        if not self.enabled:
            return
        why = ""
        if go is not None:  # (a spare's first attempt is the one node 0 gave it)
            self.attempt, why = go
        if self.history:
            output.reopen(spec)
            for name in listdir(os.path.join(self.rundir, contract.JOINED)):
                unlink(os.path.join(self.rundir, contract.JOINED, name))
        offset = os.fstat(output.log).st_size
        self.history.append(
            {
                "attempt": self.attempt,
                "offset": offset,
                "started": time.time(),
                "reason": why,
                "standby": False,
                "node_rank": node_rank,
            }
        )

    def started(self, standby: bool) -> None:
        """The attempt's torchrun runs (``standby``: it was a standby): attempts.json says
        so."""
        if not self.history:
            return
        self.history[-1]["standby"] = standby
        record = {"schema": contract.SCHEMA, "max_attempts": self.max_attempts}
        atomic_write_json(
            os.path.join(self.rundir, contract.ATTEMPTS), {**record, "attempts": self.history}
        )

    def more(self) -> bool:
        """Another attempt may follow this one."""
        return self.enabled and self.attempt < self.max_attempts

    def summary(self) -> ExitRecord:
        """What exit.json says of the attempts (nothing without restarts)."""
        return summary(self.max_attempts, self.history)


def seated_spec(spec: SpecRecord, members: tuple[int, ...], slot: int) -> SpecRecord:
    """``spec`` as the attempt runs it where the nodes changed: the node rank of mesh slot
    ``slot`` among ``members`` (the slots by node rank), torchrun's count of nodes, and the
    world's shape by node rank (a spare runs as many processes as the node it replaced)."""
    rank = members.index(slot)
    seated: SpecRecord = {**spec, "node_rank": rank}
    if "torchrun" in spec:
        seated["torchrun"] = {**spec["torchrun"], "node_rank": rank, "nnodes": len(members)}
    watch = spec.get("watch")
    if watch is not None:
        was = list(watch.get("nprocs") or [])
        own = was[slot] if slot < len(was) else int(spec.get("torchrun", {}).get("nproc", 1))
        nprocs = [was[m] if m < len(was) else own for m in members]
        seated["watch"] = {**watch, "nprocs": nprocs}
    return seated


def stop_reason(rundir: str, default: str) -> str:
    """Why the node was asked to stop (the first asker's words), else ``default``."""
    try:
        with open(os.path.join(rundir, contract.STOP_REASON)) as fh:
            return fh.read().strip() or default
    except OSError:
        return default
