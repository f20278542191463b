"""Pure: the modules a script imports for sure, and which of them the shipped code provides.

``top_level_imports`` reads a script's source the way its first run would go: the imports
at module level (and under ``if __name__ == "__main__":``) always run, so a module missing on
a host fails the ranks there. Imports inside functions, under other ``if`` tests, or in a
``try`` whose ``except`` catches ``ImportError`` are optional and left alone. Only the
top-level package of each import counts: finding ``a`` is what ``import a.b`` needs first, and
looking for ``a.b`` would import ``a``. Relative imports come with the script's own package.

``provided_by`` tells which names a shipped ``--workdir`` tree provides to a script in it:
the ranks start the script with its directory as ``sys.path[0]``. ``imports_run`` and
``modules_wanted`` say which modules of such a tree a module loads for sure, and
``compile_problem`` whether this machine's Python compiles a source at all.
"""

from __future__ import annotations

import ast
import posixpath
import sys
import warnings
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


@dataclass(frozen=True)
class ImportRef:
    """One import statement that always runs."""

    module: str  #: the dotted name after ``import`` or ``from`` ("" in ``from . import x``)
    level: int = 0  #: the leading dots of a relative import (0: absolute)
    names: tuple[str, ...] = ()  #: ``from M import a, b``: a and b (either may be a module)


def top_level_imports(source: str) -> tuple[str, ...]:
    """Top-level module names the script always imports, in order, each once. Raises
    ``SyntaxError`` (or ``ValueError`` for a NUL byte) when the source does not parse."""
    found = [
        ref.module.split(".")[0]
        for ref in imports_run(source)
        if ref.level == 0 and ref.module and ref.module != "__future__"
    ]
    return tuple(dict.fromkeys(found))


def imports_run(source: str | bytes) -> tuple[ImportRef, ...]:
    """Every import statement of ``source`` that always runs, in order. Raises like
    ``top_level_imports``."""
    found: list[ImportRef] = []
    _collect(ast.parse(source).body, found)
    return tuple(found)


def _collect(body: list[ast.stmt], found: list[ImportRef]) -> None:
    for node in body:
        if isinstance(node, ast.Import):
            found += [ImportRef(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            found.append(ImportRef(node.module or "", node.level, names))
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


def modules_wanted(ref: ImportRef, importer: str, is_package: bool) -> list[str]:
    """The dotted modules ``ref`` loads, parents first, when module ``importer`` runs it
    (``""``: the script itself, which has no package for a relative import to start
    from). A name imported ``from`` a module may be a submodule: it is listed too."""
    if ref.level:
        parts = importer.split(".") if importer else []
        package = parts if is_package else parts[:-1]
        if not importer or ref.level - 1 > len(package) - 1:
            return []
        base = package[: len(package) - (ref.level - 1)]
        full = ".".join([*base, ref.module] if ref.module else base)
    else:
        full = ref.module
    parts = full.split(".")
    wanted = [".".join(parts[: k + 1]) for k in range(len(parts))]
    return wanted + [f"{full}.{name}" for name in ref.names if name != "*"]


def compile_problem(source: bytes, label: str) -> Optional[str]:
    """Why this machine's Python does not compile ``source`` (``label``: the file as the
    user knows it): the file, line and message, then the line with a caret under the
    fault, as Python's own traceback shows it. None when it compiles."""
    try:
        with warnings.catch_warnings():  # SyntaxWarnings are the ranks' to print, if any
            warnings.simplefilter("ignore")
            compile(source, label, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return _describe(exc, label)
    except ValueError as exc:  # a NUL byte, before Python 3.12
        return f"{label}: {exc}"
    except (RecursionError, MemoryError):  # too deep for this compiler: the hosts may cope
        return None
    return None


def _describe(exc: SyntaxError, label: str) -> str:
    version = ".".join(map(str, sys.version_info[:2]))
    head = f"{label}:{exc.lineno}: {type(exc).__name__}: {exc.msg} (as Python {version} reads it)"
    text = (exc.text or "").rstrip("\r\n")
    if not text.strip():
        return head
    line = text.lstrip()
    start = max(1, (exc.offset or 1) - (len(text) - len(line)))
    end = getattr(exc, "end_offset", None)
    same_line = getattr(exc, "end_lineno", exc.lineno) == exc.lineno
    width = max(1, end - exc.offset) if end and exc.offset and same_line else 1
    width = min(width, max(1, len(line) - start + 1))
    return f"{head}\n    {line}\n    {' ' * (start - 1)}{'^' * width}"


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
