"""The working directory that outlives a run: the workspace of a local directory on a host.

A launch stages the shipped code in ``RUNDIR/code`` and checks it there, as before; ``fill``
then puts every file of it into the workspace (``<workdir>/work/<name>``), where the ranks
run. Each file is hard-linked in (copied where a link cannot be made; a shipped symbolic
link is made again, ``make_link``, only if it stays inside) under a temporary
name, then renamed over the file of the same name: a process still reading the old file
keeps it whole, and everything else in the workspace, such as what earlier runs wrote
there, stays. Retention removes run directories only, never a workspace. Nodes whose hosts
share a disk (an NFS home) share the workspace, as torchrun's nodes share a directory there.
"""

from __future__ import annotations

import os
import socket

from sshddp.remote import hostpath

SHA_FILE = ".sha256"  #: the code's digest, kept in RUNDIR/code only


class WorkspaceError(OSError):
    """A shipped path that the workspace cannot take (a directory where a file goes)."""


def make_link(target: str, path: str, root: str) -> None:
    """Make the symbolic link ``path`` -> ``target``, once ``target`` (relative) is known to
    resolve inside ``root`` from the real directory of ``path``, itself inside ``root``: a
    shipped link never leads out of the code or the workspace (``WorkspaceError``)."""
    try:
        hostpath.link_inside(target, path, root)
    except hostpath.Unsafe as exc:
        raise WorkspaceError(str(exc)) from None


def fill(code: str, workspace: str) -> None:
    """Put every file under ``code`` into ``workspace`` at the same relative path."""
    os.makedirs(workspace, 0o700, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(code):
        rel = os.path.relpath(dirpath, code)
        target = workspace if rel == "." else os.path.join(workspace, rel)
        if rel != ".":
            _make_dir(target, workspace)
        for name in sorted(filenames):
            if rel == "." and name == SHA_FILE:
                continue
            _place(os.path.join(dirpath, name), os.path.join(target, name), workspace)
        for name in [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            _place(os.path.join(dirpath, name), os.path.join(target, name), workspace)
        dirnames.sort()  # (a link to a directory is not walked into: it is placed as a link)


def _make_dir(path: str, workspace: str) -> None:
    if os.path.islink(path):
        raise WorkspaceError(
            f"{path} is a symbolic link in the workspace {workspace}; sshddp does not write "
            "shipped code through links: remove it, or launch with --fresh-cwd"
        )
    if os.path.isdir(path):
        return
    if os.path.lexists(path):
        raise WorkspaceError(
            f"{path} is a file in the workspace {workspace} but a directory in the shipped "
            "code: remove it, or launch with --fresh-cwd"
        )
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # another node sharing this disk made it just now
        if not os.path.isdir(path) or os.path.islink(path):
            raise


def _place(source: str, target: str, workspace: str) -> None:
    if os.path.isdir(target) and not os.path.islink(target):
        raise WorkspaceError(
            f"{target} is a directory in the workspace {workspace} but a file in the shipped "
            "code: remove it, or launch with --fresh-cwd"
        )
    tmp = f"{target}.sshddp-{socket.gethostname()}-{os.getpid()}"  # hosts may share a disk
    if os.path.islink(source):
        make_link(os.readlink(source), tmp, workspace)
        os.replace(tmp, target)
        return
    try:
        os.link(source, tmp)  # fails on whatever is there, a symlink included: never follows it
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links, or another one
        _copy(source, tmp)
    hostpath.rename(tmp, target)


def _copy(source: str, tmp: str) -> None:
    """``source`` (in the run directory) copied to new file ``tmp`` (``O_EXCL``)."""
    import shutil

    with hostpath.open_read(source, "shipped file") as src:
        mode = os.fstat(src.fileno()).st_mode & 0o755
        with os.fdopen(hostpath.create(tmp, mode), "wb") as dst:
            shutil.copyfileobj(src, dst)
