"""SSH to a host: the only module that imports fabric and paramiko.

``SshTransport`` keeps one paramiko connection per host, opened through fabric so
``ssh_config`` aliases, ``ProxyJump``, ``IdentityFile`` and the agent all work, verifies the
host key (``hostkeys``), and opens one channel per command. A failure to connect becomes a
``HostUnreachable`` that names the host and what to try.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from sshddp import trace
from sshddp.errors import HostUnreachable
from sshddp.hosts.transport import RemoteProcess, SshOptions
from sshddp.model.commands import endpoint
from sshddp.model.inventory import Host

if TYPE_CHECKING:  # paramiko is imported when a host is reached over SSH
    import paramiko

# paramiko's transport threads log failures (with tracebacks) through the logging module;
# without a handler Python prints them on stderr. sshddp reports every failure itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

KEEPALIVE_SECONDS = 15
# paramiko's reader thread wakes whenever its socket's timeout (0.1 s) passes without data,
# only to see whether the connection was closed meanwhile: 7.3 ms of the coordinator's CPU a
# second at 16 idle hosts (2.6 with a second; measured), for as long as a launch follows its
# run. A second is soon enough for the rest it does then (the keepalive above, a rekey); a
# close does not wait for it (``SshTransport.close`` shuts the connection down first).
IDLE_WAKE_SECONDS = 1.0
# A host whose link is cut (cable, partition, powered off) sends no FIN: without these, a
# follower waits on it for TCP's ~15 minutes of retransmissions. Idle probes start after
# DEAD_PROBE_SECONDS; a peer that acknowledges nothing for DEAD_LINK_SECONDS is dropped, and
# the follower then reconnects (the run itself never depends on this connection).
DEAD_PROBE_SECONDS = 5
DEAD_LINK_SECONDS = 20
# Measured on loopback (docs/performance.md): a 2 MB window with 256 KB packets streams one
# host's log as fast as 8 MB did (1.5-1.95x `ssh cat` against 2.25-2.5x, alternating runs)
# and 8 hosts' at once in 121-126 MB of coordinator instead of 170: paramiko buffers up to
# a window per channel while the coordinator writes. 1 MB halved one host's speed. AES-GCM
# is the fastest cipher paramiko shares with OpenSSH, so it goes first.
WINDOW_SIZE = 2 * 1024 * 1024
MAX_PACKET = 256 * 1024
_FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class _SshProcess:
    def __init__(self, channel: object) -> None:
        self._chan = channel

    def write(self, data: bytes) -> None:
        # A memoryview: paramiko's sendall slices off what each packet took, and slicing
        # bytes would copy the rest of the buffer every time (quadratic in its size).
        try:
            self._chan.sendall(memoryview(data))  # type: ignore[attr-defined]
        except (OSError, EOFError):
            pass

    def close_stdin(self) -> None:
        try:
            self._chan.shutdown_write()  # type: ignore[attr-defined]
        except (OSError, EOFError):
            pass

    def read(self, n: int = 65536) -> bytes:
        return self._chan.recv(n)  # type: ignore[attr-defined]

    def read_stderr(self) -> bytes:
        chunks = []
        while chunk := self._chan.recv_stderr(65536):  # type: ignore[attr-defined]
            chunks.append(chunk)
        return b"".join(chunks)

    def wait(self) -> int:
        return self._chan.recv_exit_status()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._chan.close()  # type: ignore[attr-defined]


@functools.cache
def _prefer_fast_ciphers() -> None:
    """Offer AES-GCM first (process-wide: SSHClient takes no per-connection cipher order)."""
    import paramiko

    preferred: tuple[str, ...] = paramiko.Transport._preferred_ciphers  # type: ignore[attr-defined]
    first = tuple(c for c in _FAST_CIPHERS if c in preferred)
    order = first + tuple(c for c in preferred if c not in first)
    paramiko.Transport._preferred_ciphers = order  # type: ignore[attr-defined]


@functools.cache
def _ssh_config(path: Optional[str]) -> paramiko.SSHConfig:
    """The ssh_config every connection of this command reads, parsed once, by fabric's
    rules: ``path`` alone (like ``ssh -F``), else ``~/.ssh/config`` then
    ``/etc/ssh/ssh_config`` (the first value of a keyword wins, as in OpenSSH); its stanzas
    indexed once by the host names they name (``sshconfig``)."""
    from fabric import Config

    from sshddp.hosts.sshconfig import IndexedSshConfig

    parsed = (Config(runtime_ssh_path=path) if path else Config()).base_ssh_config
    return IndexedSshConfig.of(parsed)


def resolve_hostname(alias: str, options: SshOptions) -> str:
    """The HostName ssh_config gives ``alias``, as a connection to it resolves it (the
    alias itself when none, or when the config cannot be read: connecting reports that)."""
    import paramiko

    try:
        return str(_ssh_config(options.ssh_config).lookup(alias).get("hostname", alias))
    except (OSError, paramiko.SSHException):
        return alias


class SshTransport:
    """One SSH connection to one host, reused for every command on it."""

    def __init__(self, host: Host, options: SshOptions) -> None:
        from fabric import Config, Connection

        _prefer_fast_ciphers()

        self.host = host
        self._options = options
        config = Config(ssh_config=_ssh_config(options.ssh_config))
        timeout = options.connect_timeout
        self._conn = Connection(
            host.host,
            user=host.user,
            port=host.port,
            config=config,
            connect_timeout=max(1, int(round(timeout))),
            connect_kwargs={"banner_timeout": timeout, "auth_timeout": timeout},
        )
        self.label = f"{self._conn.user}@{self._conn.host}:{self._conn.port}"
        self._lock = threading.Lock()
        self._known_before = False  #: known_hosts had this host's key before we connected

    @property
    def hostname(self) -> str:
        """The resolved ``HostName`` (what ssh_config maps the alias to)."""
        return str(self._conn.host)

    def known_hosts_path(self) -> Path:
        configured = self._conn.ssh_config.get("userknownhostsfile")
        first = configured.split()[0] if configured else "~/.ssh/known_hosts"
        return Path(os.path.expanduser(first))

    def connect(self) -> None:
        """Open the connection now; raises ``HostUnreachable`` with what to try."""
        with self._lock:
            if self._conn.is_connected:
                return
            started = time.monotonic()
            self._prepare_host_keys()
            sock: Optional[socket.socket] = None
            try:
                if not self._conn.gateway:  # ProxyJump/ProxyCommand: the gateway's socket
                    sock = _tcp_connect(
                        self.hostname, int(self._conn.port), self._conn.connect_timeout
                    )
                    self._conn.connect_kwargs["sock"] = sock
                self._conn.open()
            except Exception as exc:  # every paramiko/socket failure becomes a finding
                if sock is not None:
                    sock.close()
                where = _KnownHosts(self.known_hosts_path(), self.known_hosts_name())
                failure = _explain(exc, self.host.host, self.label, where)
                trace.log.info(
                    "connect %s (%s): failed in %.3f s: %s",
                    self.host.host,
                    self._address(),
                    trace.since(started),
                    failure.message,
                )
                raise failure from exc
            finally:  # a reconnection opens a socket of its own
                self._conn.connect_kwargs.pop("sock", None)
            transport = self._conn.client.get_transport()
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_SECONDS)
                _detect_dead_link(transport.sock)
                _wake_less(transport.sock)
            if trace.on():
                self._trace_connected(started)

    def _trace_connected(self, started: float) -> None:
        key = self.identity()["host_key"]
        trace.log.info(
            "connect %s (%s): ok in %.3f s, host key %s %s",
            self.host.host,
            self._address(),
            trace.since(started),
            key,
            # unknown keys are refused without --accept-new-host-keys: this one was accepted
            "(known)" if self._known_before else "(new: accepted and recorded)",
        )

    def _address(self) -> str:
        via = " via ProxyJump/ProxyCommand" if self._conn.gateway else ""
        return f"{self.label}{via}"

    def known_hosts_name(self) -> str:
        """How known_hosts names this host: ``addr``, or ``[addr]:port`` off port 22."""
        port = int(self._conn.port)
        return self.hostname if port == 22 else f"[{self.hostname}]:{port}"

    def identity(self) -> dict[str, Optional[str]]:
        """The machine this connection reached: its host key (type and SHA256 fingerprint)
        and the address and port ssh_config resolved the entry to."""
        transport = self._conn.client.get_transport() if self._conn.is_connected else None
        key = transport.get_remote_server_key() if transport is not None else None
        host_key = f"{key.get_name()} {key.fingerprint}" if key is not None else None
        return {"host_key": host_key, "endpoint": endpoint(self.hostname, int(self._conn.port))}

    def _prepare_host_keys(self) -> None:
        from sshddp.hosts.hostkeys import AcceptNewPolicy, RefuseUnknownPolicy, read_known_hosts

        client = self._conn.client
        path = self.known_hosts_path()
        known = read_known_hosts(path)
        known.install(client, self.known_hosts_name())
        self._known_before = client.get_host_keys().lookup(self.known_hosts_name()) is not None
        if self._options.accept_new_host_keys:
            hashing = str(self._conn.ssh_config.get("hashknownhosts", "no")).lower() == "yes"
            client.set_missing_host_key_policy(AcceptNewPolicy(path, known, hashing))
        else:
            client.set_missing_host_key_policy(RefuseUnknownPolicy(path, known))

    def start(self, command: str) -> RemoteProcess:
        self.connect()
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(self.host.host, f"{self.label}: the SSH connection was lost")
        try:
            channel = transport.open_session(window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET)
            channel.exec_command(command)
        except Exception as exc:
            raise HostUnreachable(
                self.host.host, f"{self.label}: could not start a command: {exc}"
            ) from exc
        return _SshProcess(channel)

    def close(self) -> None:
        # paramiko closes its socket while its reader thread may still sleep in recv() on
        # it, and Linux ends the TCP connection only once that call returns (after up to
        # IDLE_WAKE_SECONDS): shut it down first, which ends it now and wakes the thread,
        # so the host's sshd ends the session at once.
        transport = self._conn.client.get_transport() if self._conn.is_connected else None
        if transport is not None and isinstance(transport.sock, socket.socket):
            with contextlib.suppress(OSError):
                transport.sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()


def _tcp_connect(host: str, port: int, timeout: Optional[float]) -> socket.socket:
    """The TCP connection paramiko would open (every address of ``host`` in turn; refused or
    unreachable everywhere raises ``NoValidConnectionsError``, anything else at once), with
    ``TCP_NODELAY``: without it, paramiko's authentication request waits on the delayed
    acknowledgement of the packet before it, 40 ms of every connection (measured: connect and
    run a first command, 156 ms -> 26 ms on loopback)."""
    import paramiko

    errors: dict[tuple[Any, ...], OSError] = {}
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(addr)
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                raise
            errors[addr] = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise paramiko.ssh_exception.NoValidConnectionsError(errors)


def _detect_dead_link(sock: object) -> None:
    """TCP keepalive and a user timeout on the connection's socket (Linux names; best effort)."""
    if not isinstance(sock, socket.socket):
        return  # a ProxyJump channel: the jump host's connection carries the timeouts
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    tcp = {
        "TCP_KEEPIDLE": DEAD_PROBE_SECONDS,
        "TCP_KEEPINTVL": DEAD_PROBE_SECONDS,
        "TCP_KEEPCNT": 3,
        "TCP_USER_TIMEOUT": DEAD_LINK_SECONDS * 1000,
    }
    for name, value in tcp.items():
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)


def _wake_less(sock: object) -> None:
    """Let paramiko's reader thread sleep ``IDLE_WAKE_SECONDS`` on an idle connection, once
    it is up (its handshake keeps paramiko's own 0.1 s)."""
    if isinstance(sock, socket.socket):  # a ProxyJump channel: left as paramiko set it
        sock.settimeout(IDLE_WAKE_SECONDS)


class _KnownHosts:
    """Where a host's key is recorded: the known_hosts file, and the host's name in it."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name


def _explain(exc: BaseException, host: str, label: str, known: _KnownHosts) -> HostUnreachable:
    """Turn a connection failure into a message that names the host and what to try."""
    import paramiko

    from sshddp.hosts.hostkeys import RevokedHostKey, UnknownHostKey

    if isinstance(exc, (UnknownHostKey, RevokedHostKey)):
        return HostUnreachable(host, f"{label}: {exc.message}", exc.hint)
    if isinstance(exc, paramiko.BadHostKeyException):
        return _changed_key(exc, host, label, known)
    if isinstance(exc, paramiko.AuthenticationException):
        return HostUnreachable(
            host,
            f"{label}: authentication failed ({exc})",
            "check the user, that your key is in ~/.ssh/authorized_keys on the host, "
            "and IdentityFile in ssh_config; `ssh -v` shows which keys are offered",
        )
    if isinstance(exc, socket.gaierror):
        return HostUnreachable(
            host,
            f"{label}: cannot resolve the host name ({exc.strerror})",
            "check the spelling, or add a Host block with HostName to ssh_config",
        )
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return HostUnreachable(
            host,
            f"{label}: timed out connecting",
            "check that the host is up and the port is open (firewall, VPN); "
            "raise --connect-timeout for slow links",
        )
    return _explain_other(exc, host, label)


def _changed_key(
    exc: paramiko.BadHostKeyException, host: str, label: str, known: _KnownHosts
) -> HostUnreachable:
    remove = f"ssh-keygen -R {shlex.quote(known.name)} -f {shlex.quote(str(known.path))}"
    got = f"{exc.key.get_name()} {exc.key.fingerprint}"
    return HostUnreachable(
        host,
        f"{label}: the host key CHANGED: it is now {got}, known_hosts has "
        f"{exc.expected_key.fingerprint}; this may be an attack (man in the middle)",
        f"if the host was really reinstalled and {got} is its new key (ask its admin), "
        f"remove the old one with `{remove}`, then connect once with --accept-new-host-keys",
    )


def _explain_other(exc: BaseException, host: str, label: str) -> HostUnreachable:
    import paramiko

    if isinstance(exc, (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError)):
        return HostUnreachable(
            host,
            f"{label}: connection refused",
            "is sshd running on that host and port? (`systemctl status ssh`)",
        )
    text = str(exc) or type(exc).__name__
    # A listener that never speaks SSH: paramiko says "Error reading SSH protocol banner",
    # or, when authentication starts on the dead handshake, "No existing session".
    if "banner" in text.lower() or text == "No existing session":
        return HostUnreachable(
            host,
            f"{label}: the port accepts TCP but no SSH server answered within the timeout",
            "check the port; something else may be listening there, or sshd is overloaded",
        )
    return HostUnreachable(host, f"{label}: cannot connect: {text}", "try `ssh -v` to the host")
