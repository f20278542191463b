"""Reaching one host: the ``Transport`` protocol every layer above uses, and its options.

A ``Transport`` runs shell command lines on one host and hands back a ``RemoteProcess``
with byte streams. ``ssh.SshTransport`` keeps one SSH connection per host and opens one
channel per command; ``local.LocalTransport`` runs the same command lines with ``bash -c``
for the host named ``localhost``, so nothing needs an SSH server there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

from sshddp import defaults
from sshddp.model.inventory import Host


@dataclass(frozen=True)
class SshOptions:
    """How to reach hosts: the connection options of every command."""

    ssh_config: Optional[str] = None  #: like ``ssh -F``: only this file is read
    accept_new_host_keys: bool = False  #: trust and record unknown (never changed) keys
    connect_timeout: float = defaults.CONNECT_TIMEOUT  #: seconds for TCP, banner and auth


class RemoteProcess(Protocol):
    """A command running on a host, with its three byte streams."""

    def write(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def read(self, n: int = 65536) -> bytes: ...
    def read_stderr(self) -> bytes: ...
    def wait(self) -> int: ...
    def close(self) -> None: ...


class Transport(Protocol):
    """Runs command lines on one host."""

    host: Host
    label: str  #: how messages name the host (user@host:port for SSH)

    def connect(self) -> None: ...
    def start(self, command: str) -> RemoteProcess: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Completed:
    """The whole outcome of a short command."""

    returncode: int
    stdout: bytes
    stderr: bytes


def run(transport: Transport, command: str, stdin: bytes = b"") -> Completed:
    """Run a short command to completion, feeding it ``stdin``."""
    proc = transport.start(command)
    try:
        if stdin:
            proc.write(stdin)
        proc.close_stdin()
        chunks = []
        while chunk := proc.read():
            chunks.append(chunk)
        return Completed(proc.wait(), b"".join(chunks), proc.read_stderr())
    finally:
        proc.close()


def identity(transport: Transport) -> dict[str, Any]:
    """What a connected transport says of the machine it reached: ``host_key`` and
    ``endpoint`` (``model.checks.SshFacts``); empty for one that cannot tell."""
    describe = getattr(transport, "identity", None)
    return dict(describe()) if describe is not None else {}
