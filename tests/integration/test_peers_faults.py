"""The supervisors under attack and under faults, for real on sshd hosts: a crowd on their
port (P + 1) keeps no node out, and a frozen supervisor (SIGSTOP) neither hangs attach nor
passes for running in ps, and once stopped cannot rewrite how its node ended.

Each reproduces the fault as it happened and fails on the code before the fix; each ends
by scanning /proc for the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from launch_helpers import (
    exit_record,
    finish,
    node_dir,
    sshddp,
    start,
    wait_until,
    write_inventory,
)

from sshddp_lab.sshd import SshdCluster

PAYLOAD = Path(__file__).parent / "payloads" / "hardening.py"
BOUND = 90.0  # generous upper bound for what should take seconds on a loaded machine


def wait_ready(workdir: Path, run: str, nodes: int) -> None:
    def ready(n: int) -> bool:
        try:
            return f"READY {n}".encode() in (node_dir(workdir, run, n) / "node.log").read_bytes()
        except OSError:
            return False

    wait_until(lambda: all(ready(n) for n in range(nodes)), BOUND, f"every rank of {run}")


# ------------------------------------------------------- 1. a crowd on the port P + 1


class Crowd:
    """Strangers on the supervisors' port: ``size`` connections, each sending one byte
    (never a newline) every ``every`` s, and connecting again within 10 ms whenever one is
    refused or closed, until stopped or ``limit`` s have passed. Loopback only."""

    def __init__(self, addr: str, port: int, size: int, every: float, limit: float) -> None:
        self.where = (addr, port)
        self.socks: list[tuple[socket.socket, float] | None] = [None] * size
        self.every = every
        self.limit = limit
        self.stop = threading.Event()
        self.challenges = 0  #: connections the hub spoke to (it sends its challenge first)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        end = time.monotonic() + self.limit
        while not self.stop.is_set() and time.monotonic() < end:
            for i, held in enumerate(self.socks):
                self.socks[i] = self._keep(held) if held else self._connect()
            self.stop.wait(0.01)
        for held in self.socks:
            if held:
                held[0].close()

    def _connect(self) -> tuple[socket.socket, float] | None:
        try:
            sock = socket.create_connection(self.where, timeout=2)
        except OSError:
            return None
        sock.setblocking(False)
        return sock, 0.0

    def _keep(self, held: tuple[socket.socket, float]) -> tuple[socket.socket, float] | None:
        """The connection, still open, with a byte sent when one is due; None once closed."""
        sock, last = held
        try:
            if select.select([sock], [], [], 0)[0]:
                data = sock.recv(4096)
                if not data:
                    raise ConnectionResetError("closed by the hub")
                self.challenges += b'"nonce"' in data
            if time.monotonic() - last >= self.every:
                sock.send(b"x")
                last = time.monotonic()
            return sock, last
        except OSError:
            sock.close()
            return None


def test_a_crowd_on_the_supervisors_port_keeps_no_node_out(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """30 connections to node 0's supervisor port, each trickling a byte every 0.5 s and
    connecting again at once when closed, from before the launch until after node 1 had to
    have checked in (2 x the heartbeat timeout). Both nodes must join and the run succeed
    as usual: the crowd once held every authentication slot (the handshake timeout applied
    per read), node 1 never reached node 0's supervisor, and the run was stopped."""
    port = free_port()
    inv, workdir = write_inventory(ssh_env, tmp_path, port, hosts=[1, 2], nproc=1)
    go, run, timeout = tmp_path / "go", "crowded", 5.0
    crowd = Crowd(ssh_env.host(1).addr, port + 1, 30, 0.5, 120.0)
    crowd.thread.start()
    try:
        proc = start(
            ssh_env,
            tmp_path,
            "launch",
            "--name",
            run,
            "--grace",
            "2",
            "--heartbeat-timeout",
            f"{timeout:g}",
            str(inv),
            str(PAYLOAD),
            "until",
            str(go),
        )
        try:
            wait_ready(workdir, run, 2)
            time.sleep(2 * timeout + 2)  # past node 1's deadline to reach node 0's supervisor
            challenged = crowd.challenges
            go.touch()
            rc, err = finish(proc, 120)
        finally:
            go.touch()  # every rank ends, whatever failed
            if proc.poll() is None:
                proc.kill()
    finally:
        crowd.stop.set()
        crowd.thread.join(30)
    assert rc == 0, err
    for node in (0, 1):
        rec = exit_record(workdir, run, node)
        assert rec is not None and rec["state"] == "succeeded", rec
        assert not rec.get("reason"), rec  # no "never reached node 0's supervisor"
    assert challenged >= 30, "the crowd never reached node 0's supervisor"
    run_no_leak(run)


# ---------------------------------------------------------- 2. a frozen supervisor


def test_a_frozen_supervisor_hangs_nothing_and_a_stopped_node_stays_stopped(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """The node's supervisor gets SIGSTOP. `ps` once showed the node running, `attach`
    never returned, and `stop` took grace + 15 s, left the frozen supervisor alive, and
    after a SIGCONT it rewrote exit.json from "stopped" to "failed". Now ps says the node
    is not answering, attach gives up with a message, stop kills the frozen supervisor
    and writes the final record, which a SIGCONT cannot change."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=1)
    run = "frozen"
    launched = sshddp(
        ssh_env, tmp_path, "launch", "--detach", "--name", run, "--grace", "2", inv, PAYLOAD, "wait"
    )
    assert launched.returncode == 0, launched.stderr
    wait_ready(workdir, run, 1)
    supervisor = json.loads((node_dir(workdir, run, 0) / "state.json").read_text())[
        "supervisor_pid"
    ]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        ps = sshddp(ssh_env, tmp_path, "ps", timeout=60)
        assert f"{run}" in ps.stdout and "0:not-answering" in ps.stdout, ps.stdout + ps.stderr
        attached = sshddp(ssh_env, tmp_path, "attach", run, timeout=BOUND)
        said = attached.stdout + attached.stderr
        assert "frozen (SIGSTOP)" in said and "not-answering" in said, said
        assert attached.returncode == 4, said  # the run may still be going: as unreachable
        assert "Traceback" not in said, said
        stopped = sshddp(ssh_env, tmp_path, "stop", run, timeout=BOUND)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        final = exit_record(workdir, run, 0)
        assert final is not None and final["state"] == "stopped", final
        assert f"its supervisor (pid {supervisor}) was frozen (SIGSTOP)" in final["reason"], final
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGCONT)
        if exit_record(workdir, run, 0) is None:  # failed before its stop: leave nothing
            sshddp(ssh_env, tmp_path, "stop", "--force", run, timeout=BOUND)
    wait_until(lambda: not _alive(supervisor), BOUND, "the frozen supervisor to be gone")
    assert exit_record(workdir, run, 0) == final, "the node's final record was rewritten"
    run_no_leak(run)


def _alive(pid: int) -> bool:
    """``pid`` is a live process (not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
