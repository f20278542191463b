"""Serve shipped modules from memory on a host, then run the entry module.

The bootstrap (``sshddp.model.commands.BOOTSTRAP``) reads one JSON header line from stdin::

    {"importer": <this file's source>, "packed": N,
     "main": "sshddp.remote.session", "args": {...}}

and runs ``run(header)`` from this file, which reads the N bytes after the line: the
modules' sources, {name: source, ...} as zlib-compressed JSON (a file left on the host,
supervisor.py, has them in its header as ``"modules"`` instead). ``ShippedModules`` goes
first on ``sys.meta_path``, so ``import sshddp.remote.common`` finds the shipped source even
where another sshddp is installed; parent packages (``sshddp``, ``sshddp.remote``) are served
too. Sources are put in ``linecache`` so a traceback in ``supervisor.log`` shows the lines.

Compiling a launch session's 28 modules from source takes about 35 ms, every time, before
the node can start anything; so each module's code object is kept in the user's cache
(``$XDG_CACHE_HOME/sshddp/code``, else ``~/.cache/sshddp/code``), named by a hash of the
interpreter's bytecode magic, the module's name and its source: a changed module or another
Python gets its own entry, and loading one takes well under a millisecond. The directory
must be the user's own and closed to others, or it is not used; ``PYTHONDONTWRITEBYTECODE``
(``sys.dont_write_bytecode``) turns the cache off; a bad entry is compiled again.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import linecache
import marshal
import os
import stat
import sys
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import Any, Optional, Sequence

ENTRY = "main"  #: the function of the entry module that ``run`` calls with the args
CACHE_KEEP = 400  #: code cache entries kept; past that, the oldest half goes


def filename(name: str) -> str:
    """The file name tracebacks show for shipped module ``name``."""
    return f"<sshddp:{name}>"


class ShippedModules:
    """A finder and loader for the modules of one header: the protocols of
    ``importlib.abc.MetaPathFinder`` and ``Loader``, without those base classes, whose
    module imports ``importlib.resources`` and with it ``tempfile`` and ``shutil``: 3.5 ms
    of CPU in every session's start (docs/performance.md)."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = dict(sources)
        self.cache = cache_dir()

    def _is_package(self, name: str) -> bool:
        return any(other.startswith(name + ".") for other in self.sources)

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[ModuleSpec]:
        package = self._is_package(fullname)
        if fullname not in self.sources and not package:
            return None
        origin = filename(fullname)
        return importlib.util.spec_from_loader(fullname, self, origin=origin, is_package=package)

    def create_module(self, spec: ModuleSpec) -> Optional[ModuleType]:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        source = self.sources.get(name, "")
        path = filename(name)
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
        module.__file__ = path
        exec(code_of(name, source, self.cache), module.__dict__)

    def get_source(self, fullname: str) -> Optional[str]:
        return self.sources.get(fullname)

    def load_module(self, fullname: str) -> ModuleType:
        """The loader API before ``exec_module`` (typeshed's ``LoaderProtocol`` names it);
        the import system calls ``exec_module``."""
        return importlib.import_module(fullname)


def cache_dir() -> Optional[str]:
    """The code cache, made owner-only if missing; None when it cannot be used safely."""
    if sys.dont_write_bytecode:
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "sshddp", "code")
    if not os.path.isabs(path):  # no home directory to be found: never one relative to cwd
        return None
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    private = info.st_uid == os.getuid() and not info.st_mode & 0o022
    return path if private and stat.S_ISDIR(info.st_mode) else None  # lstat: a link is not


def code_of(name: str, source: str, cache: Optional[str]) -> CodeType:
    """Module ``name``'s code: from ``cache`` (a ``cache_dir()``; None: none) when it holds
    this source's, else compiled and stored there."""
    path = filename(name)
    if cache is None:
        return compile(source, path, "exec", dont_inherit=True)
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + name.encode() + b"\0")
    key.update(source.encode("utf-8", "surrogatepass"))
    entry = os.path.join(cache, key.hexdigest()[:40])
    try:
        with open(entry, "rb") as fh:
            code = marshal.loads(fh.read())
        if isinstance(code, CodeType) and code.co_filename == path:
            return code
    except (OSError, ValueError, EOFError, TypeError):
        pass  # none yet, or a bad one: compile it (again)
    code = compile(source, path, "exec", dont_inherit=True)
    _store(cache, entry, marshal.dumps(code))
    return code


def _store(cache: str, entry: str, data: bytes) -> None:
    """Write an entry whole or not at all (a temporary file renamed over it)."""
    temp = f"{entry}.{os.getpid()}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temp, entry)
        names = os.listdir(cache)
        if len(names) > CACHE_KEEP:
            _prune(cache, names)
    except OSError:  # a full or read-only disk: the module still runs, compiled
        try:
            os.unlink(temp)
        except OSError:
            pass


def _prune(cache: str, names: list[str]) -> None:
    """Remove the oldest half of the entries (by last change)."""
    aged = []
    for name in names:
        try:
            aged.append((os.lstat(os.path.join(cache, name)).st_mtime, name))
        except OSError:
            pass
    for _, name in sorted(aged)[: len(aged) // 2]:
        try:
            os.unlink(os.path.join(cache, name))
        except OSError:
            pass


def install(sources: dict[str, str]) -> ShippedModules:
    """Put the shipped modules first on the import path."""
    finder = ShippedModules(sources)
    sys.meta_path.insert(0, finder)
    return finder


def run(header: dict[str, Any]) -> None:
    """Serve the shipped modules and call ``main(header["args"])`` of ``header["main"]``.
    The modules: ``header["modules"]`` (a standalone file's), else the ``header["packed"]``
    bytes that follow the header line on stdin, zlib-compressed JSON."""
    modules = header.get("modules")
    if modules is None:
        modules = unpack(sys.stdin.buffer, int(header["packed"]))
    install(modules)
    module = importlib.import_module(header["main"])
    getattr(module, ENTRY)(header["args"])


def unpack(stream: Any, size: int) -> dict[str, str]:
    """The ``size`` packed bytes at the head of ``stream``: {module name: source}."""
    import zlib

    data = stream.read(size)
    if len(data) != size:
        raise RuntimeError(f"the shipped modules were cut short: {len(data)} of {size} bytes")
    return dict(json.loads(zlib.decompress(data).decode("utf-8")))
