"""The standby's wire: what the processes of the standby machinery are told, each message one
JSON document tagged by ``kind``. Both ends build and read them here only.

The vocabulary: a *standby* is a torchrun started before its attempt, torch imported,
waiting for its ``go`` (``standby.Standby``; the agent shim's standby mode, ``agent.py``).
A launch session starts the first attempt's standby before its probe (``first_standby.py``) from
the *standby args* the coordinator sends in the session's header (``StandbyArgs``, built by
``run/boot.py``'s ``standby_args`` alone); the process it forks to hold that standby is the
node's supervisor-to-be. ``state.json`` and ``attempts.json`` say ``"standby": true`` for an
attempt whose torchrun was a standby.

Messages:
  ``go``         supervisor -> standby, over the standby's socket, with the node's output
                 as a descriptor (SCM_RIGHTS): the attempt's environment, torchrun's
                 command line and working directory (all final only now)
  ``supervise``  launch session -> its supervisor-to-be, down a pipe, at the start: become
                 the node's supervisor, bound to ``parent`` (over srun), with the run's
                 secrets (never through a file)

Standalone: standard library only, nothing of sshddp at run time, since the agent shim,
which runs as a file in the run directory, loads it from beside itself (``contract.
STANDBY_WIRE``). Python 3.8.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, TypedDict, Union, cast

if TYPE_CHECKING:
    from sshddp.protocol.contract import Secrets, SpecRecord


class StandbyArgs(TypedDict):
    """The session header's ``"standby"``: what a launch session needs to start the first
    attempt's standby, the same values as the boot args will have."""

    rundir: str  #: the node's run directory, as planned
    spec: SpecRecord  #: spec.json as the stage will write it
    env: dict[str, str]  #: the node's planned environment
    agent: str  #: source of the agent shim (agent.py)
    site: str  #: source of the ranks' sitecustomize.py (ranksite.py)
    wire: str  #: source of this module, which the agent shim reads its go with


class StandbyGo(TypedDict):
    kind: Literal["go"]
    env: dict[str, str]  #: the attempt's whole environment
    argv: list[str]  #: torchrun as the supervisor runs it: [python, agent.py, options...]
    cwd: Optional[str]  #: torchrun's working directory (None: where the standby is)


class Supervise(TypedDict):
    kind: Literal["supervise"]
    parent: Optional[int]  #: the session's pid, which the node ends with (over srun)
    secrets: Secrets


Message = Union[StandbyGo, Supervise]


def go(env: dict[str, str], argv: list[str], cwd: Optional[str]) -> StandbyGo:
    return {"kind": "go", "env": env, "argv": argv, "cwd": cwd}


def supervise(parent: Optional[int], secrets: Secrets) -> Supervise:
    return {"kind": "supervise", "parent": parent, "secrets": secrets}


def encode(message: Message) -> bytes:
    """One message as a line."""
    return json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"


def decode_go(data: bytes) -> Optional[StandbyGo]:
    """The go in ``data``; None for anything else."""
    value = _parsed(data, "go")
    if value is None:
        return None
    env, argv, cwd = value.get("env"), value.get("argv"), value.get("cwd")
    if not (_strings(env) and _strings(argv) and (cwd is None or isinstance(cwd, str))):
        return None
    return go(cast(Dict[str, str], env), cast(List[str], argv), cwd)


def decode_supervise(data: bytes) -> Optional[Supervise]:
    """The order to supervise in ``data``; None for anything else."""
    value = _parsed(data, "supervise")
    if value is None:
        return None
    parent, secrets = value.get("parent"), value.get("secrets")
    if not (parent is None or (isinstance(parent, int) and not isinstance(parent, bool))):
        return None
    if not isinstance(secrets, dict) or not _strings(secrets.get("env")):
        return None
    key = secrets.get("peer_key")
    if not (key is None or isinstance(key, str)):
        return None
    return supervise(parent, {"env": secrets["env"], "peer_key": key})


def _parsed(data: bytes, kind: str) -> Optional[dict[str, Any]]:
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:  # (UnicodeDecodeError is one)
        return None
    if not isinstance(value, dict) or value.get("kind") != kind:
        return None
    return value


def _strings(value: object) -> bool:
    """A list of strings, or a mapping of strings to strings."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
