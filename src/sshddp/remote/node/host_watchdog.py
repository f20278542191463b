"""The run's watchdogs, run by its supervisors: so they work with no laptop attached.

Every node's supervisor knows its own facts (``node_watch``): which of its ranks called
``init_process_group`` and which returned from it (RUNDIR/joined/, written by the ranks'
sitecustomize, ``ranksite``), and how long ago the node last wrote output (node.log's
modification time: the supervisor appends to it as the ranks write). The other nodes send
theirs to node 0 with every heartbeat (``peers``). Node 0's supervisor decides
(``verdict``, pure):

- init: the world has not formed (some rank has not returned from init_process_group, or
  some node has not reported at all) ``init_timeout`` seconds after node 0 started;
- stall: the world formed (every rank returned from init_process_group), and since then no
  node of the run wrote output, nor were its ranks seen working (their stacks or CPU time
  moving between samples: ``node_progress``), for ``stall_timeout`` seconds. Its clock
  starts when the world forms: before, the init watchdog is in charge (importing torch can
  take minutes), and a run that never forms a world never stalls.

Node 0's watchdog posts the hang to its supervisor's loop (``node_events.Hang``), which
tells the other nodes. Then every node collects the stacks of its processes
(``stacks.collect``) and the NCCL flight recorder's dumps into RUNDIR/hang.json
(``contract.HangRecord``) and posts ``StacksTaken``; with the action "stop" its loop then
stops the node, which ends in state STALLED.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from sshddp.protocol import contract
from sshddp.protocol.contract import HangRecord, NodeStacks, NodeWatch, SpecRecord, WatchSpec
from sshddp.remote.common import atomic_write_json
from sshddp.remote.node import host_flight, node_progress
from sshddp.remote.node.joined import node_watch, still
from sshddp.remote.node.node_events import Hang, StacksTaken
from sshddp.remote.node.node_inbox import Inbox

TICK = 1.0  #: seconds between the watchdog's looks (the heartbeat's own interval)

Verdict = Tuple[str, str]  # (kind, reason)
Facts = Callable[[], Dict[int, NodeWatch]]  #: the other nodes' latest facts (node 0's server)


#: Device nodes of a GPU driver whose collectives are NCCL's (RCCL's on ROCm).
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")


def has_gpu(devices: Sequence[str] = GPU_DEVICES) -> bool:
    """Whether this host has a GPU driver loaded: any of ``devices`` exists."""
    return any(os.path.exists(d) for d in devices)


def nccl_env(rundir: str, env: dict[str, str], gpu: Optional[bool] = None) -> dict[str, str]:
    """The NCCL flight recorder's settings (``host_flight.settings``), armed unless the user set
    them: it keeps the last collectives of every rank, dumps them into RUNDIR/nccl/trace_<rank>
    when a collective times out, and when the watchdog asks (``host_flight.request``). Only on a
    host with a GPU (``gpu``, else ``has_gpu()``): torch 2.13's gloo records into it too,
    every collective with its Python stack, and a CPU run (gloo only) has no NCCL dump to
    gain from that."""
    if not (has_gpu() if gpu is None else gpu):
        return {}
    try:
        os.makedirs(os.path.join(rundir, contract.NCCL), 0o700, exist_ok=True)
    except OSError:  # no room: there will be no dumps
        pass
    return host_flight.settings(rundir, env)


def ranks_of(nprocs: Sequence[int], node: int) -> list[int]:
    """The global ranks of node ``node``."""
    first = sum(nprocs[:node])
    return list(range(first, first + nprocs[node]))


def formed(nprocs: Sequence[int], facts: dict[int, NodeWatch]) -> bool:
    """Every rank of every node returned from init_process_group."""
    return all(
        node in facts and set(ranks_of(nprocs, node)) <= set(facts[node]["joined"])
        for node in range(len(nprocs))
    )


def ranges(numbers: Sequence[int]) -> str:
    """0,1,2,5 -> "0-2,5"."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(numbers):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(_span(run))
        run = [n]
    if run:
        out.append(_span(run))
    return ",".join(out)


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def world_text(nprocs: Sequence[int], facts: dict[int, NodeWatch], hosts: Sequence[str]) -> str:
    """Per node: which ranks joined, which wait in init_process_group, which never called
    it; a node that never reported is said so."""
    parts = []
    for node in range(len(nprocs)):
        host = hosts[node] if node < len(hosts) else "?"
        ranks = ranks_of(nprocs, node)
        fact = facts.get(node)
        if fact is None:
            parts.append(f"node {node} ({host}): never reported (ranks {ranges(ranks)})")
            continue
        joined = [r for r in ranks if r in fact["joined"]]
        waiting = [r for r in ranks if r in fact["entered"] and r not in joined]
        never = [r for r in ranks if r not in fact["entered"]]
        said = [f"{len(joined)}/{len(ranks)} joined"]
        if waiting:
            said.append(f"ranks {ranges(waiting)} wait in init_process_group")
        if never:
            said.append(f"ranks {ranges(never)} never called init_process_group")
        parts.append(f"node {node} ({host}): " + ", ".join(said))
    return "; ".join(parts)


def verdict(
    watch: WatchSpec,
    nprocs: Sequence[int],
    facts: dict[int, NodeWatch],
    elapsed: float,
    hosts: Sequence[str],
    formed_for: Optional[float] = None,
) -> Optional[Verdict]:
    """Whether the run hung, and how, from every node's facts ``elapsed`` seconds after
    node 0 started (a node missing from ``facts`` has not reported yet), the world formed
    ``formed_for`` seconds ago (None: not yet)."""
    init = float(watch.get("init_timeout") or 0)
    expected = any(f["entered"] for f in facts.values())  # a run without torch.distributed
    if init > 0 and expected and elapsed >= init and not formed(nprocs, facts):
        return contract.HANG_INIT, (
            f"the world did not form within {init:g} s (--init-timeout): "
            + world_text(nprocs, facts, hosts)
        )
    stall = float(watch.get("stall_timeout") or 0)
    if stall > 0 and formed_for is not None and len(facts) == len(nprocs):
        quiet = min(formed_for, *(f["quiet"] for f in facts.values()))
        still = min(formed_for, *(f.get("still", f["quiet"]) for f in facts.values()))
        if still >= stall:
            return contract.HANG_STALL, (
                f"no rank wrote output for {quiet:.0f} s, nor were the ranks seen working"
                f" (stacks and CPU time still) for {still:.0f} s (--stall-timeout {stall:g})"
            )
    return None


class Watchdog:
    """A node's part: its facts for the heartbeat, and its stacks when the run hangs. On
    node 0 it also decides (``restart``). It posts what it finds to ``inbox``."""

    def __init__(self, rundir: str, spec: SpecRecord, since: float, inbox: Inbox) -> None:
        self.rundir = rundir
        self.spec = spec
        self.watch: Optional[WatchSpec] = spec.get("watch")
        self.since = since
        self.inbox = inbox
        self.facts: Facts = dict  #: the other nodes' facts (given by ``restart``)
        self.thread: Optional[threading.Thread] = None  #: node 0's deciding thread
        self.formed_at: Optional[float] = None  #: when node 0 saw the world formed
        every = node_progress.interval(self._stall())
        self.progress = node_progress.QuietWatch(rundir, every, cpu_counts=not has_gpu())

    def mine(self) -> NodeWatch:
        nprocs = self.watch["nprocs"] if self.watch else None
        found = node_watch(self.rundir, self.since, world=sum(nprocs) if nprocs else None)
        found["still"] = still(time.time(), found["quiet"], self.progress.moved_at)
        return found

    def _quiet(self) -> float:
        return self.mine()["quiet"]

    def _start(self) -> None:
        """Node 0: decide, every TICK, in a background thread."""
        if self.watch is None or int(self.spec["node_rank"]) != 0:
            return
        if not (self.watch.get("init_timeout") or self.watch.get("stall_timeout")):
            return
        self.thread = threading.Thread(target=self._decide, daemon=True, name="watchdog")
        self.thread.start()

    def restart(self, facts: Facts) -> None:
        """An attempt starts (the first, or again: ``restarts``): the world forms anew,
        watched from now, with the other nodes' ``facts``."""
        self.since = time.time()
        self.formed_at = None
        self.facts = facts
        if self._stall() > 0:
            self.progress.start(self._quiet)  # every node: are its quiet ranks working?
        if self.thread is None or not self.thread.is_alive():
            self._start()

    def _decide(self) -> None:
        assert self.watch is not None
        nprocs = list(self.watch["nprocs"] or [1])
        peers = self.spec.get("peers")
        hosts = list(peers["hosts"]) if peers else []
        reported_at = 0.0
        while True:
            time.sleep(TICK)
            facts = dict(self.facts())
            facts[0] = self.mine()
            if formed(nprocs, facts) and self.formed_at is None:
                self.formed_at = time.time()  # the stall clock starts
            if not self._stall() and self.formed_at is not None:
                return  # the world formed and nothing else is watched
            now = time.time()
            since = None if self.formed_at is None else now - self.formed_at
            found = verdict(self.watch, nprocs, facts, now - self.since, hosts, since)
            if found is None or time.time() - reported_at < self._stall():
                continue
            kind, reason = found
            action = self._action(kind)
            self.inbox.post(Hang(kind, reason, action))  # the loop tells the others
            if action == contract.ON_STALL_STOP:
                return  # the node stops as hung
            reported_at = time.time()

    def _stall(self) -> float:
        return float(self.watch["stall_timeout"] or 0) if self.watch else 0.0

    def _action(self, kind: str) -> str:
        if kind == contract.HANG_INIT or not self.watch:
            return contract.ON_STALL_STOP
        return str(self.watch["on_stall"] or contract.ON_STALL_STOP)

    def hang(self, kind: str, reason: str, action: str) -> None:
        """The run hung: record this node's stacks, then say so (``StacksTaken``: with
        action "stop", the loop stops the node)."""
        try:
            record = self._record(kind, reason, action)
            try:
                atomic_write_json(os.path.join(self.rundir, contract.HANG), record)
            except OSError as exc:
                print(f"sshddp watchdog: cannot write {contract.HANG}: {exc}", file=sys.stderr)
            print(f"sshddp watchdog: {kind}: {reason} ({action})", file=sys.stderr, flush=True)
        finally:
            self.inbox.post(StacksTaken(kind, reason, action))

    def _record(self, kind: str, reason: str, action: str) -> HangRecord:
        from sshddp.remote.calls.host_stacks import collect  # only a hung run pays for it

        asked_at = time.time()
        asked = host_flight.request(self.rundir)  # the ranks dump while their stacks are read
        stacks: NodeStacks
        try:
            stacks = collect(self.rundir)
        except Exception as exc:  # the node must stop all the same; the report says why
            stacks = {
                "schema": contract.SCHEMA,
                "node_rank": int(self.spec["node_rank"]),
                "state": contract.RUNNING,
                "processes": [],
                "py_spy": None,
                "note": f"no stacks: {type(exc).__name__}: {exc}",
                "elapsed": 0.0,
            }
        dumped = host_flight.gather(self.rundir, asked, asked_at)
        got = {d["rank"] for d in dumped}
        return {
            "schema": contract.SCHEMA,
            "kind": kind,
            "reason": reason,
            "at": asked_at,  # when it fired: the dumps take seconds
            "node_rank": int(self.spec["node_rank"]),
            "action": action,
            "watch": self.mine(),
            "stacks": stacks,
            "flight": dumped,
            "flight_late": [r for r in asked if r not in got],
            "nccl": host_flight.dumps(self.rundir),
        }
