"""The sshd harness itself: real servers whose keys and known_hosts behave as promised.

Uses paramiko directly, the way a client configured from ``ssh_config`` would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import paramiko
import pytest
import yaml

from sshddp_lab import workers
from sshddp_lab.sshd import SshdCluster, SshdClusterError, render_sshd_config

MakeCluster = Callable[..., SshdCluster]


def connect(
    cluster: SshdCluster, i: int, config: Path | None = None, key: Path | None = None
) -> paramiko.SSHClient:
    """Connect to host ``i`` as its ssh_config block says, rejecting unknown host keys."""
    cfg = paramiko.SSHConfig.from_path(str(config or cluster.ssh_config))
    entry = cfg.lookup(cluster.host(i).alias)
    client = paramiko.SSHClient()
    client.load_host_keys(entry["userknownhostsfile"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            entry["hostname"],
            port=int(entry["port"]),
            username=entry["user"],
            key_filename=str(key) if key else entry["identityfile"][0],
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
            banner_timeout=5,
            auth_timeout=5,
        )
    except BaseException:
        client.close()
        raise
    return client


def run(client: paramiko.SSHClient, command: str) -> str:
    _, stdout, stderr = client.exec_command(command, timeout=10)
    out = stdout.read().decode()
    status = stdout.channel.recv_exit_status()
    assert status == 0, f"{command!r} exited {status}: {stderr.read().decode()}"
    return out


def test_every_host_runs_a_command(cluster: SshdCluster) -> None:
    for host in cluster.hosts:
        with connect(cluster, host.index) as client:
            assert run(client, "echo ok") == "ok\n"


def test_hosts_listen_on_their_own_address(cluster: SshdCluster) -> None:
    base = workers.session_first_octet()  # 40 on xdist's first worker (or without xdist)
    assert [(h.alias, h.addr, h.port) for h in cluster.hosts] == [
        (f"h{i}", f"127.0.0.{base + i}", cluster.port) for i in range(1, 5)
    ]
    first = cluster.known_hosts.read_text().splitlines()[0]
    assert first.startswith(f"[127.0.0.{base + 1}]:{cluster.port} ssh-ed25519 AAAA")


def test_openssh_client_accepts_the_generated_config(cluster: SshdCluster) -> None:
    result = subprocess.run(
        ["ssh", "-F", str(cluster.ssh_config), "h2", "echo", "ok"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr


def test_wrong_key_is_refused(cluster: SshdCluster) -> None:
    config = cluster.wrong_key_config()
    entry = paramiko.SSHConfig.from_path(str(config)).lookup("h1")
    assert entry["identityfile"] == [str(cluster.wrong_client_key)]
    with pytest.raises(paramiko.AuthenticationException):
        connect(cluster, 1, config=config)


def test_changed_host_key_is_rejected(cluster: SshdCluster) -> None:
    try:
        cluster.change_host_key(2)
        with pytest.raises(paramiko.BadHostKeyException):
            connect(cluster, 2)
    finally:
        cluster.restore_host_key(2)
    with connect(cluster, 2) as client:
        assert run(client, "echo ok") == "ok\n"


def test_host_missing_from_known_hosts_is_rejected(cluster: SshdCluster) -> None:
    config, known = cluster.config_without_known_host(3)
    assert f"[{cluster.host(3).addr}]:{cluster.port}" not in known.read_text()
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(cluster, 3, config=config)
    with connect(cluster, 1, config=config) as client:
        assert run(client, "echo ok") == "ok\n"


def test_stopped_host_refuses_and_its_sessions_survive(cluster: SshdCluster) -> None:
    host = cluster.host(2)
    with connect(cluster, 2) as client:
        try:
            cluster.stop_host(2)
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((host.addr, host.port), timeout=5).close()
            assert run(client, "echo still") == "still\n"
        finally:
            cluster.start_host(2)
    with connect(cluster, 2) as client:
        assert run(client, "echo ok") == "ok\n"


def test_host4_python3_is_another_minor_version(cluster: SshdCluster) -> None:
    with connect(cluster, 4) as client:
        remote = run(client, "python3 -c 'import sys;print(sys.version_info[:2])'")
    assert remote.strip() != str(tuple(sys.version_info[:2]))


def test_inventory_yaml(cluster: SshdCluster) -> None:
    assert yaml.safe_load(cluster.inventory_yaml()) == {
        "defaults": {"python": sys.executable},
        "hosts": [{"host": f"h{i}", "nproc": 2} for i in range(1, 5)],
    }
    text = cluster.inventory_yaml(
        [1, 3], python="/py", env={"A": "1"}, rdzv_port=29511, nproc=1, workdir="/w"
    )
    assert yaml.safe_load(text) == {
        "defaults": {"python": "/py", "env": {"A": "1"}, "workdir": "/w"},
        "rendezvous": {"port": 29511},
        "hosts": [{"host": "h1", "nproc": 1}, {"host": "h3", "nproc": 1}],
    }


def test_extra_config_overrides_defaults_and_merges_setenv() -> None:
    text = render_sshd_config(
        ["LogLevel ERROR", "MaxSessions 64"],
        ["SetEnv PATH=/x", "MaxSessions 2", 'SetEnv "B=a b"'],
        {"HOME": "/h"},
    )
    assert text.splitlines() == [
        "LogLevel ERROR",
        'SetEnv HOME=/h PATH=/x "B=a b"',
        "MaxSessions 2",
    ]


def test_bad_config_fails_with_sshd_stderr(make_cluster: MakeCluster) -> None:
    with pytest.raises(SshdClusterError, match="(?s)h1 .*exited.*NoSuchOption"):
        make_cluster(1, extra_config={1: ["NoSuchOption yes"]})


def test_close_stops_listeners_and_connections(make_cluster: MakeCluster) -> None:
    private = make_cluster(2)
    pids = [private.sshd_pid(h.index) or 0 for h in private.hosts]
    assert all(pids)
    client = connect(private, 1)
    try:
        private.close()
        private.close()
        assert [private.sshd_pid(h.index) for h in private.hosts] == [None, None]
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        transport = client.get_transport()
        deadline = time.monotonic() + 5
        while transport is not None and transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert transport is None or not transport.is_active()
    finally:
        client.close()
