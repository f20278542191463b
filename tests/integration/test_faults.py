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

from sshd_cluster import SshdCluster


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
    ssh_env: SshdCluster, tmp_path: Path, stalled_host: tuple[Path, int],
    free_port: Callable[[], int], command: str, run_no_leak,
) -> None:  # fmt: skip
    config, _ = stalled_host
    inv = _inventory(tmp_path, free_port())
    args = [*SSHDDP, command, "--ssh-config", str(config), "--connect-timeout", "2", str(inv)]
    if command == "launch":
        args += [str(JOB), "ok"]
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=tmp_path, env=cli_env(ssh_env), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "no SSH server answered" in out and "hstall" in out
    assert "Traceback" not in out
    assert took < 30, f"{command} took {took:.1f} s against a stalled host"
    if command == "launch":
        assert "nothing was started" in out
        assert not (tmp_path / "remote" / "runs").exists()
