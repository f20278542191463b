"""``--share`` on the coordinator: once every node staged and before any starts, node 0's
copy of each shared file goes to the nodes whose copy differs, straight from node 0 over
the rendezvous port (``remote/node/host_share.py``), never through this machine; and a launch whose
working directory holds files on node 0 that other nodes lack (rank 0's checkpoint, with
no shared disk) warns, naming them and ``--share``.

Every node's stage answer carries what it found (``look``), so the warning and the
decision cost no round trip; only a transfer does (node 0 listens, the others fetch, node 0
stops and says what it sent). A node that cannot get a shared file fails its staging, and
nothing starts anywhere.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from sshddp import defaults
from sshddp.hosts.pool import HostResults, Outcome
from sshddp.hosts.session import HostSession
from sshddp.model.leftout import unshared_files
from sshddp.model.plan import NodePlan
from sshddp.model.share import Decision, Look, Transfer, decide, unshared, unshared_warning
from sshddp.run.runstate import LaunchState

#: A node's part in the transfer: None when it went well, else why not.
Problem = Optional[str]


class Share:
    """The ``--share`` step of one launch, between staging and the start."""

    def __init__(
        self, state: LaunchState, peer_key: str, say: Callable[[str], None] = lambda text: None
    ) -> None:
        self.state = state
        self.peer_key = peer_key  #: the run's key: only this run's nodes fetch the files
        self.say = say  #: where warnings and notes go (the console's stderr)
        self.looks: dict[int, Look] = {}  #: each node's stage answer's ``look``, by host index

    def look_args(self, node: NodePlan) -> Optional[dict[str, Any]]:
        """What the node reports with its stage answer: the shared paths' digests, and the
        working directory's listing where it outlives the run (the workspace, where a
        checkpoint stays for the next run); None when there is nothing to ask."""
        listing = node.workspace is not None and len(self.state.plan.nodes) > 1
        if not self.state.plan.share and not listing:
            return None
        return {
            "cwd": node.cwd,
            "share": list(self.state.plan.share),
            "list": listing,
            "cap": defaults.SHARE_LIST_CAP,
        }

    def run(self, session: Callable[[NodePlan], HostSession]) -> HostResults[Problem]:
        """Warn, note, and send what must be sent; each asked node's problem, if any."""
        plan = self.state.plan
        looks = [self.looks.get(n.index) for n in plan.nodes]
        found = unshared(looks, plan.share)
        if found:
            hosts = [n.host.host for n in plan.nodes]
            self.say(f"sshddp: warning: {unshared_warning(found, hosts)}")
            self.state.left_out += unshared_files(found, hosts)
        if not plan.share:
            return HostResults()
        decision = decide(plan.share, looks)
        self._tell(decision)
        if decision.problems:
            return _one(plan.nodes[0], "; ".join(decision.problems))
        if not decision.transfers:
            return HostResults()
        return self._send(decision.transfers, session)

    def _tell(self, decision: Decision) -> None:
        for note in decision.notes:
            self.say(f"sshddp: note: {note}")
        for path in decision.same:
            self.say(f"sshddp: --share {path}: node 0's copy is on every node; nothing sent")

    def _send(
        self, transfers: tuple[Transfer, ...], session: Callable[[NodePlan], HostSession]
    ) -> HostResults[Problem]:
        """Node 0 listens; every node that lacks a file fetches it; node 0 stops."""
        plan = self.state.plan
        first = plan.nodes[0]
        common = {
            "port": plan.rdzv_port,
            "addr": plan.rdzv_addr,
            "key": self.peer_key,
            "run": plan.run_id,
            "timeout": defaults.SHARE_TIMEOUT,
        }
        paths = [t.path for t in transfers]
        served = session(first).ask({"ask": "serve", "cwd": first.cwd, "paths": paths, **common})
        if served.get("error"):
            return _one(first, str(served["error"]))
        receivers = [n for n in plan.nodes if any(n.node_rank in t.to for t in transfers)]

        def pull(node: NodePlan) -> Problem:
            files = [
                {"path": t.path, "size": t.size, "sha256": t.sha256}
                for t in transfers
                if node.node_rank in t.to
            ]
            order = {"ask": "pull", "cwd": node.cwd, "files": files, "rank": node.node_rank}
            answer = session(node).ask({**order, **common})
            return None if answer.get("ok") else f"--share: {answer.get('error')}"

        try:
            pulled = self.state.pool.map(pull, receivers)
        finally:
            sent = session(first).ask({"ask": "unserve"})
        if all(o.ok and o.value is None for o in pulled.values()):
            self._sent(transfers, sent)
        return pulled

    def _sent(self, transfers: tuple[Transfer, ...], sent: dict[str, Any]) -> None:
        for t in transfers:
            to = ", ".join(str(r) for r in t.to)
            self.say(f"sshddp: --share {t.path}: node 0's copy ({t.size} bytes) sent to node {to}")
        files, total = sent.get("files"), sent.get("sent")
        self.say(f"sshddp: --share: node 0 sent {files} file(s), {total} bytes in all")


def _one(node: NodePlan, problem: str) -> HostResults[Problem]:
    results: HostResults[Problem] = HostResults()
    results[node.index] = Outcome(problem)
    return results
