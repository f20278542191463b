"""What the imports check asks of the hosts: the script's imports, read on this machine.

The script is parsed here (``model.imports``), never on the hosts; each host then only looks
the names up (``remote/calls/host_imports.py``). A shipped ``--workdir`` tree provides what it holds
beside the script; a single shipped file provides nothing but itself, so modules next to it
here are named in the fix. A script that lives only on the hosts is not read.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Optional

from sshddp.model.imports import ScriptImports, module_name, provided_by, top_level_imports
from sshddp.model.plan import CodeSpec
from sshddp.run.workfiles import shipped_files


def script_imports(code: CodeSpec, module: bool) -> Optional[ScriptImports]:
    """The imports check for the code of a run (None: nothing to check here)."""
    if code.kind == "remote" or code.local_path is None and not module:
        return None
    if module:
        top = code.target.split(".")[0]
        shipped = _tree_modules(code, "") if code.kind == "tar" else set()
        names = () if top in shipped else (top,)
        return ScriptImports(f"-m {code.target}", names, tuple(sorted(shipped & {top})))
    assert code.local_path is not None
    if code.kind == "tar":
        script = os.path.join(code.local_path, code.target)
        provided = _tree_modules(code, posixpath.dirname(code.target))
        return _read(script, code.target, provided, set())
    return _read(code.local_path, code.local_path, set(), _beside(code.local_path))


def _tree_modules(code: CodeSpec, script_dir: str) -> set[str]:
    assert code.local_path is not None
    return provided_by(shipped_files(Path(code.local_path), code.include), script_dir)


def _beside(script: str) -> set[str]:
    """Modules in the script's local directory (not shipped with a single file)."""
    folder = os.path.dirname(os.path.abspath(script))
    found = set()
    for entry in os.scandir(folder):
        name = module_name(entry.name, entry.is_dir())
        if name and entry.path != os.path.abspath(script):
            found.add(name)
    return found


def _read(path: str, label: str, provided: set[str], beside: set[str]) -> ScriptImports:
    try:
        with open(path, "rb") as fh:
            names = top_level_imports(fh.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return ScriptImports(label, (), error=f"cannot read {label} here: {exc}")
    except SyntaxError as exc:
        return ScriptImports(
            label, (), error=f"{label}:{exc.lineno}: does not parse here ({exc.msg})"
        )
    return ScriptImports(
        script=label,
        names=tuple(n for n in names if n not in provided),
        shipped=tuple(n for n in names if n in provided),
        beside=tuple(n for n in names if n in beside and n not in provided),
    )
