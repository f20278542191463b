"""The supervisors' wire: authenticated JSON lines on their TCP connections (port P + 1).

Each connection opens with a challenge-response, as SSH's public-key authentication and
Slurm's auth plugins (munge) do it: each side proves it holds the run's key (32 random bytes
the coordinator made for this run and sent to every host over the launch session's stdin)
with an HMAC-SHA256 over fresh nonces of both sides, the run id and the spoke's node rank.
The key never crosses this wire::

    hub   -> spoke  {"v": 1, "run": RUN, "nonce": NH}
    spoke -> hub    {"v": 1, "run": RUN, "rank": R, "nonce": NS, "mac": H(K, spoke RUN R NH NS)}
    hub   -> spoke  {"mac": H(K, hub RUN R NH NS)}

Then every line is ``MAC JSON``: the JSON carries the run id and a sequence number per
direction, and MAC is an HMAC-SHA256 over the direction and the JSON with a key of this
connection alone (H(K, session RUN R NH NS)), as SSH MACs each packet with its sequence
number: a line injected, replayed or reordered fails. A line is at most MAX_LINE bytes.
Whatever fails is noise: logged to the supervisor's log (at most MAX_NOISE_LOGS lines),
never obeyed. There is no encryption: nothing on this wire is secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

VERSION = 1
MAX_LINE = 8192  #: bytes in one line; a longer one is noise
MAX_TEXT = 2000  #: characters of a reason a message carries
HANDSHAKE_TIMEOUT = 10.0  #: seconds a new connection has for its whole handshake
MAX_NOISE_LOGS = 100  #: noise lines a supervisor logs; then it only counts them

Message = Dict[str, Any]
_noise = {"count": 0}
_noise_lock = threading.Lock()


class Refused(Exception):
    """The other side did not authenticate. ``retry``: it may be ours, not yet up."""

    def __init__(self, why: str, retry: bool = False) -> None:
        super().__init__(why)
        self.retry = retry


class TooLong(Exception):
    """A line longer than MAX_LINE."""


def noise(peer: str, why: str, data: bytes = b"") -> None:
    """Log what was ignored (shown escaped and cut short); only the first lines."""
    with _noise_lock:
        _noise["count"] += 1
        count = _noise["count"]
    if count > MAX_NOISE_LOGS + 1:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    if count > MAX_NOISE_LOGS:
        text = f"{stamp} sshddp peers: more noise; no longer logged"
    else:
        shown = f": {ascii(bytes(data[:120]))}" if data else ""
        text = f"{stamp} sshddp peers: ignored {ascii(peer)[1:-1]}: {why}{shown}"
    print(text, file=sys.stderr, flush=True)


def mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def _same(got: object, expected: str) -> bool:
    return isinstance(got, str) and hmac.compare_digest(got.encode(), expected.encode())


def time_left(deadline: float, now: float) -> float:
    """Seconds a read may wait before ``deadline`` (``time.monotonic``); socket.timeout once
    it has passed, however recently the last byte came: a stranger trickling a byte at a
    time cannot hold a handshake open past it."""
    left = deadline - now
    if left <= 0:
        raise socket.timeout("the handshake's deadline passed")
    return left


class Lines:
    """Lines from a socket, each at most MAX_LINE bytes."""

    def __init__(self, sock: socket.socket, deadline: Optional[float] = None) -> None:
        self.sock = sock
        self.buf = b""
        self.skipping = False  # inside a line that was too long: drop it to its end
        #: ``time.monotonic`` by which the next line must be whole (the handshake's); None:
        #: each read waits as long as the socket's own timeout
        self.deadline = deadline

    def line(self) -> Optional[bytes]:
        """The next line; None at EOF. Raises TooLong once per line that is too long,
        socket.timeout when nothing came in time, OSError when the connection broke."""
        while True:
            if b"\n" in self.buf:
                line, _, self.buf = self.buf.partition(b"\n")
                if self.skipping:
                    self.skipping = False
                    continue
                if len(line) > MAX_LINE:
                    raise TooLong()
                return line
            if len(self.buf) > MAX_LINE:
                self.buf = b""
                if not self.skipping:
                    self.skipping = True
                    raise TooLong()
            if self.deadline is not None:
                self.sock.settimeout(time_left(self.deadline, time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk


def _send(sock: socket.socket, obj: Message) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _receive(lines: Lines, what: str) -> Message:
    """One handshake message; Refused if there is none, or it is not a JSON object."""
    try:
        line = lines.line()
    except (TooLong, OSError) as exc:
        raise Refused(f"no {what} ({type(exc).__name__})", retry=True) from exc
    if line is None:
        raise Refused(f"the connection closed before its {what}", retry=True)
    try:
        msg = json.loads(line.decode("utf-8"))
    except ValueError:
        msg = None
    if not isinstance(msg, dict):
        raise Refused(f"its {what} is not a message of sshddp's: {ascii(line[:120])}", True)
    return msg


class Conn:
    """One authenticated connection: MACed, sequenced lines both ways."""

    def __init__(self, lines: Lines, key: bytes, run: str, out: str, peer: str) -> None:
        self.lines = lines
        self.key = key
        self.run = run
        self.out = out  #: the direction of our lines ("hub" or "spoke"); theirs is the other
        self.into = "spoke" if out == "hub" else "hub"
        self.peer = peer
        self.sent = 0
        self.received = 0
        self.lock = threading.Lock()

    def send(self, msg: Message) -> bool:
        """Send one message; False when the connection is gone."""
        with self.lock:
            body = json.dumps({"run": self.run, "seq": self.sent, **msg}, separators=(",", ":"))
            line = f"{mac(self.key, self.out, body)} {body}\n".encode()
            self.sent += 1
            try:
                self.lines.sock.sendall(line)
                return True
            except OSError:
                return False

    def receive(self) -> Optional[Message]:
        """The next authentic message; None when the connection ended. Noise is logged
        and skipped. Raises socket.timeout when nothing came in time."""
        while True:
            try:
                line = self.lines.line()
            except TooLong:
                noise(self.peer, f"a line over {MAX_LINE} bytes")
                continue
            except socket.timeout:
                raise
            except OSError:
                return None
            if line is None:
                return None
            msg = self._verify(line)
            if msg is not None:
                return msg

    def _verify(self, line: bytes) -> Optional[Message]:
        tag, _, body = line.partition(b" ")
        text = body.decode("utf-8", "replace")
        if not _same(tag.decode("ascii", "replace"), mac(self.key, self.into, text)):
            noise(self.peer, "a line without this connection's MAC", line)
            return None
        try:
            msg = json.loads(text)
        except ValueError:
            msg = None
        expected = {"run": self.run, "seq": self.received}
        if not isinstance(msg, dict) or {k: msg.get(k) for k in expected} != expected:
            noise(self.peer, "a line out of sequence (replayed?)", line)
            return None
        self.received += 1
        return dict(msg)


def offer(
    sock: socket.socket, key: bytes, run: str, peer: str, claim: Optional[Callable[[], bool]] = None
) -> tuple[Conn, int]:
    """The hub's side of the handshake: the connection and the spoke's node rank, or
    Refused saying why not. The whole handshake has HANDSHAKE_TIMEOUT seconds, not each
    read: a connection that trickles bytes is cut off at that deadline all the same.
    ``claim`` is asked once the spoke proved it holds the key, before the hub answers:
    False refuses it (the hub closed it meanwhile)."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    lines = Lines(sock, time.monotonic() + HANDSHAKE_TIMEOUT)
    ours = os.urandom(16).hex()
    try:
        _send(sock, {"v": VERSION, "run": run, "nonce": ours})
    except OSError as exc:
        raise Refused(f"the connection broke ({exc})") from exc
    hello = _receive(lines, "hello")
    rank, theirs = hello.get("rank"), hello.get("nonce")
    if hello.get("v") != VERSION or hello.get("run") != run:
        raise Refused(f"a hello for another run or version: {ascii(hello)[:200]}")
    if not isinstance(rank, int) or not isinstance(theirs, str) or not 16 <= len(theirs) <= 64:
        raise Refused(f"a malformed hello: {ascii(hello)[:200]}")
    parts = (run, str(rank), ours, theirs)
    if not _same(hello.get("mac"), mac(key, "spoke", *parts)):
        raise Refused(f"node {rank}'s hello does not prove it holds this run's key")
    if claim is not None and not claim():
        raise Refused(f"node {rank}'s connection was closed to make room for a newer one")
    try:
        _send(sock, {"mac": mac(key, "hub", *parts)})
    except OSError as exc:
        raise Refused(f"the connection broke ({exc})") from exc
    session = bytes.fromhex(mac(key, "session", *parts))
    lines.deadline = None  # authenticated: from now on the heartbeat timeout rules
    return Conn(lines, session, run, "hub", peer), rank


def join(sock: socket.socket, key: bytes, run: str, rank: int, peer: str) -> Conn:
    """A spoke's side of the handshake: the connection, or Refused saying why not
    (``retry`` when the other side may yet turn out to be this run's hub)."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    lines = Lines(sock, time.monotonic() + HANDSHAKE_TIMEOUT)
    challenge = _receive(lines, "challenge")
    theirs = challenge.get("nonce")
    if challenge.get("run") != run:
        other = ascii(challenge.get("run"))[:80]
        raise Refused(f"it belongs to another run ({other}), not to run {run}")
    if challenge.get("v") != VERSION or not isinstance(theirs, str) or len(theirs) > 64:
        raise Refused(f"a malformed challenge: {ascii(challenge)[:200]}", retry=True)
    ours = os.urandom(16).hex()
    parts = (run, str(rank), theirs, ours)
    hello = {"v": VERSION, "run": run, "rank": rank, "nonce": ours}
    try:
        _send(sock, {**hello, "mac": mac(key, "spoke", *parts)})
    except OSError as exc:
        raise Refused(f"the connection broke ({exc})", retry=True) from exc
    answer = _receive(lines, "answer")
    if not _same(answer.get("mac"), mac(key, "hub", *parts)):
        raise Refused("it did not prove it holds this run's key")
    session = bytes.fromhex(mac(key, "session", *parts))
    lines.deadline = None
    return Conn(lines, session, run, "spoke", peer)


def listen(addr: str, port: int) -> tuple[Optional[socket.socket], str]:
    """A socket listening on ``port`` of ``addr`` (else of every address; port 0: one the
    system picks), or None and why (the OS's words) it could not listen."""
    why = ""
    for host in (addr, ""):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(256)
            return s, ""
        except OSError as exc:
            why = exc.strerror or str(exc)
            s.close()
    return None, why
