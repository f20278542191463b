"""Pure: the files of the ranks' working directory that a launch did not put on every
host, and what a failing rank's last lines say of them.

Two kinds. Files of a ``--workdir`` that an ignore rule (a ``.gitignore`` line) left out of
the shipped tree, each with that rule: ``summary`` is the launch's one line about them
(caches and VCS directories are left out without a word). And files node 0's working
directory holds that another node lacks, which the launch warned about (``--share``).
``missing_hints`` explains a rank's ``FileNotFoundError`` or ``ModuleNotFoundError`` for
one of them, naming the rule or pointing back at that warning.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sshddp.model.share import size_text

SHOWN = 3  #: the largest files the launch's line names


@dataclass(frozen=True)
class LeftOut:
    """One file of the ranks' working directory that some host does not get."""

    path: str  #: relative to the working directory (``data/train.bin``)
    size: int  #: bytes, on this machine (ignored) or on node 0 (unshared)
    rule: str  #: what left it out: ``.gitignore line 3: *.bin``, or the nodes that lack it
    kind: Literal["ignored", "unshared"] = "ignored"


def unshared_files(
    found: Sequence[tuple[str, int, list[int]]], hosts: Sequence[str]
) -> list[LeftOut]:
    """``share.unshared``'s files (named in the launch's warning) as the hints know them."""
    return [
        LeftOut(name, size, ", ".join(f"node {r} ({hosts[r]})" for r in ranks), "unshared")
        for name, size, ranks in found
    ]


def summary(left: Sequence[LeftOut], more: bool = False) -> str:
    """The launch's line on the files ignore rules kept from the hosts ("" if none)."""
    if not left:
        return ""
    big = sorted(left, key=lambda f: (-f.size, f.path))
    count = f"{len(left)}{'+' if more else ''} file{'s' if len(left) != 1 else ''}"
    named = [f"{f.path} ({size_text(f.size)}, {f.rule})" for f in big[:SHOWN]]
    rest = f" and {len(left) - SHOWN} more" if len(left) > SHOWN else ""
    return (
        f"sshddp: --workdir: ignore rules left out {count}, "
        f"{size_text(sum(f.size for f in left))}: {', '.join(named)}{rest}; "
        "not sent to the hosts (--include PATTERN sends them)"
    )


_NO_FILE = re.compile(r"(?:FileNotFoundError|No such file or directory).*?: '([^']+)'")
_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def missing_hints(lines: Sequence[str], left: Sequence[LeftOut]) -> list[str]:
    """For each file or module the ``lines`` say was not found and that the launch left
    out: which rule left it out, or the warning that named it, and the fix."""
    hints: list[str] = []
    for line in lines:
        if m := _NO_FILE.search(line):
            found = [f for f in left if _same_file(m.group(1), f.path)]
        elif m := _NO_MODULE.search(line):
            found = [f for f in left if _module_file(m.group(1), f.path)]
        else:
            continue
        hints.extend(_hint(m.group(1), f) for f in found[:1])
    return list(dict.fromkeys(hints))


def _same_file(missing: str, path: str) -> bool:
    missing = missing.removeprefix("./")
    return missing == path or missing.endswith("/" + path)


def _module_file(dotted: str, path: str) -> bool:
    """Whether ``path`` is where module ``dotted`` (or a package above it) would be."""
    parts = dotted.split(".")
    stems = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    wanted = {s + ".py" for s in stems} | {s + "/__init__.py" for s in stems}
    return any(path == w or path.endswith("/" + w) for w in wanted)


def _hint(missing: str, f: LeftOut) -> str:
    if f.kind == "unshared":
        return (
            f"{_named(missing, f.path)} is a file node 0 has and {f.rule} lacked when the "
            f"run started, as the launch warned: hand node 0's copy on with --share {f.path}"
        )
    return (
        f"{_named(missing, f.path)} was not sent to the hosts: the ignore rule {f.rule} of "
        f"the --workdir left it out; launch with --include '{f.path}' (or a pattern, "
        "repeatable; `include:` in the inventory's defaults) to send it"
    )


def _named(missing: str, path: str) -> str:
    return path if missing == path else f"{missing} ({path})"
