"""uv for a host of another platform than this machine: the binary out of the ``uv``
wheel for the host's platform, fetched here with pip (so a host needs only Python and
SSH). ``run/sync.py`` keeps each platform's binary for the process.

The packed binaries kept in this user's cache (``cached``, ``keep``) are read only from a
directory of this user's that no one else may write, through no link; the one for this
machine's platform must be the local uv wheel's own binary (its SHA-256) before it is sent.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Optional

from sshddp.errors import UsageError
from sshddp.model import sync as model

PIP_TIMEOUT = 300  #: seconds for pip to fetch the uv wheel (17 MB)


def uv_binary(wheel: Path) -> bytes:
    """The ``uv`` executable inside the ``uv`` wheel at ``wheel``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".data/scripts/uv")]
        if len(names) != 1:
            raise UsageError(f"{wheel}: not a uv wheel (no *.data/scripts/uv in it)")
        return archive.read(names[0])


def cached(path: Path) -> Optional[bytes]:
    """The packed uv at ``path`` in the cache, None when there is none; ``UsageError`` when
    it, or its directory, is another user's or others may write it (they could make every
    host run their program)."""
    try:
        _check_above(path.parent.parent)
        _check_cache(path.parent, os.lstat(path.parent), "directory")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"the cached uv {path}: cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        _check_cache(path, os.fstat(fh.fileno()), "file")
        return fh.read()


def _check_cache(path: Path, info: os.stat_result, what: str) -> None:
    is_kind = stat.S_ISDIR if what == "directory" else stat.S_ISREG
    if is_kind(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
        return
    raise UsageError(
        f"the uv cache {what} {path} is not this user's alone (owner {_owner(info.st_uid)}, "
        f"{stat.filemode(info.st_mode)}): its uv would be sent to every host and run there; "
        f"remove it, or set XDG_CACHE_HOME to a directory of your own"
    )


def _check_above(path: Path) -> None:
    """Whoever may rename what is in the directory above the cache could swap the cache."""
    info = os.stat(path)
    if info.st_uid in (os.geteuid(), 0) and (
        not info.st_mode & 0o022 or info.st_mode & stat.S_ISVTX
    ):
        return
    raise UsageError(
        f"{path}, above the uv cache, is not this user's or root's alone (owner "
        f"{_owner(info.st_uid)}, {stat.filemode(info.st_mode)}): whoever owns it could swap the "
        "uv sent to every host; set XDG_CACHE_HOME to a directory of your own"
    )


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def same_binary(packed: bytes, binary: bytes, path: Path) -> bytes:
    """``packed`` if it unpacks to ``binary`` (the local uv wheel's), else ``UsageError``."""
    found = hashlib.sha256(zlib.decompress(packed)).hexdigest()
    wanted = hashlib.sha256(binary).hexdigest()
    if found != wanted:
        raise UsageError(
            f"the cached uv {path} unpacks to a binary of SHA-256 {found[:16]}..., not the "
            f"local uv wheel's ({wanted[:16]}...): it was changed; remove it"
        )
    return packed


def keep(path: Path, packed: bytes) -> None:
    """``packed`` into the cache at ``path``, whole or not at all (a half-written file would
    be sent as uv), in a directory of this user's alone; nothing when it cannot be."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_cache(path.parent, os.lstat(path.parent), "directory")
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(part, flags, 0o600), "wb") as fh:
            fh.write(packed)
        os.replace(part, path)
    except (OSError, UsageError):
        pass  # no cache: the next sync packs it again


def fetch_wheel(version: str, tag: str, folder: Path) -> Path:
    """``pip download`` of the ``uv`` wheel ``version`` for platform ``tag`` into
    ``folder``; ``UsageError`` with pip's own message when it cannot."""
    argv = [sys.executable, "-m", "pip", "download", f"uv=={version}", "--no-deps"]
    argv += ["--only-binary", ":all:", "--platform", tag, "--quiet", "-d", str(folder)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"pip could not fetch uv {version} for {tag}: {exc}") from exc
    wheels = sorted(folder.glob(f"uv-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        said = done.stderr.strip() or f"pip exited {done.returncode}"
        raise UsageError(f"pip could not fetch uv {version} for {tag}:\n{said}")
    return wheels[0]


def uv_for(host_platform: str, version: str) -> bytes:
    """The uv ``version`` binary that runs on a host of ``host_platform``."""
    tag = model.uv_wheel_tag(host_platform)
    if tag is None:
        raise UsageError(
            f"uv publishes no wheel for {host_platform}: install uv {version} on the host "
            "and put it at <workdir>/tools/uv-VERSION/uv"
        )
    with tempfile.TemporaryDirectory(prefix="sshddp-uv-") as tmp:
        return uv_binary(fetch_wheel(version, tag, Path(tmp)))
