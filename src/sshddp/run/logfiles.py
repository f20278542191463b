"""The local copies of a run's node logs on disk, and the rules that keep them true.

A node's copy is an exact prefix of its ``node.log`` on the host; beside it, the node's index
(``model.spans``) where the host keeps one. Nothing here ever makes a log shorter: a copy cut
inside a span keeps its bytes, and the span's bytes that come again are checked against
them and skipped; only the index, which names spans, is cut back to the spans the log holds
whole. A copy whose bytes differ from what its host sends cannot be reconciled: it is kept
as it is and no longer written, with a note.

The run's directory is ours alone: made owner-only, and refused when another user owns it
or may write in it (a shared ``--log-dir``); the files in it are opened relative to it, never
through a link, and only where we made them. One process at a time writes a node's copy (an
``flock`` on it); another one following the same run (a second ``attach``, ``logs`` while
the launch follows) shows what it receives and leaves the copy to the first.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Callable, Optional

from sshddp.errors import LogWriteFailed, UsageError
from sshddp.model import spans

Say = Callable[[str], None]  #: where a note about a local copy goes


def open_run_dir(directory: Path, fresh: bool) -> tuple[int, bool]:
    """A descriptor of the run's log directory, and whether this call made it. Missing
    parents are made owner-only; an existing directory must be ours and closed to others'
    writes (``fresh``, a launch: and empty)."""
    for parent in reversed([p for p in directory.parents if not p.exists()]):
        parent.mkdir(mode=0o700, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
        made = True
    except FileExistsError:
        made = False
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused(directory, "is a symbolic link or not a directory") from None
        raise
    try:
        _check_dir(fd, directory, fresh and not made)
    except BaseException:
        os.close(fd)
        raise
    return fd, made


def _check_dir(fd: int, directory: Path, must_be_empty: bool) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.getuid():
        raise _refused(directory, f"is owned by another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        mode = stat.S_IMODE(info.st_mode)
        raise _refused(directory, f"other users may write in it (mode {mode:04o})")
    if info.st_mode & 0o077:  # ours, readable by others: the ranks' output is private
        os.fchmod(fd, 0o700)
    if must_be_empty and os.listdir(fd):
        raise UsageError(
            f"log directory {directory} exists already and is not empty (an earlier run of "
            "that name?): move it away, or pick another --name or --log-dir"
        )


def _refused(path: Path, why: str) -> UsageError:
    return UsageError(
        f"local log path {path} {why}: sshddp writes a run's output only where it alone "
        "can; remove it, or pass --log-dir with a directory of your own"
    )


def open_own(dir_fd: int, path: Path, create: bool = True) -> tuple[int, bool]:
    """``path`` (a name in the directory ``dir_fd``) opened to read and append, and whether
    this call made it: made owner-only where absent; otherwise only a regular file of ours,
    never through a link."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    if create:
        try:
            return os.open(path.name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd), True
        except FileExistsError:
            pass
    try:
        fd = os.open(path.name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(path, "is a symbolic link") from None
        raise
    info = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(info.st_mode):
        why = "is not a regular file"
    elif info.st_uid != os.getuid():
        why = f"is owned by another user (uid {info.st_uid})"
    if why:
        os.close(fd)
        raise _refused(path, why)
    if info.st_mode & 0o077:  # a copy an older sshddp left readable to others
        os.fchmod(fd, 0o600)
    return fd, False


def _writer(fd: int) -> bool:
    """Whether this process may write the copy ``fd`` (no other one holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # no locks on this filesystem (some network ones): write, as before
        return True
    return True


def _read_at(fd: int, offset: int, size: int) -> bytes:
    parts = []
    while size > 0 and (data := os.pread(fd, size, offset)):
        parts.append(data)
        offset, size = offset + len(data), size - len(data)
    return b"".join(parts)


class LocalCopy:
    """One node's local log and its index. Its writer appends to them; any other process
    (``shadow``) and a copy that cannot be reconciled (``diverged``) write nothing and
    only count where the host's stream is."""

    def __init__(self, dir_fd: int, path: Path, index_path: Path, say: Say) -> None:
        self.path, self.index_path = path, index_path
        self._dir, self._say = dir_fd, say
        self._fd, self.created = open_own(dir_fd, path)
        self._index: Optional[int] = None
        self.writing = _writer(self._fd)
        self.shadow = not self.writing  #: another process writes this copy
        self._size = os.fstat(self._fd).st_size  # where the stream is, when not writing
        self._records = 0  # the index's size, when not writing
        if os.path.lexists(index_path):
            self._index, _made = open_own(dir_fd, index_path, create=False)
            self._records = self._agreed_index()

    def _agreed_index(self) -> int:
        """The index's size once cut to the spans the log holds whole (a copy cut between
        the two); the writer cuts it there (the log is never cut)."""
        assert self._index is not None
        whole = os.fstat(self._index).st_size
        whole -= whole % spans.WIDTH
        log = self.size()
        while whole:
            offset, length, _source = spans.RECORD.unpack(
                _read_at(self._index, whole - spans.WIDTH, spans.WIDTH)
            )
            if offset + length <= log:
                break
            whole -= spans.WIDTH
        if self.writing and whole != os.fstat(self._index).st_size:
            os.ftruncate(self._index, whole)
        return whole

    def size(self) -> int:
        return os.fstat(self._fd).st_size if self.writing else self._size

    def index_size(self) -> int:
        if self.writing:
            return os.fstat(self._index).st_size if self._index is not None else 0
        return self._records

    def write(self, data: bytes) -> None:
        """Append bytes of a log without index."""
        if self.writing:
            self._append(self._fd, data, self.path)
        self._size += len(data)

    def write_span(self, offset: int, data: bytes, record: bytes) -> None:
        """Bytes of a span from ``offset`` (and, after its last, its record)."""
        size = self.size()
        if offset > size and self.writing:  # a gap: never papered over (the stream retries)
            raise ValueError(f"{self.path}: a span at {offset}, the log ends at {size}")
        held = max(0, min(size - offset, len(data)))
        if held and self.writing and _read_at(self._fd, offset, held) != data[:held]:
            self._diverged(offset)
        if self.writing:
            self._append(self._fd, data[held:], self.path)
        self._size = max(self._size, offset + len(data))
        if record:
            self._add_record(record)

    def _add_record(self, record: bytes) -> None:
        self._records += len(record)
        if not self.writing:
            return
        if self._index is None:
            self._index, _made = open_own(self._dir, self.index_path)
        self._append(self._index, record, self.index_path)

    def _diverged(self, offset: int) -> None:
        self._size, self._records = self.size(), self.index_size()
        self.writing = False
        self._say(
            f"the local copy {self.path} differs from its host's log at byte {offset}: it "
            "is kept as it is and no longer updated (move it away to fetch the log again)"
        )

    @staticmethod
    def _append(fd: int, data: bytes, path: Path) -> None:
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError as exc:
            raise LogWriteFailed(f"cannot write the local log {path}: {exc.strerror}") from exc

    def discard_if_empty(self, made_here: bool = True) -> None:
        """Remove the files this copy made (not ``made_here``: or found), while they hold
        nothing (a launch that started nothing leaves no empty logs)."""
        if (self.created or not made_here) and self.writing and not self.size():
            os.unlink(self.path.name, dir_fd=self._dir)

    def close(self) -> None:
        for fd in (self._fd, self._index):
            if fd is not None:
                os.close(fd)
        self._index = None
