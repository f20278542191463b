"""Pure: a PEP 751 lock (``pylock.toml``) as ``sync --offline`` fetches it on this machine.

The lock's packages whose ``marker`` holds on this machine become exact pins
(``name==version``): what an offline host installs from the wheels it is handed, as for a
uv project's exported lock. Their wheels (``url``, or ``path`` relative to the lock) are
listed as a one-page-per-package simple index, so that pip picks, among them, the wheel
for this machine's platform and Python; each wheel fetched is then checked against the
lock's ``hashes``. A package that applies here but has no wheel (only an sdist, a
directory, a VCS checkout) is refused: sshddp does not build.

Markers are evaluated here (PEP 508, with PEP 751's ``extras`` and ``dependency_groups``):
a version-like value compares as a version, anything else as a string.
"""

from __future__ import annotations

import html
import posixpath
import re
import sys
from collections.abc import Mapping, Sequence
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


def applying(text: str, lock: str, environment: Mapping[str, str]) -> tuple[Locked, ...]:
    """The packages of the lock ``text`` (read from ``lock``, a path) whose marker holds in
    ``environment`` (marker variable -> value); ``UsageError`` naming the lock and the
    package when one of them has no wheel."""
    document = _parse(text, lock)
    env = {**environment, "dependency_groups": _groups(document)}
    found = []
    for entry in document.get("packages") or ():
        marker = str(entry.get("marker") or "")
        if marker and not marker_holds(marker, env, lock):
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


def _groups(document: Mapping[str, object]) -> str:
    groups = document.get("default-groups")
    return "\0".join(str(g) for g in groups) if isinstance(groups, list) else ""


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


Tokens = list[tuple[str, str]]  #: a marker's (kind, text): string, op or name
_TOKEN = re.compile(
    r"""\s*(?:(?P<string>'[^']*'|"[^"]*")|(?P<op>===|==|!=|<=|>=|~=|<|>|\(|\)"""
    r"""|not\s+in\b|in\b|and\b|or\b)|(?P<name>[A-Za-z_][A-Za-z0-9_.]*))"""
)


def marker_holds(marker: str, environment: Mapping[str, str], lock: str = "") -> bool:
    """Whether the PEP 508 ``marker`` holds in ``environment``; ``UsageError`` naming the
    lock when it cannot be read."""
    env = {"extra": "", "extras": "", "dependency_groups": "", **environment}
    try:
        value, rest = _or(_tokens(marker), env)
    except (IndexError, KeyError, ValueError):
        rest = [("bad", marker)]
    if rest:
        raise UsageError(f"{lock or 'marker'}: cannot read the marker {marker!r}")
    return value


_SETS = ("extras", "dependency_groups")  #: PEP 751's variables that are sets of names
_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?")
_PRE = {"a": 0, "b": 1, "rc": 2}


def _tokens(marker: str) -> Tokens:
    tokens: Tokens = []
    at = 0
    while marker[at:].strip():
        found = _TOKEN.match(marker, at)
        if found is None or found.lastgroup is None:
            return [("bad", marker[at:])]
        kind = found.lastgroup
        tokens.append((kind, re.sub(r"\s+", " ", found.group(kind))))
        at = found.end()
    return tokens


def _or(tokens: Tokens, env: Mapping[str, str]) -> tuple[bool, Tokens]:
    value, rest = _and(tokens, env)
    while rest and rest[0] == ("op", "or"):
        other, rest = _and(rest[1:], env)
        value = value or other
    return value, rest


def _and(tokens: Tokens, env: Mapping[str, str]) -> tuple[bool, Tokens]:
    value, rest = _atom(tokens, env)
    while rest and rest[0] == ("op", "and"):
        other, rest = _atom(rest[1:], env)
        value = value and other
    return value, rest


def _atom(tokens: Tokens, env: Mapping[str, str]) -> tuple[bool, Tokens]:
    if tokens[0] == ("op", "("):
        value, rest = _or(tokens[1:], env)
        if rest[:1] != [("op", ")")]:
            raise ValueError("no closing parenthesis")
        return value, rest[1:]
    (lkind, left), (okind, op), (rkind, right) = tokens[:3]
    if okind != "op" or op in ("(", ")", "and", "or"):
        raise ValueError(f"not a comparison: {op}")
    return _compare(_value(lkind, left, env), op, _value(rkind, right, env)), tokens[3:]


def _value(kind: str, text: str, env: Mapping[str, str]) -> str | frozenset[str]:
    if kind == "string":
        return text[1:-1]
    if kind != "name":
        raise ValueError(f"not a value: {text}")
    if text in _SETS:
        return frozenset(normalized(v) for v in env[text].split("\0") if v)
    return env[text]


def _compare(left: str | frozenset[str], op: str, right: str | frozenset[str]) -> bool:
    if op in ("in", "not in"):
        if isinstance(left, frozenset):
            raise ValueError("a set on the left")
        inside = normalized(left) in right if isinstance(right, frozenset) else left in right
        return inside == (op == "in")
    if isinstance(left, frozenset) or isinstance(right, frozenset):
        raise ValueError(f"a set compared with {op}")
    if op == "===":
        return left == right
    versions = _version_compare(left, op, right)
    if versions is not None:
        return versions
    strings = {"==": left == right, "!=": left != right, "<": left < right}
    strings.update({"<=": left <= right, ">": left > right, ">=": left >= right})
    return strings[op]  # ~= between strings: KeyError, an unreadable marker


def _version_compare(left: str, op: str, right: str) -> bool | None:
    """``left op right`` as versions (``right`` may end in ``.*`` for == and !=), or None
    when ``right`` is no version."""
    wild = right.endswith(".*") and op in ("==", "!=")
    have, want = _VERSION.fullmatch(left), _VERSION.fullmatch(right[:-2] if wild else right)
    if want is None:
        return None
    if have is None:  # as packaging does: no version is in a version's range
        return False
    if wild:
        prefix = _release(want)
        return (_release(have)[: len(prefix)] == prefix) == (op == "==")
    width = max(len(_release(have)), len(_release(want)))
    mine, theirs = _key(have, width), _key(want, width)
    if op == "~=":
        stem = _release(want)[:-1]
        return mine >= theirs and _release(have)[: len(stem)] == stem and len(stem) > 0
    table = {"==": mine == theirs, "!=": mine != theirs, "<": mine < theirs}
    table.update({"<=": mine <= theirs, ">": mine > theirs, ">=": mine >= theirs})
    return table[op]


def _release(found: re.Match[str]) -> tuple[int, ...]:
    return tuple(int(n) for n in found.group(1).split("."))


def _key(found: re.Match[str], width: int) -> tuple[tuple[int, ...], tuple[int, int]]:
    release = _release(found)
    release += (0,) * (width - len(release))
    pre = (_PRE[found.group(2)], int(found.group(3))) if found.group(2) else (3, 0)
    return release, pre
