"""Remote operations: each runs one shipped script on one host and decodes its answer."""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from sshddp import scripts
from sshddp.errors import InterpreterMissing, RemoteError
from sshddp.transport import RemoteProcess, Transport, run


def start_script(
    transport: Transport,
    name: str,
    args: dict[str, Any],
    env: Optional[dict[str, str]] = None,
    label: Optional[str] = None,
) -> RemoteProcess:
    """Start script ``name`` with the host's interpreter; its stdin stays open. ``env`` and
    ``label``: see ``scripts.python_command``."""
    proc = transport.start(scripts.python_command(transport.host.python, env, label))
    proc.write(scripts.header(name, args))
    return proc


def read_line(proc: RemoteProcess) -> bytes:
    """Read up to and including the first newline (or EOF)."""
    buf = b""
    while b"\n" not in buf:
        chunk = proc.read(4096)
        if not chunk:
            break
        buf += chunk
    return buf


def decode(transport: Transport, what: str, line: bytes, stderr: bytes, rc: Optional[int]) -> Any:
    """The JSON answer of a script, or a ``RemoteError`` that says what went wrong."""
    try:
        value = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    python = transport.host.python
    detail = stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    if rc == 127:
        raise InterpreterMissing(f"the interpreter {python!r} was not found on {transport.label}")
    raise RemoteError(
        f"{transport.label}: {what} failed (exit {rc}): " + (" | ".join(detail) or "no output")
    )


def call(transport: Transport, name: str, args: dict[str, Any], payload: bytes = b"") -> Any:
    """Run script ``name`` to completion and return its JSON answer."""
    result = run(
        transport,
        scripts.python_command(transport.host.python),
        scripts.header(name, args) + payload,
    )
    return decode(transport, name, result.stdout, result.stderr, result.returncode)


def stop_node(transport: Transport, rundir: str, force: bool, reason: str) -> dict[str, Any]:
    """Stop one node's run; its final exit record."""
    answer: dict[str, Any] = call(
        transport, "stop", {"rundir": rundir, "force": force, "reason": reason}
    )
    return answer


def read_node(
    transport: Transport, rundir: str, offset: int, mode: str,
    on_bytes: Callable[[bytes], None] = lambda data: None,
) -> dict[str, Any]:  # fmt: skip
    """One-shot look at a node: log bytes from ``offset`` (mode "fetch") or none ("status").

    Returns the node's status record (exit.json, or its live state)."""
    proc = start_script(transport, "follow", {"rundir": rundir, "offset": offset, "mode": mode})
    try:
        proc.close_stdin()
        while chunk := proc.read(1 << 20):
            on_bytes(chunk)
        record = status_record(proc.read_stderr())
        proc.wait()
    finally:
        proc.close()
    return record or {"state": "unknown"}


def status_record(stderr: bytes) -> Optional[dict[str, Any]]:
    """The follower's last stderr line: the node's status record, or None (cut short)."""
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and "state" in record else None
