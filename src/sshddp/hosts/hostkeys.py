"""Host-key policy: verify every host against known_hosts, like OpenSSH.

Unknown keys are refused unless the user opts in with ``--accept-new-host-keys``
(OpenSSH's ``StrictHostKeyChecking accept-new``); a changed key is always refused by
paramiko itself (``BadHostKeyException``), since it may be an attack.
"""

from __future__ import annotations

import shlex
import threading
from pathlib import Path

import paramiko

_WRITE_LOCK = threading.Lock()


class UnknownHostKey(paramiko.SSHException):
    """The host's key is in no known_hosts file."""

    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: Path) -> None:
        fp = key.fingerprint
        self.message = f"unknown host key {fp} for {hostname}; refusing to connect"
        host = hostname
        port = "22"
        if hostname.startswith("["):
            host, _, port = hostname[1:].partition("]:")
        self.hint = (
            f"check the fingerprint with the host's admin, then either run "
            f"`ssh-keyscan -p {port} {shlex.quote(host)} >> {shlex.quote(str(known_hosts))}` or "
            "pass --accept-new-host-keys "
            f"to trust and record it"
        )
        super().__init__(self.message)


class RefuseUnknownPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse any host whose key is not already known."""

    def __init__(self, known_hosts: Path) -> None:
        self._known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise UnknownHostKey(hostname, key, self._known_hosts)


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust an unknown key and append it to known_hosts (changed keys never get here)."""

    def __init__(self, known_hosts: Path) -> None:
        self._known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _WRITE_LOCK:
            self._known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self._known_hosts, "a", encoding="ascii") as fh:
                fh.write(line)
