"""The code a run ships: one script file, or a whole local directory: the files and links
that ``workfiles`` says travel.

Every node receives the same bytes; the host checks their SHA-256 before anything starts.
The bytes are written once to a temporary file and streamed from it to every host in
CHUNK-sized pieces, so the coordinator's memory stays flat whatever their size. A directory
ships as a plain tar, uncompressed, as ``tar | ssh tar x`` and rsync send by default: most
of a big workdir is data that does not compress, and compressing it would cost more CPU
than the bytes it saves on a LAN.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

from sshddp import defaults
from sshddp.errors import UsageError
from sshddp.model.leftout import LeftOut
from sshddp.model.plan import CodeSpec, LaunchOptions, decide_code
from sshddp.run.inputs import LocalFiles
from sshddp.run.workfiles import Selection, select, shipped_files

__all__ = ["Payload", "build_payload", "code_spec", "shipped_files"]

MAX_BUNDLE = defaults.MAX_CODE_BYTES
CHUNK = 1 << 20  #: bytes read from the bundle and written to a host at a time


@dataclass(frozen=True)
class Payload:
    """The bytes shipped to every host, with their digest, kept in a temporary file."""

    kind: str  #: "file", "tar" or "none"
    name: str  #: file name on the host (for "file")
    size: int  #: bytes shipped
    sha256: str
    disk_bytes: int  #: what the code takes on a host once stored (a tar is stored unpacked)
    file: Optional[IO[bytes]] = field(default=None, compare=False, repr=False)
    #: a --workdir's files its ignore rules kept from the hosts (``select``), and whether
    #: there are more than counted
    left: tuple[LeftOut, ...] = field(default=(), compare=False, repr=False)
    more_left: bool = False

    def header(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "size": self.size, "sha256": self.sha256}

    def chunks(self) -> Iterator[bytes]:
        """The bytes, CHUNK at a time. Each call reads on its own (``pread``), so every
        host's thread can stream them at once."""
        offset = 0
        while offset < self.size:
            assert self.file is not None
            data = os.pread(self.file.fileno(), min(CHUNK, self.size - offset), offset)
            if not data:
                raise OSError(f"the code bundle ended at {offset} of {self.size} bytes")
            offset += len(data)
            yield data

    def read_all(self) -> bytes:
        """Every byte at once (for tests and small payloads)."""
        return b"".join(self.chunks())

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def code_spec(options: LaunchOptions) -> CodeSpec:
    """Decide how the script or module reaches the hosts, looking at this machine's files."""
    return decide_code(options, LocalFiles())


def build_payload(code: CodeSpec) -> Payload:
    """Copy (or pack) the code once into a temporary file; every node gets these bytes.
    The caller closes it."""
    if code.kind == "none" or code.kind == "remote":
        return Payload("none", "", 0, hashlib.sha256(b"").hexdigest(), 0)
    assert code.local_path is not None
    root = Path(code.local_path)
    chosen = select(root, code.include, count=True) if code.kind == "tar" else Selection((), ())
    bundle = _Bundle()
    try:
        if code.kind == "file":
            name, stored = code.target, _copy(root, bundle)
        else:
            name, stored = "", _pack(chosen, root, bundle)
        bundle.file.flush()
    except BaseException:
        bundle.file.close()
        raise
    digest = bundle.sha.hexdigest()
    return Payload(
        code.kind, name, bundle.size, digest, stored, bundle.file, chosen.left, chosen.more
    )


class _Bundle:
    """A temporary file that hashes what is written to it."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile()
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.file.write(data)

    def tell(self) -> int:
        return self.size


def _copy(path: Path, bundle: _Bundle) -> int:
    try:
        with open(path, "rb") as fh:
            while data := fh.read(CHUNK):
                bundle.write(data)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the script: {exc.strerror}") from exc
    return bundle.size


def _pack(chosen: Selection, root: Path, bundle: _Bundle) -> int:
    """Write a tar of the shipped files to ``bundle``, then their links; the bytes the
    files hold."""
    total = 0
    copy = {"copybufsize": CHUNK}  # tarfile writes each file's bytes straight through
    with tarfile.open(fileobj=bundle, mode="w", **copy) as tar:  # type: ignore[call-overload]
        for rel in chosen.files:
            path = root / rel
            total += path.stat().st_size
            if total > MAX_BUNDLE:
                raise UsageError(
                    f"--workdir {root}: more than {MAX_BUNDLE >> 20} MB to ship; add the data "
                    "to .gitignore and keep it on the hosts"
                )
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
        for rel, target in chosen.links:  # last: no file of the tar goes through a link
            link = tarfile.TarInfo(rel)
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(link)
    return total
