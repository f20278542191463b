"""Pure: every argv and shell string sshddp sends to a host, each value quoted.

Two kinds: the remote command line that runs shipped host-side code with the host's
interpreter (``python_command``, with its ``BOOTSTRAP``), and what a node's supervisor starts,
as structure (``TorchrunOptions``, ``Program``): spec.json carries it, and
``sshddp.protocol.compose`` makes it a command line, on the host and for ``--dry-run`` alike.
Nothing here connects anywhere.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Optional

from sshddp.protocol import contract

ProgramKind = Literal["script", "module", "command"]  #: contract.PROGRAM_*

# The ``python -c`` program that runs shipped code: it reads one JSON header line from stdin
# and hands it to the shipped importer (sshddp/remote/importer.py). Kept free of single
# quotes and backslashes so it survives any POSIX-ish login shell (fish too). An interpreter
# older than 3.8 answers with its version instead of failing on the modules.
BOOTSTRAP = (
    "import sys,json\n"
    "if sys.version_info<(3,8):\n"
    ' sys.stdout.write(json.dumps({"too_old":sys.version.split()[0],'
    '"executable":sys.executable})+chr(10));sys.exit(3)\n'
    "d=json.loads(sys.stdin.buffer.readline())\n"
    'n={"__name__":"sshddp_importer"}\n'
    'exec(compile(d["importer"],"<sshddp:importer>","exec"),n)\n'
    'n["run"](d)\n'
)


def quote_path(path: str) -> str:
    """Quote a path for the remote shell, leaving a leading ``~/`` to expand there."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def python_command(
    python: str, env: Optional[Mapping[str, str]] = None, label: Optional[str] = None
) -> str:
    """The remote command line that runs shipped code with ``python``. ``env`` is added
    to its environment and ``label`` (a path) to its argv, where the host's process list
    shows it: neither may hold a secret."""
    with_env = "".join(f"{shlex.quote(f'{k}={v}')} " for k, v in (env or {}).items())
    prefix = f"env {with_env}" if with_env else ""
    suffix = f" {quote_path(label)}" if label else ""
    return f"exec {prefix}{quote_path(python)} -c {shlex.quote(BOOTSTRAP)}{suffix}"


def endpoint(addr: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 address."""
    return f"[{addr}]:{port}" if ":" in addr and not addr.startswith("[") else f"{addr}:{port}"


@dataclass(frozen=True)
class TorchrunOptions:
    """torchrun's options for one node: a static rendezvous, so host i is node rank i."""

    nnodes: int
    node_rank: int
    nproc: int  #: --nproc-per-node
    rdzv_endpoint: str  #: node 0's ``host:port`` (``endpoint``)
    rdzv_id: str  #: the run id
    #: the supervisors restart the whole run (``remote/node/restarts.py``), never torchrun alone
    max_restarts: int = 0
    #: the user's own options (checked by ``model.torchrun``), after sshddp's
    options: tuple[str, ...] = ()
    local_rank_arg: bool = False  #: the script also gets ``--local_rank=N``
    rdzv_backend: str = "static"

    def record(self) -> contract.TorchrunSpec:
        """spec.json's ``torchrun``."""
        return {
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "nproc": self.nproc,
            "rdzv_backend": self.rdzv_backend,
            "rdzv_endpoint": self.rdzv_endpoint,
            "rdzv_id": self.rdzv_id,
            "max_restarts": self.max_restarts,
            "options": list(self.options),
            "local_rank_arg": self.local_rank_arg,
        }


@dataclass(frozen=True)
class Program:
    """What a node runs: a script, ``-m MODULE``, or a command, and its arguments."""

    kind: ProgramKind
    target: str  #: the script's path, the module's name, or the command's executable
    args: tuple[str, ...] = ()  #: exactly as the program must receive them

    def record(self) -> contract.ProgramSpec:
        """spec.json's ``program``."""
        return {"kind": self.kind, "target": self.target, "args": list(self.args)}
