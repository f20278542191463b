"""``sshddp sync --offline`` on this machine: the lock's wheels, fetched once, here.

The project becomes exact pins (a uv project's lock exported; a requirements file's pins as
resolved; a pylock.toml's packages whose markers hold here), with the index lines dropped:
the hosts install with no index, from these wheels only. pip downloads them (uv has no
download command), for this machine's platform and Python, into a temporary directory;
each is listed with its size and SHA-256, which every host checks.

A pylock.toml names its wheels itself: they become a simple index of their own (a page a
package), from which alone pip picks this machine's wheel of each pinned version (pip
knows the platform tags, sshddp does not resolve); each wheel fetched must have the hash
the lock gives it. A package with no wheel for this machine is an error naming it."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sshddp.errors import UsageError
from sshddp.model import pylock
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
    every wheel they name, downloaded into ``into`` from the project's indexes (a
    pylock.toml's: its own wheels)."""
    source = Path(project.root)
    cwd = source if source.is_dir() else source.parent  # where relative --find-links start
    wheels = into / "wheels"
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary"]
    argv += [":all:", "--dest", str(wheels), "--requirement", str(into / "pins.txt")]
    if model.PYLOCK in project.files:
        lock = str(source if source.is_file() else source / model.PYLOCK)
        packages = pylock.applying(project.files[model.PYLOCK], lock, marker_holds(lock))
        pins = pylock.pins(packages)
        (into / "pins.txt").write_text(pins)
        _download_locked(argv, _index(packages, into), cwd, lock)
    else:
        pins = project.files.get(model.PINNED) or _export(source)
        (into / "pins.txt").write_text(pins)
        _run(argv, cwd, "--offline: pip could not download the wheels here")
    listed = tuple(_listed(path) for path in sorted(wheels.glob("*.whl")))
    if model.PYLOCK in project.files:
        pylock.checked({str(w["name"]): str(w["sha256"]) for w in listed}, packages, lock)
    offline = {model.PINNED: model.without_options(pins)}
    return model.project(project.root, offline, uv_version), Wheels(wheels, listed)


def _index(packages: tuple[pylock.Locked, ...], into: Path) -> Path:
    """A simple index of the lock's wheels, for pip to choose this machine's among."""
    index = into / "simple"
    for name, page in pylock.index_pages(packages).items():
        (index / name).mkdir(parents=True)
        (index / name / "index.html").write_text(page)
    index.mkdir(exist_ok=True)  # a lock with no package for this machine
    return index


def _download_locked(argv: list[str], index: Path, cwd: Path, lock: str) -> None:
    """pip download from the lock's wheels alone; a package with none for this machine is
    named."""
    done = subprocess.run(
        [*argv, "--isolated", "--index-url", index.as_uri()],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if done.returncode == 0:
        return
    unmatched = re.search(r"No matching distribution found for (\S+)", done.stderr)
    if unmatched:
        where = f"this machine ({sysconfig.get_platform()}, Python {platform.python_version()})"
        raise pylock.no_wheel(lock, unmatched[1], where)
    said = done.stderr.strip() or f"exit {done.returncode}"
    raise UsageError(f"{lock}: --offline: pip could not download the wheels here:\n{said}")


def marker_holds(lock: str, environment: Optional[Mapping[str, str]] = None) -> pylock.Holds:
    """Whether a marker of ``lock`` holds on this machine (``environment``: other values of
    its variables), by ``packaging`` under PEP 751's rules (``extras`` and
    ``dependency_groups`` are sets); ``UsageError`` naming the lock when one cannot be read."""
    from packaging.markers import (
        InvalidMarker,
        Marker,
        UndefinedComparison,
        UndefinedEnvironmentName,
    )

    def holds(marker: str, groups: frozenset[str]) -> bool:
        try:
            env: dict[str, str | AbstractSet[str]] = {**(environment or {})}
            env["dependency_groups"] = groups
            return Marker(marker).evaluate(env, context="lock_file")
        except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName) as exc:
            raise UsageError(f"{lock}: cannot read the marker {marker!r}: {exc}") from None

    return holds


def _export(root: Path) -> str:
    import uv

    argv = [uv.find_uv_bin(), "export", "--frozen", "--format", "requirements.txt"]
    argv += ["--no-hashes", "--no-emit-project", "--emit-index-url", "--emit-find-links"]
    return _run(argv, root, f"{root}: uv could not export its lock", model.uv_environ(os.environ))


def _listed(path: Path) -> dict[str, object]:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while data := fh.read(CHUNK):
            sha.update(data)
    return {"name": path.name, "size": path.stat().st_size, "sha256": sha.hexdigest()}


def _run(argv: list[str], cwd: Path, what: str, env: Optional[dict[str, str]] = None) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"{what}:\n{done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout
