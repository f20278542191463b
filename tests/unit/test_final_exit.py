"""A node's exit record is final: whoever writes it first (its supervisor, or ``stop``
for a supervisor that could not answer), nothing later replaces it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sshddp.remote import common
from sshddp.remote.node import supervisor


def test_a_final_record_is_published_once_and_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "exit.json")
    assert common.publish_json(path, {"state": "stopped"})
    assert not common.publish_json(path, {"state": "failed"})
    assert json.loads(Path(path).read_text()) == {"state": "stopped"}
    assert os.listdir(tmp_path) == ["exit.json"], "a temporary file was left behind"


def test_a_supervisor_that_wakes_up_late_never_rewrites_a_stopped_node(tmp_path: Path) -> None:
    """``stop`` wrote "stopped" while the supervisor was frozen; after a SIGCONT the
    supervisor saw torchrun killed and wrote "failed" over it."""
    rundir = str(tmp_path)
    supervisor.write_exit(rundir, 0, 1.0, "stopped", None, "stopped with `sshddp stop`")
    supervisor.write_exit(rundir, 0, 1.0, "failed", -9, "torchrun was killed by SIGKILL")
    record = json.loads((tmp_path / "exit.json").read_text())
    assert record["state"] == "stopped" and record["reason"] == "stopped with `sshddp stop`"
    assert os.listdir(tmp_path) == ["exit.json"]
