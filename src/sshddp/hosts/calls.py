"""The calls that look at or act on one node of a run on its host: stop it, read its status
and its log (once, or following it), collect its stacks. Each runs one host-side module and
decodes its answer into the host contract's records."""

from __future__ import annotations

import json
from typing import Callable, Optional

from sshddp.hosts import shipped
from sshddp.hosts.transport import RemoteProcess, Transport
from sshddp.remote import contract
from sshddp.remote.contract import ExitRecord, NodeStacks, StopAnswer


def stop_node(transport: Transport, rundir: str, force: bool, reason: str) -> StopAnswer:
    """Stop one node's run; its final exit record."""
    answer: StopAnswer = shipped.call(
        transport, "stop", {"rundir": rundir, "force": force, "reason": reason}
    )
    return answer


def node_stacks(transport: Transport, rundir: str, native: bool, timeout: float) -> NodeStacks:
    """Every thread's stack of every process of the node's run (``remote/stacks.py``)."""
    answer: NodeStacks = shipped.call(
        transport, "stacks", {"rundir": rundir, "native": native, "timeout": timeout}
    )
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

    Returns the node's status record (exit.json, or its live state)."""
    proc = shipped.start(transport, "follow", {"rundir": rundir, "offset": offset, "mode": mode})
    try:
        proc.close_stdin()
        while chunk := proc.read(1 << 20):
            on_bytes(chunk)
        record = status_record(proc.read_stderr())
        proc.wait()
    finally:
        proc.close()
    return record or {"state": contract.UNKNOWN}


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
