"""Pure: the modules a script imports for sure, and which of them the shipped code provides.

``top_level_imports`` reads a script's source the way its first run would go: the imports
at module level (and under ``if __name__ == "__main__":``) always run, so a module missing on
a host fails the ranks there. Imports inside functions, under other ``if`` tests, or in a
``try`` whose ``except`` catches ``ImportError`` are optional and left alone. Only the
top-level package of each import counts: finding ``a`` is what ``import a.b`` needs first, and
looking for ``a.b`` would import ``a``. Relative imports come with the script's own package.

``provided_by`` tells which names a shipped ``--workdir`` tree provides to a script in it:
the ranks start the script with its directory as ``sys.path[0]``.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


@dataclass(frozen=True)
class ScriptImports:
    """What the imports check asks of every host for one script."""

    script: str  #: the script as the user named it
    names: tuple[str, ...]  #: top-level modules each host must find
    shipped: tuple[str, ...] = ()  #: modules the shipped --workdir tree provides
    beside: tuple[str, ...] = ()  #: modules next to the local script that are not shipped
    path0: Optional[str] = None  #: the script's directory on the hosts, when it lives there
    error: str = ""  #: why the script's imports could not be read (then nothing is checked)


def top_level_imports(source: str) -> tuple[str, ...]:
    """Top-level module names the script always imports, in order, each once. Raises
    ``SyntaxError`` (or ``ValueError`` for a NUL byte) when the source does not parse."""
    found: list[str] = []
    _collect(ast.parse(source).body, found)
    return tuple(dict.fromkeys(found))


def _collect(body: list[ast.stmt], found: list[str]) -> None:
    for node in body:
        if isinstance(node, ast.Import):
            found += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module != "__future__":
                found.append(node.module.split(".")[0])
        elif isinstance(node, ast.Try):
            if not any(_catches_import_error(h) for h in node.handlers):
                _collect(node.body, found)
                _collect(node.orelse, found)
            _collect(node.finalbody, found)
        elif (
            isinstance(node, ast.If)
            and _is_main_guard(node.test)
            or isinstance(node, (ast.With, ast.AsyncWith))
        ):
            _collect(node.body, found)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for kind in kinds:
        name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", "")
        if name in _OPTIONAL:
            return True
    return False


def _is_main_guard(test: ast.expr) -> bool:
    """``if __name__ == "__main__":`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = [test.left, test.comparators[0]]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    consts = {s.value for s in sides if isinstance(s, ast.Constant)}
    return isinstance(test.ops[0], ast.Eq) and names == {"__name__"} and consts == {"__main__"}


def module_name(entry: str, is_dir: bool) -> Optional[str]:
    """The top-level module a file or directory named ``entry`` provides, if any: a package
    (or namespace package) directory, or a ``.py`` / compiled module file."""
    if is_dir:
        name: Optional[str] = entry
    else:
        name = entry.split(".")[0] if entry.endswith(_MODULE_SUFFIXES) else None
    return name if name and name.isidentifier() else None


def provided_by(files: Iterable[str], script_dir: str) -> set[str]:
    """Top-level modules that files of a shipped tree (paths relative to its root) provide
    to a script in ``script_dir`` (relative to the root; ``""`` for the root)."""
    base = posixpath.normpath(script_dir) if script_dir else "."
    provided: set[str] = set()
    for rel in files:
        inside = posixpath.relpath(rel, base) if base != "." else rel
        if inside.startswith("../"):
            continue
        first, sep, _ = inside.partition("/")
        name = module_name(first, bool(sep))
        if name:
            provided.add(name)
    return provided
