"""What a node says of its attempts (``--max-restarts``): from RUNDIR/attempts.json, which
the supervisor writes as each attempt starts (``restarts``), into its exit record and the
status ``follow`` reports for a running node."""

from __future__ import annotations

import os
from typing import Any

from sshddp.protocol import contract
from sshddp.protocol.contract import AttemptRecord, ExitRecord
from sshddp.remote.common import read_json


def summary(max_attempts: int, history: list[AttemptRecord]) -> ExitRecord:
    """The attempt the node is in, of how many, why each earlier one ended, where each
    one starts in node.log, and the node rank it runs as (nothing for a run without
    restarts)."""
    if max_attempts <= 1 or not history:
        return {}
    found: ExitRecord = {
        "attempt": history[-1]["attempt"],
        "attempts": max_attempts,
        "earlier": [a["reason"] for a in history[1:]],
        "offsets": [a["offset"] for a in history],
    }
    seat = history[-1].get("node_rank")
    if isinstance(seat, int):  # (attempts.json of schema 11 on)
        found["node_rank"] = seat
    return found


def read_summary(rundir: str) -> ExitRecord:
    """``summary`` from the node's attempts.json; nothing when it has none (or a broken one)."""
    record: Any = read_json(os.path.join(rundir, contract.ATTEMPTS))
    if not isinstance(record, dict) or not isinstance(record.get("attempts"), list):
        return {}
    try:
        return summary(int(record["max_attempts"]), list(record["attempts"]))
    except (KeyError, TypeError, ValueError):
        return {}
