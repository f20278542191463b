"""Restarts of the whole run (``--max-restarts N``), decided by the supervisors.

torchrun itself never restarts (it gets ``--max-restarts 0``): with the static rendezvous
one node's torchrun restarting alone hangs or fails. Instead a node whose torchrun failed
while attempts remain tells node 0's supervisor (``{"fail": k, "reason": t}``). Node 0
decides (``refusal``, pure): every node must still be heard from and none may have ended
for good, else the run ends as it did without restarts. Then every supervisor stops its
node's processes (``{"halt": k}``: the usual stop, torchrun's group and every process
carrying the node's mark, workers included), and says so (``{"halted": k}``; a node that
failed has stopped already). Once every node has, node 0 says ``{"again": k + 1}`` and
every node starts a fresh torchrun: same node ranks, same rendezvous endpoint, a fresh
rendezvous round (torchrun's TCP store binds its port with SO_REUSEADDR, so node 0's new
store takes the port at once).

node.log stays exactly what the ranks wrote; RUNDIR/attempts.json (``AttemptsRecord``)
says where each attempt starts in it and why the one before ended. Every process of
attempt k carries SSHDDP_ATTEMPT=k.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Callable, Collection, Optional, Protocol

from sshddp.remote import contract
from sshddp.remote.attempts import summary
from sshddp.remote.common import atomic_write_json, listdir, unlink
from sshddp.remote.contract import AttemptRecord, ExitRecord, SpecRecord
from sshddp.remote.output import NodeOutput
from sshddp.remote.peers import Peers
from sshddp.remote.watchdog import Watchdog

WAIT_TICK = 0.05  #: seconds between looks while a node waits for node 0's word
TAIL_BYTES = 64 * 1024  #: how much of an attempt's end is read for torchrun's failure summary
_RANK_RE = re.compile(rb"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)")
_EXIT_RE = re.compile(rb"exitcode\s*:\s*(-?\d+)")


def refusal(
    attempt: int,
    max_attempts: int,
    nnodes: int,
    heard: Collection[int],
    ended: Collection[int],
    abort: Optional[str],
) -> str:
    """Why a failure in ``attempt`` does not restart the run ("" when it does). ``heard``:
    the nodes node 0 still hears from (itself included); ``ended``: those that ended for
    good."""
    if attempt >= max_attempts:
        return f"no attempts left ({max_attempts} made)"
    if abort is not None:
        return f"the run is stopping: {abort}"
    if ended:
        return "node(s) " + ", ".join(str(r) for r in sorted(ended)) + " ended already"
    lost = [r for r in range(nnodes) if r not in heard]
    if lost:
        return "node(s) " + ", ".join(str(r) for r in lost) + " cannot be reached"
    return ""


def failure_text(log: str, offset: int, reason: str) -> str:
    """What failed, from torchrun's failure summary at the end of the attempt's output
    (``rank 5 exited with code 1``); else ``reason`` (torchrun's own exit)."""
    try:
        with open(log, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, size - TAIL_BYTES))
            tail = fh.read()
    except OSError:
        return reason
    start = tail.rfind(b"Root Cause")
    rank, code = _RANK_RE.search(tail, max(start, 0)), _EXIT_RE.search(tail, max(start, 0))
    if start < 0 or rank is None or code is None:
        return reason
    return f"rank {int(rank.group(1))} exited with code {int(code.group(1))}"


class Hub:
    """Node 0's part: decides, stops every node, and starts them again together."""

    def __init__(self, node: Restarts) -> None:
        self.node = node
        self.peers = node.peers
        self.lock = threading.Lock()
        self.current = 1  #: the attempt every node runs (or is about to start)
        self.halting: Optional[int] = None  #: the attempt being stopped everywhere
        self.why = ""
        self.halted: set[int] = set()

    def message(self, rank: int, msg: dict[str, Any]) -> None:
        """A spoke's message (``peers`` calls it on its reader thread)."""
        if "fail" in msg:
            self.failed(rank, _int(msg["fail"]), str(msg.get("reason") or "")[:500])
        elif "halted" in msg:
            self.stopped(rank, _int(msg["halted"]))
        elif "done" in msg and self.halting is not None:
            name = self.peers.name(rank)
            self.peers.broadcast_abort(f"{name} ended while the run was restarting")

    def failed(self, rank: int, attempt: int, reason: str) -> None:
        """Node ``rank``'s attempt failed (and it stopped): restart everyone, or end."""
        with self.lock:
            if self.halting is not None or attempt != self.current:
                late = self.halting == attempt
            else:
                why = self._refusal(attempt)
                if why:
                    self.peers.end_node(rank, f"{reason}; not restarted: {why}")
                    return
                self.halting, self.halted = attempt, set()
                self.why = f"{self.peers.name(rank)} failed: {reason}"
                late = True
                self._tell({"halt": attempt, "reason": self.why})
                self.node.told_halt(attempt, self.why)
        if late:
            self.stopped(rank, attempt)

    def _refusal(self, attempt: int) -> str:
        peers = self.peers
        return refusal(
            attempt, self.node.max_attempts, peers.nnodes, peers.heard(), peers.ended(), peers.abort
        )

    def stopped(self, rank: int, attempt: int) -> None:
        """Node ``rank`` stopped attempt ``attempt``; once every node has: go again."""
        with self.lock:
            if self.halting != attempt:
                return
            self.halted.add(rank)
            if len(self.halted) < self.peers.nnodes:
                return
            self.halting, self.current = None, attempt + 1
            self._tell({"again": attempt + 1, "reason": self.why})
            self.node.told_again(attempt + 1, self.why)

    def _tell(self, msg: dict[str, Any]) -> None:
        for conn in self.peers.links():
            conn.send(msg)


class Restarts:
    """A node's part: what it tells node 0, what node 0 tells it, and its attempts."""

    def __init__(self, rundir: str, spec: SpecRecord, peers: Peers) -> None:
        self.rundir = rundir
        self.peers = peers
        self.max_attempts = 1 + max(0, int(spec.get("restarts") or 0))
        self.attempt = 1
        self.history: list[AttemptRecord] = []
        self.halt: Optional[tuple[int, str]] = None  #: (attempt, why): node 0 said stop it
        self.go: Optional[tuple[int, str]] = None  #: (attempt, why): node 0 said start it
        self.on_wake: Callable[[], None] = lambda: None  #: wakes the supervisor's loop
        self.hub: Optional[Hub] = Hub(self) if peers.rank == 0 else None
        if self.enabled:
            peers.on_message = self.hub.message if self.hub else self.message

    @property
    def enabled(self) -> bool:
        return self.max_attempts > 1

    def halting(self) -> bool:
        """Node 0 asked this node to stop its current attempt."""
        return self.halt is not None and self.halt[0] == self.attempt

    def message(self, rank: int, msg: dict[str, Any]) -> None:
        """Node 0's message (a spoke's ``peers`` calls it on its reader thread)."""
        if "halt" in msg:
            self.told_halt(_int(msg["halt"]), str(msg.get("reason") or "")[:500])
        if "again" in msg:
            self.told_again(_int(msg["again"]), str(msg.get("reason") or "")[:500])

    def told_halt(self, attempt: int, why: str) -> None:
        self.halt = (attempt, why)
        self.on_wake()

    def told_again(self, attempt: int, why: str) -> None:
        self.go = (attempt, why)
        self.on_wake()

    def again(self, state: str, reason: str, stopping: Callable[[], bool]) -> bool:
        """The attempt ended in ``state``: True once every node is to start the next one;
        False when the node ends here (no restarts, none left, or the run is stopping)."""
        if not self.enabled or stopping():
            return False
        k = self.attempt
        if self.halting():
            self._send({"halted": k})
        elif state == contract.FAILED and k < self.max_attempts:
            log = os.path.join(self.rundir, contract.LOG)
            offset = self.history[-1]["offset"] if self.history else 0
            self._send({"fail": k, "reason": failure_text(log, offset, reason)})
        else:
            return False
        while not stopping():
            if self.go is not None and self.go[0] == k + 1:
                return True
            time.sleep(WAIT_TICK)
        return False

    def _send(self, msg: dict[str, Any]) -> None:
        if self.hub is not None:
            self.hub.message(0, msg)
        else:
            self.peers.tell_hub(msg)

    def run(self, node: Node) -> tuple[str, str]:
        """Run ``node``'s attempts (the first one runs) until the node ends; its final state
        and why."""
        while True:
            state, reason = node._exited() if node.loop() else node._stopped()
            if not self.again(state, reason, lambda: stopping(node)):
                break
            failed = node.spawn()
            if failed:
                return contract.FAILED, failed
        full = node.output is not None and node.output.full
        if self.halting() and state in (contract.STOPPED, contract.FAILED) and not full:
            abort = self.peers.abort  # stopped for a restart that never came
            default = "stopped: " + abort if abort else "stopped on request"
            return contract.STOPPED, stop_reason(self.rundir, default)
        return state, reason

    def begin(self, output: NodeOutput, spec: SpecRecord, watchdog: Watchdog) -> None:
        """Record the start of the next attempt (or the first) and give it a fresh output;
        the world forms anew, so the watchdog watches from now."""
        watchdog.restart()
        if not self.enabled:
            return
        why = ""
        if self.history:
            assert self.go is not None
            self.attempt, why = self.go
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


class Node(Protocol):
    """What the restarts need of a node's supervisor (``supervisor.Supervisor``)."""

    output: Optional[NodeOutput]
    stop_signal: Optional[int]
    watchdog: Watchdog
    peers: Peers

    def loop(self) -> bool: ...  #: torchrun exited (True), or the node must stop (False)
    def _exited(self) -> tuple[str, str]: ...  #: torchrun's end: the attempt's state
    def _stopped(self) -> tuple[str, str]: ...  #: the node stopped: the attempt's state
    def spawn(self) -> str: ...  #: start the next attempt; why it could not ("" if it runs)


def stopping(node: Node) -> bool:
    """The node ends whatever its attempt did: asked to, aborted, hung or out of disk."""
    output = node.output
    stops = (node.stop_signal, output.full if output else None, node.watchdog.verdict)
    return any(v is not None for v in stops) or node.peers.abort is not None


def stop_reason(rundir: str, default: str) -> str:
    """Why the node was asked to stop (the first asker's words), else ``default``."""
    try:
        with open(os.path.join(rundir, contract.STOP_REASON)) as fh:
            return fh.read().strip() or default
    except OSError:
        return default


def _int(value: object) -> int:
    """A message's attempt number; -1 (matching no attempt) for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
