"""The launch session's wire: the lines the coordinator (``hosts/session.py``) and a host's
launch session (``host_session.py``) send each other, one JSON object a line, each tagged by
``kind``. Both ends build and read them here only.

Coordinator to session (``Order``), on the session's stdin after its header:
  ``ask``    a question answered at once (``"clock"``, ``"connect"``, --share's ``"serve"``,
             ``"pull"``, ``"unserve"``), its ``args`` as the question's handler takes them
  ``go``     boot the node with ``boot`` (boot.py's args); packed files and code follow it
  ``start``  every node staged: start the node (``true``) or remove what it staged
Session to coordinator (``Reply``), on its stdout:
  ``clock``     this host's time.time(): the session's first line, before anything else
  ``facts``     the probe's facts
  ``answer``    the answer to an ``ask``, which it names
  ``released``  the probe's listeners are closed (the rendezvous port is free)
  ``staged``    stage()'s answer; ``started``: start()'s (their ``answer``: boot.py's
                ``Answer``, {"ok", "rundir", ...})
After ``started`` the stream is the node's raw log (host_follow.py), no longer this wire.

A line that is not one of these, or lacks a field, or has one of the wrong type, decodes to
None: neither end acts on a guess. Standard library only, Python 3.8.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Literal, Optional, Tuple, TypedDict, Union, cast


class Ask(TypedDict):
    kind: Literal["ask"]
    ask: str  #: the question
    args: dict[str, Any]  #: what its handler reads (probe.connect, share.Shares.answer)


class Go(TypedDict):
    kind: Literal["go"]
    boot: dict[str, Any]  #: boot.py's args


class Start(TypedDict):
    kind: Literal["start"]
    start: bool  #: False: remove what the node staged


class Clock(TypedDict):
    kind: Literal["clock"]
    clock: float  #: the host's time.time()


class Facts(TypedDict):
    kind: Literal["facts"]
    facts: dict[str, Any]  #: probe.py's facts


class Answer(TypedDict):
    kind: Literal["answer"]
    ask: str  #: the question it answers
    answer: dict[str, Any]


class Released(TypedDict):
    kind: Literal["released"]


class Staged(TypedDict):
    kind: Literal["staged"]
    answer: dict[str, Any]  #: boot.stage()'s


class Started(TypedDict):
    kind: Literal["started"]
    answer: dict[str, Any]  #: boot.start()'s


Order = Union[Ask, Go, Start]
Reply = Union[Clock, Facts, Answer, Released, Staged, Started]

Fields = Dict[str, Dict[str, Tuple[type, ...]]]
#: each kind's fields and the types their values may have (a bool is no number here)
ORDERS: Fields = {
    "ask": {"ask": (str,), "args": (dict,)},
    "go": {"boot": (dict,)},
    "start": {"start": (bool,)},
}
REPLIES: Fields = {
    "clock": {"clock": (int, float)},
    "facts": {"facts": (dict,)},
    "answer": {"ask": (str,), "answer": (dict,)},
    "released": {},
    "staged": {"answer": (dict,)},
    "started": {"answer": (dict,)},
}


def ask(question: str, args: Optional[dict[str, Any]] = None) -> Ask:
    return {"kind": "ask", "ask": question, "args": dict(args or {})}


def go(boot: dict[str, Any]) -> Go:
    return {"kind": "go", "boot": boot}


def start(start: bool) -> Start:
    return {"kind": "start", "start": start}


def clock(now: float) -> Clock:
    return {"kind": "clock", "clock": now}


def facts(found: dict[str, Any]) -> Facts:
    return {"kind": "facts", "facts": found}


def answer(question: str, said: dict[str, Any]) -> Answer:
    return {"kind": "answer", "ask": question, "answer": said}


def released() -> Released:
    return {"kind": "released"}


def staged(said: dict[str, Any]) -> Staged:
    return {"kind": "staged", "answer": said}


def started(said: dict[str, Any]) -> Started:
    return {"kind": "started", "answer": said}


def replies_to(reply: Reply, kind: str, question: str = "") -> bool:
    """Whether ``reply`` is of ``kind``, and for an answer, to ``question``."""
    fields = cast(Dict[str, Any], reply)
    return fields["kind"] == kind and (kind != "answer" or fields["ask"] == question)


def carried(reply: Reply) -> dict[str, Any]:
    """What ``reply`` tells the step that waits for it: the facts, or the answer (to a
    question, the stage, the start); nothing more for the others."""
    fields = cast(Dict[str, Any], reply)
    return dict(fields.get("facts", fields.get("answer", {})))


def encode(message: Union[Order, Reply]) -> bytes:
    """One message as its line."""
    return json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"


def decode_order(line: bytes) -> Optional[Order]:
    """The coordinator's order on ``line``; None for anything else (an empty line: EOF)."""
    return cast(Optional[Order], checked(_parsed(line), ORDERS))


def decode_reply(line: bytes) -> Optional[Reply]:
    """The session's reply on ``line``; None for anything else."""
    return reply_of(_parsed(line))


def reply_of(value: object) -> Optional[Reply]:
    """``value`` (a line's JSON, parsed) as the session's reply; None if it is not one."""
    return cast(Optional[Reply], checked(value, REPLIES))


def checked(value: object, fields: Fields) -> Optional[dict[str, Any]]:
    """``value`` as a message of ``fields``, only its kind's fields kept; None when it has
    no known kind, or a field is missing or of another type."""
    if not isinstance(value, dict):
        return None
    kind = value.get("kind")
    wanted = fields.get(kind) if isinstance(kind, str) else None
    if wanted is None:
        return None
    for name, types in wanted.items():
        field = value.get(name)
        if not isinstance(field, types) or (isinstance(field, bool) and bool not in types):
            return None
    return {"kind": kind, **{name: value[name] for name in wanted}}


def _parsed(line: bytes) -> object:
    try:
        return json.loads(line.decode("utf-8"))
    except ValueError:  # (UnicodeDecodeError is one)
        return None
