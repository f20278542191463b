"""Whether the modules a script imports resolve on this host, as its ranks will import them.

The ranks run the script with the host's interpreter, in their own environment (the login
one with the inventory's ``env`` and ``--env`` applied), with the script's directory as
``sys.path[0]``. This probe runs in the same interpreter and differs from them in two ways
only: ``sys.path[0]`` (``''`` under ``python -c``) and the ``PYTHONPATH`` it started with. So
``find`` rebuilds the ranks' path from its own (the script's directory, the ranks'
``PYTHONPATH``, then the interpreter's own entries) and asks every finder but sshddp's
shipped-module importer: nothing is imported, and no new interpreter starts. When the ranks'
environment changes the rest of Python's start-up (``PYTHONHOME``, the user site...), a fresh
interpreter with that environment answers instead.

Answers {"found": {name: bool}, "method": "in-process" | "subprocess"} or {"error": ...}.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any, Mapping, Optional

STARTUP_VARS = (
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONNOUSERSITE",
    "PYTHONPLATLIBDIR",
    "PYTHONSAFEPATH",
)
TIMEOUT = 60.0

_FRESH = r"""
import importlib.util, json, sys
ask = json.loads(sys.stdin.read())
sys.path[:] = ([ask["path0"]] if ask["path0"] else []) + [p for p in sys.path if p]
print(json.dumps({n: importlib.util.find_spec(n) is not None for n in ask["names"]}))
"""


def find(names: list[str], path0: Optional[str], env: Mapping[str, str]) -> dict[str, Any]:
    """Which of the top-level module ``names`` the ranks would find (see the docstring)."""
    if any(os.environ.get(v) != env.get(v) for v in STARTUP_VARS):
        return _fresh(names, path0, env)
    path = ([path0] if path0 else []) + _pythonpath(env.get("PYTHONPATH")) + _own_path()
    found = {}
    for name in names:
        try:
            found[name] = _find_spec(name, path)
        except (ImportError, ValueError) as exc:
            return {"error": f"looking for {name}: {exc}"}
    return {"found": found, "method": "in-process"}


def _pythonpath(value: Optional[str]) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def _own_path() -> list[str]:
    """This interpreter's path without ``''`` and without what its own PYTHONPATH added."""
    ours = _pythonpath(os.environ.get("PYTHONPATH"))
    skip = set(ours) | {os.path.abspath(p) for p in ours} | {""}
    return [p for p in sys.path if p not in skip]


def _find_spec(name: str, path: list[str]) -> bool:
    for finder in sys.meta_path:
        if type(finder).__name__ == "ShippedModules":  # sshddp's own, serving this probe
            continue
        if finder is importlib.machinery.PathFinder:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        else:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(name, None) if find_spec else None
        if spec is not None:
            return True
    return False


def _fresh(names: list[str], path0: Optional[str], env: Mapping[str, str]) -> dict[str, Any]:
    ask = json.dumps({"names": names, "path0": path0})
    try:
        out = subprocess.run(
            [sys.executable, "-c", _FRESH],
            input=ask,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{sys.executable} could not look for the modules: {exc}"}
    return {"found": found, "method": "subprocess"}
