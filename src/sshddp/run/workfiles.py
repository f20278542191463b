"""Which files of a ``--workdir`` travel, read on this machine.

A file travels unless an ignore rule drops it: the ``.gitignore`` files of the tree, each
for its own directory and below, the deeper one deciding, as git reads them (``.git``
never travels). ``--include PATTERN`` (gitignore syntax, relative to the workdir; the
inventory's ``include:``) sends ignored files all the same. A symbolic link travels as a
link when it resolves inside the workdir (its target rewritten relative to the link's
directory, so an absolute one works on the hosts too); one that leads out of it is refused
by name before anything starts: its target would not be on the hosts.

``select`` also gathers what the rules left out (``model.leftout``), for the launch's line
and the report's hints, without a word for caches and VCS directories (``QUIET``); it looks
at no more than ``COUNT_CAP`` ignored entries, so an ignored dataset of a million files
costs the launch little.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sshddp.errors import UsageError
from sshddp.model.leftout import LeftOut

#: ignored directories and files that go unmentioned: caches, VCS, environments' leftovers
QUIET = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
    | {".tox", ".nox", ".ipynb_checkpoints", ".venv", "venv", ".DS_Store"}
)
QUIET_SUFFIXES = (".pyc", ".pyo")
COUNT_CAP = 5_000  #: ignored entries looked at for the launch's line
#: the ignored directory a walk is in: its rule, and whether what is in it goes unsaid
Dropped = Optional[tuple[str, bool]]


@dataclass(frozen=True)
class Selection:
    """What of a --workdir travels, and what its ignore rules left out."""

    files: tuple[str, ...]  #: regular files, relative to the workdir, in walk order
    links: tuple[tuple[str, str], ...]  #: (link, its target relative to the link's directory)
    left: tuple[LeftOut, ...] = ()  #: ignored files, beyond QUIET ones (with ``count``)
    more: bool = False  #: the count stopped at COUNT_CAP: there are more


def shipped_files(root: Path, include: tuple[str, ...] = ()) -> list[str]:
    """Files and links under ``root`` that travel (see the module's text)."""
    chosen = select(root, include)
    return [*chosen.files, *(link for link, _ in chosen.links)]


def select(root: Path, include: tuple[str, ...] = (), count: bool = False) -> Selection:
    """What of ``root`` travels; with ``count``, what its ignore rules left out too.
    ``UsageError`` names the links that lead out of it."""
    walk = _Walk(str(root), include, count)
    walk.run()
    if walk.outside:
        shown = ", ".join(f"{link} -> {target}" for link, target in walk.outside[:5])
        more = f" and {len(walk.outside) - 5} more" if len(walk.outside) > 5 else ""
        raise UsageError(
            f"--workdir {root}: symbolic links lead out of it: {shown}{more}. Their targets "
            "would not be on the hosts, so nothing was started: copy the files into the "
            "workdir (or point the links inside it), or add the links to .gitignore to "
            "leave them out"
        )
    return Selection(tuple(walk.files), tuple(walk.links), tuple(walk.left), walk.more)


class _Walk:
    """One walk of a workdir: its rules as they are met, and what it found."""

    def __init__(self, root: str, include: tuple[str, ...], count: bool) -> None:
        self.root = root
        self.real = os.path.realpath(root)
        self.include = _spec(list(include), "--include") if include else None
        self.count = count
        self.rules: list[tuple[str, Any, list[str]]] = []  #: (directory, spec, its lines)
        #: ignored directories walked: their rule, and whether what is in them goes unsaid
        self.dropped: dict[str, tuple[str, bool]] = {}
        self.files: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.outside: list[tuple[str, str]] = []
        self.left: list[LeftOut] = []
        self.more = False
        self.seen = 0  #: ignored entries looked at

    def run(self) -> None:
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel + "/"
            above = self.dropped.get(rel)
            if above is not None and self.more and self.include is None:
                dirnames[:] = []  # counted enough: the rest of an ignored tree is not read
                continue
            if above is None:
                self._read_rules(dirpath, rel)
            dirnames[:] = [d for d in sorted(dirnames) if self._enter(dirpath, rel, d, above)]
            for name in sorted(filenames):
                self._file(rel + name, above)

    def _read_rules(self, dirpath: str, rel: str) -> None:
        ignore = os.path.join(dirpath, ".gitignore")
        if os.path.isfile(ignore):
            with open(ignore, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
            self.rules.append((rel, _spec(lines, rel + ".gitignore"), lines))

    def rule(self, rel: str) -> Optional[str]:
        """The rule that ignores ``rel`` (a directory's ends in /), or None."""
        said: Optional[str] = None
        for base, spec, lines in self.rules:
            if rel.startswith(base):
                found = spec.check_file(rel[len(base) :])
                if found.include is not None:
                    line = f"{base}.gitignore line {found.index + 1}: {lines[found.index].strip()}"
                    said = line if found.include else None
        return said

    def _enter(self, dirpath: str, rel: str, name: str, above: Dropped) -> bool:
        """Whether the walk goes into directory ``name`` (a link to one is a link)."""
        if name == ".git":
            return False
        if os.path.islink(os.path.join(dirpath, name)):
            self._file(rel + name, above)
            return False
        dropped = above[0] if above else self.rule(rel + name + "/")
        if dropped is None:
            return True
        quiet = name in QUIET or bool(above and above[1])
        wanted = self.include is not None or (self.count and not quiet and not self.more)
        if wanted:
            self.dropped[rel + name + "/"] = (dropped, quiet)
        return wanted

    def _file(self, rel: str, above: Dropped) -> None:
        dropped = above[0] if above else self.rule(rel)
        if dropped and not (self.include is not None and self.include.match_file(rel)):
            if not (above and above[1]):
                self._left(rel, dropped)
            return
        path = os.path.join(self.root, rel)
        if os.path.islink(path):
            self._link(path, rel)
        elif os.path.isfile(path):
            self.files.append(rel)

    def _link(self, path: str, rel: str) -> None:
        real = os.path.realpath(path)
        if real == self.real or real.startswith(self.real.rstrip("/") + "/"):
            here = os.path.realpath(os.path.dirname(path))
            self.links.append((rel, os.path.relpath(real, here)))
        else:
            self.outside.append((rel, os.readlink(path)))

    def _left(self, rel: str, rule: str) -> None:
        name = rel.rsplit("/", 1)[-1]
        if not self.count or name in QUIET or name.endswith(QUIET_SUFFIXES):
            return
        self.seen += 1
        if self.seen > COUNT_CAP:
            self.more = True
            return
        try:
            size = os.lstat(os.path.join(self.root, rel)).st_size
        except OSError:
            return
        self.left.append(LeftOut(rel, size, rule))


def _spec(lines: list[str], where: str) -> Any:
    import pathspec

    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{where}: not a gitignore pattern: {exc}") from None
