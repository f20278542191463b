"""``--share`` on the coordinator: once every node staged and before any starts, node 0's
copy of each shared file goes to the nodes whose copy differs, straight from node 0 over
the rendezvous port (``remote/node/host_share.py``), never through this machine; and a launch whose
working directory holds files on node 0 that other nodes lack (rank 0's checkpoint, with
no shared disk) warns, naming them and ``--share``.

Every node's stage answer carries what it found (``look``), so the warning and the
decision cost no round trip; only a transfer does (node 0 listens, the others fetch, node 0
stops and says what it sent). A node that cannot get a shared file fails its staging, and
nothing starts anywhere.

``Handoff``: a payload every host of a command needs, known by its SHA-256, on every host
with each byte of it leaving this machine once. A launch's ``--workdir`` archive (before
the go) and the uv binary of a first ``sync`` take this one path.

The hosts say whether they keep it already (``<workdir>/payloads/<sha256>``, checked there
and then); one host gets it from here, and the hosts hand it on to each other
(``model/share.py``'s tree, ``remote/node/host_handoff.py`` on the hosts) over connections
authenticated with a key made for this command. Every copy is checked against the SHA-256
computed here before it is kept; a host that cannot get it from its source gets it from
here, and the console's note says so. The hosts' sessions are the launch's, or for a sync
sessions of their own that only answer the hand-off's questions (``host_handoff.main``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional, Protocol

from sshddp import defaults, trace
from sshddp.hosts.pool import HostPool, HostResults, Outcome, node_addr
from sshddp.hosts.session import HostSession
from sshddp.model import share as model
from sshddp.model.inventory import Host
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


MIN_BYTES = defaults.HANDOFF_MIN_BYTES
TIMEOUT = defaults.HANDOFF_TIMEOUT
CONNECT_TIMEOUT = 5.0  #: seconds a host retries connecting to the server it gets it from
CHUNK = 1 << 20  #: bytes of an in-memory payload written at a time

Sessions = Callable[[Host], HostSession]


class Blob(Protocol):
    """What is handed on: its size, its digest, and its bytes a chunk at a time."""

    @property
    def size(self) -> int: ...

    @property
    def sha256(self) -> str: ...

    def chunks(self) -> Iterator[bytes]: ...


@dataclass(frozen=True)
class Bytes:
    """A payload held in memory (sync's packed uv binary)."""

    data: bytes = field(repr=False)
    sha256: str = ""  #: computed from ``data`` when not given

    def __post_init__(self) -> None:
        if not self.sha256:
            object.__setattr__(self, "sha256", hashlib.sha256(self.data).hexdigest())

    @property
    def size(self) -> int:
        return len(self.data)

    def chunks(self) -> Iterator[bytes]:
        view = memoryview(self.data)
        for start in range(0, len(view), CHUNK):
            yield bytes(view[start : start + CHUNK])


@dataclass(frozen=True)
class Audience:
    """Who a hand-off is for, and how its lines name them."""

    hosts: tuple[Host, ...]  #: in tree order: the first is the first to get it from here
    labels: tuple[str, ...]  #: each host as a line names it (``node 0 (h1)``, ``h1``)
    run_id: str  #: the command's id: servers serve only its hosts
    what: str = "code"  #: the payload, as a line names it
    earlier: str = "launch"  #: what left kept copies before


class Handoff:
    """The hand-off of one payload to ``audience``'s hosts."""

    def __init__(
        self,
        audience: Audience,
        payload: Blob,
        pool: HostPool,
        peer_key: str,
        say: Callable[[str], None],
    ) -> None:
        self.audience = audience
        self.payload = payload
        self.pool = pool
        self.peer_key = peer_key  #: only this command's hosts get or give a copy
        self.say = say
        self.kept_on: set[int] = set()  #: positions of the hosts holding a kept copy
        self.delivery: Optional[model.Delivery] = None
        self.nospace: list[int] = []  #: hosts whose disk filled as they received it
        self._ready = [threading.Event() for _ in audience.hosts]
        self._served: dict[int, tuple[str, int]] = {}  #: a server's address and port
        self._got: dict[int, int] = {}
        self._fallbacks: dict[int, str] = {}
        self._lock = threading.Lock()
        self._sent = 0  #: bytes that left this machine

    def run(self, session: Sessions) -> HostResults[Problem]:
        """Every host's copy, kept on it: each host's problem, if any (by host index)."""
        hosts = self.audience.hosts
        with trace.phase("handoff"):
            have = self.pool.map(lambda h: self._have(session(h), h), hosts)
            if not all(o.ok for o in have.values()):
                return _failures(have)
            tree = model.tree([bool(have[h.index].value) for h in hosts], defaults.HANDOFF_FANOUT)
            try:
                for pos in tree.kept:
                    self._serve(session, tree, pos)  # a server that fails: from here instead
                    self._ready[pos].set()
                routes = {r.node: r.source for r in tree.routes}
                todo = [hosts[r.node] for r in tree.routes]
                got = self.pool.map(lambda h: self._deliver(session, tree, routes, h), todo)
            finally:
                for pos in self._served:  # a session that failed: its end ends its server
                    _quietly(partial(_unserve, session, hosts[pos]))
            what, earlier = self.audience.what, self.audience.earlier
            self.delivery = model.Delivery(
                self.payload.size, self._sent, self._got, tree.kept, self._fallbacks, what, earlier
            )
            for line in self.delivery.lines(self.audience.labels):
                trace.log.info("handoff: %s", line)
        return got

    def record(self) -> Optional[dict[str, object]]:
        """The ``--json`` record of the delivery, once there was one."""
        if self.delivery is None:
            return None
        names = [h.host for h in self.audience.hosts]
        return self.delivery.record(names, self.audience.labels)

    def disk_full(self) -> str:
        """What a command says when hosts' disks filled as they received the payload."""
        named = ", ".join(self.audience.labels[i] for i in sorted(self.nospace))
        return (
            f"run {self.audience.run_id}: no space left on {named} for the "
            f"{self.audience.what} ({self.payload.size} bytes) under its workdir: nothing "
            "was started; free some space there (old runs: `sshddp ps`), or give the host "
            "another `workdir:`"
        )

    def _have(self, session: HostSession, host: Host) -> bool:
        answer = session.ask({"ask": "payload-have", **self._what(host)})
        if answer.get("bad"):
            label = self.audience.labels[self.audience.hosts.index(host)]
            self.say(f"sshddp: warning: {label}: {answer['bad']}")
        if answer.get("error"):
            raise OSError(str(answer["error"]))
        return bool(answer.get("have"))

    def _what(self, host: Host) -> dict[str, Any]:
        return {"workdir": host.workdir, "sha256": self.payload.sha256, "size": self.payload.size}

    def _deliver(
        self, session: Sessions, tree: model.Tree, routes: dict[int, int], host: Host
    ) -> Problem:
        pos = self.audience.hosts.index(host)
        try:
            problem = self._fetch(session(host), host, pos, routes[pos])
            if problem is None:
                self._serve(session, tree, pos)
            return problem
        finally:
            self._ready[pos].set()  # those it serves go on: from it, or from here

    def _fetch(self, session: HostSession, host: Host, pos: int, source: int) -> Problem:
        labels, what = self.audience.labels, self.audience.what
        if source != model.LAPTOP:
            self._ready[source].wait()
            answer = self._pull(session, host, source)
            if answer.get("ok"):
                self._got[pos] = source
                return None
            if not answer.get("nospace"):  # a full disk stays full: no second copy
                why = str(answer.get("error"))
                note = model.fallback_note(pos, source, labels, why, what)
                self.say(f"sshddp: note: {note}")
                self._fallbacks[pos] = why
                answer = self._take(session, host)
        else:
            answer = self._take(session, host)
        if answer.get("ok"):
            self._got[pos] = source if pos not in self._fallbacks else model.LAPTOP
            return None
        if answer.get("nospace"):
            self.nospace.append(pos)
        return f"could not keep the {what}: {answer.get('error')}"

    def _take(self, session: HostSession, host: Host) -> dict[str, Any]:
        answer = session.ask({"ask": "payload-take", **self._what(host)}, self.payload.chunks())
        with self._lock:
            self._sent += self.payload.size
        return answer

    def _pull(self, session: HostSession, host: Host, source: int) -> dict[str, Any]:
        where = self._served.get(source)
        if where is None:
            return {"error": "it has no copy to hand on"}
        order = {"ask": "payload-pull", **self._what(host), "addr": where[0], "port": where[1]}
        order.update(key=self.peer_key, run=self.audience.run_id, rank=host.index)
        order.update(source=self.audience.labels[source], timeout=TIMEOUT)
        order["connect_timeout"] = CONNECT_TIMEOUT  # it listens already: refused, it is gone
        return session.ask(order)

    def _serve(self, session: Sessions, tree: model.Tree, pos: int) -> None:
        """The host holds a kept copy; a server of it, if it hands it on."""
        host = self.audience.hosts[pos]
        self.kept_on.add(pos)
        if not tree.children(pos):
            return
        order = {"ask": "payload-serve", **self._what(host), "key": self.peer_key}
        order.update(run=self.audience.run_id, timeout=TIMEOUT)
        answer = _quietly(lambda: session(host).ask(order)) or {}
        if answer.get("port"):
            addr = node_addr(host, self.pool.options)
            self._served[pos] = (addr, int(answer["port"]))
            label = self.audience.labels[pos]
            trace.log.info("handoff: %s serves on %s:%s", label, addr, answer["port"])


def _unserve(session: Sessions, host: Host) -> dict[str, Any]:
    return session(host).ask({"ask": "payload-unserve"})


def _quietly(ask: Callable[[], dict[str, Any]]) -> Optional[dict[str, Any]]:
    """``ask()``, or None (traced) when the session failed: its host fails its part."""
    try:
        return ask()
    except Exception as exc:
        trace.log.info("handoff: %s", exc)
        return None


def _failures(outcomes: HostResults[bool]) -> HostResults[Problem]:
    failed: HostResults[Problem] = HostResults()
    for index, outcome in outcomes.items():
        if not outcome.ok:
            failed[index] = Outcome(error=outcome.error)
    return failed
