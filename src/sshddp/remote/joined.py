"""Which ranks of a node joined the world, and how long the node has been quiet.

Read from the node's run directory: RUNDIR/joined/<rank> (``contract.JoinedRecord``, written
by the ranks' sitecustomize around ``init_process_group``) and node.log's modification time
(the supervisor appends to it as the ranks write). The watchdogs (``watchdog``) and
``sshddp ps`` (``follow``'s status) both read it here.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from sshddp.remote import contract
from sshddp.remote.common import listdir, read_json
from sshddp.remote.contract import NodeWatch


def node_watch(rundir: str, since: float, now: Optional[float] = None) -> NodeWatch:
    """This node's facts: its ranks in and through init_process_group, and how long its
    output has been quiet (since ``since``, its start, when it wrote none)."""
    now = time.time() if now is None else now
    entered, joined = [], []
    directory = os.path.join(rundir, contract.JOINED)
    for name in listdir(directory):
        record = read_json(os.path.join(directory, name)) if name.isdigit() else None
        if not isinstance(record, dict):
            continue
        entered.append(int(name))
        if record.get("joined") is not None:
            joined.append(int(name))
    try:
        last = max(since, os.stat(os.path.join(rundir, contract.LOG)).st_mtime)
    except OSError:
        last = since
    return {"entered": sorted(entered), "joined": sorted(joined), "quiet": max(0.0, now - last)}
