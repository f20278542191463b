"""ssh_config is read once a command, and the address other nodes reach a host at is the
one its connection resolves; the TCP connection under SSH (``hosts/ssh.py``). No SSH
connection is opened here (``tests/integration/test_ssh_socket.py`` opens real ones)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from sshddp.hosts import ssh
from sshddp.hosts.pool import node_addr
from sshddp.hosts.ssh import SshTransport, _tcp_connect, resolve_hostname
from sshddp.hosts.transport import SshOptions
from sshddp.model.inventory import parse_inventory

HOSTS = 16


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    ssh._ssh_config.cache_clear()
    yield
    ssh._ssh_config.cache_clear()


def write_config(path: Path, hosts: int) -> Path:
    blocks = [f"Host h{i}\n    HostName 127.0.0.{40 + i}\n    Port 2222\n" for i in range(1, hosts)]
    path.write_text("\n".join(blocks) + "\nHost *\n    User alice\n")
    return path


def test_one_parse_for_every_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path / "ssh_config", HOSTS)
    parses = []
    parse = paramiko.SSHConfig.parse

    def counting(self: paramiko.SSHConfig, file_obj: object) -> None:
        parses.append(file_obj)
        parse(self, file_obj)  # type: ignore[arg-type]

    monkeypatch.setattr(paramiko.SSHConfig, "parse", counting)
    text = "hosts:\n" + "".join(f"  - host: h{i}\n" for i in range(1, HOSTS + 1))
    inv = parse_inventory(text, "inv.yaml")
    options = SshOptions(ssh_config=str(config))
    transports = [SshTransport(host, options) for host in inv.hosts]
    addrs = [node_addr(host, options) for host in inv.hosts]
    assert len(parses) == 1
    # h16 has no block of its own: its alias is its address, as ssh would resolve it
    expected = [f"127.0.0.{40 + i}" for i in range(1, HOSTS)] + ["h16"]
    assert [t.hostname for t in transports] == expected
    assert addrs == expected
    assert {t.label for t in transports[:-1]} == {f"alice@{a}:2222" for a in expected[:-1]}


def test_user_config_without_ssh_config_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    write_config(home / ".ssh" / "config", 3)
    monkeypatch.setenv("HOME", str(home))
    assert resolve_hostname("h2", SshOptions()) == "127.0.0.42"
    assert resolve_hostname("elsewhere", SshOptions()) == "elsewhere"


def test_unreadable_config_leaves_the_alias(tmp_path: Path) -> None:
    options = SshOptions(ssh_config=str(tmp_path / "missing"))
    assert resolve_hostname("h1", options) == "h1"


def test_tcp_connection_without_nagle() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sock = _tcp_connect("127.0.0.1", port, 5.0)
        peer, _ = server.accept()
        with sock, peer:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert sock.gettimeout() == 5.0  # until paramiko's transport sets its own
            peer.sendall(b"SSH-2.0-x\r\n")
            assert sock.recv(64) == b"SSH-2.0-x\r\n"


def test_refused_everywhere_is_paramikos_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
        _tcp_connect("127.0.0.1", port, 5.0)  # nothing listens there any more


def test_unknown_name_raises_at_once() -> None:
    with pytest.raises(socket.gaierror):
        _tcp_connect("no-such-host.invalid", 22, 5.0)
