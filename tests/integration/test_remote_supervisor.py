"""The supervisor (remote/node/supervisor.py), run here as on a host, with its idle sleep made an
hour long: a signal, or torchrun exiting while a child of it still holds the output pipe,
must wake it at once, or these runs would hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sshddp.hosts import shipped
from standin_specs import stand_in


def start_supervisor(rundir: Path, code: str, python: str) -> subprocess.Popen[bytes]:
    rundir.mkdir(parents=True)
    # unique, across xdist workers too (their tmp names are alike): the supervisor stops by it
    mark = f"r1/n0-{rundir.parent.name}-{os.getpid()}"
    spec = {
        **stand_in(rundir, code),  # the code runs as the node's torchrun
        "run_id": "r1",
        "node_rank": 0,
        "cwd": None,
        "grace": 10,
        "mark": mark,
        "peers": {},
        "tty": False,
    }
    (rundir / "spec.json").write_text(json.dumps(spec))
    source = shipped.standalone("supervisor").replace("IDLE_WAIT = 1.0", "IDLE_WAIT = 3600.0")
    assert "IDLE_WAIT = 3600.0" in source
    (rundir / "supervisor.py").write_text(source)
    return subprocess.Popen([python, "-S", str(rundir / "supervisor.py"), str(rundir)])


def wait_json(path: Path, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            time.sleep(0.02)
    raise AssertionError(f"no {path.name} after {timeout} s")


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    """This interpreter, and the oldest a host may have."""
    return sys.executable if request.param == "this" else str(oldest_python)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_wakes_an_idle_supervisor(
    tmp_path: Path, sig: signal.Signals, python: str
) -> None:
    rundir = tmp_path / "n0"
    code = "import time; print('up', flush=True); time.sleep(600)"
    sup = start_supervisor(rundir, code, python)
    try:
        wait_json(rundir / "state.json")
        while b"up" not in (rundir / "node.log").read_bytes():
            time.sleep(0.02)
        sup.send_signal(sig)
        record = wait_json(rundir / "exit.json")
        assert record["state"] == "stopped" and record["reason"] == "stopped on request", record
        assert sup.wait(30) == 0
    finally:
        sup.kill()


def test_torchrun_exiting_wakes_it_though_a_child_holds_the_pipe(
    tmp_path: Path, python: str
) -> None:
    """No EOF comes on the output pipe (a grandchild keeps it open): SIGCHLD does the waking,
    then the grandchild, which carries the node's marker, is stopped with the node."""
    rundir = tmp_path / "n0"
    code = (
        "import subprocess, time; subprocess.Popen(['sleep', '600']); "
        "print('spawned', flush=True); time.sleep(0.5)"
    )
    sup = start_supervisor(rundir, code, python)
    try:
        record = wait_json(rundir / "exit.json")
        assert record["state"] == "succeeded" and record["returncode"] == 0, record
        assert b"spawned\n" in (rundir / "node.log").read_bytes()
        assert sup.wait(30) == 0
    finally:
        sup.kill()
