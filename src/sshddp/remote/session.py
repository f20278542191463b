"""One host's whole part of a launch, or of a doctor run, on one SSH channel and one
interpreter: the preflight probe, a wait for the coordinator's go, staging the code, a wait
for the start, then following the node's log.

args: {"probe": probe args, or None to skip the preflight; "warm": for a torchrun node of a
launch, what its torchrun needs to start importing torch at once (prewarm.py): {"rundir",
"spec", "env", "agent", "site"}, as the boot args will have them}
stdin after the header: first, any number of questions about the probe, each answered at
once: {"ask": "clock"} (this host's time.time(), for the clock check) and {"ask": "connect",
"connect": [addr, port], "timeout": s} (a rendezvous connect, when node 0 picked the port);
then {"go": true, "boot": boot args}, the packed files boot args "packed" counts (boot.py)
and the code bytes, then later {"start": true};
{"go": false} / {"start": false} (or EOF) end it there, and a node staged but not started is
removed. After the start stdin stays open: its EOF means the coordinator went away, and the
follower ends (the run goes on; with boot args "bound", over srun, the node stops first: see
bound.py).
stdout, one JSON line each: {"clock": this host's time.time()} as soon as the session runs
(the coordinator's first clock sample); the probe's facts (if asked); an answer per
question; after the go, {"released": true} once the probe's listeners are closed (the
rendezvous port is free for torchrun); stage()'s answer (with boot args "look", what the
ranks' working directory holds: share.py, whose questions may come next); after the
start, start()'s answer; then, if the node started, the raw bytes of node.log and, at the
end, the node's status record on stderr, as follow.py sends them. A port the probe reserved
for the supervisors (a picked pair's P+1) stays reserved until just before the supervisor
starts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from sshddp.remote import contract
from sshddp.remote.common import emit
from sshddp.remote.probe import Holds, connect, probe

if TYPE_CHECKING:
    from sshddp.remote.prewarm import Prewarm


def _order() -> dict[str, Any]:
    line = sys.stdin.buffer.readline()
    try:
        order = json.loads(line.decode("utf-8")) if line.strip() else {}
    except ValueError:
        order = {}
    return order if isinstance(order, dict) else {}


def _answer(order: dict[str, Any]) -> dict[str, Any]:
    if order["ask"] == "clock":
        return {"clock": time.time()}
    if order["ask"] == "connect":
        return {"rendezvous": connect(order)}
    return {"error": f"unknown question {order['ask']!r}"}


def main(args: dict[str, Any]) -> None:
    # First, before anything that takes time: this host's clock, the coordinator's first
    # clock sample (from its writing the header to reading this line).
    emit({"clock": time.time()})
    warm = None
    if args.get("warm"):  # before the probe: torch imports while the preflight runs
        from sshddp.remote.prewarm import Prewarm

        warm = Prewarm.begin(args["warm"])
    try:
        _session(args, warm)
    finally:
        if warm is not None:
            warm.cancel()  # no start: the waiter ends its standby and removes what it made


def _session(args: dict[str, Any], warm: Optional[Prewarm]) -> None:
    holds = Holds()
    if args.get("probe") is not None:
        facts, holds = probe(args["probe"])
        emit(facts)
    order = _order()
    while "ask" in order:
        emit(_answer(order))
        order = _order()
    holds.release_listeners()
    try:
        if order.get("go"):
            emit({"released": True})
            _boot(order["boot"], holds, warm)
    finally:
        holds.release_all()


def _boot(boot_args: dict[str, Any], holds: Holds, warm: Optional[Prewarm]) -> None:
    # A doctor session never gets here: the code for a launch is imported only now.
    from sshddp.remote import boot, bound, follow

    boot_args = boot.unpack_files(boot_args, sys.stdin.buffer)
    staged = boot.stage(boot_args, sys.stdin.buffer, warm)
    if not staged.get("ok"):
        emit(staged)
        return
    answer = _start(boot_args, staged, holds, warm)
    if answer is None:
        return
    emit(answer)
    state = answer.get("state") or {}
    if answer.get("ok") and state.get("state") == contract.RUNNING:
        if boot_args.get("bound"):
            bound.hold_signals()
        follow.main({"rundir": answer["rundir"], "offset": 0, "index": 0})
        if boot_args.get("bound"):
            bound.end_with_session(answer["rundir"], state)


def _start(
    boot_args: dict[str, Any], staged: dict[str, Any], holds: Holds, warm: Optional[Prewarm]
) -> Optional[dict[str, Any]]:
    """Tell the coordinator the node staged and, on its start, start the supervisor: its
    answer. Until then this session owns the node: whatever ends it first (no start, the
    channel's EOF or a broken pipe as the coordinator dies, an error) removes what it
    staged, and None."""
    from sshddp.remote import boot, share

    rundir = staged["rundir"]
    started = False
    try:
        if boot_args.get("look"):  # the files --share and its warning compare
            staged["look"] = share.look(boot_args["look"])
        emit(staged)
        with share.Shares() as shares:  # --share: node 0's files to the others, before the start
            order = _order()
            while "ask" in order:
                emit(shares.answer(order))
                order = _order()
        holds.release_all()  # the supervisor binds the reserved port as it starts
        if not order.get("start"):
            return None
        started = True
        return boot.start(boot_args, rundir, warm)
    finally:
        if not started:
            boot.discard(rundir)
