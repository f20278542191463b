"""The supervisors of one run watch each other, so a run needs no laptop to stop.

Node 0's supervisor is the ``Hub``: it listens on the rendezvous port + 1. Every other
node's supervisor is a ``Spoke`` holding one TCP connection to it, and both sides send a
heartbeat line every interval. A node whose run ends other than "succeeded", a connection
that drops before its node said it was done (its supervisor was killed: the kernel closes
the socket), or silence longer than the timeout (host powered off, network cut): the hub
broadcasts an abort and every supervisor stops its node. JSON lines: {"hb": r},
{"done": r, "state": s, "reason": t}, {"abort": reason}, {"bye": 0}.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Iterator, Optional

from sshddp.remote.contract import SUCCEEDED, SpecRecord


class Peers:
    """This node's view of the others. The base class serves a run of one node, or one
    with no hub address: there is no one to watch, and every call does nothing."""

    def __init__(self, spec: SpecRecord) -> None:
        conf: dict[str, Any] = dict(spec.get("peers") or {})
        self.rank = int(spec["node_rank"])
        self.nnodes = int(conf.get("nnodes", 1))
        self.addr = str(conf.get("addr") or "")
        self.port = int(conf.get("port", 0))
        self.timeout = float(conf.get("timeout", 30))
        self.interval = min(1.0, self.timeout / 5.0)
        self.names = list(conf.get("hosts") or [])
        self.abort: Optional[str] = None  # set once: why this node must stop
        self.on_abort: Optional[Callable[[], None]] = None  # wakes the supervisor's loop
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

    def _set_abort(self, reason: str) -> None:
        with self.lock:
            if self.abort is None:
                self.abort = reason
        if self.on_abort is not None:
            self.on_abort()

    def _send(self, sock: socket.socket, obj: dict[str, Any]) -> bool:
        try:
            sock.sendall((json.dumps(obj) + "\n").encode())
            return True
        except OSError:
            return False

    def _lines(
        self, sock: socket.socket, on_silence: Callable[[], None]
    ) -> Iterator[dict[str, Any]]:
        """Yield JSON messages; calls on_silence() and stops when nothing came in time."""
        sock.settimeout(self.timeout)
        buf = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                on_silence()
                return
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line.decode())
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    yield msg


class Hub(Peers):
    """Node 0: every other supervisor connects here; an abort goes out to all of them."""

    def __init__(self, spec: SpecRecord) -> None:
        super().__init__(spec)
        self.done: dict[int, tuple[Optional[str], str]] = {}  # rank -> (state, reason)
        self.conns: dict[int, socket.socket] = {}

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
            conn, _ = srv.accept()
            threading.Thread(target=self._reader, args=(conn,), daemon=True).start()

    def _deadline(self) -> None:
        time.sleep(self.timeout * 2)  # every node must have checked in by then
        with self.lock:
            missing = [
                r for r in range(1, self.nnodes) if r not in self.conns and r not in self.done
            ]
        if missing:
            names = ", ".join(self.name(r) for r in missing)
            self.broadcast_abort(f"{names} never reached node 0's supervisor")

    def _reader(self, conn: socket.socket) -> None:
        rank: Optional[int] = None
        for msg in self._lines(conn, lambda: None):
            if "hb" in msg and rank is None:
                rank = int(msg["hb"])
                with self.lock:
                    self.conns[rank] = conn
                    late = self.abort
                if late:
                    self._send(conn, {"abort": late})
            elif "done" in msg:
                self.node_done(int(msg["done"]), msg.get("state"), msg.get("reason", ""))
        with self.lock:
            if rank is not None and self.conns.get(rank) is conn:
                del self.conns[rank]
        if rank is not None and rank not in self.done:
            self.node_done(rank, "lost", f"{self.name(rank)} went silent or lost its supervisor")

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.interval)
            with self.lock:
                conns = list(self.conns.values())
            for conn in conns:
                self._send(conn, {"hb": 0})

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
            self._send(conn, {"abort": reason})

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
            self._send(conn, {"bye": 0})


class Spoke(Peers):
    """A node other than 0: one connection to the hub, heartbeats both ways."""

    def __init__(self, spec: SpecRecord) -> None:
        super().__init__(spec)
        self.sock: Optional[socket.socket] = None

    def start(self) -> None:
        threading.Thread(target=self._client, daemon=True).start()

    def _connect(self) -> Optional[socket.socket]:
        deadline = time.time() + self.timeout * 2
        while time.time() < deadline and self.abort is None:
            try:
                return socket.create_connection((self.addr, self.port), timeout=2)
            except OSError:
                time.sleep(0.2)
        return None

    def _client(self) -> None:
        sock = self._connect()
        if sock is None:
            self._set_abort(f"cannot reach node 0's supervisor at {self.addr}:{self.port}")
            return
        self.sock = sock
        self._send(sock, {"hb": self.rank})
        threading.Thread(target=self._heartbeat, args=(sock,), daemon=True).start()

        def silent() -> None:
            self._set_abort(f"{self.name(0)} went silent for {self.timeout:.0f} s")

        for msg in self._lines(sock, silent):
            if "abort" in msg:
                self._set_abort(str(msg["abort"]))
            if "bye" in msg:
                return  # node 0 is done and leaves; nothing is lost
        self._set_abort(f"lost the connection to {self.name(0)} (its host or supervisor is gone)")

    def _heartbeat(self, sock: socket.socket) -> None:
        while self._send(sock, {"hb": self.rank}):
            time.sleep(self.interval)

    def report(self, state: str, reason: str) -> None:
        if self.sock is not None:
            self._send(self.sock, {"done": self.rank, "state": state, "reason": reason})


def peers_for(spec: SpecRecord) -> Peers:
    """The hub for node 0, a spoke for the others; nothing to watch for a single node."""
    peers = Peers(spec)
    if peers.nnodes <= 1 or not peers.addr or peers.port <= 0:
        return peers
    return Hub(spec) if peers.rank == 0 else Spoke(spec)
