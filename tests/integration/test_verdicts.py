"""What a run's report says of a run that succeeded: real sshd hosts, real torchrun, gloo on
CPU. A run whose processes never formed the planned world succeeds with a warning that
says so, with every node's numbers; a distributed run gets none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from launch_helpers import launch, sshddp, write_inventory

from sshddp_lab.sshd import SshdCluster

SHORT = Path(__file__).parent / "payloads" / "short.py"  # prints its env; never imports torch


def exit_record(workdir: Path, run: str, node: int) -> dict[str, Any]:
    return dict(json.loads((workdir / "runs" / run / f"n{node}" / "exit.json").read_text()))


def test_a_script_that_never_calls_init_process_group_is_reported_not_distributed(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """2 hosts x 2 ranks of a script without init_process_group: the run succeeds (exit
    code 0: its processes did), and the report warns that it was not distributed, with
    every node's count, the likely cause and the fix."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    done = sshddp(ssh_env, tmp_path, "launch", "--name", "nod", str(inv), str(SHORT))
    assert done.returncode == 0, done.stderr
    assert "sshddp: run nod succeeded\n" in done.stderr, done.stderr
    assert "sshddp: WARNING: run nod was not distributed: none of its processes called" in (
        done.stderr
    ), done.stderr
    assert "never formed the planned world of 4" in done.stderr, done.stderr
    for node in range(2):
        said = f"node {node}   h{node + 1}                   0 of 2 process(es) joined"
        assert said in done.stderr, done.stderr
        record = exit_record(workdir, "nod", node)
        assert record["world"] == {"planned": 4, "ranks": 2, "joined": 0, "sizes": []}, record
    assert "ACCELERATE_USE_CPU=1" in done.stderr, done.stderr
    run_no_leak("nod")


def test_a_distributed_run_gets_no_warning(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """2 hosts x 2 ranks that all-reduce: no warning; each node's exit record says its two
    ranks joined a world of 4."""
    run = launch(ssh_env, tmp_path, free_port(), ["ok"], hosts=[1, 2])
    assert run.rc == 0, run.stderr
    assert "WARNING" not in run.stderr and "not distributed" not in run.stderr, run.stderr
    for node in range(2):
        record = exit_record(run.workdir, run.run_id, node)
        assert record["world"] == {"planned": 4, "ranks": 2, "joined": 2, "sizes": [4, 4]}
    run_no_leak(run.run_id)
