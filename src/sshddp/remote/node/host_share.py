"""``--share`` on a host: what its working directory holds, and node 0's copy of a shared
file handed to the nodes that lack it, between staging and the start.

``look`` answers in the stage answer: the working directory's top-level files (names and
sizes, sorted, at most ``cap``) and each shared path's size and SHA-256. Then, only where a
node lacks node 0's version, the launch session (``host_session.py``) takes these orders:

    {"ask": "serve", "cwd", "paths", "port", "addr", "run", "key", "timeout"}  node 0: listen on the
        rendezvous port (proven reachable by the preflight, free until torchrun starts)
    {"ask": "pull", "cwd", "files": [{"path", "size", "sha256"}], "addr", "port", "run",
        "rank", "key", "timeout"}  another node: fetch each file from node 0
    {"ask": "relay", "cwd", "paths", "run", "key", "timeout"}  a node that holds node 0's
        version of every path (checked as it arrived): hand them on to the nodes below it
        in the tree, from its own files, on a port of its own (-> {"port", "pid"})
    {"ask": "unserve"}  node 0: stop listening; the answer counts what was sent (a relay:
        its server stops)

Connections open with the supervisors' handshake (``wire.py``: both sides prove they hold
the run's key, which came on the session's stdin); node 0 serves only the shared paths.
The bytes themselves travel raw and are checked by the receiver against the digest node 0
reported over SSH, then renamed over the old file: a node never holds half a file. A relay
serves the files it holds in place (no second copy on its disk); its server is a process of
its own (``fork_server``), so one that dies costs its receivers a retry from node 0, never
the node's session.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import stat
import threading
import time
from typing import Any, Dict, Iterator, Optional

from sshddp.remote import hostpath
from sshddp.remote.node import wire

CHUNK = 1 << 20  #: bytes hashed, read or sent at a time
CONNECT_TIMEOUT = 2.0  #: seconds one connect attempt waits
RESOLVE_WAIT = 10.0  #: seconds a name that the resolver cannot answer for yet is retried
#: seconds a relay's server lives at most (a net only: the start or the session's end stops
#: it first); a many-GB checkpoint to its children may take minutes
RELAY_LIFETIME = 3600.0
Answer = Dict[str, Any]


def look(args: dict[str, Any]) -> Answer:
    """What the working directory ``args["cwd"]`` holds: {"files": [[name, size], ...],
    "more": bool (the listing stopped at ``args["cap"]``), "share": {path: {"size",
    "sha256"}, or {"error"}, or None where missing}}."""
    cwd = os.path.expanduser(args["cwd"])
    files: list[list[Any]] = []
    more = False
    if args.get("list"):
        files, more = _listing(cwd, int(args["cap"]))
    shares = {path: digest(os.path.join(cwd, path)) for path in args.get("share") or ()}
    return {"files": files, "more": more, "share": shares}


def _listing(cwd: str, cap: int) -> tuple[list[list[Any]], bool]:
    try:
        with os.scandir(cwd) as it:
            entries = sorted(
                (e for e in it if not e.name.startswith(".") and _is_file(e)),
                key=lambda e: e.name,
            )
    except OSError:  # no working directory yet: nothing to compare
        return [], False
    listed: list[list[Any]] = []
    for entry in entries[:cap]:
        try:
            listed.append([entry.name, entry.stat().st_size])
        except OSError:
            pass
    return listed, len(entries) > cap


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def digest(path: str) -> Optional[Answer]:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
            return {"error": "it is not a file (--share takes files)"}
        sha = hashlib.sha256()
        size = 0
        with open(path, "rb") as fh:
            for data in iter(lambda: fh.read(CHUNK), b""):
                sha.update(data)
                size += len(data)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return {"error": f"cannot read it: {exc.strerror}"}
    return {"size": size, "sha256": sha.hexdigest()}


class Shares:
    """A launch session's orders between staging and the start."""

    def __init__(self) -> None:
        self.server: Optional[Server] = None
        self.relays: list[int] = []  #: the pids of this node's relay servers

    def __enter__(self) -> Shares:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
        stop_servers(self.relays)

    def answer(self, order: dict[str, Any]) -> Answer:
        ask = order.get("ask")
        try:
            if ask == "serve":
                self.server = Server(order)
                return {"serving": True}
            if ask == "relay":
                return self._relay(order)
            if ask == "unserve":
                stop_servers(self.relays)
                return self.server.stop() if self.server else {"sent": 0, "files": 0}
            if ask == "pull":
                return pull(order)
        except (OSError, wire.Refused, ValueError, hostpath.Unsafe) as exc:
            return {"error": str(exc)}
        return {"error": f"unknown question {ask!r}"}

    def _relay(self, order: dict[str, Any]) -> Answer:
        cwd = os.path.expanduser(order["cwd"])
        for path in order["paths"]:
            hostpath.check_file(os.path.join(cwd, path), "a --share file to hand on")
        sock, why = wire.listen("", 0)
        if sock is None:
            raise OSError(f"cannot listen to hand on the shared files: {why}")
        port = int(sock.getsockname()[1])
        self.relays.append(fork_server(dict(order, cwd=cwd, lifetime=RELAY_LIFETIME), sock))
        return {"port": port, "pid": self.relays[-1]}


def fork_server(order: dict[str, Any], sock: socket.socket) -> int:
    """A ``Server`` of ``order["paths"]`` under ``order["cwd"]`` on ``sock`` (listening),
    in a process forked off this session: its pid. ``sock`` is closed here."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _forked(order, sock, parent)  # never returns
    sock.close()
    return pid


def _forked(order: dict[str, Any], sock: socket.socket, parent: int) -> None:
    """The forked server: off the session's stdin and stdout, every other descriptor but
    its socket closed (the probe's reserved ports among them); it serves until killed, until
    the session is gone, or until its ``lifetime`` (else its ``timeout``)."""
    try:
        _quiet(sock.fileno())
        server = Server(order, sock)
        deadline = time.time() + float(order.get("lifetime") or order["timeout"])
        while os.getppid() == parent and time.time() < deadline:
            time.sleep(0.2)
        server.stop()
    finally:
        os._exit(0)


def _quiet(keep: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        if name.isdigit() and int(name) > 2 and int(name) != keep:
            try:
                os.close(int(name))
            except OSError:
                pass


def stop_servers(pids: list[int]) -> int:
    """Stop the forked servers ``pids`` (each waited for, the list emptied): how many."""
    count = 0
    while pids:
        pid = pids.pop()
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        count += 1
    return count


class Server:
    """Node 0: the shared files, to every node of this run that asks (threads, one each)."""

    def __init__(self, order: dict[str, Any], sock: Optional[socket.socket] = None) -> None:
        """``sock``: a socket listening already (else one on ``order``'s addr and port)."""
        self.cwd = os.path.expanduser(order["cwd"])
        self.paths = set(order["paths"])
        self.key = bytes.fromhex(order["key"])
        self.run = str(order["run"])
        self.timeout = float(order["timeout"])
        self.sent = 0
        self.files = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.sock = sock or _listen(order.get("addr") or "", int(order["port"]))
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.sock.accept()
            except OSError:  # closed by stop()
                return
            thread = threading.Thread(target=self._serve, args=(sock, addr), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, addr: Any) -> None:
        try:
            conn, _ = wire.offer(sock, self.key, self.run, f"{addr[0]}:{addr[1]}")
            sock.settimeout(self.timeout)
            while True:
                want = conn.receive()
                if want is None or want.get("want") not in self.paths:
                    break  # done (EOF: the receiver closes first), or not ours to give
                self._send(conn, sock, str(want["want"]))
        except (OSError, wire.Refused):
            pass
        finally:
            sock.close()

    def _send(self, conn: wire.Conn, sock: socket.socket, path: str) -> None:
        with open(os.path.join(self.cwd, path), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            conn.send({"size": size})
            left = size
            while left > 0:
                data = fh.read(min(CHUNK, left))
                if not data:
                    raise OSError(f"{path} shrank while it was sent")
                sock.sendall(data)
                left -= len(data)
        with self.lock:
            self.sent += size
            self.files += 1

    def stop(self) -> Answer:
        """Stop listening once every receiver is done: what was sent."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.acceptor.join(5)
        for thread in list(self.threads):
            thread.join(5)
        return {"sent": self.sent, "files": self.files}


def _listen(addr: str, port: int) -> socket.socket:
    sock, why = wire.listen(addr, port)
    if sock is None:
        raise OSError(f"node 0 cannot listen on port {port} to hand on the shared files: {why}")
    return sock


def pull(order: dict[str, Any]) -> Answer:
    """Fetch each of ``order["files"]`` from node 0, check its digest and put it in place;
    {"ok": true, "received": bytes} or {"error"}."""
    cwd = os.path.expanduser(order["cwd"])
    where = f"{order['addr']}:{order['port']}"
    who = str(order.get("source") or "node 0")
    waits = float(order.get("connect_timeout") or order["timeout"])  # it may not listen yet
    sock = _connect(order["addr"], int(order["port"]), waits, who)
    received = 0
    try:
        conn = wire.join(sock, bytes.fromhex(order["key"]), order["run"], order["rank"], where)
        sock.settimeout(float(order["timeout"]))
        for item in order["files"]:
            conn.send({"want": item["path"]})
            header = conn.receive()
            if header is None or not isinstance(header.get("size"), int):
                raise OSError(f"{who} ({where}) did not send {item['path']}")
            _store(conn.lines, cwd, item, header["size"], who)
            received += header["size"]
    finally:
        sock.close()  # first: the wait in TIME_WAIT is ours, not node 0's rendezvous port's
    return {"ok": True, "received": received}


def _connect(addr: str, port: int, timeout: float, who: str = "node 0") -> socket.socket:
    """A connection to ``who``'s server, retried until ``timeout`` (it may not listen yet);
    a name this host cannot resolve fails at once (a resolver that cannot answer, within
    RESOLVE_WAIT): waiting would not change the answer."""
    deadline = time.time() + timeout
    resolving = time.time() + min(timeout, RESOLVE_WAIT)
    while True:
        try:
            return socket.create_connection((addr, port), timeout=CONNECT_TIMEOUT)
        except socket.gaierror as exc:
            if exc.errno == socket.EAI_AGAIN and time.time() <= resolving:
                time.sleep(0.1)  # the resolver is busy or unreachable for now
                continue
            raise OSError(
                f"cannot resolve {addr}, the name of {who}, on this host ({exc.strerror}): "
                f"give {who} an `addr:` in the inventory that this host can reach"
            ) from exc
        except OSError as exc:
            if time.time() > deadline:
                raise OSError(f"cannot reach {who} at {addr}:{port}: {exc}") from exc
            time.sleep(0.1)


def _store(
    lines: wire.Lines, cwd: str, item: dict[str, Any], size: int, who: str = "node 0"
) -> None:
    """``size`` raw bytes from ``lines`` into a new temporary file (``O_EXCL``, an
    unguessable name) beside the target, then, if they are node 0's version, renamed over
    it. A target directory others may write to (unless sticky and ours) is refused."""
    target = os.path.join(cwd, item["path"])
    os.makedirs(os.path.dirname(target) or cwd, 0o700, exist_ok=True)
    try:
        folder = hostpath.target_dir(os.path.dirname(target) or cwd, "--share target directory")
    except hostpath.Unsafe as exc:
        raise OSError(str(exc)) from None
    name = os.path.basename(target)
    fd, tmp = hostpath.temp_file(folder, f".{name}.sshddp-share-")
    sha = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as fh:
            for data in _raw(lines, size, who):
                sha.update(data)
                fh.write(data)
        if sha.hexdigest() != item["sha256"]:
            raise OSError(
                f"{item['path']} arrived from {who} with SHA-256 {sha.hexdigest()}, not "
                f"{item['sha256']} (did it change on {who} meanwhile?): refused"
            )
        hostpath.rename(tmp, os.path.join(folder, name))
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _raw(lines: wire.Lines, size: int, who: str = "node 0") -> Iterator[bytes]:
    """``size`` bytes after the last line read: what ``lines`` holds already, then more."""
    left = size
    if lines.buf:
        data, lines.buf = lines.buf[:left], lines.buf[left:]
        left -= len(data)
        yield data
    while left > 0:
        data = lines.sock.recv(min(CHUNK, left))
        if not data:
            raise OSError(f"{who} closed the connection {left} bytes short")
        left -= len(data)
        yield data
