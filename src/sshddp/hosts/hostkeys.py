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

A command's connections share one parse of a file (``read_known_hosts``), parsed again only
once its bytes change, and each connection is given only the entries that name its host: reading
the file and installing every entry for each of N hosts cost the coordinator time growing with
N² (paramiko's ``HostKeys.add`` scans its table, N³).
"""

from __future__ import annotations

import base64
import hashlib
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys

_WRITE_LOCK = threading.Lock()
_HASHED = "|1|"
_READ_LOCK = threading.Lock()
#: path -> (the file's bytes when parsed, None when missing; what they said)
_READ: dict[Path, tuple[Optional[bytes], KnownHosts]] = {}


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
    #: plain host name -> (position in ``entries``, the entry), filled by ``load``
    by_name: dict[str, list[tuple[int, HostKeyEntry]]] = field(default_factory=dict)
    #: (position in ``entries``, hashed name, the entry) of every hashed name
    hashed_names: list[tuple[int, str, HostKeyEntry]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> KnownHosts:
        """Read ``path`` (a missing file is empty), line by line, never failing on one."""
        try:
            return cls.parse(path.read_bytes())
        except OSError:
            return cls()

    @classmethod
    def parse(cls, data: bytes) -> KnownHosts:
        """What known_hosts text ``data`` says, line by line, never failing on one."""
        known = cls()
        text = data.decode("utf-8", errors="replace")
        for number, raw in enumerate(text.splitlines(), start=1):
            known._add(raw.strip(), number)
        # A revoked key is never trusted, wherever it is listed.
        known.entries = [e for e in known.entries if e.key.asbytes() not in known.revoked]
        known._index()
        return known

    def _index(self) -> None:
        for position, entry in enumerate(self.entries):
            for name in entry.hostnames:
                if name.startswith(_HASHED):
                    self.hashed_names.append((position, name, entry))
                else:
                    self.by_name.setdefault(name, []).append((position, entry))

    def naming(self, host: str) -> list[tuple[str, HostKeyEntry]]:
        """(the name as the file writes it, the entry) of every entry that names ``host``
        (``addr`` or ``[addr]:port``), in the file's order: what paramiko's lookup of
        ``host`` would find among all of them."""
        found = [(p, host, e) for p, e in self.by_name.get(host, [])]
        if not host.startswith(_HASHED):
            found += [(p, h, e) for p, h, e in self.hashed_names if _hashes_to(host, h)]
        return [(name, entry) for _, name, entry in sorted(found, key=lambda f: f[0])]

    def install(self, client: paramiko.SSHClient, host: Optional[str] = None) -> None:
        """Make these the keys ``client`` trusts: those that name ``host``, or all of them."""
        keys = client.get_host_keys()
        if host is None:
            pairs = [(name, e) for e in self.entries for name in e.hostnames]
        else:
            pairs = self.naming(host)
        for name, entry in pairs:
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


def _hashes_to(host: str, hashed: str) -> bool:
    try:
        return bool(HostKeys.hash_host(host, hashed) == hashed)
    except ValueError:  # a salt that is not base64: names no host
        return False


def read_known_hosts(path: Path) -> KnownHosts:
    """``KnownHosts.load(path)``, parsed again only when the file's bytes differ from those
    parsed last (reading and comparing them costs microseconds; parsing, milliseconds): the
    hosts of one command share one parse."""
    try:
        data: Optional[bytes] = path.read_bytes()
    except OSError:
        data = None
    # One parser at a time: the fan-out's first connections all find nothing parsed yet, and
    # each parsing the file itself cost 32 parses at once (2 s of CPU at 256 hosts).
    with _READ_LOCK:
        read = _READ.get(path)
        if read is not None and read[0] == data:
            return read[1]
        known = KnownHosts.parse(data) if data is not None else KnownHosts()
        _READ[path] = (data, known)
        return known


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
