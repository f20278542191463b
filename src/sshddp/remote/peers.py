# peers: the supervisors of one run watch each other, so a run needs no laptop to stop.
# Node 0's supervisor is the hub: it listens on the rendezvous port + 1. Every other node's
# supervisor holds one TCP connection to it and both sides send a heartbeat line every
# interval. A node whose run ends other than "succeeded", a connection that drops before
# its node said it was done (its supervisor was killed: the kernel closes the socket), or
# silence longer than the timeout (host powered off, network cut): the hub broadcasts an
# abort and every supervisor stops its node. JSON lines: {"hb": r}, {"done": r, "state": s,
# "reason": t}, {"abort": reason}.
import socket
import threading


class Peers(object):
    def __init__(self, spec):
        conf = spec.get("peers") or {}
        self.rank = spec["node_rank"]
        self.nnodes = int(conf.get("nnodes", 1))
        self.addr = conf.get("addr")
        self.port = int(conf.get("port", 0))
        self.timeout = float(conf.get("timeout", 30))
        self.interval = min(1.0, self.timeout / 5.0)
        self.names = conf.get("hosts") or []
        self.abort = None  # set once: why this node must stop
        self.on_abort = None  # called once abort is set (wakes the supervisor's loop)
        self.done = {}  # hub: rank -> (state, reason)
        self.lock = threading.Lock()
        self.conns = {}  # hub: rank -> socket
        self.sock = None  # peer: socket to the hub
        self.enabled = self.nnodes > 1 and bool(self.addr) and self.port > 0

    def name(self, rank):
        host = self.names[rank] if rank < len(self.names) else "?"
        return "node %d (%s)" % (rank, host)

    def start(self):
        if not self.enabled:
            return
        target = self._serve if self.rank == 0 else self._client
        threading.Thread(target=target, daemon=True).start()

    # -------------------------------------------------------------- both sides

    def _send(self, sock, obj):
        try:
            sock.sendall((json.dumps(obj) + "\n").encode())
            return True
        except OSError:
            return False

    def _lines(self, sock, on_silence):
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
                    yield json.loads(line.decode())
                except ValueError:
                    continue

    def _set_abort(self, reason):
        with self.lock:
            if self.abort is None:
                self.abort = reason
        if self.on_abort is not None:
            self.on_abort()

    # -------------------------------------------------------------- hub (node 0)

    def _listen(self):
        for host in (self.addr, ""):
            s = socket.socket(socket.AF_INET6 if ":" in (host or "") else socket.AF_INET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, self.port))
                s.listen(256)
                return s
            except OSError:
                s.close()
        return None

    def _serve(self):
        srv = self._listen()
        if srv is None:
            self._set_abort("cannot listen on port %d for the other nodes' supervisors" % self.port)
            return
        threading.Thread(target=self._hub_heartbeat, daemon=True).start()
        threading.Thread(target=self._hub_deadline, daemon=True).start()
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self._hub_reader, args=(conn,), daemon=True).start()

    def _hub_deadline(self):
        time.sleep(self.timeout * 2)  # every node must have checked in by then
        with self.lock:
            missing = [
                r for r in range(1, self.nnodes) if r not in self.conns and r not in self.done
            ]
        if missing:
            self.broadcast_abort(
                "%s never reached node 0's supervisor" % ", ".join(self.name(r) for r in missing)
            )

    def _hub_reader(self, conn):
        rank = None
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
            self.node_done(rank, "lost", "%s went silent or lost its supervisor" % self.name(rank))

    def _hub_heartbeat(self):
        while True:
            time.sleep(self.interval)
            with self.lock:
                conns = list(self.conns.values())
            for conn in conns:
                self._send(conn, {"hb": 0})

    def node_done(self, rank, state, reason):
        with self.lock:
            if rank in self.done:
                return
            self.done[rank] = (state, reason)
        if state != "succeeded":
            why = "%s %s" % (self.name(rank), state)
            self.broadcast_abort(why + (": " + reason if reason else ""))

    def broadcast_abort(self, reason):
        self._set_abort(reason)
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            self._send(conn, {"abort": reason})

    def all_done(self):
        with self.lock:
            return len(self.done) >= self.nnodes

    # -------------------------------------------------------------- peer (node > 0)

    def _connect(self):
        deadline = time.time() + self.timeout * 2
        while time.time() < deadline and self.abort is None:
            try:
                return socket.create_connection((self.addr, self.port), timeout=2)
            except OSError:
                time.sleep(0.2)
        return None

    def _client(self):
        sock = self._connect()
        if sock is None:
            self._set_abort("cannot reach node 0's supervisor at %s:%d" % (self.addr, self.port))
            return
        self.sock = sock
        self._send(sock, {"hb": self.rank})
        threading.Thread(target=self._peer_heartbeat, args=(sock,), daemon=True).start()

        def silent():
            return self._set_abort("%s went silent for %.0f s" % (self.name(0), self.timeout))

        for msg in self._lines(sock, silent):
            if "abort" in msg:
                self._set_abort(msg["abort"])
            if "bye" in msg:
                return  # node 0 is done and leaves; nothing is lost
        self._set_abort("lost the connection to %s (its host or supervisor is gone)" % self.name(0))

    def _peer_heartbeat(self, sock):
        while self._send(sock, {"hb": self.rank}):
            time.sleep(self.interval)

    # -------------------------------------------------------------- this node's end

    def report(self, state, reason):
        """Tell the others how this node ended (the hub records its own)."""
        if not self.enabled:
            return
        if self.rank == 0:
            self.node_done(0, state, reason)
        elif self.sock is not None:
            self._send(self.sock, {"done": self.rank, "state": state, "reason": reason})

    def wait_others(self):
        """Hub only: stay up (relaying aborts) until every node has reported."""
        if not self.enabled or self.rank != 0:
            return
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
