"""``sshddp sync --offline`` on this machine: the lock's wheels, fetched once, here.

The project becomes exact pins (a uv project's lock exported; a requirements file's pins as
resolved), with the index lines dropped: the hosts install with no index, from these
wheels only. pip downloads them (uv has no download command), for this machine's platform
and Python, into a temporary directory; each is listed with its size and SHA-256, which
every host checks.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sshddp.errors import UsageError
from sshddp.model import sync as model
from sshddp.model.sync import Project

CHUNK = 1 << 20  #: bytes of a wheel read and written at a time


@dataclass(frozen=True)
class Wheels:
    """The wheels of a lock, fetched here."""

    folder: Path
    listed: tuple[dict[str, object], ...]  #: {"name", "size", "sha256"}, in sending order

    @property
    def size(self) -> int:
        return sum(int(str(w["size"])) for w in self.listed)

    def stream(self) -> Iterator[bytes]:
        """What the seed reads: the list as a JSON line, then each file's bytes."""
        import json

        yield json.dumps(list(self.listed)).encode() + b"\n"
        for item in self.listed:
            with open(self.folder / str(item["name"]), "rb") as fh:
                while data := fh.read(CHUNK):
                    yield data


def fetch(project: Project, uv_version: str, into: Path) -> tuple[Project, Wheels]:
    """``project`` as exact pins with no index lines (what an offline host installs), and
    every wheel they name, downloaded into ``into`` from the project's indexes."""
    if model.PYLOCK in project.files:
        raise UsageError(f"{project.root}: --offline takes a uv project or a requirements file")
    source = Path(project.root)
    cwd = source if source.is_dir() else source.parent  # where relative --find-links start
    pins = project.files.get(model.PINNED) or _export(source)
    (into / "pins.txt").write_text(pins)
    wheels = into / "wheels"
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary"]
    argv += [":all:", "--dest", str(wheels), "--requirement", str(into / "pins.txt")]
    _run(argv, cwd, "--offline: pip could not download the wheels here")
    listed = tuple(_listed(path) for path in sorted(wheels.glob("*.whl")))
    offline = {model.PINNED: model.without_options(pins)}
    return model.project(project.root, offline, uv_version), Wheels(wheels, listed)


def _export(root: Path) -> str:
    import uv

    argv = [uv.find_uv_bin(), "export", "--frozen", "--format", "requirements.txt"]
    argv += ["--no-hashes", "--no-emit-project", "--emit-index-url", "--emit-find-links"]
    return _run(argv, root, f"{root}: uv could not export its lock")


def _listed(path: Path) -> dict[str, object]:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while data := fh.read(CHUNK):
            sha.update(data)
    return {"name": path.name, "size": path.stat().st_size, "sha256": sha.hexdigest()}


def _run(argv: list[str], cwd: Path, what: str) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"{what}:\n{done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout
