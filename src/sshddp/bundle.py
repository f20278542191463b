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

from sshddp.errors import UsageError
from sshddp.plan import CodeSpec, LaunchOptions

MAX_BUNDLE = 512 * 1024 * 1024


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
        return {"kind": self.kind, "name": self.name, "size": len(self.data),
                "sha256": self.sha256}  # fmt: skip


def code_spec(options: LaunchOptions) -> CodeSpec:
    """Decide how the script or module reaches the hosts."""
    if options.workdir:
        return _workdir_spec(options)
    if options.module:
        return CodeSpec("none", options.module)
    assert options.script is not None
    local = Path(options.script)
    if local.is_dir():
        raise UsageError(f"{options.script}: is a directory; pass a script, or use --workdir")
    if local.is_file():
        return CodeSpec("file", local.name, str(local))
    # Not here: taken as a path on the hosts, relative to the remote home directory.
    target = options.script[2:] if options.script.startswith("~/") else options.script
    return CodeSpec("remote", target)


def _workdir_spec(options: LaunchOptions) -> CodeSpec:
    """The script (or module) inside a shipped --workdir, as a path relative to it."""
    assert options.workdir is not None
    root = Path(options.workdir).resolve()
    if not root.is_dir():
        raise UsageError(f"--workdir {options.workdir}: not a local directory")
    if options.module:
        return CodeSpec("tar", options.module, str(root))
    assert options.script is not None
    script = Path(options.script)
    candidates = [script] if script.is_absolute() else [root / script, Path.cwd() / script]
    for candidate in (c.resolve() for c in candidates):
        if candidate.is_file() and candidate.is_relative_to(root):
            return CodeSpec("tar", candidate.relative_to(root).as_posix(), str(root))
    raise UsageError(
        f"{options.script}: not a file inside --workdir {options.workdir} (give the script "
        "relative to that directory)"
    )


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
