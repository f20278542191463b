"""What a run starts from on this machine: the inventory (a file, or a Slurm job's nodes)
and the local paths of the code.

The model parses and decides (``model.inventory``, ``model.allocation``,
``model.plan.decide_code``); this module reads the file, asks Slurm, and looks at the local
filesystem for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Optional

from sshddp.errors import InventoryError
from sshddp.hosts import slurm
from sshddp.model import allocation
from sshddp.model.inventory import (
    Inventory,
    Rendezvous,
    SlurmRequest,
    Transport,
    format_of,
    parse_host_list,
    parse_inventory,
)
from sshddp.model.plan import PathKind

MAX_INVENTORY_BYTES = 1 << 20  # an inventory is a few hundred lines; refuse to slurp a wrong path
SLURM_SOURCE = "slurm"  #: INVENTORY ``slurm`` (the current allocation) or ``slurm:JOBID``


def load_inventory(
    path: str | os.PathLike[str], environ: Optional[Mapping[str, str]] = None
) -> Inventory:
    """Read and validate an inventory file; the format follows the name (``format_of``).
    ``hosts: {slurm: ...}`` is resolved here, asking Slurm with ``environ``'s settings."""
    name = os.fspath(path)
    inv = parse_inventory(_read_text(name), source=name, fmt=format_of(name))
    return _resolve_slurm(inv, os.environ if environ is None else environ)


def load_source(
    arg: str, environ: Mapping[str, str], transport: Optional[Transport] = None
) -> Inventory:
    """The inventory an INVENTORY argument names: ``slurm`` (the allocation sshddp runs in),
    ``slurm:JOBID`` (a running job's nodes) or a file; every host on ``transport`` if given
    (``--transport``)."""
    if arg == SLURM_SOURCE or arg.startswith(SLURM_SOURCE + ":"):
        job = arg.partition(":")[2] or allocation.CURRENT
        inv = _resolve_slurm(Inventory(arg, (), Rendezvous(), SlurmRequest(job, arg)), environ)
    else:
        inv = load_inventory(arg, environ)
    return allocation.with_transport(inv, transport)


def _resolve_slurm(inv: Inventory, environ: Mapping[str, str]) -> Inventory:
    """The inventory with a ``slurm`` request replaced by the job's nodes."""
    request = inv.slurm
    if request is None:
        return inv
    where = f"{request.source}:{request.line}" if request.line else request.source
    if request.job == allocation.CURRENT:
        job = allocation.current_job(environ, where)
    else:
        job = allocation.valid_job_id(request.job, where)
    inside = environ.get("SLURM_JOB_ID") == job  # this shell's own job: exact task counts
    tasks = environ.get("SLURM_TASKS_PER_NODE") if inside else None
    alloc = allocation.parse_job(slurm.show_job(job, environ, where), job, tasks)
    names = [node.name for node in alloc.nodes]
    addrs = allocation.parse_node_addrs(slurm.node_addrs(names, environ))
    nodes = tuple(replace(node, addr=addrs.get(node.name)) for node in alloc.nodes)
    hosts = allocation.slurm_inventory(replace(alloc, nodes=nodes), request, inv.rendezvous)
    return replace(hosts, share=inv.share, sync=inv.sync)


def load_host_list(
    hosts: str, python: Optional[str] = None, user: Optional[str] = None
) -> Inventory:
    """``-H HOST:N,...`` as an inventory; ``--python`` and ``--user`` act as its defaults."""
    return parse_host_list(hosts, python=python, user=user)


def _read_text(name: str) -> str:
    try:
        with open(name, "rb") as stream:
            data = stream.read(MAX_INVENTORY_BYTES + 1)
    except FileNotFoundError:
        raise InventoryError(f"{name}: inventory file not found.") from None
    except IsADirectoryError:
        raise InventoryError(f"{name}: is a directory, not an inventory file.") from None
    except PermissionError:
        raise InventoryError(f"{name}: cannot read the inventory: permission denied.") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or exc
        raise InventoryError(f"{name}: cannot read the inventory: {reason}.") from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise InventoryError(
            f"{name}: larger than {MAX_INVENTORY_BYTES} bytes; not an inventory file."
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InventoryError(
            f"{name}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}); save the inventory as UTF-8."
        ) from None


class LocalFiles:
    """``model.plan.LocalPaths`` for this machine's filesystem."""

    def kind(self, path: str) -> PathKind:
        p = Path(path)
        if p.is_dir():
            return "dir"
        return "file" if p.is_file() else "missing"

    def resolve(self, path: str) -> str:
        return str(Path(path).resolve())
