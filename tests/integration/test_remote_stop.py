"""``sshddp stop`` on a host (remote/node/stop.py), run here: it signals the supervisor that
state.json names only while that pid still is that process (same start time)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

from sshddp.remote import common
from sshddp.remote.node import stop


def test_the_supervisor_is_known_by_pid_and_start_time() -> None:
    ours = stop._is_our_supervisor
    with subprocess.Popen(["sleep", "30"]) as proc:
        started = common.start_time(proc.pid)
        assert isinstance(started, int)
        assert ours({"supervisor_pid": proc.pid, "supervisor_start": started})
        assert not ours({"supervisor_pid": proc.pid, "supervisor_start": started + 1})
        assert not ours({"supervisor_pid": proc.pid})
        proc.kill()
        proc.wait()
        assert not ours({"supervisor_pid": proc.pid, "supervisor_start": started})
    assert not ours({})


def test_stop_never_signals_a_process_that_reused_the_pid(tmp_path: Path) -> None:
    """The supervisor is gone and its pid now belongs to another process: stop does the
    supervisor's job (nothing of the run is left) and leaves that process alone."""
    rundir = tmp_path / "runs" / "r1" / "n0"
    rundir.mkdir(parents=True)
    (rundir / "spec.json").write_text(
        json.dumps({"node_rank": 0, "mark": f"r1/n0-{os.getpid()}", "grace": 1})
    )
    with subprocess.Popen(["sleep", "30"]) as stranger:
        state = {
            "state": "running",
            "supervisor_pid": stranger.pid,
            "pgid": None,
            "supervisor_start": common.start_time(stranger.pid) - 1,
        }
        (rundir / "state.json").write_text(json.dumps(state))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            stop.main({"rundir": str(rundir), "force": False, "reason": "test"})
        answer = json.loads(out.getvalue())
        assert stranger.poll() is None, "stop signalled a process that only reused the pid"
        stranger.kill()
    assert answer["state"] == "stopped" and answer["already"] is False, answer
    assert answer["reason"] == "stopped after its supervisor was lost", answer
    assert json.loads((rundir / "exit.json").read_text())["state"] == "stopped"
