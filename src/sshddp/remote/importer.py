"""Serve shipped modules from memory on a host, then run the entry module.

The bootstrap (``sshddp.model.commands.BOOTSTRAP``) reads one JSON header line from stdin::

    {"importer": <this file's source>, "packed": N,
     "main": "sshddp.remote.node.host_session", "args": {...}}

and runs ``run(header)`` from this file, which reads the N bytes after the line: the
modules' sources, {name: source, ...} as zlib-compressed JSON (a file left on the host,
supervisor.py, has them in its header as ``"modules"`` instead). ``ShippedModules`` goes
first on ``sys.meta_path``, so ``import sshddp.remote.common`` finds the shipped source even
where another sshddp is installed; parent packages (``sshddp``, ``sshddp.remote``) are served
too. Sources are put in ``linecache`` so a traceback in ``supervisor.log`` shows the lines.
Each module is compiled from its source as it is imported; nothing is written on the host.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import linecache
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Optional, Sequence

ENTRY = "main"  #: the function of the entry module that ``run`` calls with the args


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
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> Optional[str]:
        return self.sources.get(fullname)

    def load_module(self, fullname: str) -> ModuleType:
        """The loader API before ``exec_module`` (typeshed's ``LoaderProtocol`` names it);
        the import system calls ``exec_module``."""
        return importlib.import_module(fullname)


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
