"""``sshddp fetch``: copy back a file or directory that a run wrote on its nodes.

Each node's copy is streamed over its own SSH channel, in parallel with a bounded fan-out,
into ``DEST/node<K>-<host>/``: a file as itself, a directory as a tar stream unpacked on
arrival. The host sends the stream's size and SHA-256 at the end; the copy counts and hashes
what arrives, and only a copy that matches takes its place: until then it lives under a
temporary name in the same directory, so a cut transfer never leaves a half file behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from sshddp.errors import LocalWriteFailed, RemoteError, SshddpError, UsageError
from sshddp.hosts import calls
from sshddp.hosts.calls import FetchStream
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.plan import NodePlan
from sshddp.run.registry import RunRecord

TMP_PREFIX = ".sshddp-fetch-"


class Progress(Protocol):
    """Where transfer progress goes (a progress bar on a terminal, or nowhere)."""

    def begin(self, key: int, label: str, total: int) -> None: ...
    def advance(self, key: int, size: int) -> None: ...


class NoProgress:
    def begin(self, key: int, label: str, total: int) -> None:
        pass

    def advance(self, key: int, size: int) -> None:
        pass


@dataclass(frozen=True)
class NodeCopy:
    """What ``fetch`` did on one node: where the verified copy is, or why there is none."""

    node: NodePlan
    target: Optional[Path] = None  #: the local copy
    kind: str = ""  #: "file" or "dir"
    size: int = 0  #: bytes received and verified (a directory's as a tar stream)
    sha256: str = ""
    skipped: tuple[str, ...] = ()  #: names in a directory the host did not send
    skipped_count: int = 0
    error: Optional[SshddpError] = None


def node_dir(node: NodePlan) -> str:
    """``node<K>-<host>``, named like the node's local log."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node.host.host)
    return f"node{node.node_rank}-{safe}"


def check_dest(dest: Path) -> None:
    """DEST is a directory, or can be made one: say so before connecting anywhere."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"DEST {dest}: exists and is not a directory")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"DEST {dest}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(dest, os.W_OK | os.X_OK):
        raise UsageError(f"DEST {dest}: not writable")


def fetch(
    record: RunRecord,
    ssh: SshOptions,
    fanout: int,
    path: str,
    dest: Path,
    only: Optional[int],
    progress: Progress,
) -> list[NodeCopy]:
    """Copy ``path`` (relative to each node's working directory) from every node of the run,
    or only node ``only``, into ``dest``; one outcome per node, in node order."""
    check_dest(dest)
    nodes = [n for n in record.plan().nodes if only is None or n.node_rank == only]
    with HostPool([n.host for n in nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        reachable = [n for n in nodes if errors[n.index] is None]

        def copy(node: NodePlan) -> NodeCopy:
            stream = calls.fetch_path(pool.transport(node), node.rundir, node.cwd, path)
            try:
                return _receive(node, stream, dest / node_dir(node), progress)
            finally:
                stream.close()

        outcomes = pool.map(copy, reachable)
    copies = []
    for node in nodes:
        err, outcome = errors[node.index], outcomes.get(node.index)
        if err is not None:
            copies.append(NodeCopy(node, error=err))
        elif outcome is not None and outcome.value is not None:
            copies.append(outcome.value)
        else:
            copies.append(NodeCopy(node, error=_as_error(node, outcome.error if outcome else None)))
    return copies


def _as_error(node: NodePlan, exc: Optional[BaseException]) -> SshddpError:
    if isinstance(exc, SshddpError):
        return exc
    if isinstance(exc, OSError):  # reading from the host raises RemoteError: this is local
        return LocalWriteFailed(f"the copy from {node.host.host} could not be written: {exc}")
    return RemoteError(f"{node.host.host}: {type(exc).__name__}: {exc}")


class Received:
    """The stream as it arrives: counted, hashed and shown."""

    def __init__(self, stream: FetchStream, key: int, progress: Progress) -> None:
        self.stream = stream
        self.key = key
        self.progress = progress
        self.sha = hashlib.sha256()
        self.count = 0

    def read(self, n: int = 1 << 20) -> bytes:
        try:
            data = self.stream.read(n)
        except (OSError, EOFError) as exc:  # the connection, not the local disk
            raise RemoteError(f"the connection broke mid-copy: {exc}") from exc
        if data:
            self.sha.update(data)
            self.count += len(data)
            self.progress.advance(self.key, len(data))
        return data

    def drain(self) -> None:
        while self.read():
            pass


def _receive(node: NodePlan, stream: FetchStream, into: Path, progress: Progress) -> NodeCopy:
    header = stream.header
    host = node.host.host
    if not header.get("ok"):
        raise UsageError(f"{host}: {header.get('error', 'nothing to copy')}")
    name = str(header.get("name", ""))
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise RemoteError(f"{host}: refusing the name {name!r} for the copy")
    into.mkdir(parents=True, exist_ok=True)
    tmp = into / f"{TMP_PREFIX}{os.getpid()}-{name}"
    progress.begin(node.node_rank, f"{node_dir(node)}/{name}", int(header.get("size", 0)))
    received = Received(stream, node.node_rank, progress)
    try:
        damaged = _unpack(received, tmp, host) if header["kind"] == "dir" else _write(received, tmp)
        _verify(received, stream, host, header["path"])
        if damaged:  # the host's own archive is broken (it matched what was sent)
            raise RemoteError(f"{host}: the archive of {header['path']} is damaged: {damaged}")
        target = into / name
        _put(tmp, target)
    finally:
        _remove(tmp)
    return NodeCopy(
        node,
        target,
        header["kind"],
        received.count,
        received.sha.hexdigest(),
        tuple(header.get("skipped", ())),
        int(header.get("skipped_count", 0)),
    )


def _write(received: Received, tmp: Path) -> str:
    with open(tmp, "wb") as fh:
        while data := received.read():
            fh.write(data)
    return ""


def _unpack(received: Received, tmp: Path, host: str) -> str:
    """Unpack the host's tar stream under ``tmp``: directories and plain files only, every
    one inside it. What is wrong with the archive, or "" (a damaged one is read to its end,
    so the check of what arrived can say whether the link or the host damaged it)."""
    tmp.mkdir()
    try:
        _extract(received, tmp, host)
    except tarfile.TarError as exc:
        received.drain()
        return str(exc) or type(exc).__name__
    received.drain()  # the end-of-archive blocks: the hash covers every byte sent
    return ""


def _extract(received: Received, tmp: Path, host: str) -> None:
    with tarfile.open(fileobj=received, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            local = _member_path(member, tmp, host)
            if local is None:  # the directory itself
                continue
            if member.isdir():
                local.mkdir(parents=True, exist_ok=True)
                continue
            source = tar.extractfile(member)
            assert source is not None
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "wb") as fh:
                shutil.copyfileobj(source, fh, 1 << 20)


def _member_path(member: tarfile.TarInfo, tmp: Path, host: str) -> Optional[Path]:
    """Where an archive member goes under ``tmp`` (None for the directory itself), or
    ``RemoteError`` for one that is not a plain file or directory inside it."""
    parts = member.name.split("/")  # the first is the directory's own name
    plain = member.isfile() or member.isdir()
    inside = not member.name.startswith("/") and ".." not in parts and "" not in parts
    if not (plain and inside) or (len(parts) == 1 and not member.isdir()):
        raise RemoteError(f"{host}: refusing archive member {member.name!r}")
    return tmp.joinpath(*parts[1:]) if len(parts) > 1 else None


def _verify(received: Received, stream: FetchStream, host: str, path: str) -> None:
    trailer = stream.trailer()
    if trailer is None:
        raise RemoteError(f"{host}: the copy of {path} was cut short ({received.count} bytes)")
    if trailer.get("error"):
        raise RemoteError(f"{host}: {trailer['error']}")
    got, sent = (received.count, received.sha.hexdigest()), (trailer["bytes"], trailer["sha256"])
    if got != sent:
        raise RemoteError(
            f"{host}: the copy of {path} does not match what the host sent: received "
            f"{got[0]} bytes with SHA-256 {got[1]}, sent {sent[0]} bytes with SHA-256 {sent[1]}"
        )


def _put(tmp: Path, target: Path) -> None:
    """Move the verified copy into place: a file replaces a file, a directory's files go
    into an existing directory (replacing those of the same name)."""
    if target.is_dir() != tmp.is_dir() and target.exists():
        kind = "a directory" if target.is_dir() else "a file"
        raise UsageError(f"{target}: exists locally as {kind}; move it away or pick another DEST")
    if not tmp.is_dir() or not target.exists():
        os.replace(tmp, target)
        return
    for root, _, files in os.walk(tmp):
        rel = Path(root).relative_to(tmp)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.replace(Path(root) / name, target / rel / name)


def _remove(tmp: Path) -> None:
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    elif tmp.exists():
        tmp.unlink()


def summary(copies: Sequence[NodeCopy]) -> list[str]:
    """One line per node copied, for the terminal."""
    lines = []
    for c in copies:
        if c.error is not None or c.target is None:
            continue
        what = "directory" if c.kind == "dir" else "file"
        lines.append(
            f"node {c.node.node_rank} ({c.node.host.host}): {what} {c.target} "
            f"({_size(c.size)}, sha256 {c.sha256[:16]}, verified)"
        )
        if c.skipped_count:
            names = ", ".join(c.skipped)
            more = (
                f" and {c.skipped_count - len(c.skipped)} more"
                if len(c.skipped) < c.skipped_count
                else ""
            )
            lines.append(f"  skipped (links, devices, unreadable): {names}{more}")
    return lines


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"
