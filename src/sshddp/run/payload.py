"""The code a run ships: one script file, or a whole local directory honouring .gitignore.

Every node receives the same bytes; the host checks their SHA-256 before anything starts.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sshddp import defaults
from sshddp.errors import UsageError
from sshddp.model.plan import CodeSpec, LaunchOptions, decide_code
from sshddp.run.inputs import LocalFiles

MAX_BUNDLE = defaults.MAX_CODE_BYTES


@dataclass(frozen=True)
class Payload:
    """The bytes shipped to every host, with their digest."""

    kind: str  #: "file", "tar" or "none"
    name: str  #: file name on the host (for "file")
    data: bytes
    sha256: str

    @property
    def disk_bytes(self) -> int:
        """What the code takes on a host once stored (a tar is stored unpacked)."""
        if self.kind != "tar":
            return len(self.data)
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:gz") as tar:
            return sum(m.size for m in tar.getmembers())

    def header(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "size": len(self.data), "sha256": self.sha256}


def code_spec(options: LaunchOptions) -> CodeSpec:
    """Decide how the script or module reaches the hosts, looking at this machine's files."""
    return decide_code(options, LocalFiles())


def build_payload(code: CodeSpec) -> Payload:
    """Read (or pack) the code once; every node gets these bytes."""
    if code.kind == "file":
        assert code.local_path is not None
        data = _read(Path(code.local_path))
        return Payload("file", code.target, data, hashlib.sha256(data).hexdigest())
    if code.kind == "tar":
        assert code.local_path is not None
        data = _pack(Path(code.local_path))
        return Payload("tar", "", data, hashlib.sha256(data).hexdigest())
    return Payload("none", "", b"", hashlib.sha256(b"").hexdigest())


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the script: {exc.strerror}") from exc


def shipped_files(root: Path) -> list[str]:
    """Files under ``root`` that are not ignored by its .gitignore files (nor .git)."""
    import pathspec

    files: list[str] = []
    specs: list[tuple[str, Optional[Any]]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        ignore = Path(dirpath, ".gitignore")
        if ignore.is_file():
            lines = ignore.read_text(encoding="utf-8", errors="replace").splitlines()
            specs.append((rel_dir, pathspec.GitIgnoreSpec.from_lines(lines)))
        dirnames[:] = sorted(
            d for d in dirnames if d != ".git" and not _ignored(specs, rel_dir + d + "/")
        )
        files += [rel_dir + f for f in sorted(filenames) if not _ignored(specs, rel_dir + f)]
    return files


def _ignored(specs: list[tuple[str, Optional[Any]]], rel: str) -> bool:
    for base, spec in specs:
        if spec is not None and rel.startswith(base) and spec.match_file(rel[len(base) :]):
            return True
    return False


def _pack(root: Path) -> bytes:
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for rel in shipped_files(root):
            path = root / rel
            if path.is_symlink() or not path.is_file():
                continue
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
    return buf.getvalue()
