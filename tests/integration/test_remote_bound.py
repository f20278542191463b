"""A node bound to its launch session (remote/node/bound.py), as it runs over srun: run here
through the real session, as the host's shell (here: a Slurm job step) would run it.

Over srun a node's processes live in its launch session's job step, which ends when the
session does; so the session must not leave before its node, and the node must not
outlive its session."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_remote_session import answer, boot_args, session_clock

from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP
from sshddp.protocol import session_messages as msgs
from sshddp.remote.common import pid_alive
from sshddp.remote.node.bound import CALLER_GONE, COORDINATOR_GONE, SESSION_GONE

BOUND = 60.0


def start_node(
    python: str, rundir: Path, bound: bool | str = True
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A session that has started a node whose script sleeps; (session, state)."""
    script = b"import time\nprint('up', flush=True)\ntime.sleep(600)\n"
    args = boot_args(rundir)
    args["payload"] = {**args["payload"], "size": len(script)}
    args["payload"]["sha256"] = hashlib.sha256(script).hexdigest()
    args["bound"] = bound
    proc = subprocess.Popen(
        [python, "-c", BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    sent = time.time()
    proc.stdin.write(shipped.header("host_session", {"probe": None}))
    proc.stdin.write(msgs.encode(msgs.go(args)) + script)
    proc.stdin.flush()
    session_clock(proc.stdout, sent)
    assert answer(proc.stdout, "released") == {}
    assert answer(proc.stdout, "staged")["ok"]
    proc.stdin.write(msgs.encode(msgs.start(True)))
    proc.stdin.flush()
    started = answer(proc.stdout, "started")
    assert started["ok"] and started["state"]["state"] == "running", started
    assert proc.stdout.readline() == b"Rup\n"  # the node's log, streamed (R: no index)
    return proc, started["state"]


def exit_record(rundir: Path) -> dict[str, Any]:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            return dict(json.loads((rundir / "exit.json").read_text()))
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError(f"no exit.json in {rundir} after {BOUND:.0f} s")


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_coordinator_gone_stops_the_node_before_the_session_leaves(
    tmp_path: Path, oldest_python: Path, which: str
) -> None:
    """SIGTERM (Slurm signals the whole step) does not end the session; stdin's EOF (the
    coordinator went away) stops the node, and the session exits only after its
    supervisor has."""
    python = sys.executable if which == "this" else str(oldest_python)
    rundir = tmp_path / "runs" / "r1" / "n0"
    proc, state = start_node(python, rundir)
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "the bound session died of SIGTERM"
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(BOUND) == 0
        assert not pid_alive(state["supervisor_pid"]), "the session left before its node"
        assert not pid_alive(state["pid"]), "torchrun outlived its session"
    finally:
        proc.kill()
        proc.wait()
    record = exit_record(rundir)
    assert record["state"] == "stopped" and record["reason"] == COORDINATOR_GONE, record


def test_a_node_bound_to_its_caller_stops_when_the_caller_goes(tmp_path: Path) -> None:
    """Under the Python API (bound: "caller") the session's stdin ends when the caller's
    process dies: the node stops, and says why."""
    rundir = tmp_path / "runs" / "r1" / "n0"
    proc, state = start_node(sys.executable, rundir, bound="caller")
    try:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(BOUND) == 0
        assert not pid_alive(state["pid"]), "torchrun outlived its session"
    finally:
        proc.kill()
        proc.wait()
    record = exit_record(rundir)
    assert record["state"] == "stopped" and record["reason"] == CALLER_GONE, record


def test_a_supervisor_whose_session_vanished_stops_its_node(tmp_path: Path) -> None:
    rundir = tmp_path / "runs" / "r1" / "n0"
    proc, state = start_node(sys.executable, rundir)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        record = exit_record(rundir)
    finally:
        proc.kill()
    assert record["state"] == "stopped" and record["reason"] == SESSION_GONE, record
    deadline = time.monotonic() + BOUND
    while pid_alive(state["supervisor_pid"]) or pid_alive(state["pid"]):
        assert time.monotonic() < deadline, "the node outlived its session"
        time.sleep(0.05)


def test_an_unbound_node_outlives_its_session(tmp_path: Path) -> None:
    """Over SSH (not bound) the run goes on without its session, as it always has."""
    rundir = tmp_path / "runs" / "r1" / "n0"
    proc, state = start_node(sys.executable, rundir, bound=False)
    proc.kill()
    proc.wait()
    time.sleep(1.5)  # a bound supervisor would have noticed by now
    assert not (rundir / "exit.json").exists()
    os.kill(state["supervisor_pid"], signal.SIGTERM)  # clean up: stop it as `stop` would
    assert exit_record(rundir)["state"] == "stopped"
