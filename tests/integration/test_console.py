"""What the console shows of a failing run, against real sshd hosts and real torchrun + gloo:
3 hosts of 2 ranks, one rank raising. The ranks' own lines and the failing rank's traceback
(the script's frames only, as ``python job.py`` shows them); none of torchrun's agent
chatter, which the node logs keep byte for byte and ``-v`` shows live. torchrun's failure
summary names the script, not sshddp's rank shim.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Callable

from launch_helpers import JOB, Run, assert_one_failure_one_traceback, launch

from sshddp_lab.sshd import SshdCluster

#: torchrun's own lines: its OMP banner, a stopped agent's SignalException, the failed
#: agent's ChildFailedError, its stopping of the other workers
CHATTER = ("OMP_NUM_THREADS", "SignalException", "ChildFailedError", "Sending process")
OLD_COUNT = 150  #: console lines of this run when torchrun's agents showed (194 measured)
FRAME = re.compile(r'^\[3 h2\] +\[rank3\]:   File "([^"]+)", line \d+, in (\S+)$')


def agent_bytes(run: Run, node: int) -> bytes:
    """What torchrun's agent wrote into node ``node``'s log (its spans, node.idx says)."""
    log = run.remote_log(node).read_bytes()
    index = run.remote_log(node).with_suffix(".idx").read_bytes()
    return b"".join(
        log[offset : offset + length]
        for offset, length, source in struct.iter_unpack("<QIi", index)
        if source == -1
    )


def test_a_failing_rank_shows_its_own_traceback_and_no_torchrun_chatter(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), ["raise", "3"], opts=["--name", "fail3"])
    assert run.rc != 0, run.stderr
    out = run.stdout
    assert "[3 h2]   [rank3]: RuntimeError: boom on rank 3" in out.splitlines(), out
    frames = [m.groups() for m in map(FRAME.match, out.splitlines()) if m]
    script = frames[0][0] if frames else ""
    assert script.startswith(str(run.workdir)) and script.endswith(f"/{JOB.name}"), frames
    assert frames == [(script, "<module>"), (script, "main"), (script, "mode_raise")], out
    assert "rank.py" not in out + run.stderr, out
    for chatter in CHATTER:
        assert chatter not in out, chatter
    assert len(out.splitlines()) < OLD_COUNT // 2, out

    # The logs keep every byte the agents wrote: the chatter is there, the shim's frame not.
    agents = b"".join(agent_bytes(run, node) for node in range(3))
    for chatter in CHATTER:
        assert chatter.encode() in agents, chatter
    for node in range(3):
        log = run.remote_log(node).read_bytes()
        assert run.local_log(node).read_bytes() == log, node
        assert b"rank.py" not in log, node
    # torchrun's failure summary names the script the rank ran
    summary = agent_bytes(run, 1).decode().splitlines()
    assert f"{JOB.name} FAILED" in summary, summary
    run_no_leak("fail3")


def test_a_collective_death_cascade_shows_one_traceback_and_a_line_per_victim(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Rank 3 raises while the five others all-reduce: each of them dies of its death
    ("Connection closed by peer") and writes a traceback of its own. The console shows rank
    3's whole and each victim's as one line (55 lines before); the logs keep them all."""
    run = launch(ssh_env, tmp_path, free_port(), ["raise", "3"], opts=["--name", "cascade"])
    assert run.rc == 1, run.stderr
    assert "root cause: node 1 on h2, global rank 3 " in run.stderr, run.stderr
    assert "[3 h2]   [rank3]: RuntimeError: boom on rank 3" in run.stdout.splitlines()
    folded = assert_one_failure_one_traceback(run, 3, "rank 3")
    assert all("Connection closed by peer" in line for line in folded), folded
    assert len(run.stdout.splitlines()) <= 35, run.stdout
    for node in range(3):  # the console's folding never touches a log
        assert run.local_log(node).read_bytes() == run.remote_log(node).read_bytes(), node
    run_no_leak("cascade")


def test_verbose_shows_torchruns_lines_live(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(
        ssh_env, tmp_path, free_port(), ["raise", "3"], opts=["-v", "--name", "loud"], hosts=[1, 2]
    )
    assert run.rc != 0, run.stderr
    shown = [line for line in run.stdout.splitlines() if line.startswith("[2-3 h2]")]
    assert any("ChildFailedError" in line for line in shown), run.stdout
    assert f"[2-3 h2] {JOB.name} FAILED" in shown, run.stdout
    run_no_leak("loud")
