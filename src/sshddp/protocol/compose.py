"""The one composer of a node's command line, from spec.json's structure.

spec.json says what a node runs (``launcher``, ``torchrun``'s options, the ``program`` and
its arguments), never a command line; ``node_argv`` turns that into the argv, given where it
runs: the interpreter and the run directory holding the shims. The node's supervisor calls
it with its own interpreter and run directory, and ``sshddp launch --dry-run`` calls it on
the same record with the inventory's python and the planned run directory, so what the
dry run shows is what the host runs.

Stdlib only (Python 3.8): the coordinator imports it too, as it imports ``contract``.
"""

from __future__ import annotations

import posixpath

from sshddp.protocol import contract
from sshddp.protocol.contract import ProgramSpec, SpecRecord, TorchrunSpec

#: For ``local_rank_arg``: torchrun puts each worker's local rank in it (the one argument
#: sshddp lets torchrun template).
LOCAL_RANK_ARG = "--local_rank=${local_rank}"


def node_argv(spec: SpecRecord, python: str, rundir: str) -> list[str]:
    """What the node's supervisor starts, from ``spec`` with interpreter ``python`` and
    run directory ``rundir``.

    torchrun starts through the agent shim and its ranks through the rank shim (``python
    rank.py``, which line-buffers them, so lines of ranks sharing a pipe never mix); a node
    launcher's script or module starts through the rank shim, without torchrun; a user's
    command runs as it is.
    """
    launcher = spec.get("launcher", contract.LAUNCH_TORCHRUN)
    program = spec["program"]
    if launcher == contract.LAUNCH_COMMAND:
        return [program["target"], *program["args"]]
    rank = [python, posixpath.join(rundir, contract.RANK_SHIM)]
    if launcher == contract.LAUNCH_NODE:
        return [*rank, *program_argv(program)]
    options = spec["torchrun"]
    agent = [python, posixpath.join(rundir, contract.AGENT_SHIM)]
    # every argument after the program is templated by torchrun: each is made literal
    args = [torchrun_literal(a) for a in program_argv(program)]
    last = [LOCAL_RANK_ARG] if options["local_rank_arg"] else []
    # "--" ends torchrun's options: its parser would otherwise read the program's own
    # arguments for abbreviations of its options (`train.py --log 3`: "ambiguous option")
    return [*agent, *torchrun_options(options), "--no-python", "--", *rank, *args, *last]


def torchrun_options(options: TorchrunSpec) -> list[str]:
    """torchrun's options for a static rendezvous (host i is node rank i), then the user's
    own, last so that torchrun's parser lets them override (``--rdzv-backend=c10d``)."""
    return [
        "--nnodes",
        str(options["nnodes"]),
        "--node-rank",
        str(options["node_rank"]),
        "--nproc-per-node",
        str(options["nproc"]),
        "--rdzv-backend",
        options["rdzv_backend"],
        "--rdzv-endpoint",
        options["rdzv_endpoint"],
        "--rdzv-id",
        options["rdzv_id"],
        "--max-restarts",
        str(options["max_restarts"]),
        *options["options"],
    ]


def program_argv(program: ProgramSpec) -> list[str]:
    """The script and its arguments, or ``-m MODULE`` and its arguments."""
    head = ["-m"] if program["kind"] == contract.PROGRAM_MODULE else []
    return [*head, program["target"], *program["args"]]


def torchrun_literal(arg: str) -> str:
    """``arg`` as torchrun must receive it for the script to get exactly ``arg``.

    torchrun passes every argument after the program through ``string.Template``
    (``safe_substitute(local_rank=...)``), so ``$$`` would arrive as ``$`` and
    ``${local_rank}`` as ``0``; with every ``$`` doubled it gives back the text unchanged.
    """
    return arg.replace("$", "$$")
