"""Stream one file or directory that a run wrote on this host, with its size and SHA-256.

args: {"rundir", "cwd": the ranks' working directory ("" when unknown), "path"}
A relative path is taken from the ranks' working directory: ``cwd``, else the one in the
run directory's spec.json; ``~`` and absolute paths are taken as they are.
stdout: one JSON line (contract.FetchHeader), then the bytes: a file's own, or a directory as
an uncompressed tar stream of its directories and regular files (links, devices and
unreadable files are skipped, and named).
stderr at the end: one JSON line (contract.FetchTrailer): how many bytes went out and their
SHA-256, so the coordinator can check what it received.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from typing import IO, Any, Optional

from sshddp.protocol import contract
from sshddp.remote.common import emit, home_path, read_json

CHUNK = 1 << 20
TAR_BLOCK = 512
MAX_SKIPPED_NAMES = 20


class Hashed:
    """What goes to stdout, counted and hashed on the way."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.sha.update(data)
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


def resolve(rundir: str, cwd: str, path: str) -> Optional[str]:
    """The absolute path asked for, or None when it is relative and the run's working
    directory is unknown."""
    if path.startswith("~") or os.path.isabs(path):
        return os.path.normpath(os.path.expanduser(path))
    if not cwd:
        spec = read_json(os.path.join(home_path(rundir), contract.SPEC)) or {}
        cwd = spec.get("cwd") or ""
    if not cwd:
        return None
    return os.path.normpath(os.path.join(home_path(cwd), path))


def _walk(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(absolute path, name in the archive) of every directory and regular file under root,
    parents first; and the names of what is skipped."""
    base = os.path.basename(root.rstrip("/")) or "root"
    entries = [(root, base)]
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        prefix = base if rel == "." else f"{base}/{rel}"
        for name in dirnames + sorted(filenames):
            full = os.path.join(dirpath, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and os.access(full, os.R_OK)):
                entries.append((full, f"{prefix}/{name}"))
            else:
                skipped.append(f"{prefix}/{name}")
    return entries, skipped


def _tar_size(entries: list[tuple[str, str]]) -> int:
    """About how many bytes the tar stream of ``entries`` takes (for a progress bar)."""
    total = 2 * TAR_BLOCK
    for full, _ in entries:
        size = os.lstat(full).st_size if os.path.isfile(full) else 0
        total += TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK
    return total


def _send_dir(entries: list[tuple[str, str]], out: Hashed) -> None:
    import tarfile  # only a directory needs it

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for full, name in entries:
            info = tar.gettarinfo(full, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isdir():
                tar.addfile(info)
                continue
            with open(full, "rb") as fh:
                tar.addfile(info, fh)


def _send_file(path: str, out: Hashed) -> None:
    with open(path, "rb") as fh:
        while True:
            data = fh.read(CHUNK)
            if not data:
                return
            out.write(data)


def _header(path: str) -> tuple[contract.FetchHeader, Any]:
    """What is about to be sent, and what ``main`` needs to send it."""
    name = os.path.basename(path.rstrip("/")) or "root"
    if os.path.isdir(path):
        entries, skipped = _walk(path)
        header: contract.FetchHeader = {
            "ok": True,
            "kind": "dir",
            "path": path,
            "name": name,
            "size": _tar_size(entries),
            "skipped": skipped[:MAX_SKIPPED_NAMES],
            "skipped_count": len(skipped),
        }
        return header, entries
    size = os.stat(path).st_size
    return {"ok": True, "kind": "file", "path": path, "name": name, "size": size}, None


def main(args: dict[str, Any]) -> None:
    path = resolve(args["rundir"], args.get("cwd") or "", args["path"])
    if path is None:
        why = "the run's working directory is unknown (its run directory is gone); give PATH"
        emit({"ok": False, "error": why + " as an absolute path or ~/..."})
        return
    try:
        if not os.path.isfile(path) and not os.path.isdir(path):
            found = os.path.lexists(path)
            what = "is neither a file nor a directory" if found else "not found"
            emit({"ok": False, "path": path, "error": f"{path}: {what}", "missing": not found})
            return
        header, entries = _header(path)
    except OSError as exc:
        emit({"ok": False, "path": path, "error": f"{path}: {exc.strerror or exc}"})
        return
    emit(header)
    out = Hashed(sys.stdout.buffer)
    trailer: contract.FetchTrailer = {"bytes": 0, "sha256": ""}
    try:
        if header["kind"] == "dir":
            _send_dir(entries, out)
        else:
            _send_file(path, out)
        out.flush()
    except OSError as exc:  # a file that shrank or vanished while being read
        trailer["error"] = f"{path}: reading it failed: {exc.strerror or exc}"
    trailer["bytes"] = out.count
    trailer["sha256"] = out.sha.hexdigest()
    emit(trailer, sys.stderr)
