"""Pure: a PEP 751 lock (``pylock.toml``) as ``sync --offline`` fetches it on this machine.

The lock's packages whose ``marker`` holds on this machine become exact pins
(``name==version``): what an offline host installs from the wheels it is handed, as for a
uv project's exported lock. Their wheels (``url``, or ``path`` relative to the lock) are
listed as a one-page-per-package simple index, so that pip picks, among them, the wheel
for this machine's platform and Python; each wheel fetched is then checked against the
lock's ``hashes``. A package that applies here but has no wheel (only an sdist, a
directory, a VCS checkout) is refused: sshddp does not build.

Whether a marker holds is the caller's question (``Holds``: ``run/syncwheels.py`` asks
``packaging``, under PEP 751's rules, with the lock's default groups).
"""

from __future__ import annotations

import html
import posixpath
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from sshddp.errors import UsageError


@dataclass(frozen=True)
class Wheel:
    """One wheel the lock names for a package."""

    file: str  #: its file name
    url: str  #: where it is fetched from (a ``path`` made a file: URL)
    sha256: str  #: "" when the lock gives no SHA-256


@dataclass(frozen=True)
class Locked:
    """One package of the lock that applies to this machine."""

    name: str
    version: str
    wheels: tuple[Wheel, ...]


#: whether a ``marker`` holds on the machine the wheels are for, with these default groups
Holds = Callable[[str, frozenset[str]], bool]


def applying(text: str, lock: str, holds: Holds) -> tuple[Locked, ...]:
    """The packages of the lock ``text`` (read from ``lock``, a path) whose marker
    ``holds``; ``UsageError`` naming the lock and the package when one of them has no
    wheel."""
    document = _parse(text, lock)
    groups = _groups(document)
    found = []
    for entry in document.get("packages") or ():
        marker = str(entry.get("marker") or "")
        if marker and not holds(marker, groups):
            continue
        found.append(_locked(entry, lock))
    return tuple(found)


def pins(packages: Sequence[Locked]) -> str:
    """The exact pins an offline host installs: ``name==version``, one a line."""
    return "".join(f"{p.name}=={p.version}\n" for p in packages)


def index_pages(packages: Sequence[Locked]) -> dict[str, str]:
    """A simple index of the packages' wheels: its folder name (the normalized package
    name) -> its ``index.html``."""
    pages = {}
    for p in packages:
        links = "".join(
            f'<a href="{html.escape(w.url)}">{html.escape(w.file)}</a>\n' for w in p.wheels
        )
        pages[normalized(p.name)] = f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"
    return pages


def checked(fetched: Mapping[str, str], packages: Sequence[Locked], lock: str) -> None:
    """``UsageError`` unless every wheel ``fetched`` (file name -> SHA-256) is one the lock
    names, with the hash it gives (when it gives one)."""
    locked = {w.file: w.sha256 for p in packages for w in p.wheels}
    for file, sha256 in sorted(fetched.items()):
        if file not in locked:
            raise UsageError(f"{lock}: {file} was fetched, but the lock names no such wheel")
        if locked[file] and locked[file] != sha256:
            raise UsageError(
                f"{lock}: {file} has SHA-256 {sha256}, but the lock says {locked[file]}: the "
                "wheel at that address is not the one locked (re-create the lock, or fix the "
                "address); nothing was sent to the hosts"
            )


def no_wheel(lock: str, package: str, where: str) -> UsageError:
    """The error of a package that has no wheel for this machine's ``where``."""
    return UsageError(
        f"{lock}: package {package} has no wheel for {where}: sync --offline installs wheels "
        "only, fetched for this machine (it builds nothing); lock a version that publishes "
        "one, or sync without --offline"
    )


def normalized(name: str) -> str:
    """A package's name as an index spells it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _parse(text: str, lock: str) -> dict[str, Any]:
    if sys.version_info < (3, 11):
        raise UsageError(f"{lock}: sync --offline reads a pylock.toml with Python 3.11 or newer")
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{lock}: not a valid TOML file: {exc}") from None


def _groups(document: Mapping[str, object]) -> frozenset[str]:
    groups = document.get("default-groups")
    return frozenset(str(g) for g in groups) if isinstance(groups, list) else frozenset()


def _locked(entry: Mapping[str, object], lock: str) -> Locked:
    name, version = str(entry.get("name") or "?"), str(entry.get("version") or "")
    wheels = entry.get("wheels")
    if not wheels or not isinstance(wheels, list):
        has = [key for key in ("sdist", "archive", "directory", "vcs") if key in entry]
        raise no_wheel(lock, f"{name} {version}".strip(), "any platform" + _only(has))
    if not version:
        raise UsageError(f"{lock}: package {name} has no version: it cannot be pinned")
    return Locked(name, version, tuple(_wheel(w, lock) for w in wheels))


def _only(has: list[str]) -> str:
    return f" (the lock gives only its {' and '.join(has)})" if has else ""


def _wheel(entry: Mapping[str, object], lock: str) -> Wheel:
    url = str(entry.get("url") or "")
    if not url and entry.get("path"):
        path = posixpath.join(posixpath.dirname(posixpath.abspath(lock)), str(entry["path"]))
        url = "file://" + posixpath.normpath(path)
    file = str(entry.get("name") or posixpath.basename(unquote(urlsplit(url).path)))
    hashes = entry.get("hashes")
    sha256 = str(hashes.get("sha256") or "") if isinstance(hashes, dict) else ""
    return Wheel(file, url, sha256.lower())
