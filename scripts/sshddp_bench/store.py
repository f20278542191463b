"""The suite's stored results: one JSON file per case under ``benchmarks/results/``, written
when the case ends, read back by ``python -m sshddp_bench report`` to write BENCHMARKS.md.

A row is whatever the case measured (its frozen dataclasses of ``Stat`` and numbers); the
codec keeps the types (tuples, dicts keyed by numbers, nested dataclasses), so the case's
own ``table`` renders the stored row exactly as it rendered the live one.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sshddp_bench.case import Sizes
from sshddp_bench.harness import BenchError

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/sshddp_bench/store.py
RESULTS = ROOT / "benchmarks" / "results"
TYPE, TUPLE, DICT, SET, FLOAT = "@type", "@tuple", "@dict", "@frozenset", "@float"


@dataclass(frozen=True)
class Stored:
    """One case's last measurement, as stored."""

    case: str  #: its ``--only`` name
    row: Any  #: what its run returned
    machine: tuple[tuple[str, str], ...]  #: the report's *Machine* table, that run's
    command: str  #: the command that measured it
    reps: int  #: repetitions
    sizes: Sizes | None  #: the sizes it ran at (None: a tool outside the cases, ``mechanisms``)


def encode(value: Any) -> Any:
    """``value`` as JSON data that ``decode`` turns back into an equal value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = f"{_module(type(value))}:{type(value).__qualname__}"
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {TYPE: name, **fields}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {TUPLE: [encode(v) for v in value]}
    if isinstance(value, frozenset):
        return {SET: sorted(encode(v) for v in value)}
    if isinstance(value, dict):
        return {DICT: [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT: repr(value)}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise BenchError(f"cannot store a {type(value).__name__}: {value!r}")


def _module(cls: type) -> str:
    """``cls``'s module by its importable name (``python -m sshddp_bench.mechanisms`` runs
    that module as ``__main__``)."""
    if cls.__module__ == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is not None:
            return str(spec.name)
    return cls.__module__


def decode(data: Any) -> Any:
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if TUPLE in data:
        return tuple(decode(v) for v in data[TUPLE])
    if SET in data:
        return frozenset(decode(v) for v in data[SET])
    if DICT in data:
        return {decode(k): decode(v) for k, v in data[DICT]}
    if FLOAT in data:
        return float(data[FLOAT])
    cls = _class(data[TYPE])
    return cls(**{k: decode(v) for k, v in data.items() if k != TYPE})


def _class(name: str) -> Any:
    """A dataclass of the suite, by ``module:qualname``; nothing outside the suite."""
    module, _, qualname = name.partition(":")
    if module.split(".")[0] != "sshddp_bench":
        raise BenchError(f"a stored result names {name!r}, not a class of sshddp_bench")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def path_of(results: Path, case: str) -> Path:
    return results / f"{case}.json"


def save(results: Path, stored: Stored) -> Path:
    """Write ``stored`` as its case's file (the case's earlier result replaced)."""
    results.mkdir(parents=True, exist_ok=True)
    path = path_of(results, stored.case)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(encode(stored), indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def load(results: Path, names: tuple[str, ...]) -> dict[str, Stored]:
    """Every stored case among ``names``, by name."""
    found: dict[str, Stored] = {}
    for name in names:
        path = path_of(results, name)
        if path.exists():
            stored = decode(json.loads(path.read_text()))
            if not isinstance(stored, Stored) or stored.case != name:
                raise BenchError(f"{path}: not the stored result of case {name}")
            found[name] = stored
    return found
