"""A host's workdir and its ``runs/``: checked before sshddp puts anything there, so no one
else can plant a file or a symlink in a run directory.

A run directory is ``<workdir>/runs/<run id>/n<node rank>/``. The workdir (made if missing)
and ``runs/`` must be directories owned by this user that no one else may write to, as
OpenSSH's StrictModes asks of ``~/.ssh``; sshddp makes ``runs/``, the run's directory and the
node's 0700. The node's directory must not exist: a run never reuses one.

The workdir is resolved once (``resolve``) and only its real path is used from then on, so
no one can change where a running node's files are by swapping a symlink. The path leads
only through what no other user can change: every symlink on the way is this user's or
root's, every directory above the workdir root's or this user's and, if others may write to
it, sticky (as /tmp is: no one else may rename or remove what is ours in it).

``inspect`` tells the probe what a launch would find (doctor and the preflight report it);
``make_rundir`` makes a node's directory and says where it is, or raises ``Unsafe`` saying
what is wrong and how to fix it.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from sshddp.remote import hostpath
from sshddp.remote.hostpath import Unsafe

__all__ = ["Unsafe", "inspect", "make_rundir", "make_workdir", "moved", "resolve", "resolve_rundir"]

PRIVATE = hostpath.PRIVATE


def resolve(workdir: str) -> str:
    """The real path of ``workdir`` (``~`` expanded; a missing tail stays as it is, to be
    made), followed only through what no other user can change (``hostpath.chase``)."""
    return hostpath.chase(workdir, "workdir")


def _check(path: str, what: str, follow: bool) -> None:
    st = os.stat(path) if follow else os.lstat(path)
    problem = hostpath.dir_problem(path, st, what)
    if problem:
        raise problem


def _mkdir(path: str) -> bool:
    """Make a 0700 directory; False when something is there already."""
    try:
        os.mkdir(path, PRIVATE)
        return True
    except FileExistsError:
        return False


def make_workdir(workdir: str) -> str:
    """The real path of ``workdir`` (``resolve``), made 0700 if missing, else checked as a
    launch checks it: a directory of this user's that no one else may write to."""
    try:
        real = resolve(workdir)
        os.makedirs(real, PRIVATE, exist_ok=True)
        _check(real, "workdir", follow=False)
        return real
    except OSError as exc:
        raise _cannot(exc, workdir) from exc


def make_rundir(rundir: str) -> str:
    """Make node directory ``rundir`` (0700), its run's directory and ``runs/`` (0700) and the
    workdir if missing, checking each directory that was there before; the node directory's
    real path (``resolve``), the only one to use from here on. ``Unsafe`` if a check fails,
    or if the node directory exists already."""
    workdir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.expanduser(rundir))))
    try:
        rundir = resolve_rundir(rundir)
        run = os.path.dirname(rundir)
        runs = os.path.dirname(run)
        workdir = os.path.dirname(runs)
        # exist_ok: the nodes of a run may share one file system (an NFS home) and create
        # it at the same moment; whoever made it, the checks below apply.
        os.makedirs(workdir, PRIVATE, exist_ok=True)
        # Resolved: a symlink there now was put there since, and is not followed.
        _check(workdir, "workdir", follow=False)
        _mkdir(runs)
        _check(runs, "the runs directory", follow=False)
        if not _mkdir(run):
            _check(run, "the run's directory", follow=False)
        if not _mkdir(rundir):
            raise Unsafe(
                f"run directory {rundir} already exists on this host (a run never reuses one)",
                "pick another --name, or remove it if it is an old run's",
            )
        return rundir
    except OSError as exc:
        raise _cannot(exc, workdir) from exc


def resolve_rundir(rundir: str) -> str:
    """Node directory ``rundir`` under its workdir's real path (``resolve``), made or not."""
    given = os.path.expanduser(rundir)
    node, run = os.path.basename(given), os.path.basename(os.path.dirname(given))
    workdir = resolve(os.path.dirname(os.path.dirname(os.path.dirname(given))))
    return os.path.join(workdir, "runs", run, node)


def moved(path: str, rundir: str, real: str) -> str:
    """``path`` (``~`` expanded), under the workdir of node directory ``rundir`` as given,
    moved under the workdir of ``real``, its resolved path; any other path as it is."""
    path = os.path.expanduser(path)
    given = os.path.dirname(os.path.dirname(os.path.dirname(os.path.expanduser(rundir))))
    workdir = os.path.dirname(os.path.dirname(os.path.dirname(real)))
    if path == given or path.startswith(given.rstrip("/") + "/"):
        return workdir + path[len(given.rstrip("/")) :]
    return path


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
    try:
        workdir = resolve(workdir)
    except Unsafe as exc:
        return {**found, "problem": exc.what, "fix": exc.fix}
    except OSError as exc:
        return {**found, "problem": f"cannot look at {workdir}: {exc.strerror}"}
    for what, candidate, follow in (
        ("workdir", workdir, False),
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
