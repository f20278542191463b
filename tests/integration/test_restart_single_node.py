"""A real supervisor of one node restarting a real command (no SSH: the same code a host
runs): attempts recorded, success in attempt 2, or the end after its attempts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sshddp.protocol import contract

ONCE = "import os, sys; print('attempt', os.environ['SSHDDP_ATTEMPT']); sys.exit({code})"


RUN = (
    "import sys; from sshddp.remote.node.supervisor import run_supervisor; "
    "run_supervisor(sys.argv[1])"
)


def supervise(tmp_path: Path, code: str, restarts: int = 2) -> tuple[dict[str, Any], Path]:
    """Run the real supervisor of a one-node run of ``python -c SCRIPT`` to its end."""
    rundir = tmp_path / "n0"
    rundir.mkdir()
    spec = {
        "schema": contract.SCHEMA,
        "run_id": "rs",
        "node_rank": 0,
        "program": {
            "kind": contract.PROGRAM_COMMAND,
            "target": sys.executable,
            "args": ["-c", ONCE.format(code=code)],
        },
        "cwd": None,
        "grace": 1.0,
        "mark": f"rs/n0/{tmp_path.name}-{os.getpid()}",
        "launcher": contract.LAUNCH_COMMAND,
        "restarts": restarts,
    }
    (rundir / contract.SPEC).write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-c", RUN, str(rundir)], timeout=120)
    assert done.returncode == 0
    return json.loads((rundir / contract.EXIT).read_text()), rundir


def test_a_single_node_restarts_and_succeeds_in_attempt_2(tmp_path: Path) -> None:
    ended, rundir = supervise(tmp_path, "1 if os.environ['SSHDDP_ATTEMPT'] == '1' else 0")
    assert ended["state"] == "succeeded" and ended["attempt"] == 2, ended
    assert ended["earlier"] == ["node 0 (?) failed: the launcher exited with code 1"], ended
    log = (rundir / contract.LOG).read_bytes()
    assert log == b"attempt 1\nattempt 2\n"  # the ranks' bytes, nothing else
    assert ended["offsets"] == [0, len(b"attempt 1\n")]
    assert not (rundir / contract.JOINED).exists() or not list((rundir / "joined").iterdir())


def test_a_single_node_that_always_fails_ends_after_its_attempts(tmp_path: Path) -> None:
    ended, rundir = supervise(tmp_path, "3")
    assert (ended["state"], ended["returncode"], ended["attempt"]) == ("failed", 3, 3), ended
    assert len(ended["earlier"]) == 2
    assert (rundir / contract.LOG).read_bytes() == b"attempt 1\nattempt 2\nattempt 3\n"
    record = json.loads((rundir / contract.ATTEMPTS).read_text())
    assert [a["attempt"] for a in record["attempts"]] == [1, 2, 3]


def test_without_restarts_a_node_has_no_attempts(tmp_path: Path) -> None:
    ended, rundir = supervise(tmp_path, "1", restarts=0)
    assert ended["state"] == "failed" and "attempt" not in ended, ended
    assert not (rundir / contract.ATTEMPTS).exists()
