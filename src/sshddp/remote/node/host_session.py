"""One host's whole part of a launch, or of a doctor run, on one SSH channel and one
interpreter: the preflight probe, a wait for the coordinator's go, staging the code, a wait
for the start, then following the node's log.

args: {"probe": probe args, or None to skip the preflight}
The lines both ways are ``session_messages``'s, which says what each carries and when. On
stdin after the header: any number of ``ask`` (each answered at once), then a ``go`` (then
the packed files boot args "packed" counts, host_boot.py, and the code bytes), then, after any
more questions (--share's, host_share.py), a ``start``. Anything else, or EOF, ends it there, and
a node staged but not started is removed. After the start stdin stays open: its EOF means
the coordinator went away, and the follower ends (the run goes on; with boot args "bound",
over srun or under the Python API, the node stops first: see bound.py).
On stdout: ``clock`` as soon as the session runs (the coordinator's first clock sample),
``facts`` (if asked), an ``answer`` per question, ``released`` after the go, once the
probe's listeners are closed (the rendezvous port is free for torchrun), ``staged`` (with
boot args "look", what the ranks' working directory holds: host_share.py), ``started``; then, if
the node started, the raw bytes of node.log and, at the end, the node's status record on
stderr, as host_follow.py sends them. A port the probe reserved for the supervisors (a picked
pair's P+1) stays reserved until just before the supervisor starts.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

from sshddp.protocol import contract, session_messages
from sshddp.remote.calls.probe import Holds, connect, probe


def _order() -> Optional[session_messages.Order]:
    return session_messages.decode_order(sys.stdin.buffer.readline())


def _say(message: session_messages.Reply) -> None:
    sys.stdout.write(session_messages.encode(message).decode("utf-8"))
    sys.stdout.flush()


def _answer(order: session_messages.Ask) -> session_messages.Answer:
    question, args = order["ask"], order["args"]
    if question == "clock":
        return session_messages.answer(question, {"clock": time.time()})
    if question == "connect":
        return session_messages.answer(question, {"rendezvous": connect(args)})
    if question.startswith("payload-"):  # the code handed from host to host
        from sshddp.remote.node import host_handoff

        return session_messages.answer(
            question, host_handoff.answer(question, args, sys.stdin.buffer)
        )
    return session_messages.answer(question, {"error": f"unknown question {question!r}"})


def main(args: dict[str, Any]) -> None:
    # First, before anything that takes time: this host's clock, the coordinator's first
    # clock sample (from its writing the header to reading this line).
    _say(session_messages.clock(time.time()))
    _session(args)


def _session(args: dict[str, Any]) -> None:
    holds = Holds()
    if args.get("probe") is not None:
        facts, holds = probe(args["probe"])
        _say(session_messages.facts(facts))
    order = _order()
    while order is not None and order["kind"] == "ask":
        _say(_answer(order))
        order = _order()
    _stop_handoff()
    holds.release_listeners()
    try:
        if order is not None and order["kind"] == "go":
            _say(session_messages.released())
            _boot(order["boot"], holds)
    finally:
        holds.release_all()


def _stop_handoff() -> None:
    """The hand-off's servers end at the go (every node has its code by then), or with
    the session."""
    handoff = sys.modules.get("sshddp.remote.node.host_handoff")
    if handoff is not None:
        handoff.stop_all()


def _boot(boot_args: dict[str, Any], holds: Holds) -> None:
    # A doctor session never gets here: the code for a launch is imported only now.
    from sshddp.remote.node import bound, host_boot, host_follow

    boot_args = host_boot.unpack_files(boot_args, sys.stdin.buffer)
    staged = host_boot.stage(boot_args, sys.stdin.buffer)
    if not staged.get("ok"):
        _say(session_messages.staged(staged))
        return
    answer = _start(boot_args, staged, holds)
    if answer is None:
        return
    _say(session_messages.started(answer))
    state = answer.get("state") or {}
    if not (answer.get("ok") and state.get("state") == contract.RUNNING):
        return
    kind = boot_args.get("bound")
    if not kind:
        host_follow.main({"rundir": answer["rundir"], "offset": 0, "index": 0})
        return
    bound.hold_signals()
    try:  # a coordinator gone mid-write is a broken pipe here: the node stops all the same
        host_follow.main({"rundir": answer["rundir"], "offset": 0, "index": 0})
    finally:
        bound.end_with_session(answer["rundir"], state, kind)


def _start(
    boot_args: dict[str, Any], staged: dict[str, Any], holds: Holds
) -> Optional[dict[str, Any]]:
    """Tell the coordinator the node staged and, on its start, start the supervisor: its
    answer. Until then this session owns the node: whatever ends it first (no start, the
    channel's EOF or a broken pipe as the coordinator dies, an error) removes what it
    staged, and None."""
    from sshddp.remote.node import host_boot, host_share

    rundir = staged["rundir"]
    started = False
    try:
        if boot_args.get("look"):  # the files --share and its warning compare
            staged["look"] = host_share.look(boot_args["look"])
        _say(session_messages.staged(staged))
        with (
            host_share.Shares()
        ) as shares:  # --share: node 0's files to the others, before the start
            order = _order()
            while order is not None and order["kind"] == "ask":
                question = {**order["args"], "ask": order["ask"]}
                _say(session_messages.answer(order["ask"], shares.answer(question)))
                order = _order()
        holds.release_all()  # the supervisor binds the reserved port as it starts
        if order is None or order["kind"] != "start" or not order["start"]:
            return None
        started = True
        return host_boot.start(boot_args, rundir)
    finally:
        if not started:
            host_boot.discard(rundir)
