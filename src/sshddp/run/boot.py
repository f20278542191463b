"""Booting a run: stage the code on every node, then start them all.

Nothing starts anywhere unless every node staged: a node that cannot stage (full disk,
host gone, bad checksum, missing script) makes the others remove what they staged. Every
node gets the go and, right behind it, the code, at once. Node 0's probe lets go of the
rendezvous port on its go, before it stages; so no torchrun (none starts before every node
staged) can reach that listener instead of node 0's store. Node 0 once went alone first,
from when a node started as soon as it staged, and the code waited for the "released"
answer: two round trips more. A node that fails to start stops the ones that did.

Each run gets a new secret, the key its supervisors authenticate each other with (port
P + 1). It reaches each host in the boot order on the session's stdin, never an argv, and
is kept nowhere on this machine: not in the plan, the registry or any log.
"""

from __future__ import annotations

import json
import secrets
import threading
import zlib
from functools import cache
from typing import Any, Callable, Optional

from sshddp import defaults, trace
from sshddp.errors import SshddpError
from sshddp.hosts import shipped
from sshddp.hosts.pool import HostResults
from sshddp.hosts.session import HostSession
from sshddp.model import share as model_share
from sshddp.model.plan import LaunchPlan, NodePlan
from sshddp.model.state import NodeState
from sshddp.run.payload import Payload
from sshddp.run.runstate import LaunchState
from sshddp.run.share import Audience, Handoff, Share
from sshddp.run.teardown import Teardown

#: A node's answer to staging or starting: None when it went well, else why not.
Problem = Optional[str]
#: One thread builds the host code, and one packs it; the others wait for it, then reuse
#: it. Without them, every pool thread that asked before the first had finished built it
#: again: at 16 hosts, up to 16 supervisor files, and 3 to 7 packings of them at the go,
#: which spread the go to the hosts over 20-110 ms where it now takes 14-45. Two locks: a
#: session opening for the files never waits on the packing.
_BUILDING = threading.Lock()
_PACKING = threading.Lock()
_pack_started = threading.Event()  #: a pack_soon() started its thread


def pack_soon() -> Optional[threading.Thread]:
    """Pack the host code in a thread, if no call did yet (the thread, or None): the
    coordinator calls this as it opens the hosts' sessions, so the packing runs while it
    waits for their probes and the go finds it made. (Started any earlier, it slowed the
    coordinator's own start-up: the JSON half of it holds the interpreter lock.) A failure
    is left for the go, which packs it again and says why."""
    if _pack_started.is_set():
        return None
    _pack_started.set()  # two callers at once start two threads: the second waits, reuses

    def pack() -> None:
        try:
            packed_host_code()
        except Exception:  # the go packs it again, and says why it fails
            pass

    thread = threading.Thread(target=pack, name="sshddp-pack", daemon=True)
    thread.start()
    return thread


def host_code() -> tuple[str, str, str, str, str]:
    """``_host_code()``, built once whichever thread asks first."""
    with _BUILDING:
        return _host_code()


def packed_host_code() -> bytes:
    """``_packed_host_code()``, packed once whichever thread asks first."""
    with _PACKING:
        return _packed_host_code()


@cache
def _host_code() -> tuple[str, str, str, str, str]:
    """The supervisor file left in every run directory, the rank shim, the ranks'
    sitecustomize, torchrun's agent shim and the standby wire's module it reads."""
    return (
        shipped.standalone("supervisor"),
        shipped.source("sshddp.remote.rankside.rank"),
        shipped.source("sshddp.remote.rankside.ranksite"),
        shipped.source("sshddp.remote.rankside.agent"),
        shipped.source("sshddp.protocol.standby_messages"),
    )


@cache
def _packed_host_code() -> bytes:
    """Those files as the bytes that follow every host's go: zlib-compressed JSON, made
    once a launch (238 KB of text, 64 KB packed, per host, from a laptop's uplink)."""
    supervisor, rank_shim, site, agent, wire = host_code()
    files = {"supervisor": supervisor, "rank": rank_shim, "agent": agent, "site": site}
    files["wire"] = wire
    return zlib.compress(json.dumps(files, separators=(",", ":")).encode(), shipped.PACK_LEVEL)


class Boot:
    """Stages and starts every node of ``state``'s run through its launch session."""

    def __init__(
        self,
        state: LaunchState,
        payload: Payload,
        unreachable: Optional[dict[int, BaseException]] = None,
        before_start: Callable[[], bool] = lambda: True,
        say: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.state = state
        self.payload = payload
        self.unreachable = unreachable or {}
        # Called once every node staged, before any starts: False cancels the launch (every
        # node removes what it staged, nothing starts anywhere).
        self.before_start = before_start
        self.cancelled = False
        self.peer_key = secrets.token_hex(32)  #: the supervisors' shared secret for this run
        self.share = Share(state, self.peer_key, say)  #: --share, between stage and start
        #: the code, before the go
        self.handoff = Handoff(_audience(state), payload, state.pool, self.peer_key, say)

    def run(self, teardown: Teardown) -> bool:
        """Boot every node; False (and every started node stopped) when one failed."""
        state = self.state
        for result in state.results.values():
            result.state = NodeState.STARTING
        with trace.phase("stage"):
            staged = self._handoff()  # a node without its copy: not staged
            if all(o.ok and o.value is None for o in staged.values()):
                staged = state.pool.map(self._stage, state.plan.nodes)
            if all(o.ok and o.value is None for o in staged.values()):
                staged.update(self.share.run(self._session))  # a node without a file: unstaged
        if all(o.ok and o.value is None for o in staged.values()):
            if not self.before_start():
                trace.log.info("start: cancelled (Ctrl-C while staging): removing the staged")
                self.cancelled = True
                state.pool.map(lambda n: self._session(n).discard(), state.plan.nodes)
                return True
            with trace.phase("start"):
                self._settle(state.pool.map(self._start, state.plan.nodes))
        else:
            self._settle(staged, not_started=True)
            ok = [n for n in state.plan.nodes if _fine(staged, n)]
            state.pool.map(lambda n: self._session(n).discard(), ok)
        if state.root_cause is None:
            return True
        state.close_sessions()  # a staged node that was not started removes what it staged
        failed = state.results[state.root_cause]
        trace.log.info(
            "boot: node %d (%s) failed: %s", failed.node_rank, failed.host, failed.reason
        )
        teardown.request(False, f"node {failed.node_rank} ({failed.host}) failed to start")
        teardown.wait()
        return False

    def _handoff(self) -> HostResults[Problem]:
        """The code handed from host to host, when it pays: code of ``HANDOFF_MIN_BYTES``
        or more, to more than one node; else it follows the go (a round trip to ask costs
        more than the bytes)."""
        nodes, payload = self.state.plan.nodes, self.payload
        if payload.kind == "none" or len(nodes) < 2 or payload.size < defaults.HANDOFF_MIN_BYTES:
            return HostResults()
        by_host = {n.host.index: n for n in nodes}
        return self.handoff.run(lambda host: self._session(by_host[host.index]))

    def _session(self, node: NodePlan) -> HostSession:
        session = self.state.sessions.get(node.index)
        if session is None:
            error = self.unreachable.get(node.index)
            raise error or SshddpError(f"{node.host.host}: no session")
        return session

    def _stage(self, node: NodePlan) -> Problem:
        session = self._session(node)
        session.go(self._boot_args(node), packed_host_code())
        # Right behind the go, not after the "released" answer: the session reads the code
        # once it let go of the port, and a round trip per node is saved.
        if not self._kept(node):
            session.send_code(self.payload.chunks())
        session.answer("release")
        answer = session.answer("stage")
        trace.log.info("stage node %d (%s): %s", node.node_rank, node.host.host, _verdict(answer))
        self.share.looks[node.index] = answer.get("look")
        return None if answer.get("ok") else str(answer.get("error"))

    def _start(self, node: NodePlan) -> Problem:
        session = self._session(node)
        session.start(True)
        problem = self._started(node, session.answer("start"))
        trace.log.info("start node %d (%s): %s", node.node_rank, node.host.host, problem or "ok")
        return problem

    def _boot_args(self, node: NodePlan) -> dict[str, Any]:
        plan = self.state.plan
        return {
            "rundir": node.rundir,
            "spec": plan.spec(node),
            "env": dict(node.env),
            "payload": {
                **self.payload.header(),
                **({"kept": node.host.workdir} if self._kept(node) else {}),
            },
            "packed": len(packed_host_code()),  # supervisor, rank, agent, site, wire: after the go
            "remote_script": plan.code.target if plan.code.kind == "remote" else None,
            "keep_runs": plan.keep_runs,
            "bound": _bound_to(node, plan),
            "workspace": node.workspace,
            "peer_key": self.peer_key,
            "look": self.share.look_args(node),
        }

    def _kept(self, node: NodePlan) -> bool:
        """Whether the node stages from the copy the hand-off left it."""
        return self.state.plan.nodes.index(node) in self.handoff.kept_on

    def _started(self, node: NodePlan, answer: dict[str, Any]) -> Problem:
        """None when the node's torchrun started, else why not."""
        if not answer.get("ok"):
            return str(answer.get("error"))
        state = answer.get("state") or {}
        if state.get("state") not in (None, NodeState.RUNNING.value):
            self.state.results[node.node_rank].apply(state)
            return str(state.get("reason") or "torchrun did not start")
        return None

    def _settle(self, outcomes: HostResults[Problem], not_started: bool = False) -> None:
        """Each node's state after staging (``not_started``) or starting: running, failed
        with why, or not started because another node failed. Nodes missing from
        ``outcomes`` were never asked."""
        state = self.state
        failed = [n for n in state.plan.nodes if n.index in outcomes and not _fine(outcomes, n)]
        for node in state.plan.nodes:
            outcome = outcomes.get(node.index)
            result = state.results[node.node_rank]
            if outcome is not None and (not outcome.ok or outcome.value):
                result.state = NodeState.FAILED
                result.reason = outcome.value or _message(outcome.error)
                if state.root_cause is None:
                    state.root_cause = node.node_rank
            elif not_started and failed:
                result.state = NodeState.STOPPED
                result.reason = (
                    f"not started: node {failed[0].node_rank} "
                    f"({failed[0].host.host}) could not be staged"
                )
            else:
                result.state = NodeState.RUNNING


def _verdict(answer: dict[str, Any]) -> str:
    return "ok" if answer.get("ok") else f"failed: {answer.get('error')}"


def _fine(outcomes: HostResults[Problem], node: NodePlan) -> bool:
    outcome = outcomes.get(node.index)
    return outcome is not None and outcome.ok and outcome.value is None


def _message(error: Optional[BaseException]) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, SshddpError):
        return error.message
    return f"{type(error).__name__}: {error}"


def _bound_to(node: NodePlan, plan: LaunchPlan) -> Optional[str]:
    """What the node's end is bound to (remote/node/bound.py): its Slurm job step (over
    srun), the caller's process (the Python API), or nothing (the run outlives the laptop)."""
    if node.host.transport == "srun":
        return "srun"
    return "caller" if plan.end_with_caller else None


def _audience(state: LaunchState) -> Audience:
    nodes = state.plan.nodes
    labels = model_share.node_labels([n.host.host for n in nodes])
    return Audience(tuple(n.host for n in nodes), tuple(labels), state.plan.run_id)
