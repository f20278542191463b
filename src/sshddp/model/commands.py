"""Pure: every argv and shell string sshddp sends to a host, each value quoted.

Two kinds: the remote command line that runs shipped host-side code with the host's
interpreter (``python_command``, with its ``BOOTSTRAP``), and the torchrun command a node's
supervisor starts (``torchrun_argv``). Nothing here connects anywhere.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Optional

from sshddp.remote import contract

#: For --local-rank-arg: torchrun puts each worker's local rank in it (the one argument
#: sshddp lets torchrun template).
LOCAL_RANK_ARG = "--local_rank=${local_rank}"

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


def torchrun_argv(
    python: str,
    node_rank: int,
    nnodes: int,
    nproc: int,
    rdzv: tuple[str, int],
    run_id: str,
    max_restarts: int,
    rundir: str,
    program: tuple[str, ...],
    options: tuple[str, ...] = (),
    local_rank_arg: bool = False,
) -> tuple[str, ...]:
    """torchrun with a static rendezvous, so host i gets node rank i deterministically.

    ``program`` is the script and its arguments (or ``-m MODULE`` and its arguments), as the
    script must receive them. ``options`` are the user's own torchrun options (checked by
    ``model.torchrun``), placed before the program; ``local_rank_arg`` appends
    ``--local_rank=N`` for scripts written for ``torch.distributed.launch``. Ranks start
    through ``rank.py`` in the run directory rather than torchrun's default ``python -u``:
    it runs the script unchanged but line-buffers stdout and stderr, so each line is one
    write and lines of the ranks sharing the node's log pipe never mix.
    """
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        endpoint(*rdzv),
        "--rdzv-id",
        run_id,
        "--max-restarts",
        str(max_restarts),
        *options,
        "--no-python",
        python,
        f"{rundir}/{contract.RANK_SHIM}",
    ]
    # The one argument torchrun may template: it puts each worker's local rank in it.
    last = (LOCAL_RANK_ARG,) if local_rank_arg else ()
    return (*argv, *(torchrun_literal(a) for a in program), *last)


def torchrun_literal(arg: str) -> str:
    """``arg`` as torchrun must receive it for the script to get exactly ``arg``.

    torchrun passes every argument after the program through ``string.Template``
    (``safe_substitute(local_rank=...)``), so ``$$`` would arrive as ``$`` and
    ``${local_rank}`` as ``0``; with every ``$`` doubled it gives back the text unchanged.
    """
    return arg.replace("$", "$$")
