"""Which processes of a node joined a world, and how long the node has been quiet.

Read from the node's run directory: RUNDIR/joined/<rank> and joined/p<pid>
(``contract.JoinedRecord``, written by the node's sitecustomize around
``init_process_group``) and node.log's modification time (the supervisor appends to it as
the ranks write). The watchdogs (``watchdog``), ``sshddp ps`` (``follow``'s status) and the
node's exit record (``supervisor``: did the run form its world) read it here.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import NodeWatch, ProgressRecord, SpecRecord, WorldRecord
from sshddp.remote.common import listdir, read_json


def records(rundir: str) -> dict[str, dict[str, Any]]:
    """The node's joined records by file name (``<rank>`` or ``p<pid>``); whole ones only."""
    directory = os.path.join(rundir, contract.JOINED)
    found = {}
    for name in listdir(directory):
        if not (name.isdigit() or (name[:1] == "p" and name[1:].isdigit())):
            continue  # a record being written (".<name>.<pid>")
        record = read_json(os.path.join(directory, name))
        if isinstance(record, dict):
            found[name] = record
    return found


def node_watch(
    rundir: str, since: float, now: Optional[float] = None, world: Optional[int] = None
) -> NodeWatch:
    """This node's facts: its ranks in and through init_process_group, and how long its
    output has been quiet (since ``since``, its start, when it wrote none). A node
    launcher's worker counts by the rank its group gave it once it joined a group of size
    ``world`` (the planned one): a group of another size numbers its ranks its own way."""
    now = time.time() if now is None else now
    entered, joined = set(), set()
    for name, record in records(rundir).items():
        rank = int(name) if name.isdigit() else record.get("rank")
        if not name.isdigit() and (world is None or record.get("world") != world):
            continue  # a worker still waiting, or in a world of its own
        if not isinstance(rank, int) or isinstance(rank, bool):
            continue
        entered.add(rank)
        if record.get("joined") is not None:
            joined.add(rank)
    try:
        last = max(since, os.stat(os.path.join(rundir, contract.LOG)).st_mtime)
    except OSError:
        last = since
    quiet = max(0.0, now - last)  # still: as quiet, until its ranks are seen working
    return {"entered": sorted(entered), "joined": sorted(joined), "quiet": quiet, "still": quiet}


def still(now: float, quiet: float, moved_at: Optional[float]) -> float:
    """Seconds since the node last wrote output (``quiet`` ago) or its ranks were seen
    working (at ``moved_at``: ``node_progress``)."""
    if moved_at is None:
        return quiet
    return max(0.0, min(quiet, now - moved_at))


def progress(rundir: str) -> Optional[ProgressRecord]:
    """The node's last progress record (``node_progress``), None without one."""
    record: Optional[ProgressRecord] = read_json(os.path.join(rundir, contract.PROGRESS))
    return record if isinstance(record, dict) else None


def ranks_by_pid(rundir: str, world: Optional[int]) -> dict[int, int]:
    """The global rank of each process with no RANK of its own that joined a group of size
    ``world`` (the planned one): a node launcher's worker, by its joined/p<pid> record."""
    found = {}
    for name, record in records(rundir).items():
        rank = record.get("rank")
        if name.isdigit() or world is None or record.get("world") != world:
            continue
        if record.get("joined") is not None and isinstance(rank, int):
            found[int(name[1:])] = rank
    return found


def entered(rundir: str) -> set[int]:
    """The pids of the node's processes that have called ``init_process_group``: each one's
    own stacks thread answers the samplers that run unasked (``node_sampler``,
    ``node_progress``) from then on (``ranksite``)."""
    return {r["pid"] for r in records(rundir).values() if isinstance(r.get("pid"), int)}


def node_world(rundir: str, spec: SpecRecord) -> Optional[WorldRecord]:
    """Whether this node's processes formed the planned world: how many returned from
    init_process_group and the world sizes they saw; None without a planned shape."""
    watch = spec.get("watch")
    nprocs = list(watch.get("nprocs") or []) if watch else []
    node = int(spec.get("node_rank", 0))
    if node >= len(nprocs):
        return None
    joined = [r for r in records(rundir).values() if r.get("joined") is not None]
    sizes = sorted(r["world"] for r in joined if isinstance(r.get("world"), int))
    ran = sorted(r["collectives"] for r in joined if isinstance(r.get("collectives"), int))
    return {
        "planned": sum(nprocs),
        "ranks": nprocs[node],
        "joined": len(joined),
        "sizes": sizes,
        "collectives": ran,
    }
