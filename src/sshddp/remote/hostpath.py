"""The one gate for paths on a host: every file sshddp creates, writes, reads back or runs
under a host's workdir, run directory, cache or a target directory comes through here.

A path is resolved once (``chase``), component by component, as systemd's ``chase()`` and
OpenSSH's ``safe_path()`` do: every symlink on the way is this user's or root's, and every
directory on the way is this user's or root's and, if others may write to it, sticky (as
/tmp is: no one else may rename or remove what is ours in it). Only the real path is used
from then on, so no one can change where a file goes by swapping a link.

In a checked directory: a new file is made ``O_EXCL | O_NOFOLLOW`` (``create``,
``temp_file``) and renamed within that directory (``rename``); a file read back is opened
``O_NOFOLLOW`` and must be a regular file of this user's (or root's) that no one else may
write (``open_read``); a program is run only if it is this user's (or root's) and no one
else may write it (``executable``). ``Unsafe`` says what is wrong, naming the path and its
owner, and the fix.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO, Any, Optional

PRIVATE = 0o700
MAX_LINKS = 40  #: symlinks followed while resolving a path, as Linux follows at most
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
READ_BACK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Unsafe(Exception):
    """A path sshddp must not use, or cannot make: what is wrong, and the fix."""

    def __init__(self, what: str, fix: str = "") -> None:
        super().__init__(f"{what}; {fix}" if fix else what)
        self.what = what
        self.fix = fix


def owner(uid: int) -> str:
    """``uid 1001 (alice)``: a file's owner, by name where this host knows it."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _name(uid: int) -> str:
    """`` alice`` (with its space), or "" where this host does not know the uid."""
    named = owner(uid)
    return " " + named.split("(", 1)[1].rstrip(")") if "(" in named else ""


def _trusted(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


# ------------------------------------------------------------------ resolving, once


def _link_problem(given: str, link: str, st: os.stat_result, what: str) -> Optional[Unsafe]:
    """Why symlink ``link`` (its lstat ``st``) on the way to ``given`` must not be
    followed: its owner could point it elsewhere at any moment."""
    if _trusted(st.st_uid):
        return None
    where = "" if link == given else f" (on the way to {what} {given})"
    return Unsafe(
        f"{what} {link} is a symlink{where} owned by {owner(st.st_uid)}, not by this user "
        f"(uid {os.geteuid()}) or root: its owner could point it at their own files",
        f"point `{what}:` to a real directory of your own",
    )


def _above_problem(given: str, path: str, st: os.stat_result, what: str) -> Optional[Unsafe]:
    """Why directory ``path`` above ``given`` lets someone else move what is below it."""
    if not _trusted(st.st_uid):
        return Unsafe(
            f"{path}, above {what} {given}, belongs to {owner(st.st_uid)}, who could "
            "replace what sshddp checked there",
            f"point `{what}:` to a directory whose parents are yours or root's",
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return Unsafe(
            f"{path}, above {what} {given}, is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}, not sticky), who could replace what is in it",
            f"run `chmod go-w {path}` on the host, or point `{what}:` elsewhere",
        )
    return None


def chase(path: str, what: str = "workdir") -> str:
    """The real path of ``path`` (``~`` expanded; a missing tail stays as it is, to be
    made), followed only through what no other user can change (see the module's text);
    ``Unsafe`` otherwise. ``what`` names the path in the messages (an inventory key)."""
    given = os.path.abspath(os.path.expanduser(path))
    todo = given.split("/")[1:]
    done, links = "/", 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return os.path.join(here, *todo)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            problem = _link_problem(given, here, st, what) or _loop(given, links, what)
            if problem:
                raise problem
            target = os.readlink(here)
            done = "/" if target.startswith("/") else done
            todo = target.split("/") + todo
            continue
        if stat.S_ISDIR(st.st_mode) and any(p not in ("", ".") for p in todo):
            problem = _above_problem(given, here, st, what)
            if problem:
                raise problem
        done = here
    return done


def _loop(given: str, links: int, what: str) -> Optional[Unsafe]:
    if links <= MAX_LINKS:
        return None
    return Unsafe(f"{what} {given}: too many levels of symbolic links", "fix the links")


# ------------------------------------------------------------------ directories


def dir_problem(path: str, st: os.stat_result, what: str) -> Optional[Unsafe]:
    """What is wrong with private directory ``path`` (its lstat ``st``): it must be a
    directory of this user's that no one else may write to, as OpenSSH's StrictModes asks
    of ``~/.ssh``."""
    if stat.S_ISLNK(st.st_mode):
        return Unsafe(f"{what} {path} is a symlink", "remove it: sshddp makes that directory")
    if not stat.S_ISDIR(st.st_mode):
        return Unsafe(f"{what} {path} is not a directory", "point `workdir:` elsewhere")
    if st.st_uid != os.geteuid():
        return Unsafe(
            f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid "
            f"{os.geteuid()}): its owner{_name(st.st_uid)} could change what sshddp finds there",
            "remove it, or point `workdir:` to a directory of your own",
        )
    if st.st_mode & 0o022:
        return Unsafe(
            f"{what} {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) "
            f"and owned by {owner(st.st_uid)}: others could plant files there",
            f"run `chmod go-w {path}` on the host (sshddp makes its directories 0700)",
        )
    return None


def check_dir(path: str, what: str) -> None:
    """``Unsafe`` unless ``path``, not followed if a link, is a private directory (see
    ``dir_problem``)."""
    problem = dir_problem(path, os.lstat(path), what)
    if problem:
        raise problem


def private_dir(path: str, what: str) -> str:
    """Directory ``path`` (in a checked directory), made 0700 if missing, else checked."""
    try:
        os.mkdir(path, PRIVATE)
    except FileExistsError:
        pass
    check_dir(path, what)
    return path


def private_dirs(root: str, rel: str, what: str) -> str:
    """``root/rel`` (``root`` checked), each missing component made 0700, each existing
    one checked (``check_dir``): the path of the last."""
    path = root
    for part in rel.split("/"):
        if part:
            path = private_dir(os.path.join(path, part), what)
    return path


def target_dir(path: str, what: str) -> str:
    """The real path of directory ``path`` where sshddp writes beside another's files (a
    --share target): this user's or root's, and if others may write to it, sticky and this
    user's; ``Unsafe`` otherwise."""
    real = chase(path, what)
    st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise Unsafe(f"{what} {real} is not a directory")
    shared = st.st_mode & 0o022
    if not _trusted(st.st_uid) or (
        shared and not (st.st_mode & stat.S_ISVTX and st.st_uid == os.geteuid())
    ):
        raise Unsafe(
            f"{what} {real} belongs to {owner(st.st_uid)} (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): others could plant the names sshddp writes there",
            "use a directory of your own, or make this one sticky (chmod +t) and yours",
        )
    return real


# ------------------------------------------------------------------ files


def create(path: str, mode: int = 0o600, flags: int = 0) -> int:
    """A descriptor of a new file at ``path``, open for writing. Whatever is there already,
    a symlink included, makes it fail (FileExistsError) instead of being followed."""
    return os.open(path, NEW_FILE | flags, mode)


def temp_file(directory: str, prefix: str) -> tuple[int, str]:
    """A new file of an unguessable name in checked ``directory`` (``mkstemp``: O_EXCL,
    0600): its descriptor and path."""
    import tempfile  # here: it brings shutil, bz2 and lzma, which a node's start does without

    return tempfile.mkstemp(prefix=prefix, dir=directory)


def temp_dir(directory: str, prefix: str) -> str:
    """A new 0700 directory of an unguessable name in checked ``directory``."""
    import tempfile

    return tempfile.mkdtemp(prefix=prefix, dir=directory)


def link_inside(target: str, path: str, root: str) -> None:
    """Make the symbolic link ``path`` -> ``target``, once ``target`` (relative) is known to
    resolve inside ``root`` from the real directory of ``path``, itself inside ``root``: a
    link sshddp makes never leads out of the tree it belongs to (``Unsafe``)."""
    top = os.path.realpath(root)
    here = os.path.realpath(os.path.dirname(path))
    lands = os.path.realpath(os.path.join(here, target))
    if os.path.isabs(target) or not all(_within(p, top) for p in (here, lands)):
        raise Unsafe(f"{path} -> {target} would lead out of {root}: refusing the link")
    os.symlink(target, path)


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def truncate(path: str) -> None:
    """Empty the regular file of ours at ``path`` (never through a link, never a FIFO's
    open that waits); nothing where there is none or it is not ours to empty."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
            os.ftruncate(fd, 0)
    except OSError:
        pass
    finally:
        os.close(fd)


def rename(source: str, target: str) -> None:
    """Rename ``source`` over ``target``, both in checked directories of one file system
    (a new file or a build beside where it goes): what is at ``target`` is replaced, never
    followed."""
    os.replace(source, target)


def file_problem(path: str, st: os.stat_result, what: str) -> Optional[Unsafe]:
    """Why file ``path`` (its stat ``st``) must not be trusted: not a regular file, or
    someone else's, or writable by others."""
    if not stat.S_ISREG(st.st_mode):
        return Unsafe(f"{what} {path} is not a regular file", f"remove {path}")
    if not _trusted(st.st_uid):
        return Unsafe(
            f"{what} {path} belongs to {owner(st.st_uid)}, not to this user (uid "
            f"{os.geteuid()}) or root: sshddp neither reads nor runs another user's file",
            f"remove {path} (sshddp puts its own there)",
        )
    if st.st_mode & 0o022:
        return Unsafe(
            f"{what} {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) "
            f"and owned by {owner(st.st_uid)}",
            f"remove it, or run `chmod go-w {path}` on the host",
        )
    return None


def check_file(path: str, what: str) -> None:
    """``Unsafe`` unless ``path``, not followed if a link, is a regular file of this
    user's (or root's) that no one else may write; FileNotFoundError when missing."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Unsafe(f"{what} {path} is a symlink (owned by {owner(st.st_uid)})", "remove it")
    problem = file_problem(path, st, what)
    if problem:
        raise problem


def lock_file(path: str) -> int:
    """A descriptor of lock file ``path`` in a checked directory, made 0600 if missing;
    never through a symlink, never another user's file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    problem = file_problem(path, os.fstat(fd), "lock file")
    if problem:
        os.close(fd)
        raise problem
    return fd


def open_read(path: str, what: str = "file", binary: bool = True) -> IO[Any]:
    """File ``path`` open for reading: never through a symlink (ELOOP), never a FIFO or a
    device, never another user's or one others may write (``Unsafe``)."""
    fd = os.open(path, READ_BACK)
    try:
        problem = file_problem(path, os.fstat(fd), what)
        if problem:
            raise problem
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb" if binary else "r")
    except BaseException:
        os.close(fd)
        raise


def executable(path: str, what: str = "program") -> Optional[str]:
    """``path`` if it is a program sshddp may run: not a symlink, a regular file of this
    user's (or root's) that no one else may write, executable; None when there is none;
    ``Unsafe`` when there is one that is not safe to run."""
    try:
        check_file(path, what)
    except FileNotFoundError:
        return None
    return path if os.access(path, os.X_OK) else None


def run_checked(path: str, what: str = "program") -> str:
    """``path``, a program about to be run: ``Unsafe`` (or FileNotFoundError) unless
    ``executable`` says it may be."""
    if executable(path, what) is None:
        raise FileNotFoundError(errno.ENOENT, f"{what} is not there or not executable", path)
    return path


def mount_of(path: str) -> str:
    """The mount point of the file system holding ``path`` (or its nearest existing parent)."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path
