"""The supervisors' messages to each other: one tagged record per kind, built and read here.

``wire`` carries them (MACed, sequenced JSON lines); this module says what they mean. Every
message is a JSON object whose ``"t"`` names its kind:

- ``hb``: a heartbeat; a node other than 0 adds ``"w"``, its watchdog facts (``NodeWatch``);
- ``done``: how the sender's node ended (``state``, ``reason``);
- ``abort``: node 0 stops every node (``reason``);
- ``hang``: node 0's watchdog found the run hung: take the stacks, then ``action``;
- ``fail``: the sender's attempt failed and it stopped (``--max-restarts``); ``hardware``,
  where one of its ranks died of a hardware error (``hardware.HARDWARE``), says so in words:
  node 0 then seats a spare in its place;
- ``check``: node 0 needs a spare for attempt ``attempt``: each waiting spare checks its
  health; ``health``: a spare's answer (``problem``: "" when healthy, else the evidence);
- ``halt``: node 0 stops attempt ``attempt`` everywhere; ``halted``: the sender did (with
  ``hardware`` as ``fail``'s, where its output shows one of its ranks died of one);
- ``again``: node 0 starts attempt ``attempt`` everywhere; where the nodes changed (a spare
  took a lost node's place, or the run goes on with fewer nodes), ``nodes`` lists the
  supervisors by node rank (each by the slot it joined the mesh with: node ranks, then the
  spares) and ``replaced`` the node ranks that are new; ``bye``: node 0 leaves.

``decode`` checks a message's kind and fields, and returns None for anything else: noise,
logged as ``wire`` logs a line that fails its MAC, never obeyed.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Optional, TypedDict, Union

from sshddp.protocol.contract import NodeWatch

MAX_TEXT = 2000  #: characters of a reason a message carries
MAX_WHY = 500  #: characters of a restart's reason (fail, halt, again)
MAX_NODES = 100_000  #: entries of ``again``'s lists of nodes
MAX_SHARED = 1000  #: files ``again``'s ``share`` may name
_HEX = frozenset("0123456789abcdef")


class Beat(TypedDict, total=False):
    t: Literal["hb"]
    rank: int
    w: NodeWatch  #: a node other than 0: its watchdog facts


class Done(TypedDict):
    t: Literal["done"]
    rank: int
    state: str
    reason: str


class Abort(TypedDict):
    t: Literal["abort"]
    reason: str


class HangNews(TypedDict):
    t: Literal["hang"]
    kind: str
    reason: str
    action: str


class _Fail(TypedDict):
    t: Literal["fail"]
    attempt: int
    reason: str


class Fail(_Fail, total=False):
    hardware: str  #: "rank 4 died of a hardware error (...)": the node must be replaced


class Check(TypedDict):
    t: Literal["check"]
    attempt: int


class Health(TypedDict):
    t: Literal["health"]
    attempt: int
    problem: str  #: "" when the spare is healthy, else what its look found


class Halt(TypedDict):
    t: Literal["halt"]
    attempt: int
    reason: str


class _Halted(TypedDict):
    t: Literal["halted"]
    attempt: int


class Halted(_Halted, total=False):
    hardware: str  #: as ``Fail``'s


class _Again(TypedDict):
    t: Literal["again"]
    attempt: int
    reason: str


class SharedFile(TypedDict):
    path: str  #: relative to the ranks' working directory
    size: int
    sha256: str


class ShareOffer(TypedDict):
    """Node 0's ``--share`` files for the next attempt (``remote/node/restart_share.py``)."""

    port: int  #: where node 0 serves them, on the rendezvous address
    files: list[SharedFile]


class Again(_Again, total=False):
    nodes: list[int]  #: the supervisors' mesh slots by node rank, where they changed
    replaced: list[int]  #: the node ranks a spare took (with ``nodes``)
    share: ShareOffer  #: node 0's shared files: a node whose copy differs pulls it first


class Bye(TypedDict):
    t: Literal["bye"]


PeerMessage = Union[Beat, Done, Abort, HangNews, Fail, Check, Health, Halt, Halted, Again, Bye]


def beat(rank: int, facts: Optional[NodeWatch] = None) -> Beat:
    msg: Beat = {"t": "hb", "rank": rank}
    if facts is not None:
        msg["w"] = facts
    return msg


def done(rank: int, state: str, reason: str) -> Done:
    return {"t": "done", "rank": rank, "state": state, "reason": reason[:MAX_TEXT]}


def abort(reason: str) -> Abort:
    return {"t": "abort", "reason": reason[:MAX_TEXT]}


def hang(kind: str, reason: str, action: str) -> HangNews:
    return {"t": "hang", "kind": kind, "reason": reason[:MAX_TEXT], "action": action}


def fail(attempt: int, reason: str, hardware: str = "") -> Fail:
    msg: Fail = {"t": "fail", "attempt": attempt, "reason": reason[:MAX_WHY]}
    if hardware:
        msg["hardware"] = hardware[:MAX_WHY]
    return msg


def check(attempt: int) -> Check:
    return {"t": "check", "attempt": attempt}


def health(attempt: int, problem: str) -> Health:
    return {"t": "health", "attempt": attempt, "problem": problem[:MAX_WHY]}


def halt(attempt: int, reason: str) -> Halt:
    return {"t": "halt", "attempt": attempt, "reason": reason}


def halted(attempt: int, hardware: str = "") -> Halted:
    msg: Halted = {"t": "halted", "attempt": attempt}
    if hardware:
        msg["hardware"] = hardware[:MAX_WHY]
    return msg


def again(
    attempt: int,
    reason: str,
    nodes: Optional[list[int]] = None,
    replaced: Optional[list[int]] = None,
) -> Again:
    msg: Again = {"t": "again", "attempt": attempt, "reason": reason}
    if nodes is not None:
        msg["nodes"] = list(nodes)
        msg["replaced"] = list(replaced or ())
    return msg


def with_share(msg: Again, share: ShareOffer) -> Again:
    """``msg`` saying where node 0 serves its shared files for the attempt."""
    return {**msg, "share": share}


def bye() -> Bye:
    return {"t": "bye"}


def encode(msg: PeerMessage) -> dict[str, Any]:
    """The JSON object ``wire`` sends."""
    return dict(msg)


def _text(raw: dict[str, Any], key: str, most: int) -> Optional[str]:
    value = raw.get(key)
    return value[:most] if isinstance(value, str) else None


def _number(raw: dict[str, Any], key: str) -> Optional[int]:
    value = raw.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _beat(raw: dict[str, Any]) -> Optional[PeerMessage]:
    rank = _number(raw, "rank")
    if rank is None:
        return None
    facts = raw.get("w")
    return beat(rank, facts if isinstance(facts, dict) else None)  # type: ignore[arg-type]


def _done(raw: dict[str, Any]) -> Optional[PeerMessage]:
    rank, state, reason = _number(raw, "rank"), raw.get("state"), _text(raw, "reason", MAX_TEXT)
    if rank is None or not isinstance(state, str) or reason is None:
        return None
    return done(rank, state, reason)


def _abort(raw: dict[str, Any]) -> Optional[PeerMessage]:
    reason = _text(raw, "reason", MAX_TEXT)
    return None if reason is None else abort(reason)


def _hang(raw: dict[str, Any]) -> Optional[PeerMessage]:
    texts = [_text(raw, k, MAX_TEXT) for k in ("kind", "reason", "action")]
    kind, reason, action = texts
    if kind is None or reason is None or action is None:
        return None
    return hang(kind, reason, action)


def _restart(raw: dict[str, Any]) -> Optional[PeerMessage]:
    tag, attempt = raw["t"], _number(raw, "attempt")
    if tag == "halted" and attempt is not None:
        return halted(attempt, _text(raw, "hardware", MAX_WHY) or "")
    if tag == "check" and attempt is not None:
        return check(attempt)
    problem = _text(raw, "problem", MAX_WHY)
    if tag == "health":
        return None if attempt is None or problem is None else health(attempt, problem)
    reason = _text(raw, "reason", MAX_WHY)
    if attempt is None or reason is None:
        return None
    if tag == "fail":
        return fail(attempt, reason, _text(raw, "hardware", MAX_WHY) or "")
    if tag == "halt":
        return halt(attempt, reason)
    nodes, replaced = _numbers(raw, "nodes"), _numbers(raw, "replaced")
    if ("nodes" in raw and nodes is None) or ("replaced" in raw and replaced is None):
        return None
    msg = again(attempt, reason, nodes, replaced)
    if "share" not in raw:
        return msg
    share = _share(raw["share"])
    return None if share is None else with_share(msg, share)


def _share(raw: Any) -> Optional[ShareOffer]:
    """A ``ShareOffer``: a port, and files each a plain relative path (no ``..``, not
    absolute), a size and a SHA-256 in hex; None for anything else."""
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), list):
        return None
    port, files = _number(raw, "port"), raw["files"]
    if port is None or not 0 < port < 65536 or len(files) > MAX_SHARED:
        return None
    checked: list[SharedFile] = []
    for item in files:
        path = item.get("path") if isinstance(item, dict) else None
        size, sha = (_number(item, "size"), item.get("sha256")) if path else (None, None)
        if not isinstance(path, str) or size is None or size < 0 or not _hex64(sha):
            return None
        parts = path.replace("\\", "/").split("/")
        if path.startswith("/") or ".." in parts or len(path) > MAX_TEXT:
            return None
        checked.append({"path": path, "size": size, "sha256": str(sha)})
    return {"port": port, "files": checked}


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in _HEX for c in value)


def _numbers(raw: dict[str, Any], key: str) -> Optional[list[int]]:
    value = raw.get(key)
    if not isinstance(value, list) or len(value) > MAX_NODES:
        return None
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    return list(value) if ok else None


_READERS: dict[str, Callable[[dict[str, Any]], Optional[PeerMessage]]] = {
    "hb": _beat,
    "done": _done,
    "abort": _abort,
    "hang": _hang,
    "fail": _restart,
    "check": _restart,
    "health": _restart,
    "halt": _restart,
    "halted": _restart,
    "again": _restart,
    "bye": lambda raw: bye(),
}


def decode(raw: dict[str, Any]) -> Optional[PeerMessage]:
    """The message ``raw`` (an authentic line's JSON object) carries; None when it is not
    one of these (the caller logs it as noise)."""
    tag = raw.get("t")
    reader = _READERS.get(tag) if isinstance(tag, str) else None
    return reader(raw) if reader is not None else None
