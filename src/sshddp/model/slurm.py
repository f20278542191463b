"""Slurm's compressed host and count lists, expanded exactly as Slurm expands them.

Inside an allocation Slurm hands over its nodes as a *hostlist* (``SLURM_JOB_NODELIST=
gpu[01-04,07]``) and per-node counts in a run-length form (``SLURM_TASKS_PER_NODE=2(x3),1``).
sshddp turns them into one host per node rank, so the expansion must match Slurm's own
(``scontrol show hostnames``) name for name and in the same order: node rank *i* is the
*i*-th name. Anything Slurm would not print is refused with an ``InventoryError`` naming the
text, the position and the expected form; nothing is guessed and nothing falls back to
localhost.

Pure: no I/O, standard library only.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from sshddp.errors import InventoryError

__all__ = ["MAX_NAMES", "expand_hostlist", "expand_tasks_per_node"]

MAX_NAMES = 65536  #: Slurm's own cap on one range (hostlist.c MAX_RANGE); also ours in all
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._-]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_SHOWN = 80  # characters of a long list quoted around the bad spot


@dataclass(frozen=True)
class _Group:
    """One comma-separated element of a hostlist, e.g. ``a[1-2]b[3-4]``."""

    texts: tuple[str, ...]  #: the literal parts around the brackets; one more than ``ranges``
    ranges: tuple[tuple[str, ...], ...]  #: each bracket's names, zero padding applied


# ------------------------------------------------------------------------- hostlists


def expand_hostlist(text: str) -> list[str]:
    """Every host name of a Slurm hostlist, in Slurm's order, duplicates kept.

    ``"gpu[01-02,07],login"`` -> ``["gpu01", "gpu02", "gpu07", "login"]``. Duplicates stay
    because Slurm keeps them and positions are node ranks.
    """
    if not text.strip():
        raise _hostlist_error(text, 0, "the list is empty", "at least one host name")
    names: list[str] = []
    for start, element in _elements(text):
        group = _parse_group(text, start, element)
        if len(names) + _size(group) > MAX_NAMES:
            raise _hostlist_error(
                text, start, f"it names more than {MAX_NAMES} hosts", "a smaller list"
            )
        names.extend(_expand_group(group))
    return names


def _elements(text: str) -> Iterator[tuple[int, str]]:
    """(offset, element) for each top-level comma-separated element of ``text``.

    Commas inside brackets separate ranges, not elements. Surrounding whitespace (a
    trailing newline from a file or ``$(...)``) is ignored.
    """
    first = len(text) - len(text.lstrip())
    last = len(text.rstrip())
    start, depth, opened = first, 0, 0
    for pos in range(first, last):
        char = text[pos]
        if char == "[":
            if depth:
                raise _hostlist_error(text, pos, "a '[' inside brackets", "']' first")
            depth, opened = 1, pos
        elif char == "]":
            if not depth:
                raise _hostlist_error(text, pos, "a ']' with no '[' before it", "'[' first")
            depth = 0
        elif char == "," and not depth:
            yield start, _nonempty(text, start, pos)
            start = pos + 1
    if depth:
        raise _hostlist_error(text, opened, "this '[' is never closed", "a matching ']'")
    yield start, _nonempty(text, start, last)


def _nonempty(text: str, start: int, end: int) -> str:
    if start == end:
        raise _hostlist_error(text, start, "an empty element", "a host name between commas")
    return text[start:end]


def _parse_group(text: str, start: int, element: str) -> _Group:
    """Split ``a[1-2]b[3]`` into texts ``("a", "b", "")`` and the brackets' names."""
    texts: list[str] = []
    ranges: list[tuple[str, ...]] = []
    pos = 0
    while True:
        opened = element.find("[", pos)
        literal = element[pos:] if opened < 0 else element[pos:opened]
        _check_name_chars(text, start + pos, literal)
        texts.append(literal)
        if opened < 0:
            break
        closed = element.index("]", opened)  # balanced: _elements checked
        ranges.append(_parse_ranges(text, start + opened + 1, element[opened + 1 : closed]))
        pos = closed + 1
    if ranges and texts[-1]:
        # Slurm's hostlist_create refuses it ("Invalid hostlist"): text after the last
        # bracket, e.g. n[1-3]7.
        where = start + len(element) - len(texts[-1])
        raise _hostlist_error(text, where, "text after the last ']'", "',' or the end")
    return _Group(tuple(texts), tuple(ranges))


def _check_name_chars(text: str, start: int, literal: str) -> None:
    bad = _BAD_CHAR.search(literal)
    if bad is not None:
        raise _hostlist_error(
            text,
            start + bad.start(),
            f"the character {bad.group()!r}",
            "letters, digits, '.', '-', '_', brackets or ','",
        )


def _parse_ranges(text: str, start: int, inner: str) -> tuple[str, ...]:
    """``01-03,7`` -> ``("01", "02", "03", "7")``: the width of LOW sets the padding."""
    names: list[str] = []
    pos = 0
    for part in inner.split(","):
        names.extend(_parse_range(text, start + pos, part))
        if len(names) > MAX_NAMES:
            raise _hostlist_error(text, start, f"over {MAX_NAMES} names", "a smaller range")
        pos += len(part) + 1
    return tuple(names)


def _parse_range(text: str, start: int, part: str) -> list[str]:
    match = _RANGE.fullmatch(part)
    if match is None:
        raise _hostlist_error(
            text, start, f"the range {part!r}", "N or LOW-HIGH of decimal digits, as in [1-3,7]"
        )
    low_text, high_text = match.group(1), match.group(2) or match.group(1)
    low, high = int(low_text), int(high_text)
    if low > high:
        raise _hostlist_error(text, start, f"the range {part!r} goes down", "LOW <= HIGH")
    if high - low + 1 > MAX_NAMES:
        raise _hostlist_error(
            text, start, f"the range {part!r} has over {MAX_NAMES} names", "a smaller range"
        )
    width = len(low_text)
    return [f"{k:0{width}d}" for k in range(low, high + 1)]


def _size(group: _Group) -> int:
    return math.prod(len(names) for names in group.ranges)


def _expand_group(group: _Group) -> list[str]:
    """Names of one element in Slurm's order.

    Slurm (hostlist.c ``_push_range_list``) treats the last bracket as the host range, so
    it varies fastest, and expands the other brackets from the right, recursing into the
    prefix: for ``a[1-2]b[1-2]c[1-2]`` the loops nest b (outer), a, c (inner). Two brackets
    give the usual cartesian order.
    """
    count = len(group.ranges)
    if not count:
        return [group.texts[0]]
    order = [*range(count - 2, -1, -1), count - 1]
    names = []
    for combo in itertools.product(*(group.ranges[i] for i in order)):
        picked = dict(zip(order, combo))
        parts = [group.texts[0]]
        for i in range(count):
            parts += [picked[i], group.texts[i + 1]]
        names.append("".join(parts))
    return names


def _hostlist_error(text: str, pos: int, problem: str, expected: str) -> InventoryError:
    return InventoryError(
        f"bad Slurm hostlist {_quote(text, pos)}: {problem} at character {pos + 1}; "
        f"expected {expected}. A hostlist is comma-separated names, each with optional "
        "bracketed ranges, as Slurm prints it in SLURM_JOB_NODELIST (e.g. gpu[01-04,07])."
    )


# ----------------------------------------------------------------- per-node counts


def expand_tasks_per_node(text: str) -> list[int]:
    """One count per node from Slurm's run-length form: ``2(x3),1`` -> ``[2, 2, 2, 1]``.

    The form of ``SLURM_TASKS_PER_NODE`` and ``SLURM_JOB_CPUS_PER_NODE``; entry *i* belongs
    to the *i*-th name of the node list.
    """
    if not text.strip():
        raise _counts_error(text, 0, "the list is empty", "at least one count")
    counts: list[int] = []
    pos = len(text) - len(text.lstrip())
    for item in text.strip().split(","):
        value, repeat = _parse_count(text, pos, item)
        if len(counts) + repeat > MAX_NAMES:
            raise _counts_error(text, pos, f"over {MAX_NAMES} nodes", "a shorter list")
        counts += [value] * repeat
        pos += len(item) + 1
    return counts


def _parse_count(text: str, pos: int, item: str) -> tuple[int, int]:
    match = _COUNT.fullmatch(item)
    if match is None:
        raise _counts_error(text, pos, f"the item {item!r}", "N or N(xK), as in 2(x3),1")
    repeat = int(match.group(2) or 1)
    if repeat < 1:
        raise _counts_error(text, pos, f"the repeat in {item!r} is 0", "K >= 1 in N(xK)")
    return int(match.group(1)), repeat


def _counts_error(text: str, pos: int, problem: str, expected: str) -> InventoryError:
    return InventoryError(
        f"bad Slurm per-node count list {_quote(text, pos)}: {problem} at character "
        f"{pos + 1}; expected {expected}. Slurm writes SLURM_TASKS_PER_NODE and "
        "SLURM_JOB_CPUS_PER_NODE as comma-separated counts, N(xK) for K nodes of N each."
    )


def _quote(text: str, pos: int) -> str:
    """``text`` quoted, or the part of it around ``pos`` when it is long."""
    if len(text) <= _SHOWN:
        return repr(text)
    lo = max(0, min(pos - _SHOWN // 2, len(text) - _SHOWN))
    head = "..." if lo else ""
    tail = "..." if lo + _SHOWN < len(text) else ""
    return f"{head}{text[lo : lo + _SHOWN]!r}{tail} ({len(text)} characters)"
