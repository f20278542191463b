"""The calls that look at or act on one node of a run on its host: stop it, read its status
and its log (once, or following it). Each runs one host-side module and decodes its answer
into the host contract's records."""

from __future__ import annotations

import json
from typing import Callable, Optional

from sshddp.errors import RemoteError
from sshddp.hosts import shipped
from sshddp.hosts.transport import RemoteProcess, Transport
from sshddp.model.state import NodeState
from sshddp.remote import contract
from sshddp.remote.contract import ExitRecord, StopAnswer

GONE_REASON = "its run directory is not on the host (retention removed it, or it was never made)"


def stop_node(transport: Transport, rundir: str, force: bool, reason: str) -> StopAnswer:
    """Stop one node's run; its final exit record."""
    answer: StopAnswer = shipped.call(
        transport, "stop", {"rundir": rundir, "force": force, "reason": reason}
    )
    if answer.get("state") == contract.UNKNOWN and "ended" not in answer:
        return {"state": NodeState.GONE.value, "reason": GONE_REASON, "already": True}
    return answer


def follow_node(transport: Transport, rundir: str, offset: int) -> RemoteProcess:
    """Stream the node's log from ``offset`` until it ends; the status comes on stderr
    (``status_record``)."""
    return shipped.start(transport, "follow", {"rundir": rundir, "offset": offset})


def read_node(
    transport: Transport,
    rundir: str,
    offset: int,
    mode: str,
    on_bytes: Callable[[bytes], None] = lambda data: None,
) -> ExitRecord:
    """One-shot look at a node: log bytes from ``offset`` (mode "fetch") or none ("status").

    Returns the node's status record (exit.json, or its live state); state "gone" when the
    host holds no run directory for it. A ``RemoteError`` when the answer was cut short."""
    proc = shipped.start(transport, "follow", {"rundir": rundir, "offset": offset, "mode": mode})
    try:
        proc.close_stdin()
        while chunk := proc.read(1 << 20):
            on_bytes(chunk)
        record = status_record(proc.read_stderr())
        proc.wait()
    finally:
        proc.close()
    if record is None:
        raise RemoteError(f"{transport.label}: no status came back for {rundir}")
    if record.get("state") == contract.UNKNOWN and "ended" not in record:
        return {"state": NodeState.GONE.value, "reason": GONE_REASON}
    return record


def status_record(stderr: bytes) -> Optional[ExitRecord]:
    """The follower's last stderr line: the node's status record, or None (cut short)."""
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if isinstance(record, dict) and "state" in record:
        found: ExitRecord = record  # type: ignore[assignment]
        return found
    return None
