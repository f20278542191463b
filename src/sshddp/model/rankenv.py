"""The environment a node's ranks will get, and what in it breaks a multi-node run.

Pure. The supervisor starts torchrun in the host's login environment with the inventory's
``env`` and then ``--env`` applied; ``ranks_env`` merges them the same way and keeps where
each value came from, for the variables the checks look at (``WATCH_NAMES``,
``WATCH_PREFIXES``; the probe reports only those from the login environment). The rest reads
values the way their consumers do: ``visible_gpus`` as CUDA reads ``CUDA_VISIBLE_DEVICES``,
``nccl_interfaces`` as NCCL reads ``NCCL_SOCKET_IFNAME`` and ``gloo_interfaces`` as torch's
gloo backend reads ``GLOO_SOCKET_IFNAME``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Optional

#: torchrun sets these for every rank it starts, over whatever the environment held.
TORCHRUN_SETS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
#: torchrun's own (restart count, run id...); set for the ranks or read by torchrun itself.
TORCHELASTIC_PREFIX = "TORCHELASTIC_"
#: Not set by torchrun, but read by scripts and frameworks (PyTorch Lightning) as the node
#: rank, which sshddp gives torchrun as --node-rank (GROUP_RANK in the ranks).
NODE_RANK = "NODE_RANK"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
STRAY = (*TORCHRUN_SETS, NODE_RANK)
WATCH_NAMES = (*STRAY, CUDA_VISIBLE_DEVICES, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
WATCH_PREFIXES = (TORCHELASTIC_PREFIX,)

Source = Literal["login", "inventory", "--env"]


@dataclass(frozen=True)
class EnvValue:
    """One variable as the ranks will see it, and where its value comes from."""

    name: str
    value: str
    source: Source


def ranks_env(
    login: Mapping[str, str], inventory: Mapping[str, str], cli: Mapping[str, str]
) -> dict[str, EnvValue]:
    """The watched variables the ranks get: login, then the inventory's env, then --env."""
    merged: dict[str, EnvValue] = {}
    layers: tuple[tuple[Source, Mapping[str, str]], ...] = (
        ("login", login),
        ("inventory", inventory),
        ("--env", cli),
    )
    for source, values in layers:
        for name, value in values.items():
            if watched(name):
                merged[name] = EnvValue(name, value, source)
    return merged


def watched(name: str) -> bool:
    return name in WATCH_NAMES or name.startswith(WATCH_PREFIXES)


def is_stray(name: str) -> bool:
    """Set by sshddp or torchrun for the ranks: never the user's to set."""
    return name in STRAY or name.startswith(TORCHELASTIC_PREFIX)


# --- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------


def visible_gpus(value: str, uuids: Optional[Sequence[str]]) -> list[str]:
    """The GPUs ``CUDA_VISIBLE_DEVICES=value`` leaves, in order, as CUDA reads it: indices
    or ``GPU-``/``MIG-`` UUID prefixes, separated by commas, up to the first entry that
    names no GPU (``-1``, an index past the last GPU, a repeat). ``uuids``: the host's GPUs
    by index, or None when unknown (then every well-formed entry counts, as ``#index``)."""
    left: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        gpu = _entry_gpu(entry, uuids)
        if gpu is None or gpu in left:
            break
        left.append(gpu)
    return left


def _entry_gpu(entry: str, uuids: Optional[Sequence[str]]) -> Optional[str]:
    if entry.startswith(("GPU-", "MIG-")):
        if uuids is None or entry.startswith("MIG-"):
            return entry
        found = [u for u in uuids if u.startswith(entry)]
        return found[0] if len(found) == 1 else None
    if not entry.isdigit():
        return None
    index = int(entry)
    if uuids is None:
        return f"#{index}"
    return uuids[index] if index < len(uuids) else None


# --- interface variables -------------------------------------------------------------------


def nccl_interfaces(spec: str, names: Iterable[str]) -> list[str]:
    """The interfaces ``NCCL_SOCKET_IFNAME=spec`` selects among ``names``: a comma list of
    name prefixes; ``=`` before the list asks for exact names, ``^`` (first) excludes the
    list's matches instead; ``:port`` after an entry is ignored here."""
    exclude = spec.startswith("^")
    rest = spec[1:] if exclude else spec
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    entries = [e.split(":")[0].strip() for e in rest.split(",") if e.strip()]

    def listed(name: str) -> bool:
        return any(name == e if exact else name.startswith(e) for e in entries)

    return [n for n in names if listed(n) != exclude]


def gloo_interfaces(spec: str) -> list[str]:
    """The interfaces ``GLOO_SOCKET_IFNAME=spec`` names: exact names, comma separated."""
    return [e.strip() for e in spec.split(",") if e.strip()]
