"""A host's workdir and its ``runs/``: checked before sshddp puts anything there, so no one
else can plant a file or a symlink in a run directory.

A run directory is ``<workdir>/runs/<run id>/n<node rank>/``. The workdir (made if missing)
and ``runs/`` must be directories owned by this user that no one else may write to, as
OpenSSH's StrictModes asks of ``~/.ssh``; sshddp makes ``runs/``, the run's directory and the
node's 0700. The node's directory must not exist: a run never reuses one.

``inspect`` tells the probe what a launch would find (doctor and the preflight report it);
``make_rundir`` makes a node's directory, or raises ``Unsafe`` saying what is wrong and how
to fix it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Optional

PRIVATE = 0o700


class Unsafe(Exception):
    """A directory sshddp must not use, or cannot make: what is wrong, and the fix."""

    def __init__(self, what: str, fix: str = "") -> None:
        super().__init__(f"{what}; {fix}" if fix else what)
        self.what = what
        self.fix = fix


def _problem(path: str, st: os.stat_result, what: str) -> Optional[Unsafe]:
    """What is wrong with directory ``path`` (its stat ``st``) for sshddp, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return Unsafe(f"{what} {path} is not a directory", "point `workdir:` elsewhere")
    if st.st_uid != os.geteuid():
        return Unsafe(
            f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
            "someone else could change what a run finds there",
            "point `workdir:` to a directory of your own",
        )
    if st.st_mode & 0o022:
        return Unsafe(
            f"{what} {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}), "
            "who could plant files in a run",
            f"run `chmod go-w {path}` on the host (sshddp makes its directories 0700)",
        )
    return None


def _check(path: str, what: str, follow: bool) -> None:
    st = os.stat(path) if follow else os.lstat(path)
    if not follow and stat.S_ISLNK(st.st_mode):
        raise Unsafe(f"{what} {path} is a symlink", "remove it: sshddp makes that directory")
    problem = _problem(path, st, what)
    if problem:
        raise problem


def _mkdir(path: str) -> bool:
    """Make a 0700 directory; False when something is there already."""
    try:
        os.mkdir(path, PRIVATE)
        return True
    except FileExistsError:
        return False


def make_rundir(rundir: str) -> None:
    """Make node directory ``rundir`` (0700), its run's directory and ``runs/`` (0700) and the
    workdir if missing, checking each directory that was there before; ``Unsafe`` if one
    fails, or if ``rundir`` exists already."""
    runs = os.path.dirname(os.path.dirname(rundir))
    workdir = os.path.dirname(runs)
    try:
        # exist_ok: the nodes of a run may share one file system (an NFS home) and create
        # it at the same moment; whoever made it, the checks below apply.
        os.makedirs(workdir, PRIVATE, exist_ok=True)
        # The workdir may be a symlink the user made (to a bigger disk): follow it.
        _check(workdir, "workdir", follow=True)
        _mkdir(runs)
        _check(runs, "the runs directory", follow=False)
        if not _mkdir(os.path.dirname(rundir)):
            _check(os.path.dirname(rundir), "the run's directory", follow=False)
        if not _mkdir(rundir):
            raise Unsafe(
                f"run directory {rundir} already exists on this host (a run never reuses one)",
                "pick another --name, or remove it if it is an old run's",
            )
    except OSError as exc:
        raise _cannot(exc, workdir) from exc


def _cannot(exc: OSError, workdir: str) -> Unsafe:
    where = exc.filename or workdir
    if exc.errno == errno.EROFS:
        return Unsafe(
            f"cannot create {where}: it is on a read-only file system",
            "point `workdir:` of this host to a writable directory",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Unsafe(
            f"cannot create {where}: permission denied",
            "point `workdir:` of this host to a directory you can write",
        )
    return Unsafe(f"cannot create {where}: {exc.strerror}")


def inspect(workdir: str) -> dict[str, Any]:
    """What a launch would find: {"path": the nearest existing directory, "readonly":
    bool, "problem": why the workdir or runs/ must not be used, or None, "fix"}."""
    path = workdir
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    path = path or "/"
    found: dict[str, Any] = {"path": path, "readonly": _readonly(path), "problem": None}
    for what, candidate, follow in (
        ("workdir", workdir, True),
        ("the runs directory", os.path.join(workdir, "runs"), False),
    ):
        if os.path.lexists(candidate):
            try:
                _check(candidate, what, follow)
            except Unsafe as exc:
                found.update(problem=exc.what, fix=exc.fix)
                break
            except OSError as exc:
                found.update(problem=f"cannot look at {candidate}: {exc.strerror}")
                break
    return found


def _readonly(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
