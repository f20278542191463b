"""The package's shape, checked: layers whose imports only point down, no import cycle,
host-side code that imports only the standard library and itself, short functions, and
folders a newcomer can read.

Layers, top to bottom: api -> cli -> run -> hosts -> model -> (protocol, errors, defaults, trace).
The host-side package ``sshddp.remote`` (rooms by role: ``node``, ``rankside``, ``calls``) is
shipped to the hosts, never imported here: ``hosts.shipped`` reads its sources as text.
``sshddp.protocol`` is what both sides share (the contract, the composer, the wires'
messages): stdlib-only, shipped too, and imported by either side.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
#: the packages shipped to the hosts: stdlib-only, Python 3.8
SHIPPED = ("remote", "protocol")
MAX_FOLDER_MODULES = 32
PACKAGE = SRC / "sshddp"
LAYERS = {
    "api": 5,
    "cli": 4,
    "run": 3,
    "hosts": 2,
    "model": 1,
    "protocol": 0,
    "errors": 0,
    "defaults": 0,
    "trace": 0,
}
TOP_LEVEL = {"sshddp", "sshddp.__main__"}  # the package itself and `python -m sshddp`
MAX_FUNCTION_LINES = 50
MAX_CLASS_LINES = 150
#: classes allowed past MAX_CLASS_LINES, and why
LONG_CLASSES: dict[str, str] = {}


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, name: str) -> Iterator[tuple[str, int]]:
    """(imported sshddp module, line) for every import anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            known = modules()
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in known else base), node.lineno


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def sshddp_imports(name: str, path: Path) -> list[tuple[str, int]]:
    return [(m, line) for m, line in imports(path, name) if m.split(".")[0] == "sshddp"]


@pytest.mark.parametrize("name", sorted(modules()))
def test_imports_point_down(name: str) -> None:
    path = modules()[name]
    if name in TOP_LEVEL:
        return
    mine = layer(name)
    for target, line in sshddp_imports(name, path):
        if target == "sshddp":  # the version
            continue
        theirs = layer(target)
        where = f"{path.relative_to(SRC)}:{line} imports {target}"
        if mine == "remote":
            assert theirs in SHIPPED, f"{where}: host-side code imports only the shipped code"
        elif mine == "protocol":
            assert theirs == "protocol", f"{where}: the protocol imports only itself"
        elif theirs == "remote":
            raise AssertionError(f"{where}: only the protocol is shared, never the host code")
        else:
            assert LAYERS[theirs] <= LAYERS[mine], f"{where}: an import pointing up"


def test_host_side_code_imports_only_the_standard_library() -> None:
    stdlib = sys.stdlib_module_names
    for name, path in modules().items():
        if layer(name) not in SHIPPED:
            continue
        for target, line in imports(path, name):
            top = target.split(".")[0]
            assert top == "sshddp" or top in stdlib, f"{path}:{line} imports {target}"


def test_no_import_cycle() -> None:
    graph = {name: {t for t, _ in sshddp_imports(name, p)} for name, p in modules().items()}
    # `sshddp.launch` & co. are re-exported lazily (on first use, never at `import sshddp`)
    graph["sshddp"] = {t for t in graph["sshddp"] if layer(t) != "api"}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or nxt == node:
                continue
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_functions_and_classes_stay_short() -> None:
    long = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            size = (
                (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            )
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and size > MAX_FUNCTION_LINES
            ):
                long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}: {size} lines")
            if (
                isinstance(node, ast.ClassDef)
                and size > MAX_CLASS_LINES
                and node.name not in LONG_CLASSES
            ):
                long.append(
                    f"{path.relative_to(SRC)}:{node.lineno} class {node.name}: {size} lines"
                )
    assert not long, "\n".join(long)


def test_a_call_ships_exactly_the_host_side_modules_its_entry_imports() -> None:
    """``hosts.shipped`` finds imports by scanning text; ast agrees, for every module."""
    from sshddp.hosts import shipped

    for name in modules():
        if layer(name) not in SHIPPED or name in {"sshddp.remote", "sshddp.protocol"}:
            continue
        by_ast = {t for t, _ in sshddp_imports(name, modules()[name])}
        assert shipped.imports_of(name) == by_ast, name
    stop = shipped.closure("sshddp.remote.node.stop")
    assert "sshddp.remote.node.stop" in stop and "sshddp.remote.common" in stop
    assert "sshddp.remote.node.supervisor" not in stop and "sshddp.remote.calls.probe" not in stop


def test_a_host_module_is_named_for_the_side_it_runs_on() -> None:
    """A traceback's file name says which side of the wire it ran on: no module of the
    host-side package shares its file name with a module of the coordinator."""
    host = {p.name for p in (PACKAGE / "remote").rglob("*.py")} - {"__init__.py"}
    coordinator = {
        p.name for p in PACKAGE.rglob("*.py") if "remote" not in p.relative_to(PACKAGE).parts
    }
    assert host, "the host-side package has modules"
    assert not host & coordinator, f"named on both sides: {sorted(host & coordinator)}"


def test_no_class_name_is_defined_twice() -> None:
    """One name, one meaning: an event and a message, or two wires' messages, never share
    a class name (a reader would have to check which one a line means)."""
    where: dict[str, list[str]] = {}
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, f"class names defined more than once: {twice}"


def test_no_folder_is_a_crowd() -> None:
    """A newcomer finds a module by its folder's role: none holds more than a screenful."""
    crowded = {
        str(folder.relative_to(SRC)): n
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if (n := len(list(folder.glob("*.py")))) > MAX_FOLDER_MODULES
    }
    assert not crowded, f"folders over {MAX_FOLDER_MODULES} modules: {crowded}"


def test_no_two_test_files_share_a_name() -> None:
    """The test folders are not packages: pytest imports each test file by its base name,
    and a second file of the same name fails the run's collection ("import file mismatch")."""
    tests = SRC.parent / "tests"
    names = Counter(path.name for path in tests.rglob("test_*.py"))
    assert not [name for name, n in names.items() if n > 1], names.most_common(3)
