"""How host-side code (``sshddp.remote``) reaches a host and runs there.

A command line (``model.commands.python_command``) runs the host's configured interpreter
with a tiny bootstrap that reads one JSON header line from stdin: the shipped importer, the
entry module and its arguments, and the size of what follows the line: the sources of the
modules the call needs, as zlib-compressed JSON (``remote/importer.py`` says what it does
with them). A launch session's 29 modules are 255 KB as JSON and 75 KB packed, sent to
every host of every launch, from a laptop's uplink. Any bytes after those (shipped code)
stay on stdin for the entry module. Nothing is installed on the host, and no argument
or secret ever appears in a process's argv.
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, Optional

from sshddp.errors import InterpreterMissing, RemoteError
from sshddp.hosts.transport import RemoteProcess, Transport, run
from sshddp.model.commands import python_command

PACKAGE = "sshddp.remote"
#: the packages shipped to the hosts: the host code, and the protocol both sides import
SHIPPED = (PACKAGE, "sshddp.protocol")
#: zlib level of the packed modules: 6 (the default) packs 255 KB to 75 KB in 21 ms, once
#: per launch; 9 gains 0.4 KB for three times the time, 1 loses 16 KB
PACK_LEVEL = 6
IMPORTER = f"{PACKAGE}.importer"
_BUILDING = threading.Lock()


def _file(module: str) -> Any:
    """The source file of shipped module ``module``: ``a/b.py``, or ``a/b/__init__.py`` for
    a package."""
    parent, _, leaf = module.rpartition(".")
    folder = resources.files(parent)
    if (folder / leaf).is_dir():
        return folder / leaf / "__init__.py"
    return folder / f"{leaf}.py"


@cache
def source(module: str) -> str:
    """The source of shipped module ``module`` (``sshddp.remote`` or ``sshddp.protocol``,
    or below)."""
    return _file(module).read_text(encoding="utf-8")


@cache
def is_package(module: str) -> bool:
    parent, _, leaf = module.rpartition(".")
    return (resources.files(parent) / leaf).is_dir()


_ROOTS = r"sshddp\.(?:remote|protocol)"
_FROM = re.compile(rf"^[ \t]*from[ \t]+({_ROOTS}(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|.*)$", re.M)
_IMPORT = re.compile(rf"^[ \t]*import[ \t]+({_ROOTS}(?:\.\w+)+)", re.M)


def imports_of(module: str) -> set[str]:
    """The shipped modules that ``module`` imports, anywhere in its code. A text scan, not
    ``ast``: it is fast, and ``ast.parse`` is not safe in threads on Python 3.11."""
    text = source(module)
    found = set(_IMPORT.findall(text))
    for base, names in _FROM.findall(text):
        if not is_package(base):
            found.add(base)
            continue
        for name in names.strip("()").split(","):
            name = name.split("#")[0].split(" as ")[0].strip()
            if not name:
                continue
            full = f"{base}.{name}"
            found.add(full if _file(full).is_file() else base)
    return found


@cache
def closure(entry: str) -> tuple[str, ...]:
    """``entry`` and every shipped module it needs, their packages included, sorted."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(imports_of(module))
        parent = module.rpartition(".")[0]
        if parent != "sshddp":
            todo.append(parent)
    return tuple(sorted(seen))


@cache
def _by_short_name() -> dict[str, str]:
    """Every shipped module by its file's name (unique: a module's name says its side)."""
    found = {}
    for root in SHIPPED:
        base = resources.files(root)
        for path in _walk(base):
            found[path[-1]] = ".".join((root, *path))
    return found


def _walk(folder: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for item in folder.iterdir():
        if item.is_dir() and (item / "__init__.py").is_file():
            out.extend(_walk(item, (*prefix, item.name)))
        elif item.name.endswith(".py") and item.name != "__init__.py":
            out.append((*prefix, item.name[:-3]))
    return out


def entry_module(name: str) -> str:
    """``"host_session"`` -> ``"sshddp.remote.node.host_session"`` (a dotted name as is)."""
    return name if "." in name else _by_short_name()[name]


@cache
def _header_prefix(entry: str) -> tuple[bytes, bytes]:
    """The header line up to its arguments, and the packed modules after it: the same
    bytes for every call of ``entry``."""
    modules = json.dumps({m: source(m) for m in closure(entry)}, separators=(",", ":"))
    packed = zlib.compress(modules.encode(), PACK_LEVEL)
    body = {"importer": source(IMPORTER), "packed": len(packed), "main": entry}
    text = json.dumps(body, separators=(",", ":"))
    return text[:-1].encode() + b',"args":', packed


def header(name: str, args: Mapping[str, Any]) -> bytes:
    """What goes first on stdin to run ``main(args)`` of host-side module ``name``: the
    header line, then the packed modules."""
    with _BUILDING:  # the first call builds it; the pool's other threads wait, then reuse it
        prefix, packed = _header_prefix(entry_module(name))
    return prefix + json.dumps(args, separators=(",", ":")).encode() + b"}\n" + packed


def standalone(name: str) -> str:
    """A file that runs ``main({"rundir": argv[1]})`` of ``name`` with the shipped modules:
    ``python -S FILE RUNDIR``. Left in a run directory as supervisor.py."""
    entry = entry_module(name)
    body = {
        "importer": source(IMPORTER),
        "modules": {m: source(m) for m in closure(entry)},
        "main": entry,
    }
    return (
        f'"""Runs {entry} for a run directory: python -S {name}.py RUNDIR"""\n'
        "import json\n"
        "import sys\n\n"
        f"HEADER = json.loads({json.dumps(body)!r})\n"
        'NAMESPACE = {"__name__": "sshddp_importer"}\n'
        'exec(compile(HEADER["importer"], "<sshddp:importer>", "exec"), NAMESPACE)\n'
        'if __name__ == "__main__":\n'
        '    NAMESPACE["run"](dict(HEADER, args={"rundir": sys.argv[1]}))\n'
    )


def start(
    transport: Transport,
    name: str,
    args: Mapping[str, Any],
    env: Optional[Mapping[str, str]] = None,
    label: Optional[str] = None,
) -> RemoteProcess:
    """Start host-side module ``name`` with the host's interpreter; its stdin stays open.
    ``env`` and ``label``: see ``model.commands.python_command``."""
    proc = transport.start(python_command(transport.host.python, env, label))
    proc.write(header(name, args))
    return proc


def call(transport: Transport, name: str, args: Mapping[str, Any], payload: bytes = b"") -> Any:
    """Run host-side module ``name`` to completion and return its JSON answer."""
    command = python_command(transport.host.python)
    result = run(transport, command, header(name, args) + payload)
    return decode(transport, name, result.stdout, result.stderr, result.returncode)


def decode(transport: Transport, what: str, line: bytes, stderr: bytes, rc: Optional[int]) -> Any:
    """The JSON answer of host-side code, or a ``RemoteError`` that says what went wrong."""
    try:
        value = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    python = transport.host.python
    detail = stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    if rc == 127:
        raise InterpreterMissing(f"the interpreter {python!r} was not found on {transport.label}")
    raise RemoteError(
        f"{transport.label}: {what} failed (exit {rc}): " + (" | ".join(detail) or "no output")
    )
