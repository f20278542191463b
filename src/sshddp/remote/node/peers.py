"""The supervisors of one run watch each other, so a run needs no laptop to stop.

Node 0's supervisor runs the ``PeerServer``: it listens on the rendezvous port + 1. Every
other node's supervisor is a ``PeerClient`` holding one TCP connection to it, and both sides
send a heartbeat every interval. A node whose run ends other than "succeeded", a connection
that drops before its node said it was done (its supervisor was killed: the kernel closes
the socket), or silence longer than the timeout (host powered off, network cut): the server
broadcasts an abort and every supervisor stops its node. The messages are
``peer_messages``'; what a supervisor must act on (an abort, a hang, node 0's word on a
restart, another node's end or failure, and on node 0 who is connected and who ended) is
posted to its loop's inbox as an event (``node_events``), never acted on here.

Every connection is authenticated with the run's key and every message with a MAC
(``wire``): a stranger's connection, or another run's supervisor that reached this port,
is noise, logged and never obeyed. The server serves at most one connection per node and
MAX_PENDING connections that have yet to authenticate, each for one handshake deadline
(``wire.HANDSHAKE_TIMEOUT``) in all. A new connection beyond those takes the slot of the
oldest: a node's supervisor answers the challenge at once, so strangers that hold their
connections open (to crowd the port) are the ones that go, never a node of the run.
A client that never reached the server says so in its exit record (``settle``).

The spares of a run with restarts (spec.json ``spare``) are clients too: spare i joins as
slot N + i and waits. With restarts, a node lost is not an abort here: node 0's loop hears
of it (a ``done`` in the state LOST) and decides whether a spare takes its place (``seats``);
``members`` (the slots by node rank) follows node 0's word.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Optional

from sshddp.protocol import peer_messages as pm
from sshddp.protocol.contract import LOST, SUCCEEDED, NodeWatch, SpecRecord
from sshddp.remote.node import wire
from sshddp.remote.node.node_events import (
    Event,
    Hang,
    HealthAsked,
    Message,
    Node0Said,
    PeerAbort,
    PeerView,
    RunOver,
)
from sshddp.remote.node.node_inbox import Inbox

#: seconds a client's last try to connect may run past its deadline (connect and handshake)
CONNECT_SLACK = 2 + wire.HANDSHAKE_TIMEOUT
MAX_PENDING = 64  # connections awaiting authentication at the server; a newer one evicts the oldest
#: seconds a client whose node has ended goes on trying to reach node 0's supervisor to say
#: so. Node 0's, if it is there and never hears, stops at its own deadline for every node
#: (``PeerServer._deadline``); one that left already (both nodes failed at once) is not
#: waited for the whole connect deadline.
REPORT_GRACE = 10.0


class Peers:
    """This node's view of the others. The base class serves a run of one node, or one
    with no server address: there is no one to watch, and every call does nothing.
    ``inbox``: where the supervisor's loop hears what it must act on; ``facts``: this
    node's watchdog facts, sent with a client's heartbeats."""

    def __init__(
        self,
        spec: SpecRecord,
        key: Optional[bytes] = None,
        inbox: Optional[Inbox] = None,
        facts: Optional[Callable[[], NodeWatch]] = None,
    ) -> None:
        conf: dict[str, Any] = dict(spec.get("peers") or {})
        self.key = key or b""  #: the run's shared secret; with none, nobody authenticates
        self.run = str(spec.get("run_id", ""))
        self.rank = int(spec["node_rank"])
        self.nnodes = int(conf.get("nnodes", 1))
        self.addr = str(conf.get("addr") or "")
        self.port = int(conf.get("port", 0))
        self.timeout = float(conf.get("timeout", 30))
        self.interval = min(1.0, self.timeout / 5.0)
        self.names = [*(conf.get("hosts") or []), *(conf.get("spares") or [])]
        self.slots = self.nnodes + len(conf.get("spares") or [])  #: nodes, then the spares
        self.members = list(range(self.nnodes))  #: the slots by node rank (node 0's word)
        self.replaceable = int(spec.get("restarts") or 0) > 0  #: a lost node may be replaced
        self.abort: Optional[str] = None  # set once: why this node must stop
        self.inbox = inbox if inbox is not None else Inbox()
        self.watch_facts = facts
        self.facts: dict[int, NodeWatch] = {}  # the server's: the clients' latest facts
        #: the server's: rank -> (state, reason)
        self.done: dict[int, tuple[Optional[str], str]] = {}
        self.conns: dict[int, wire.Conn] = {}  # the server's: the clients' connections
        self.pending = Pending()  # the server's: connections not yet authenticated
        self.lock = threading.Lock()

    def name(self, slot: int) -> str:
        host = self.names[slot] if slot < len(self.names) else "?"
        if slot not in self.members:
            return f"spare {host}"
        return f"node {self.members.index(slot)} ({host})"

    def seat(self, nodes: list[int]) -> None:
        """The slots by node rank from now on (node 0's ``again`` changed them)."""
        with self.lock:
            self.members = list(nodes)

    def start(self) -> None:
        """Start watching (in background threads)."""

    def report(self, state: str, reason: str) -> None:
        """Tell the others how this node ended."""

    def released(self) -> bool:
        """The others no longer need this node (node 0's server relays aborts until every
        node reported its end)."""
        return True

    def farewell(self) -> None:
        """Say goodbye to the others, once released (the server's)."""

    def settle(self) -> str:
        """What this node's exit record must say of its link to node 0's supervisor once
        its own run has ended: "" when all was well."""
        return ""

    def known(self) -> dict[int, NodeWatch]:
        """The other nodes' latest watchdog facts (the server's)."""
        with self.lock:
            return dict(self.facts)

    def remember(self, rank: int, msg: pm.Beat) -> None:
        """Keep the watchdog facts a client's heartbeat carries."""
        if "w" in msg:
            with self.lock:
                self.facts[rank] = msg["w"]

    def links(self) -> list[wire.Conn]:
        """The connections to the other nodes' supervisors (the server's)."""
        return []

    def heard(self) -> set[int]:
        """The nodes this one hears from, itself included (the server's view)."""
        with self.lock:
            return {self.rank, *self.conns}

    def ended(self) -> set[int]:
        """The nodes that reported their end (the server's view)."""
        with self.lock:
            return set(self.done)

    def tell_node_0(self, msg: pm.PeerMessage) -> None:
        """Send node 0's supervisor ``msg`` (a client's)."""

    def tell_all(self, msg: pm.PeerMessage) -> None:
        """Send ``msg`` to every other node (the server's); an ``again`` that changes the
        nodes changes who they are from now on."""
        if msg["t"] == "again" and "nodes" in msg:
            self.seat(msg["nodes"])
        for conn in self.links():
            conn.send(pm.encode(msg))

    def broadcast_abort(self, reason: str) -> None:
        """Stop every node (the server tells the others)."""
        self._set_abort(reason)

    def _post(self, event: Event) -> None:
        self.inbox.post(event)

    def _view(self) -> None:
        """Tell the loop who is connected and who ended (node 0 decides restarts by it)."""
        self._post(PeerView(frozenset(self.heard()), frozenset(self.ended())))

    def _set_abort(self, reason: str) -> None:
        with self.lock:
            first = self.abort is None
            if first:
                self.abort = reason
        if first:
            self._post(PeerAbort(reason))


class Pending:
    """The server's connections that have yet to authenticate, oldest first: at most
    MAX_PENDING, a newer one evicting the oldest."""

    def __init__(self) -> None:
        self.socks: dict[socket.socket, str] = {}  #: and the peer's address
        self.lock = threading.Lock()

    def add(self, sock: socket.socket, peer: str) -> None:
        with self.lock:
            if len(self.socks) >= MAX_PENDING:
                oldest = next(iter(self.socks))
                why = f"over {MAX_PENDING} connections awaiting authentication: the oldest goes"
                wire.noise(self.socks.pop(oldest), why)
                try:  # its reader's next read ends, and the reader closes it (``close``)
                    oldest.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.socks[sock] = peer

    def claimer(self, sock: socket.socket) -> Callable[[], bool]:
        """What ``wire.offer`` asks once ``sock`` proved the key: it leaves the connections
        that may be evicted; False when it was evicted already."""

        def claim() -> bool:
            with self.lock:
                return self.socks.pop(sock, None) is not None

        return claim

    def close(self, sock: socket.socket) -> None:
        """Close a connection refused (under the lock: an eviction never shuts down a
        descriptor that was closed and then reused)."""
        with self.lock:
            self.socks.pop(sock, None)
            sock.close()


class PeerServer(Peers):
    """Node 0: every other supervisor connects here; an abort goes out to all of them."""

    def start(self) -> None:
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        srv, why = wire.listen(self.addr, self.port)
        if srv is None:
            self._set_abort(f"cannot listen on port {self.port} for the supervisors: {why}")
            return
        threading.Thread(target=self._heartbeat, daemon=True).start()
        threading.Thread(target=self._deadline, daemon=True).start()
        while True:
            sock, addr = srv.accept()
            peer = f"{addr[0]}:{addr[1]}"
            self.pending.add(sock, peer)
            threading.Thread(target=self._reader, args=(sock, peer), daemon=True).start()

    def _deadline(self) -> None:
        time.sleep(self.timeout * 2)  # every node must have checked in by then
        with self.lock:
            missing = [
                r for r in range(1, self.nnodes) if r not in self.conns and r not in self.done
            ]
        if missing:
            names = ", ".join(self.name(r) for r in missing)
            self.broadcast_abort(f"{names} never reached node 0's supervisor")

    def _admit(self, sock: socket.socket, peer: str) -> Optional[tuple[wire.Conn, int]]:
        """An authenticated connection of a node not yet connected, and its rank; None
        (noise logged, socket closed) for anything else."""
        try:
            conn, rank = wire.offer(sock, self.key, self.run, peer, self.pending.claimer(sock))
        except wire.Refused as exc:
            self.pending.close(sock)
            wire.noise(peer, str(exc))
            return None
        with self.lock:
            taken = not 0 < rank < self.slots or rank in self.conns
            if not taken:
                self.conns[rank] = conn
                late = self.abort
        if taken:
            wire.noise(peer, f"node {rank} is not a node of this run, or is connected already")
            sock.close()  # claimed: no eviction can reach it
            return None
        self._view()
        if late:
            conn.send(pm.encode(pm.abort(late)))
        return conn, rank

    def _reader(self, sock: socket.socket, peer: str) -> None:
        admitted = self._admit(sock, peer)
        if admitted is None:
            return
        conn, rank = admitted
        sock.settimeout(self.timeout)
        how = "its connection to node 0's supervisor dropped"
        while True:
            try:
                msg = conn.receive()
            except socket.timeout:  # silence: the node counts as lost
                how, msg = f"no heartbeat for {self.timeout:.0f} s", None
            if msg is None:
                break
            self._heard(rank, msg, peer)
        with self.lock:
            if self.conns.get(rank) is conn:
                del self.conns[rank]
        self._view()
        sock.close()
        if rank in self.done:
            return
        if self.replaceable:  # node 0's loop decides: a spare in its place, or the end
            if self.record_done(rank, LOST, how):
                self._post(Message(rank, pm.done(rank, LOST, how)))
        else:
            self.node_done(rank, LOST, f"{self.name(rank)} went silent or lost its supervisor")

    def _heard(self, rank: int, raw: wire.Message, peer: str) -> None:
        """A client's message: facts kept; a failure, a halt or an end goes to the loop (a
        node reports for itself only: the connection's rank, never the message's)."""
        msg = pm.decode(raw)
        if msg is None:
            wire.noise(peer, f"not a message of the supervisors': {ascii(raw)[:200]}")
        elif msg["t"] == "hb":
            self.remember(rank, msg)
        elif msg["t"] == "done":
            self.record_done(rank, msg["state"], msg["reason"])
            self._post(Message(rank, msg))  # the loop decides whether the run stops
        elif msg["t"] in ("fail", "halted", "health"):
            self._post(Message(rank, msg))

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.interval)
            self.tell_all(pm.beat(0))

    def record_done(self, rank: int, state: Optional[str], reason: str) -> bool:
        """Note how node ``rank`` ended; False when it had said so already."""
        with self.lock:
            if rank in self.done:
                return False
            self.done[rank] = (state, reason)
        self._view()
        return True

    def node_done(self, rank: int, state: Optional[str], reason: str) -> None:
        """Node ``rank`` ended (this node, or a lost one): unless it succeeded, the run stops."""
        if not self.record_done(rank, state, reason):
            return
        if state != SUCCEEDED:
            why = f"{self.name(rank)} {state}"
            self.broadcast_abort(why + (": " + reason if reason else ""))

    def broadcast_abort(self, reason: str) -> None:
        self._set_abort(reason)
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            conn.send(pm.encode(pm.abort(reason)))

    def links(self) -> list[wire.Conn]:
        with self.lock:
            return list(self.conns.values())

    def all_done(self) -> bool:
        """Every node of the run (by the latest word on who they are) reported its end."""
        with self.lock:
            return all(slot in self.done for slot in self.members)

    def report(self, state: str, reason: str) -> None:
        self.node_done(0, state, reason)

    def released(self) -> bool:
        """Every node has reported, or none is left to hear an abort."""
        if self.all_done():
            return True
        with self.lock:
            live = bool(self.conns)
        return not live and self.abort is not None

    def farewell(self) -> None:
        if self.all_done():
            self.tell_all(pm.bye())


class PeerClient(Peers):
    """A node other than 0: one connection to node 0's server, heartbeats both ways."""

    def __init__(
        self,
        spec: SpecRecord,
        key: Optional[bytes] = None,
        inbox: Optional[Inbox] = None,
        facts: Optional[Callable[[], NodeWatch]] = None,
    ) -> None:
        super().__init__(spec, key, inbox, facts)
        self.conn: Optional[wire.Conn] = None
        self.connected = threading.Event()  # set once connected, or given up
        self.ended_at: Optional[float] = None  # when this node's own run ended (``report``)

    def start(self) -> None:
        threading.Thread(target=self._client, daemon=True).start()

    def _connect(self) -> Optional[wire.Conn]:
        """An authenticated connection to this run's server; None (and the abort set) when
        there is none in time, or the port is held by something that is not it."""
        where = f"{self.addr}:{self.port}"
        deadline = time.time() + self.timeout * 2
        while time.time() < self._give_up(deadline) and self.abort is None:
            try:
                sock = socket.create_connection((self.addr, self.port), timeout=2)
            except OSError:
                time.sleep(0.2)
                continue
            try:
                return wire.join(sock, self.key, self.run, self.rank, where)
            except wire.Refused as exc:
                sock.close()
                if not exc.retry:
                    self._set_abort(
                        f"the supervisors' port {where} is not node 0's supervisor of this "
                        f"run: {exc}"
                    )
                    return None
                wire.noise(where, str(exc))
                time.sleep(0.2)
        self._set_abort(f"cannot reach node 0's supervisor at {where}")
        return None

    def _give_up(self, deadline: float) -> float:
        """When to stop trying to connect: ``deadline``, or sooner once this node ended."""
        ended = self.ended_at
        return deadline if ended is None else min(deadline, ended + REPORT_GRACE)

    def _ended(self) -> None:
        if self.ended_at is None:
            self.ended_at = time.time()

    def _client(self) -> None:
        conn = self._connect()
        self.conn = conn
        self.connected.set()
        if conn is None:
            return
        conn.send(pm.encode(pm.beat(self.rank)))
        threading.Thread(target=self._heartbeat, args=(conn,), daemon=True).start()
        conn.lines.sock.settimeout(self.timeout)
        while True:
            try:
                msg = conn.receive()
            except socket.timeout:
                self._set_abort(f"{self.name(0)} went silent for {self.timeout:.0f} s")
                return
            if msg is None:
                break
            if self._told(msg):
                self._post(RunOver())
                return  # node 0 is done and leaves; nothing is lost
        self._set_abort(f"lost the connection to {self.name(0)} (its host or supervisor is gone)")

    def _told(self, raw: wire.Message) -> bool:
        """Node 0's message, posted to the loop where it must act; True for its goodbye."""
        msg = pm.decode(raw)
        if msg is None:
            wire.noise(self.name(0), f"not a message of the supervisors': {ascii(raw)[:200]}")
        elif msg["t"] == "abort":
            self._set_abort(msg["reason"])
        elif msg["t"] == "hang":
            self._post(Hang(msg["kind"], msg["reason"], msg["action"]))
        elif msg["t"] == "halt" or msg["t"] == "again":
            self._post(Node0Said(msg))
        elif msg["t"] == "check":
            self._post(HealthAsked(msg["attempt"]))
        return msg is not None and msg["t"] == "bye"

    def _heartbeat(self, conn: wire.Conn) -> None:
        while conn.send(pm.encode(self._beat())):
            time.sleep(self.interval)

    def _beat(self) -> pm.Beat:
        return pm.beat(self.rank, self.watch_facts() if self.watch_facts else None)

    def tell_node_0(self, msg: pm.PeerMessage) -> None:
        if self.conn is not None:
            self.conn.send(pm.encode(msg))

    def settle(self) -> str:
        """Wait for the connection to node 0's supervisor (a node that ended at once is
        still connecting); what this node's record must say when there is none."""
        self._ended()
        self.connected.wait(self.timeout * 2 + CONNECT_SLACK)
        if self.conn is not None:
            return ""
        return (
            f"never reached node 0's supervisor at {self.addr}:{self.port}: this node ran "
            "without the supervisors watching each other (no other node's failure would "
            "have stopped it)"
        )

    def report(self, state: str, reason: str) -> None:
        self._ended()
        self.connected.wait(self.timeout * 2)  # a node that ended at once: still connecting
        if self.conn is not None:
            self.conn.send(pm.encode(pm.done(self.rank, state, reason)))


def peers_for(
    spec: SpecRecord,
    key: Optional[bytes],
    inbox: Optional[Inbox] = None,
    facts: Optional[Callable[[], NodeWatch]] = None,
) -> Peers:
    """The server for node 0, a client for the others, both holding the run's ``key`` and
    posting to ``inbox``; nothing to watch for a single node."""
    peers = Peers(spec, key, inbox, facts)
    if peers.nnodes <= 1 or not peers.addr or peers.port <= 0:
        return peers
    kind = PeerServer if peers.rank == 0 else PeerClient
    return kind(spec, key, inbox, facts)
