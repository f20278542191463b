"""The TCP connection under each SSH connection, against a real sshd: Nagle off, paramiko's
reader thread waking once a second on an idle connection, a close that ends the TCP
connection at once (that thread may still sleep in ``recv``), and a command's output intact."""

from __future__ import annotations

import socket
from pathlib import Path

from sshddp.hosts.ssh import IDLE_WAKE_SECONDS, SshTransport
from sshddp.hosts.transport import SshOptions
from sshddp.model.inventory import parse_inventory
from sshddp_lab.sshd import SshdCluster

_TCP_ESTABLISHED = "01"


def tcp_state(local: tuple[str, int]) -> str:
    """The kernel's state of the IPv4 TCP socket bound to ``local`` ("" when there is none)."""
    addr = socket.inet_aton(local[0])[::-1].hex().upper()  # /proc/net/tcp: little-endian hex
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if fields[1] == f"{addr}:{local[1]:04X}":
            return fields[3]
    return ""


def test_connection_socket(cluster: SshdCluster) -> None:
    host = parse_inventory("hosts:\n  - host: h1\n", "inv.yaml").hosts[0]
    transport = SshTransport(host, SshOptions(ssh_config=str(cluster.ssh_config)))
    try:
        transport.connect()
        paramiko_transport = transport._conn.client.get_transport()
        assert paramiko_transport is not None
        sock = paramiko_transport.sock
        assert isinstance(sock, socket.socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock.gettimeout() == IDLE_WAKE_SECONDS  # paramiko's is 0.1 s
        proc = transport.start("printf 'a\\nb\\n'; printf err >&2; exit 3")
        out = b""
        while chunk := proc.read():
            out += chunk
        assert (out, proc.read_stderr(), proc.wait()) == (b"a\nb\n", b"err", 3)
        local = sock.getsockname()
        assert tcp_state(local) == _TCP_ESTABLISHED
    finally:
        transport.close()
    assert tcp_state(local) != _TCP_ESTABLISHED  # the FIN went at the close, not at a wake-up
    paramiko_transport.join(10 * IDLE_WAKE_SECONDS)
    assert not paramiko_transport.is_alive()
