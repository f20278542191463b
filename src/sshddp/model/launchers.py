"""Pure: what a node runs besides torchrun, and the environment every launcher reads.

``--launcher torchrun`` (the default) runs torchrun on every node; ``--launcher node`` runs
one process per node that spawns its own workers: a Lightning ``Trainer``, a script that
calls ``torch.multiprocessing.spawn``, or any command after ``--`` (``accelerate launch``,
``deepspeed``...), whose arguments may name the run's figures as placeholders. Either way
the node's environment says where the rendezvous is and which node this is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sshddp.errors import UsageError
from sshddp.model.commands import endpoint
from sshddp.protocol import contract

Launcher = Literal["torchrun", "node"]
LAUNCHERS: tuple[Launcher, ...] = ("torchrun", "node")
RDZV_ENDPOINT_VAR = "SSHDDP_RDZV_ENDPOINT"

#: Placeholders a ``-- COMMAND``'s arguments may use; ``{{`` and ``}}`` are literal braces.
PLACEHOLDERS = ("node_rank", "nnodes", "master_addr", "master_port", "nproc", "world_size")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


@dataclass(frozen=True)
class NodeFigures:
    """What one node of a run is: the values its environment and placeholders carry."""

    node_rank: int
    nnodes: int
    nproc: int  #: this node's processes (its gpus, or nproc)
    world_size: int  #: every node's processes together
    master_addr: str  #: node 0's address: the rendezvous
    master_port: int

    def placeholders(self) -> dict[str, str]:
        return {name: str(getattr(self, name)) for name in PLACEHOLDERS}


def launcher_env(launcher: Launcher, node: NodeFigures) -> dict[str, str]:
    """The variables sshddp sets for a node's processes.

    torchrun sets its workers' own (``RANK``, ``GROUP_RANK``, ``MASTER_ADDR``...), so a
    torchrun node gets only ``NODE_RANK``, which torchrun leaves unset and Lightning reads:
    a stray one from a shell makes it wait for a node that never comes. A node launcher
    gets everything Lightning, ``mp.spawn`` scripts and ``accelerate`` read.
    """
    if launcher == "torchrun":
        return {"NODE_RANK": str(node.node_rank)}
    return {
        "MASTER_ADDR": node.master_addr,
        "MASTER_PORT": str(node.master_port),
        "NODE_RANK": str(node.node_rank),
        "GROUP_RANK": str(node.node_rank),
        "NNODES": str(node.nnodes),
        "WORLD_SIZE": str(node.world_size),
        "LOCAL_WORLD_SIZE": str(node.nproc),
        "NPROC_PER_NODE": str(node.nproc),
        RDZV_ENDPOINT_VAR: endpoint(node.master_addr, node.master_port),
    }


def expand(args: Sequence[str], values: Mapping[str, str]) -> tuple[str, ...]:
    """Each argument with ``{name}`` replaced by its value; ``{{``/``}}`` give a brace.

    An unknown name or an unmatched ``{`` is refused, naming the argument, so a typo never
    reaches the hosts as literal text.
    """
    return tuple(_expand_one(arg, i, values) for i, arg in enumerate(args))


def _expand_one(arg: str, index: int, values: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name is not None and name in values:
            return values[name]
        known = ", ".join("{" + n + "}" for n in values)
        what = f"unknown placeholder {token!r}" if name is not None else f"a lone {token!r}"
        raise UsageError(
            f"command argument {index + 1} ({arg!r}): {what}; the placeholders are {known}, "
            "and `{{` or `}}` is a literal brace"
        )

    return _TOKEN.sub(replace, arg)


def spec_launcher(launcher: Launcher, command: tuple[str, ...]) -> str:
    """What runs the node: spec.json's ``launcher`` (``contract.SpecRecord``)."""
    if launcher == "torchrun":
        return contract.LAUNCH_TORCHRUN
    return contract.LAUNCH_COMMAND if command else contract.LAUNCH_NODE
