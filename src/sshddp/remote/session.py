"""One host's whole part of a launch, or of a doctor run, on one SSH channel and one
interpreter: the preflight probe, a wait for the coordinator's go, staging the code, a wait
for the start, then following the node's log.

args: {"probe": probe args, or None to skip the preflight}
stdin after the header: {"go": true, "boot": boot args} and the code bytes, then later
{"start": true}; {"go": false} / {"start": false} (or EOF) end it there, and a node staged
but not started is removed. After the start stdin stays open: its EOF means the
coordinator went away, and the follower ends (the run goes on; with boot args "bound",
over srun, the node stops first: see bound.py).
stdout, one JSON line each: the probe's facts (if asked); after the go, {"released": true}
once the probe's listeners are closed (the rendezvous port is free for torchrun); stage()'s
answer; after the start, start()'s answer; then, if the node started, the raw bytes of
node.log and, at the end, the node's status record on stderr, as follow.py sends them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sshddp.remote import contract
from sshddp.remote.common import emit
from sshddp.remote.probe import Held, probe, release


def _order() -> dict[str, Any]:
    line = sys.stdin.buffer.readline()
    try:
        order = json.loads(line.decode("utf-8")) if line.strip() else {}
    except ValueError:
        order = {}
    return order if isinstance(order, dict) else {}


def main(args: dict[str, Any]) -> None:
    held: list[Held] = []
    if args.get("probe") is not None:
        facts, held = probe(args["probe"])
        emit(facts)
    order = _order()
    release(held)
    if order.get("go"):
        emit({"released": True})
        _boot(order["boot"])


def _boot(boot_args: dict[str, Any]) -> None:
    # A doctor session never gets here: the code for a launch is imported only now.
    from sshddp.remote import boot, bound, follow

    staged = boot.stage(boot_args, sys.stdin.buffer)
    emit(staged)
    if not staged.get("ok"):
        return
    if not _order().get("start"):
        boot.discard(staged["rundir"])
        return
    answer = boot.start(boot_args)
    emit(answer)
    state = answer.get("state") or {}
    if answer.get("ok") and state.get("state") == contract.RUNNING:
        if boot_args.get("bound"):
            bound.hold_signals()
        follow.main({"rundir": answer["rundir"], "offset": 0})
        if boot_args.get("bound"):
            bound.end_with_session(answer["rundir"], state)
