"""The ranks' record of init_process_group, with real torch in a fresh process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sshddp.hosts import shipped
from sshddp.protocol import contract


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


INIT = """
import sys
import torch.distributed as dist
assert "init_process_group" in dist.init_process_group.__name__
dist.init_process_group("gloo", rank=0, world_size=1)
print("joined", flush=True)
"""


def test_a_rank_records_init_process_group_with_real_torch(tmp_path: Path) -> None:
    """A rank's sitecustomize wraps torch's init_process_group (torch imported by the
    script, not by it): joined/<RANK> says when the call started and when it returned, and
    the world size; a process without RANK (a node launcher's worker) writes joined/p<pid>
    with the rank its group gave it."""
    rundir = tmp_path / "n0"
    (rundir / "site").mkdir(parents=True)
    (rundir / "spec.json").write_text("{}")
    (rundir / "site" / "sitecustomize.py").write_text(
        shipped.source("sshddp.remote.rankside.ranksite")
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(rundir / "site"),
        "RANK": "5",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
    }
    before = time.time()
    done = subprocess.run(
        [sys.executable, "-c", INIT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "joined\n"
    record = json.loads((rundir / contract.JOINED / "5").read_text())
    assert record["rank"] == 5 and record["schema"] == contract.SCHEMA
    assert before <= record["entered"] <= record["joined"] <= time.time()
    assert record["world"] == 1  # the world size the group formed with
    worker = {k: v for k, v in env.items() if k != "RANK"}  # a node launcher's worker
    worker["MASTER_PORT"] = str(_free_port())
    done = subprocess.run(
        [sys.executable, "-c", INIT], env=worker, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    pids = [p for p in os.listdir(rundir / contract.JOINED) if p.startswith("p")]
    assert len(pids) == 1, pids
    record = json.loads((rundir / contract.JOINED / pids[0]).read_text())
    assert (record["rank"], record["world"]) == (0, 1) and record["joined"] is not None
    untouched = "import sys, sitecustomize; print('torch' in sys.modules)"
    plain = subprocess.run(
        [sys.executable, "-c", untouched], env=env, capture_output=True, text=True, timeout=60
    )
    assert plain.stdout == "False\n", plain.stderr  # the hook never imports torch itself
