"""The calls that look at or act on one node of a run on its host: stop it, read its status
and its log (once, or following it), copy back what it wrote, collect its stacks. Each runs
one host-side module and decodes its answer into the host contract's records."""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from sshddp import defaults
from sshddp.errors import RemoteError
from sshddp.hosts import shipped
from sshddp.hosts.transport import RemoteProcess, Transport
from sshddp.model.state import NodeState
from sshddp.protocol import contract
from sshddp.protocol.contract import (
    ExitRecord,
    FetchHeader,
    FetchTrailer,
    HangRecord,
    NodeStacks,
    StopAnswer,
    TopRecord,
)

GONE_REASON = "its run directory is not on the host (retention removed it, or it was never made)"


def stop_node(transport: Transport, rundir: str, force: bool, reason: str) -> StopAnswer:
    """Stop one node's run; its final exit record."""
    answer: StopAnswer = shipped.call(
        transport, "stop", {"rundir": rundir, "force": force, "reason": reason}
    )
    if answer.get("state") == contract.UNKNOWN and "ended" not in answer:
        return {"state": NodeState.GONE.value, "reason": GONE_REASON, "already": True}
    return answer


def node_stacks(transport: Transport, rundir: str, native: bool, timeout: float) -> NodeStacks:
    """Every thread's stack of every process of the node's run (``remote/calls/host_stacks.py``)."""
    answer: NodeStacks = shipped.call(
        transport, "host_stacks", {"rundir": rundir, "native": native, "timeout": timeout}
    )
    return answer


def node_top(transport: Transport, rundir: str, tail: int) -> TopRecord:
    """The node's latest sample and its ranks' last output (``remote/calls/node_top.py``)."""
    answer: TopRecord = shipped.call(transport, "node_top", {"rundir": rundir, "tail": tail})
    return answer


def watch_top(transport: Transport, rundir: str, tail: int, every: float) -> RemoteProcess:
    """``node_top``'s records as a stream, one JSON line every ``every`` s, until its stdin
    is closed (a live ``sshddp top``); the host's process list shows it as RUNDIR/top."""
    args = {"rundir": rundir, "tail": tail, "every": every}
    return shipped.start(transport, "node_top", args, label=f"{rundir}/top")


def resize_node(transport: Transport, rundir: str, columns: int, rows: int) -> str:
    """Give the node's pty (--tty) a new size (``remote/node/winsize.py``); "" or why not."""
    answer = shipped.call(
        transport, "winsize", {"rundir": rundir, "columns": columns, "rows": rows}
    )
    return "" if answer.get("ok") else str(answer.get("error", "no answer"))


def node_hang(transport: Transport, rundir: str) -> Optional[HangRecord]:
    """What the node's watchdog recorded when the run hung (``remote/node/host_hang.py``), if
    any."""
    answer: HangRecord = shipped.call(transport, "host_hang", {"rundir": rundir})
    return answer if isinstance(answer, dict) and answer else None


def follow_node(transport: Transport, rundir: str, offset: int, index: int) -> RemoteProcess:
    """Stream the node's log from ``offset`` (and its index from ``index``: see
    ``remote/node/host_follow.py``) until it ends; the status comes on stderr
    (``status_record``)."""
    args = {"rundir": rundir, "offset": offset, "index": index}
    return shipped.start(transport, "host_follow", args)


def read_node(
    transport: Transport,
    rundir: str,
    offset: int,
    mode: str,
    on_bytes: Callable[[bytes], None] = lambda data: None,
    index: Optional[int] = None,
) -> ExitRecord:
    """One-shot look at a node: log bytes from ``offset`` (mode "fetch") or none ("status").

    Returns the node's status record (exit.json, or its live state); state "gone" when the
    host holds no run directory for it. A ``RemoteError`` when the answer was cut short."""
    args: dict[str, Any] = {"rundir": rundir, "offset": offset, "mode": mode}
    if index is not None:  # the log framed with its index (remote/node/host_follow.py)
        args["index"] = index
    proc = shipped.start(transport, "host_follow", args)
    try:
        proc.close_stdin()
        while chunk := proc.read(defaults.STREAM_READ):
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


class FetchStream:
    """The bytes of one ``fetch`` call after its header: ``read`` them to the end, then
    ``trailer`` says what the host sent."""

    def __init__(self, proc: RemoteProcess, header: FetchHeader, rest: bytes) -> None:
        self.proc = proc
        self.header = header
        self._rest = rest

    def read(self, n: int = 1 << 20) -> bytes:
        if self._rest:
            data, self._rest = self._rest[:n], self._rest[n:]
            return data
        return self.proc.read(n)

    def trailer(self) -> Optional[FetchTrailer]:
        """The host's account of what it sent, or None when its answer was cut short."""
        lines = self.proc.read_stderr().decode("utf-8", "replace").strip().splitlines()
        self.proc.wait()
        try:
            record = json.loads(lines[-1]) if lines else None
        except ValueError:
            return None
        if isinstance(record, dict) and "sha256" in record:
            found: FetchTrailer = record  # type: ignore[assignment]
            return found
        return None

    def close(self) -> None:
        self.proc.close()


def fetch_path(transport: Transport, rundir: str, cwd: str, path: str) -> FetchStream:
    """Start copying ``path`` (relative to the node's ``cwd``) from the host; the header has
    come when this returns (``header["ok"]`` false: nothing follows, and why)."""
    proc = shipped.start(transport, "host_fetch", {"rundir": rundir, "cwd": cwd, "path": path})
    try:
        proc.close_stdin()
        buf = b""
        while b"\n" not in buf:
            chunk = proc.read(1 << 16)
            if not chunk:
                break
            buf += chunk
        line, _, rest = buf.partition(b"\n")
        try:
            header = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            header = None
        if not isinstance(header, dict):  # no answer: say why (the interpreter, its error)
            shipped.decode(transport, "host_fetch", line, proc.read_stderr(), proc.wait())
    except BaseException:
        proc.close()
        raise
    return FetchStream(proc, header, rest)
