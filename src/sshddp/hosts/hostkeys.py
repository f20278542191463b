"""Host-key policy: verify every host against known_hosts, like OpenSSH.

Unknown keys are refused unless the user opts in with ``--accept-new-host-keys``
(OpenSSH's ``StrictHostKeyChecking accept-new``); a changed key is always refused by
paramiko itself (``BadHostKeyException``), since it may be an attack.

known_hosts is read here, not by paramiko, whose reader stops at the first line it cannot
parse: a ``@revoked`` key is refused for every host (OpenSSH refuses it for the hosts its
line names; refusing it everywhere is stricter), a ``@cert-authority`` line is skipped
(paramiko cannot check host certificates: a host known only through one is unknown), and
any other line that is not a host key is skipped, as OpenSSH does. New keys are written
hashed when the file holds hashed names or ssh_config says ``HashKnownHosts yes``.
Fingerprints are always shown as OpenSSH shows them: ``SHA256:`` and unpadded base64.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys

_WRITE_LOCK = threading.Lock()
_HASHED = "|1|"


def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as ``ssh-keygen -l`` prints it: ``SHA256:<base64>``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


@dataclass
class KnownHosts:
    """What a known_hosts file says: the trusted keys, and the revoked ones."""

    entries: list[HostKeyEntry] = field(default_factory=list)  #: trusted (none revoked)
    revoked: set[bytes] = field(default_factory=set)  #: key blobs never to accept
    hashed: bool = False  #: the file holds hashed host names

    @classmethod
    def load(cls, path: Path) -> KnownHosts:
        """Read ``path`` (a missing file is empty), line by line, never failing on one."""
        known = cls()
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return known
        for number, raw in enumerate(text.splitlines(), start=1):
            known._add(raw.strip(), number)
        # A revoked key is never trusted, wherever it is listed.
        known.entries = [e for e in known.entries if e.key.asbytes() not in known.revoked]
        return known

    def install(self, client: paramiko.SSHClient) -> None:
        """Make these the keys ``client`` trusts."""
        keys = client.get_host_keys()
        for entry in self.entries:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)

    def _add(self, line: str, number: int) -> None:
        if not line or line.startswith("#"):
            return
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
        if marker not in ("", "@revoked"):
            return  # @cert-authority (and anything newer): not a host key
        try:
            entry = HostKeyEntry.from_line(line, number)
        except Exception:  # a line paramiko cannot read is skipped, as OpenSSH does
            return
        if entry is None or entry.key is None:
            return
        if marker == "@revoked":
            self.revoked.add(entry.key.asbytes())
            return
        self.hashed = self.hashed or any(h.startswith(_HASHED) for h in entry.hostnames)
        self.entries.append(entry)

    def check_revoked(self, hostname: str, key: paramiko.PKey) -> None:
        if key.asbytes() in self.revoked:
            raise RevokedHostKey(hostname, key)


class RevokedHostKey(paramiko.SSHException):
    """The host presented a key that known_hosts marks ``@revoked``."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        self.message = (
            f"host key {fingerprint(key)} of {hostname} is marked @revoked in known_hosts; "
            "refusing to connect"
        )
        self.hint = "the host's admin must give it a new key; then check its fingerprint and add it"
        super().__init__(self.message)


class UnknownHostKey(paramiko.SSHException):
    """The host's key is in no known_hosts file."""

    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: Path) -> None:
        self.message = f"unknown host key {fingerprint(key)} for {hostname}; refusing to connect"
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

    def __init__(self, known_hosts: Path, known: KnownHosts) -> None:
        self._known_hosts = known_hosts
        self._known = known

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        self._known.check_revoked(hostname, key)
        raise UnknownHostKey(hostname, key, self._known_hosts)


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust an unknown key and append it to known_hosts (changed and revoked keys never
    get in), hashed like the file's other names (or when ``hash_names``)."""

    def __init__(self, known_hosts: Path, known: KnownHosts, hash_names: bool = False) -> None:
        self._known_hosts = known_hosts
        self._known = known
        self._hash = hash_names or known.hashed

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        self._known.check_revoked(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        name = HostKeys.hash_host(hostname) if self._hash else hostname
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        with _WRITE_LOCK:
            self._known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self._known_hosts, "a", encoding="ascii") as fh:
                fh.write(line)
