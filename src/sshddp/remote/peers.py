"""The supervisors of one run watch each other, so a run needs no laptop to stop.

Node 0's supervisor is the ``Hub``: it listens on the rendezvous port + 1. Every other
node's supervisor is a ``Spoke`` holding one TCP connection to it, and both sides send a
heartbeat line every interval. A node whose run ends other than "succeeded", a connection
that drops before its node said it was done (its supervisor was killed: the kernel closes
the socket), or silence longer than the timeout (host powered off, network cut): the hub
broadcasts an abort and every supervisor stops its node. Messages: {"hb": r} (from a
spoke with "w": its ``NodeWatch`` facts, for the watchdog), {"done": r, "state": s,
"reason": t}, {"abort": reason}, {"hang": kind, "reason": t, "action": a} (the watchdog
fired: collect the stacks, then stop or go on), {"bye": 0}.

Every connection is authenticated with the run's key and every message with a MAC
(``wire``): a stranger's connection, or another run's supervisor that reached this port,
is noise, logged and never obeyed. The hub serves at most one connection per node and
MAX_PENDING connections that have yet to authenticate, each for one handshake deadline
(``wire.HANDSHAKE_TIMEOUT``) in all. A new connection beyond those takes the slot of the
oldest: a node's supervisor answers the challenge at once, so strangers that hold their
connections open (to crowd the port) are the ones that go, never a node of the run.
A spoke that never reached the hub says so in its exit record (``settle``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Optional

from sshddp.remote import wire
from sshddp.remote.contract import SUCCEEDED, NodeWatch, SpecRecord

#: seconds a spoke's last try to connect may run past its deadline (connect and handshake)
CONNECT_SLACK = 2 + wire.HANDSHAKE_TIMEOUT
MAX_PENDING = 64  # connections awaiting authentication at the hub; a newer one evicts the oldest


class Peers:
    """This node's view of the others. The base class serves a run of one node, or one
    with no hub address: there is no one to watch, and every call does nothing."""

    def __init__(self, spec: SpecRecord, key: Optional[bytes] = None) -> None:
        conf: dict[str, Any] = dict(spec.get("peers") or {})
        self.key = key or b""  #: the run's shared secret; with none, nobody authenticates
        self.run = str(spec.get("run_id", ""))
        self.rank = int(spec["node_rank"])
        self.nnodes = int(conf.get("nnodes", 1))
        self.addr = str(conf.get("addr") or "")
        self.port = int(conf.get("port", 0))
        self.timeout = float(conf.get("timeout", 30))
        self.interval = min(1.0, self.timeout / 5.0)
        self.names = list(conf.get("hosts") or [])
        self.abort: Optional[str] = None  # set once: why this node must stop
        self.on_abort: Optional[Callable[[], None]] = None  # wakes the supervisor's loop
        self.watch_facts: Optional[Callable[[], NodeWatch]] = None  # a spoke's, for the hub
        self.on_hang: Optional[Callable[[str, str, str], None]] = None  # told by the hub
        self.facts: dict[int, NodeWatch] = {}  # the hub's: the spokes' latest facts
        #: every message from a peer, with the sender's rank (``restarts``)
        self.on_message: Optional[Callable[[int, dict[str, Any]], None]] = None
        self.done: dict[int, tuple[Optional[str], str]] = {}  # the hub's: rank -> (state, reason)
        self.conns: dict[int, wire.Conn] = {}  # the hub's: the spokes' connections
        self.lock = threading.Lock()

    def name(self, rank: int) -> str:
        host = self.names[rank] if rank < len(self.names) else "?"
        return f"node {rank} ({host})"

    def start(self) -> None:
        """Start watching (in background threads)."""

    def report(self, state: str, reason: str) -> None:
        """Tell the others how this node ended."""

    def wait_others(self) -> None:
        """Stay up as long as the others need this node (the hub relays aborts)."""

    def settle(self) -> str:
        """What this node's exit record must say of its link to node 0's supervisor once
        its own run has ended: "" when all was well."""
        return ""

    def known(self) -> dict[int, NodeWatch]:
        """The other nodes' latest watchdog facts (the hub's)."""
        with self.lock:
            return dict(self.facts)

    def remember(self, rank: int, msg: dict[str, Any]) -> None:
        """Keep the watchdog facts a spoke's heartbeat carries."""
        if isinstance(msg.get("w"), dict):
            with self.lock:
                self.facts[rank] = msg["w"]

    def links(self) -> list[wire.Conn]:
        """The connections to the other nodes' supervisors (the hub's)."""
        return []

    def heard(self) -> set[int]:
        """The nodes this one hears from, itself included (the hub's view)."""
        with self.lock:
            return {self.rank, *self.conns}

    def ended(self) -> set[int]:
        """The nodes that reported their end (the hub's view)."""
        with self.lock:
            return set(self.done)

    def end_node(self, rank: int, reason: str) -> None:
        """Node ``rank`` failed for good: the run stops (the hub tells every node)."""
        self.broadcast_abort(f"{self.name(rank)} failed: {reason}")

    def tell_hub(self, msg: dict[str, Any]) -> None:
        """Send node 0's supervisor ``msg`` (a spoke's)."""

    def broadcast_abort(self, reason: str) -> None:
        """Stop every node (the hub tells the others)."""
        self._set_abort(reason)

    def tell_hang(self, kind: str, reason: str, action: str) -> None:
        """Tell the other nodes the run hung (the hub's)."""
        for conn in self.links():
            conn.send({"hang": kind, "reason": reason[: wire.MAX_TEXT], "action": action})

    def _set_abort(self, reason: str) -> None:
        with self.lock:
            if self.abort is None:
                self.abort = reason
        if self.on_abort is not None:
            self.on_abort()


class Pending:
    """The hub's connections that have yet to authenticate, oldest first: at most
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


class Hub(Peers):
    """Node 0: every other supervisor connects here; an abort goes out to all of them."""

    def __init__(self, spec: SpecRecord, key: Optional[bytes] = None) -> None:
        super().__init__(spec, key)
        self.pending = Pending()  #: connections not yet authenticated

    def start(self) -> None:
        threading.Thread(target=self._serve, daemon=True).start()

    def _listen(self) -> Optional[socket.socket]:
        for host in (self.addr, ""):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, self.port))
                s.listen(256)
                return s
            except OSError:
                s.close()
        return None

    def _serve(self) -> None:
        srv = self._listen()
        if srv is None:
            self._set_abort(f"cannot listen on port {self.port} for the other nodes' supervisors")
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
            taken = not 0 < rank < self.nnodes or rank in self.conns
            if not taken:
                self.conns[rank] = conn
                late = self.abort
        if taken:
            wire.noise(peer, f"node {rank} is not a node of this run, or is connected already")
            sock.close()  # claimed: no eviction can reach it
            return None
        if late:
            conn.send({"abort": late})
        return conn, rank

    def _reader(self, sock: socket.socket, peer: str) -> None:
        admitted = self._admit(sock, peer)
        if admitted is None:
            return
        conn, rank = admitted
        sock.settimeout(self.timeout)
        while True:
            try:
                msg = conn.receive()
            except socket.timeout:  # silence: the node counts as lost
                msg = None
            if msg is None:
                break
            self.remember(rank, msg)
            if self.on_message is not None:
                self.on_message(rank, msg)
            if "done" in msg:  # a node reports for itself only
                reason = str(msg.get("reason") or "")[: wire.MAX_TEXT]
                self.node_done(rank, str(msg.get("state")), reason)
        with self.lock:
            if self.conns.get(rank) is conn:
                del self.conns[rank]
        sock.close()
        if rank not in self.done:
            self.node_done(rank, "lost", f"{self.name(rank)} went silent or lost its supervisor")

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.interval)
            with self.lock:
                conns = list(self.conns.values())
            for conn in conns:
                conn.send({"hb": 0})

    def node_done(self, rank: int, state: Optional[str], reason: str) -> None:
        with self.lock:
            if rank in self.done:
                return
            self.done[rank] = (state, reason)
        if state != SUCCEEDED:
            why = f"{self.name(rank)} {state}"
            self.broadcast_abort(why + (": " + reason if reason else ""))

    def broadcast_abort(self, reason: str) -> None:
        self._set_abort(reason)
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            conn.send({"abort": reason[: wire.MAX_TEXT]})

    def links(self) -> list[wire.Conn]:
        with self.lock:
            return list(self.conns.values())

    def all_done(self) -> bool:
        with self.lock:
            return len(self.done) >= self.nnodes

    def report(self, state: str, reason: str) -> None:
        self.node_done(0, state, reason)

    def wait_others(self) -> None:
        """Stay up (relaying aborts) until every node has reported, then say goodbye."""
        while not self.all_done():
            with self.lock:
                live = bool(self.conns)
            if not live and self.abort is not None:
                return
            time.sleep(0.05)
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            conn.send({"bye": 0})


class Spoke(Peers):
    """A node other than 0: one connection to the hub, heartbeats both ways."""

    def __init__(self, spec: SpecRecord, key: Optional[bytes] = None) -> None:
        super().__init__(spec, key)
        self.conn: Optional[wire.Conn] = None
        self.connected = threading.Event()  # set once connected, or given up

    def start(self) -> None:
        threading.Thread(target=self._client, daemon=True).start()

    def _connect(self) -> Optional[wire.Conn]:
        """An authenticated connection to this run's hub; None (and the abort set) when
        there is none in time, or the port is held by something that is not it."""
        where = f"{self.addr}:{self.port}"
        deadline = time.time() + self.timeout * 2
        while time.time() < deadline and self.abort is None:
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

    def _client(self) -> None:
        conn = self._connect()
        self.conn = conn
        self.connected.set()
        if conn is None:
            return
        conn.send({"hb": self.rank})
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
            if "abort" in msg:
                self._set_abort(str(msg["abort"])[: wire.MAX_TEXT])
            if "hang" in msg and self.on_hang is not None:
                self.on_hang(str(msg["hang"]), str(msg.get("reason")), str(msg.get("action")))
            if self.on_message is not None:
                self.on_message(0, msg)
            if "bye" in msg:
                return  # node 0 is done and leaves; nothing is lost
        self._set_abort(f"lost the connection to {self.name(0)} (its host or supervisor is gone)")

    def _heartbeat(self, conn: wire.Conn) -> None:
        while conn.send(self._beat()):
            time.sleep(self.interval)

    def _beat(self) -> dict[str, Any]:
        if self.watch_facts is None:
            return {"hb": self.rank}
        return {"hb": self.rank, "w": self.watch_facts()}

    def tell_hub(self, msg: dict[str, Any]) -> None:
        if self.conn is not None:
            self.conn.send(msg)

    def settle(self) -> str:
        """Wait for the connection to node 0's supervisor (a node that ended at once is
        still connecting); what this node's record must say when there is none."""
        self.connected.wait(self.timeout * 2 + CONNECT_SLACK)
        if self.conn is not None:
            return ""
        return (
            f"never reached node 0's supervisor at {self.addr}:{self.port}: this node ran "
            "without the supervisors watching each other (no other node's failure would "
            "have stopped it)"
        )

    def report(self, state: str, reason: str) -> None:
        self.connected.wait(self.timeout * 2)  # a node that ended at once: still connecting
        if self.conn is not None:
            done = {"done": self.rank, "state": state, "reason": reason[: wire.MAX_TEXT]}
            self.conn.send(done)


def peers_for(spec: SpecRecord, key: Optional[bytes]) -> Peers:
    """The hub for node 0, a spoke for the others, both holding the run's ``key``; nothing
    to watch for a single node."""
    peers = Peers(spec, key)
    if peers.nnodes <= 1 or not peers.addr or peers.port <= 0:
        return peers
    return Hub(spec, key) if peers.rank == 0 else Spoke(spec, key)
