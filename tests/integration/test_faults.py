"""Faults injected for real: a host whose port accepts TCP but never speaks SSH."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import JOB, SSHDDP, cli_env

from sshddp_lab.sshd import SshdCluster


@pytest.fixture
def stalled_host(ssh_env: SshdCluster, tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """An ssh_config with an extra host `hstall` whose listener accepts and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.45", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # hold it open, say nothing
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(
        ssh_env.ssh_config.read_text()
        + f"\nHost hstall\n    HostName 127.0.0.45\n    Port {port}\n    User root\n"
    )
    try:
        yield config, port
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def _inventory(tmp_path: Path, port: int) -> Path:
    import sys

    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"defaults: {{python: {sys.executable}, workdir: {tmp_path}/remote, "
        "env: {GLOO_SOCKET_IFNAME: lo}}\n"
        f"rendezvous: {{port: {port}}}\n"
        "hosts:\n  - {host: h1, nproc: 1}\n  - {host: hstall, nproc: 1}\n"
    )
    return inv


@pytest.mark.parametrize("command", ["doctor", "launch"])
def test_stalled_ssh_listener_is_a_finding_not_a_hang(
    ssh_env: SshdCluster,
    tmp_path: Path,
    stalled_host: tuple[Path, int],
    free_port: Callable[[], int],
    command: str,
    run_no_leak,
) -> None:
    config, _ = stalled_host
    inv = _inventory(tmp_path, free_port())
    args = [*SSHDDP, command, "--ssh-config", str(config), "--connect-timeout", "2", str(inv)]
    if command == "launch":
        args += [str(JOB), "ok"]
    t0 = time.monotonic()
    proc = subprocess.run(
        args, cwd=tmp_path, env=cli_env(ssh_env), capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "no SSH server answered" in out and "hstall" in out
    assert "Traceback" not in out
    assert took < 30, f"{command} took {took:.1f} s against a stalled host"
    if command == "launch":
        assert "nothing was started" in out
        assert not (tmp_path / "remote" / "runs").exists()


def test_changed_and_unknown_host_keys_are_refused_by_every_command(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    from launch_helpers import write_inventory

    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    env = cli_env(ssh_env)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SSHDDP, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    started = run("launch", "--detach", "--name", "hk", str(inv), str(JOB), "wait")
    assert started.returncode == 0, started.stderr
    ssh_env.change_host_key(2)
    try:
        for args, code in (
            (("launch", str(inv), str(JOB), "ok"), 3),
            (("attach", "hk"), 4),
            (("logs", "hk"), 0),
            (("stop", "hk"), 4),
        ):
            r = run(*args)
            out = r.stdout + r.stderr
            assert r.returncode == code, (args, out)
            assert "CHANGED" in out and "attack" in out, (args, out)
            assert "Traceback" not in out
        # `stop` reached node 0 only; node 0's supervisor then stopped node 1 over the peer
        # link. Nothing went to node 1 over the refused connection.
        import json

        exit_path = workdir / "runs/hk/n1/exit.json"
        deadline = time.monotonic() + 30  # the peers stop node 1 just after `stop` returns
        while not exit_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        exit1 = json.loads(exit_path.read_text())
        assert exit1["state"] == "stopped"
        assert exit1["reason"].startswith("stopped: node 0 (h1) stopped"), exit1
        assert not (workdir / "runs/hk/n1/stop-reason").exists()
    finally:
        ssh_env.restore_host_key(2)
    config, _ = ssh_env.config_without_known_host(2)
    for args, code in (
        (("attach", "--ssh-config", str(config), "hk"), 4),
        (("stop", "--ssh-config", str(config), "hk"), 4),
    ):
        r = run(*args)
        out = r.stdout + r.stderr
        assert r.returncode == code and "unknown host key" in out, (args, out)
        assert "--accept-new-host-keys" in out and "Traceback" not in out
    run_no_leak("hk", timeout=3.0)
