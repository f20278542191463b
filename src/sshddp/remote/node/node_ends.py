"""How a node's attempt ended, and so how the node ends: pure functions of the facts.

The supervisor's loop (``supervisor``) posts the facts as events (torchrun's exit code once
its processes are gone, the output that could not grow, a stop asked for, a peer's abort, a
hang's verdict); ``node_events.decide`` calls these to name the attempt's end (``Ending``:
succeeded, failed, stopped or stalled, and why) and then the node's. Nothing here does I/O.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Optional

from sshddp.protocol import contract

NOT_STARTED = (
    "torchrun did not start"  #: what the other nodes hear of a first attempt that never ran
)


@dataclass(frozen=True)
class Ending:
    """How an attempt, or the node, ended."""

    state: str  #: contract.SUCCEEDED, FAILED, STOPPED or STALLED
    reason: str  #: why ("" for a success)
    rc: Optional[int] = None  #: torchrun's exit code (negative: the signal), if it ran
    told: str = ""  #: what the other nodes hear, where it is not ``reason``
    asked: bool = (
        False  #: the asker's words (the node's stop reason file), if any, replace ``reason``
    )


def exited(rc: int, full: Optional[str], what: str) -> Ending:
    """torchrun (``what``: or the node's launcher) exited with ``rc`` by itself; ``full``:
    why node.log could not grow (a node whose output was cut short never passes as
    complete)."""
    if full:
        return Ending(contract.FAILED, full, rc)
    if rc == 0:
        return Ending(contract.SUCCEEDED, "", rc)
    return Ending(contract.FAILED, describe(rc, what), rc)


def stopped(
    rc: int,
    abort: Optional[str],
    verdict: Optional[tuple[str, str]],
    full: Optional[str],
    signalled: bool,
) -> Ending:
    """The node's processes were stopped: asked to (``signalled``, or the launch session is
    gone), the run aborted (``abort``), hung (``verdict``: kind, reason) or out of disk
    (``full``, which fails the node unless someone asked it to stop)."""
    if full and not abort and not signalled:
        return Ending(contract.FAILED, full, rc)
    if verdict is not None:
        return Ending(contract.STALLED, verdict[1], rc)
    return Ending(contract.STOPPED, stop_words(abort), rc, asked=True)


def final(end: Ending, halting: bool, abort: Optional[str], full: Optional[str]) -> Ending:
    """The node's end after its last attempt's ``end``: one that node 0 had halted for a
    restart that never came (``halting``) was stopped, not failed, unless its output was
    cut short."""
    if halting and end.state in (contract.STOPPED, contract.FAILED) and not full:
        return Ending(contract.STOPPED, stop_words(abort), end.rc, asked=True)
    return end


def not_started(why: str, rc: Optional[int], attempt: int) -> Ending:
    """Attempt ``attempt``'s torchrun could not start (``why``); ``rc``: the exit code of
    the attempt before it, if any. The others hear of a first attempt as one that never ran."""
    return Ending(contract.FAILED, why, rc, told=NOT_STARTED if attempt == 1 else "")


def stop_words(abort: Optional[str]) -> str:
    """Why a node was stopped, where no one who asked gave words of their own."""
    return "stopped: " + abort if abort else "stopped on request"


def describe(rc: int, what: str = "torchrun") -> str:
    """``what``'s exit, as the node's reason says it."""
    if rc < 0:
        return f"{what} was killed by {signame(-rc)}"
    return f"{what} exited with code {rc}"


def signame(num: int) -> str:
    """A signal's name (``SIGTERM``), or its number where it has none."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
