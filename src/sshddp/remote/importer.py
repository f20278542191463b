"""Serve shipped modules from memory on a host, then run the entry module.

The bootstrap (``sshddp.hosts.shipped.BOOTSTRAP``) reads one JSON header from stdin::

    {"importer": <this file's source>, "modules": {name: source, ...},
     "main": "sshddp.remote.session", "args": {...}}

and runs ``run(header)`` from this file. ``ShippedModules`` goes first on ``sys.meta_path``,
so ``import sshddp.remote.common`` finds the shipped source even where another sshddp is
installed; parent packages (``sshddp``, ``sshddp.remote``) are served too. Sources are put in
``linecache`` so a traceback in ``supervisor.log`` shows the lines.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import linecache
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Optional, Sequence

ENTRY = "main"  #: the function of the entry module that ``run`` calls with the args


def filename(name: str) -> str:
    """The file name tracebacks show for shipped module ``name``."""
    return f"<sshddp:{name}>"


class ShippedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder and loader for the modules of one header."""

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


def install(sources: dict[str, str]) -> ShippedModules:
    """Put the shipped modules first on the import path."""
    finder = ShippedModules(sources)
    sys.meta_path.insert(0, finder)
    return finder


def run(header: dict[str, Any]) -> None:
    """Serve ``header["modules"]`` and call ``main(header["args"])`` of ``header["main"]``."""
    install(header["modules"])
    module = importlib.import_module(header["main"])
    getattr(module, ENTRY)(header["args"])
