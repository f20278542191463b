"""A payload more than one host needs (a ``--workdir`` archive, sync's uv), kept once on
each host and handed on from host to host, so that each byte leaves the coordinator once.

The kept copy is ``<workdir>/payloads/<sha256>``: whole and checked, or absent. It arrives
in a temporary file of an unguessable name beside it, is checked against the SHA-256 the
coordinator computed, and only then renamed into place; a transfer cut short, a copy that
fails its check or a full disk leave only that temporary file's removal behind. The newest
``KEEP`` copies stay, so the next launch of the same code sends nothing.

The launch session (``host_session.py``) takes these questions before the go:

    payload-have {"workdir", "sha256", "size"}  -> {"have": bool, "bad": why a kept copy
        that failed its check was removed}
    payload-take {"workdir", "sha256", "size"}, then exactly size bytes on stdin: the copy
        from the coordinator -> {"ok": true} or {"error", "nospace": bool}
    payload-pull {"workdir", "sha256", "size", "addr", "port", "key", "run", "rank",
        "source", "timeout"}: the copy from another host's server -> {"ok", "received"} or
        {"error", "nospace"}
    payload-serve {"workdir", "sha256", "key", "run", "timeout"}: hand the kept copy to the
        hosts of this run that ask (-> {"port", "pid"})
    payload-unserve {}: stop serving

Run as a call of its own (``main``: ``sync``'s uv, a command that starts nothing), it is a
session that answers these questions alone: the lines both ways are ``session_messages``'s,
as ``host_session.py``'s (``clock`` first, then an ``answer`` to each ``ask``); EOF ends it,
its servers with it. It ships a quarter of the launch session's code.

A server is a process of its own, forked off the session (``host_share.Server``: the
supervisors' handshake with the run's key, then the raw bytes, checked by the receiver), so
a server that dies costs its receivers a retry, never the session; it ends when told, when
the session ends or at the go, and after its ``timeout`` in any case.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import socket
import sys
import time
from typing import IO, Any, Dict

from sshddp.protocol import session_messages
from sshddp.remote import hostpath
from sshddp.remote.common import os_error_said
from sshddp.remote.node import host_share, wire
from sshddp.remote.workdir import make_workdir

FOLDER = "payloads"  #: under the workdir: the kept copies, by SHA-256
KEEP = 3  #: kept copies a host keeps (the newest)
STALE = 3600.0  #: seconds after which a temporary file there is a dead transfer's
CHUNK = host_share.CHUNK
Answer = Dict[str, Any]
_SERVERS: list[int] = []  #: the pids of this session's servers


def main(args: dict[str, Any]) -> None:
    """The session of a command that only hands payloads on."""
    _say(session_messages.clock(time.time()))
    try:
        order = session_messages.decode_order(sys.stdin.buffer.readline())
        while order is not None and order["kind"] == "ask":
            said = answer(order["ask"], order["args"], sys.stdin.buffer)
            _say(session_messages.answer(order["ask"], said))
            order = session_messages.decode_order(sys.stdin.buffer.readline())
    finally:
        stop_all()


def _say(message: session_messages.Reply) -> None:
    sys.stdout.write(session_messages.encode(message).decode("utf-8"))
    sys.stdout.flush()


def kept(workdir: str, sha256: str) -> str:
    """Where the kept copy of ``sha256`` is (its folder made, or checked: ours alone)."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a SHA-256: {sha256!r}")
    root = make_workdir(workdir)
    folder = hostpath.private_dirs(root, FOLDER, "the payloads directory")
    return os.path.join(folder, sha256)


def answer(question: str, args: dict[str, Any], stream: IO[bytes]) -> Answer:
    """The session's answer to ``payload-*`` question ``question``."""
    try:
        if question == "payload-take":
            return take(args, stream)
        if question == "payload-have":
            return have(args)
        if question == "payload-pull":
            return pull(args)
        if question == "payload-serve":
            return serve(args)
        if question == "payload-unserve":
            return {"stopped": stop_all()}
    except (OSError, ValueError, hostpath.Unsafe, wire.Refused) as exc:
        return _failed(exc, str(args.get("workdir") or ""))
    return {"error": f"unknown question {question!r}"}


def _failed(exc: BaseException, where: str) -> Answer:
    """The answer for ``exc``: a full disk is named, with what is free there."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return {"error": os_error_said(exc, where), "nospace": True}
    return {"error": str(exc), "nospace": False}


def whole(path: str, sha256: str, size: int) -> bool:
    """Whether ``path`` is a kept copy of ours of ``size`` bytes whose SHA-256 is
    ``sha256``; False when it is missing."""
    try:
        hostpath.check_file(path, "the kept payload")
    except FileNotFoundError:
        return False
    if os.lstat(path).st_size != size:
        return False
    return _digest(path) == sha256


def _digest(path: str) -> str:
    sha = hashlib.sha256()
    with hostpath.open_read(path, "the kept payload") as fh:
        for data in iter(lambda: fh.read(CHUNK), b""):
            sha.update(data)
    return sha.hexdigest()


def have(args: dict[str, Any]) -> Answer:
    """Whether this host keeps the copy already; one that fails its check is removed."""
    path = kept(args["workdir"], args["sha256"])
    if whole(path, args["sha256"], int(args["size"])):
        os.utime(path, follow_symlinks=False)  # the newest: pruning keeps it
        return {"have": True}
    if not os.path.lexists(path):
        return {"have": False}
    os.unlink(path)
    bad = f"its kept copy {path} failed its SHA-256 check (changed or cut short): removed"
    return {"have": False, "bad": bad}


def take(args: dict[str, Any], stream: IO[bytes]) -> Answer:
    """The copy from ``stream`` (exactly ``size`` bytes, all read whatever happens, so the
    session's stdin stays in step), kept once its SHA-256 is the coordinator's."""
    size, left = int(args["size"]), int(args["size"])
    path = kept(args["workdir"], args["sha256"])
    fd, tmp = hostpath.temp_file(os.path.dirname(path), ".take-")
    sha = hashlib.sha256()
    problem: Any = None
    try:
        with os.fdopen(fd, "wb", buffering=0) as fh:
            while left > 0:
                data = stream.read(min(CHUNK, left))
                if not data:
                    raise OSError(f"the copy was cut short ({size - left} of {size} bytes)")
                left -= len(data)
                if problem is None:
                    problem = _write(fh, data)
                    sha.update(data)
        if problem is not None:
            return _failed(problem, path)
        if sha.hexdigest() != args["sha256"]:
            raise OSError(f"the copy arrived with SHA-256 {sha.hexdigest()}: refused")
        hostpath.rename(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    prune(os.path.dirname(path))
    return {"ok": True}


def _write(fh: Any, data: bytes) -> Any:
    """None once ``data`` is written, else the OSError (a full disk) that stopped it."""
    view = memoryview(data)
    try:
        while view:
            view = view[fh.write(view) :]
    except OSError as exc:
        return exc
    return None


def pull(args: dict[str, Any]) -> Answer:
    """The copy from the server of another host (``source``), checked, then kept."""
    sha, size = str(args["sha256"]), int(args["size"])
    path = kept(args["workdir"], sha)
    if whole(path, sha, size):  # hosts that share a disk: another one brought it
        return {"ok": True, "received": 0}
    files = [{"path": sha, "size": size, "sha256": sha}]
    got = host_share.pull(dict(args, cwd=os.path.dirname(path), files=files))
    prune(os.path.dirname(path))
    return got


def serve(args: dict[str, Any]) -> Answer:
    """Fork a server of the kept copy: its port and pid."""
    path = kept(args["workdir"], args["sha256"])
    hostpath.check_file(path, "the kept payload")
    sock, why = wire.listen("", 0)
    if sock is None:
        raise OSError(f"cannot listen to hand on the payload: {why}")
    port = int(sock.getsockname()[1])
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _server(sock, path, args, parent)  # never returns
    sock.close()
    _SERVERS.append(pid)
    return {"port": port, "pid": pid}


def _server(sock: socket.socket, path: str, args: dict[str, Any], parent: int) -> None:
    """The forked server: off the session's stdin and stdout, every other descriptor but
    its socket closed (the probe's reserved ports among them); it serves until killed, until
    the session is gone, or until its timeout."""
    try:
        _quiet(sock.fileno())
        order = {"cwd": os.path.dirname(path), "paths": [os.path.basename(path)]}
        order.update(key=args["key"], run=args["run"], timeout=args["timeout"])
        server = host_share.Server(order, sock)
        deadline = time.time() + float(args["timeout"])
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


def stop_all() -> int:
    """Stop this session's servers (each waited for): how many there were."""
    count = 0
    while _SERVERS:
        pid = _SERVERS.pop()
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


def prune(folder: str) -> None:
    """Keep the newest KEEP copies in ``folder``; remove dead transfers' temporary files."""
    copies: list[tuple[float, str]] = []
    now = time.time()
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            continue
        if name.startswith("."):
            if now - mtime > STALE:
                _remove(path)
        else:
            copies.append((mtime, path))
    for _, path in sorted(copies, reverse=True)[KEEP:]:
        _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
