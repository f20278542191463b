"""How the stdlib-only scripts in ``sshddp/remote`` reach a host and are run there.

A command line runs the host's configured interpreter with a tiny bootstrap (``-c``) that
reads one JSON header line from stdin (script source and arguments) and executes it; any
bytes after the header (shipped code) stay on stdin for the script. Nothing is installed on
the host and no argument or secret ever appears in a process's argv.
"""

from __future__ import annotations

import json
import shlex
from functools import cache
from importlib import resources
from typing import Any, Optional

# Kept free of quotes and backslashes so it survives any POSIX-ish login shell (fish too).
# An interpreter older than 3.8 answers with its version instead of failing on the scripts.
BOOTSTRAP = (
    "import sys,json\n"
    "if sys.version_info<(3,8):\n"
    ' sys.stdout.write(json.dumps({"too_old":sys.version.split()[0],'
    '"executable":sys.executable})+chr(10));sys.exit(3)\n'
    "d=json.loads(sys.stdin.buffer.readline())\n"
    'exec(compile(d["src"],"<sshddp:"+d["name"]+">","exec"),'
    '{"__name__":"__sshddp__","ARGS":d["args"]})\n'
)


@cache
def _read(name: str) -> str:
    return (resources.files("sshddp.remote") / f"{name}.py").read_text(encoding="utf-8")


# Scripts built from others: their parts are shipped before them, in this order.
_PARTS = {"session": ("probe", "boot", "follow")}


def script_source(name: str) -> str:
    """``common.py``, the parts, then script ``name``; it ends calling ``<name>_main(ARGS)``."""
    parts = [_read("common"), *(_read(p) for p in _PARTS.get(name, ())), _read(name)]
    return "\n".join(parts) + f"\n{name}_main(ARGS)\n"


def supervisor_source() -> str:
    """The supervisor as a standalone file (it outlives the command that wrote it)."""
    return (
        f"{_read('common')}\n{_read('peers')}\n{_read('supervisor')}\n"
        "if __name__ == '__main__':\n    run_supervisor(sys.argv[1])\n"
    )


def rank_source() -> str:
    """The rank shim, standalone: every rank's interpreter runs it from the run directory."""
    return _read("rank")


def quote_path(path: str) -> str:
    """Quote a path for the remote shell, leaving a leading ``~/`` to expand there."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def python_command(
    python: str, env: Optional[dict[str, str]] = None, label: Optional[str] = None
) -> str:
    """The remote command line that runs a shipped script with ``python``. ``env`` is added
    to its environment and ``label`` (a path) to its argv, where the host's process list
    shows it: neither may hold a secret."""
    with_env = "".join(f"{shlex.quote(f'{k}={v}')} " for k, v in (env or {}).items())
    prefix = f"env {with_env}" if with_env else ""
    suffix = f" {quote_path(label)}" if label else ""
    return f"exec {prefix}{quote_path(python)} -c {shlex.quote(BOOTSTRAP)}{suffix}"


def header(name: str, args: dict[str, Any]) -> bytes:
    """The stdin header line that carries script ``name`` and its arguments."""
    body = {"name": name, "src": script_source(name), "args": args}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"
