"""``sshddp fetch``: copy back a file or directory that a run wrote on its nodes.

Each node's copy is streamed over its own SSH channel, in parallel with a bounded fan-out,
into ``DEST/node<K>-<host>/``: a file as itself, a directory as a tar stream unpacked on
arrival. The host sends the stream's size and SHA-256 at the end; the copy counts and hashes
what arrives, and only a copy that matches takes its place: until then it lives under a
temporary name in the same directory, so a cut transfer never leaves a half file behind.

DEST may be shared: sshddp writes only in directories that no one else can write in (or
sticky ones of its user's), never through a link, and makes its temporaries anew
(``mkstemp``), so a name planted by another user never redirects a copy.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from sshddp.errors import LocalWriteFailed, RemoteError, SshddpError, UsageError
from sshddp.hosts import calls
from sshddp.hosts.calls import FetchStream
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model.escape import visible
from sshddp.model.layout import NodeLayout
from sshddp.run.registry import RunRecord

TMP_PREFIX = ".sshddp-fetch-"


class PathMissing(UsageError):
    """Nothing is at PATH on a node (not an error on one node of several, when another
    node has it)."""


class FetchProgress(Protocol):
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

    node: NodeLayout
    target: Optional[Path] = None  #: the local copy
    kind: str = ""  #: "file" or "dir"
    size: int = 0  #: bytes received and verified (a directory's as a tar stream)
    sha256: str = ""
    skipped: tuple[str, ...] = ()  #: names in a directory the host did not send
    skipped_count: int = 0
    error: Optional[SshddpError] = None


def node_dir(node: NodeLayout) -> str:
    """``node<K>-<host>``, named like the node's local log."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node.host.host)
    return f"node{node.node_rank}-{safe}"


def check_dest(dest: Path) -> None:
    """DEST is a directory, or can be made one, that no one else can write in: say so
    before connecting anywhere."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"DEST {dest}: exists and is not a directory")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"DEST {dest}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(dest, os.W_OK | os.X_OK):
        raise UsageError(f"DEST {dest}: not writable")
    _check_private(dest, os.stat(dest), "DEST")
    _umask()  # read once, here, before any thread creates a file


def _check_private(path: Path, info: os.stat_result, what: str) -> None:
    """Refuse a directory others can write in: they could plant the names sshddp writes.
    One that is sticky and ours is safe (no one else can replace what sshddp puts there)."""
    shared = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and not (info.st_mode & stat.S_ISVTX and info.st_uid == os.geteuid()):
        raise UsageError(
            f"{what} {path}: other users can write in it (mode {stat.filemode(info.st_mode)}, "
            f"owner uid {info.st_uid}), so they could plant the names fetch writes; pick a "
            "directory of your own, or make this one sticky (chmod +t) and yours"
        )


def _own_dir(path: Path) -> None:
    """Make ``path`` (a directory inside DEST), or check the one there: a directory, not a
    link, ours, that no one else can write in."""
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise UsageError(f"{path}: is {kind}; fetch writes through no link: move it away")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"{path}: belongs to uid {info.st_uid}, not to you; move it away or pick another DEST"
        )
    _check_private(path, info, "the directory")


@functools.cache
def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def fetch(
    record: RunRecord,
    ssh: SshOptions,
    fanout: int,
    path: str,
    dest: Path,
    only: Optional[int],
    progress: FetchProgress,
) -> list[NodeCopy]:
    """Copy ``path`` (relative to each node's working directory) from every node of the run,
    or only node ``only``, into ``dest``; one outcome per node, in node order."""
    check_dest(dest)
    nodes = [n for n in record.layout().nodes if only is None or n.node_rank == only]
    with HostPool([n.host for n in nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        reachable = [n for n in nodes if errors[n.index] is None]

        def copy(node: NodeLayout) -> NodeCopy:
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


def _as_error(node: NodeLayout, exc: Optional[BaseException]) -> SshddpError:
    if isinstance(exc, SshddpError):
        return exc
    if isinstance(exc, OSError):  # reading from the host raises RemoteError: this is local
        return LocalWriteFailed(f"the copy from {node.host.host} could not be written: {exc}")
    return RemoteError(f"{node.host.host}: {type(exc).__name__}: {exc}")


class Received:
    """The stream as it arrives: counted, hashed and shown."""

    def __init__(self, stream: FetchStream, key: int, progress: FetchProgress) -> None:
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


def _receive(
    node: NodeLayout, stream: FetchStream, into: Path, progress: FetchProgress
) -> NodeCopy:
    header = stream.header
    host = node.host.host
    if not header.get("ok"):
        error = f"{host}: {header.get('error', 'nothing to copy')}"
        raise PathMissing(error) if header.get("missing") else UsageError(error)
    name = str(header.get("name", ""))
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise RemoteError(f"{host}: refusing the name {name!r} for the copy")
    _own_dir(into)
    progress.begin(node.node_rank, f"{node_dir(node)}/{name}", int(header.get("size", 0)))
    received = Received(stream, node.node_rank, progress)
    try:
        _land(received, stream, into / name, host)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise UsageError(
            f"{host}: {header['path']}: a name in it is too long for the local file system "
            f"under {into} ({exc.strerror}); pick a DEST with a shorter path, or a shorter PATH"
        ) from None
    return NodeCopy(
        node,
        into / name,
        header["kind"],
        received.count,
        received.sha.hexdigest(),
        tuple(header.get("skipped", ())),
        int(header.get("skipped_count", 0)),
    )


def _land(received: Received, stream: FetchStream, target: Path, host: str) -> None:
    """Receive the copy under a new temporary name beside ``target`` (made exclusively: a
    name planted there is never opened), check it, then move it into place."""
    header = stream.header
    is_dir, fd = header["kind"] == "dir", -1
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, dir=target.parent)
        tmp = Path(name)
    try:
        damaged = _unpack(received, tmp, host) if is_dir else _write(received, fd)
        _verify(received, stream, host, header["path"])
        if damaged:  # the host's own archive is broken (it matched what was sent)
            raise RemoteError(f"{host}: the archive of {header['path']} is damaged: {damaged}")
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~_umask())  # mkstemp's are 0600
        _put(tmp, target)
    finally:
        _remove(tmp)


def _write(received: Received, fd: int) -> str:
    with open(fd, "wb") as fh:
        while data := received.read():
            fh.write(data)
    return ""


def _unpack(received: Received, tmp: Path, host: str) -> str:
    """Unpack the host's tar stream under ``tmp``: directories and plain files only, every
    one inside it. What is wrong with the archive, or "" (a damaged one is read to its end,
    so the check of what arrived can say whether the link or the host damaged it)."""
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
    """Move the verified copy into place: a file replaces a file (or a link, never what it
    points to), a directory's files go into an existing directory (replacing those of the
    same name); a directory is never reached through a link."""
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        os.replace(tmp, target)
        return
    if tmp.is_dir() and stat.S_ISLNK(info.st_mode):
        raise UsageError(f"{target}: is a link; fetch writes through no link: move it away")
    if stat.S_ISDIR(info.st_mode) != tmp.is_dir():
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a file"
        raise UsageError(f"{target}: exists locally as {kind}; move it away or pick another DEST")
    if not tmp.is_dir():
        os.replace(tmp, target)
        return
    for root, _, files in os.walk(tmp):
        rel = Path(root).relative_to(tmp)
        _real_dir(target / rel)
        for name in files:
            os.replace(Path(root) / name, target / rel / name)


def _real_dir(path: Path) -> None:
    """``path`` made, or there as a directory and not a link to one."""
    try:
        path.mkdir()
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UsageError(
                f"{path}: is a link or a file, where the copy has a directory: move it away"
            ) from None


def _remove(tmp: Path) -> None:
    if not os.path.lexists(tmp):  # moved into place
        return
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink()


def absent(copies: Sequence[NodeCopy], only: Optional[int]) -> list[NodeCopy]:
    """The nodes that lack PATH where that is no failure: some other node had it, and no
    single node was asked for."""
    if only is not None or not any(c.error is None for c in copies):
        return []
    return [c for c in copies if isinstance(c.error, PathMissing)]


def summary(copies: Sequence[NodeCopy], only: Optional[int] = None) -> list[str]:
    """One line per node copied, and per node that lacked PATH (``absent``), for the
    terminal. What the host named is shown with its control characters escaped."""
    lines = []
    for c in copies:
        if c.error is not None or c.target is None:
            continue
        what = "directory" if c.kind == "dir" else "file"
        lines.append(
            f"node {c.node.node_rank} ({c.node.host.host}): {what} {visible(str(c.target))} "
            f"({_size(c.size)}, sha256 {c.sha256[:16]}, verified)"
        )
        if c.skipped_count:
            names = ", ".join(visible(n) for n in c.skipped)
            more = (
                f" and {c.skipped_count - len(c.skipped)} more"
                if len(c.skipped) < c.skipped_count
                else ""
            )
            lines.append(f"  skipped (links, devices, unreadable): {names}{more}")
    for c in absent(copies, only):
        why = visible(c.error.message if c.error else "")
        lines.append(f"node {c.node.node_rank} ({c.node.host.host}): nothing to copy: {why}")
    return lines


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"
