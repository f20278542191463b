"""Programs that end at once, launched many times: each launch's verdict, exit code and log
bytes are its own. A node whose program ended before its launch session looked is followed
like any other (its output fetched, its verdict its own), never "did not start".

``INSTANT_LAUNCHES`` launches of each exit code (default: a few; ``scripts/instant_soak.sh``
runs 50 of each, 100 launches under each launcher).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import node_dir, wait_until, write_inventory

from cli_helpers import sshddp
from sshddp_lab.sshd import SshdCluster, processes_with_env

# A node's one line, then its exit: no torch import, so the node ends within milliseconds
# of its start (35 ms under --launcher node).
INSTANT = """\
import os, sys
node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK")
print(f"instant {sys.argv[1]} node {node}", flush=True)
sys.exit(int(sys.argv[1]))
"""
# Launches of each case: a node launch takes about 1 s, a torchrun one 4 (it imports torch,
# so its ranks end long after it started: one host suffices).
LAUNCHES = int(os.environ.get("INSTANT_LAUNCHES", "0"))
# Seconds a failed run's processes have to go once the launch returned: a node whose
# program ended before node 0's supervisor left gives up on it peers.REPORT_GRACE (10 s)
# after its end.
LINGER = 30.0
CASES = [("node", [1, 2], LAUNCHES or 6), ("torchrun", [1], LAUNCHES or 1)]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("launcher", "hosts", "launches"), CASES, ids=[c[0] for c in CASES])
def test_instant_programs_get_their_own_verdict_and_every_byte_each_time(
    launcher: str,
    hosts: list[int],
    launches: int,
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=hosts, nproc=1)
    script = tmp_path / "instant.py"
    script.write_text(INSTANT)
    log_dir = tmp_path / "logs"
    opts = ["--ssh-config", ssh_env.ssh_config, "--log-dir", log_dir, f"--launcher={launcher}"]
    lingering: list[str] = []
    for i in range(launches):
        for code in (0, 1):
            result = sshddp(["launch", *opts, "--no-check", inv, script, str(code)])
            where = f"launch {i + 1}, exit {code}:\n{result.explain()}"
            assert result.code == code, where
            run = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
            verdict = "succeeded" if code == 0 else "failed"
            assert f"sshddp: run {run} {verdict}" in result.err, where
            assert "did not start" not in result.err, where
            for node in range(len(hosts)):
                assert_log(workdir, log_dir / run, node, result.err, code, launcher, where)
            if code == 0:
                run_no_leak(run)
            elif processes_with_env("SSHDDP_RUN_ID", run):
                lingering.append(run)
    stuck = [run for run in lingering if not gone_in_time(run)]
    assert not stuck, f"a supervisor outlived its failed run by {LINGER:.0f} s: {stuck}"


def gone_in_time(run: str) -> bool:
    """Whether every process of ``run`` is gone within LINGER s (after both nodes failed at
    once, node 1's supervisor once waited a minute for node 0's, which had left); one that
    is not is killed, so it outlives no test."""
    try:
        wait_until(lambda: not processes_with_env("SSHDDP_RUN_ID", run), LINGER, run)
        return True
    except AssertionError:
        for pid, _ in processes_with_env("SSHDDP_RUN_ID", run):
            os.kill(pid, signal.SIGKILL)
        return False


def assert_log(
    workdir: Path, logs: Path, node: int, err: str, code: int, launcher: str, where: str
) -> None:
    """The node's local log is the host's, byte for byte; a node that ended of itself wrote
    its line (alone, but for torchrun's own lines after a failed rank)."""
    run = logs.name
    local = (logs / f"node{node}-h{node + 1}.log").read_bytes()
    assert local == (node_dir(workdir, run, node) / "node.log").read_bytes(), where
    if f"node {node}   h{node + 1}" in err and "stopped: " in err.split(f"node {node}   ")[1]:
        return  # stopped when another node failed: it may not have come to its line
    line = f"instant {code} node {node}\n".encode()
    alone = launcher == "node" or code == 0
    assert local == line if alone else local.startswith(line), where
