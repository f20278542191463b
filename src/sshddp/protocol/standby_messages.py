"""The standby's wire: what the processes of the standby machinery are told, each message one
JSON document tagged by ``kind``. Both ends build and read them here only.

The vocabulary: a *standby* is a torchrun started before its attempt, torch imported,
waiting for its ``go`` (``standby.Standby``; the agent shim's standby mode, ``agent.py``).
``state.json`` and ``attempts.json`` say ``"standby": true`` for an attempt whose torchrun
was a standby.

Messages:
  ``go``         supervisor -> standby, over the standby's socket, with the node's output
                 as a descriptor (SCM_RIGHTS): the attempt's environment, torchrun's
                 command line and working directory

Standalone: standard library only, nothing of sshddp at run time, since the agent shim,
which runs as a file in the run directory, loads it from beside itself (``contract.
STANDBY_WIRE``). Python 3.8.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, TypedDict, cast


class StandbyGo(TypedDict):
    kind: Literal["go"]
    env: dict[str, str]  #: the attempt's whole environment
    argv: list[str]  #: torchrun as the supervisor runs it: [python, agent.py, options...]
    cwd: Optional[str]  #: torchrun's working directory (None: where the standby is)


def go(env: dict[str, str], argv: list[str], cwd: Optional[str]) -> StandbyGo:
    return {"kind": "go", "env": env, "argv": argv, "cwd": cwd}


def encode(message: StandbyGo) -> bytes:
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
