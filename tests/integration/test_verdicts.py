"""What a run's report says of a run that succeeded: real sshd hosts, real torchrun, gloo on
CPU. A run whose processes never formed the planned world succeeds with a warning that
says so, with every node's numbers; a distributed run gets none."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from launch_helpers import launch, sshddp, write_inventory

from sshddp.hosts import shipped
from sshddp.protocol import contract
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
        expected = {"planned": 4, "ranks": 2, "joined": 0, "sizes": [], "collectives": []}
        assert record["world"] == expected, record
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
        world = record["world"]
        ran = world.pop("collectives")
        assert world == {"planned": 4, "ranks": 2, "joined": 2, "sizes": [4, 4]}, record
        assert len(ran) == 2 and min(ran) >= 1, record  # each rank said, and it all-reduced
    run_no_leak(run.run_id)


#: A one-process world, as a script writes it: ``MODE`` says what it does with it.
COLLECTIVES = """
import sys
import torch
import torch.distributed as dist
from torch.distributed import destroy_process_group
mode = sys.argv[1]
dist.init_process_group("gloo", rank=0, world_size=1)
if "reduce" in mode:
    dist.all_reduce(torch.ones(1))
    dist.barrier()
if "destroy" in mode:
    destroy_process_group()
"""


def test_every_process_says_how_many_collectives_its_groups_ran(tmp_path: Path) -> None:
    """The node's sitecustomize, with real torch: a process that formed a world records, as
    it destroys its group (through the name ``torch.distributed`` exports) or as it exits,
    how many collectives ran on it; 0 when none did (what accelerate does on CPU hosts)."""
    rundir = tmp_path / "n0"
    (rundir / "site").mkdir(parents=True)
    (rundir / "spec.json").write_text("{}")
    (rundir / "site" / "sitecustomize.py").write_text(
        shipped.source("sshddp.remote.rankside.ranksite")
    )
    ran = {}
    for rank, mode in enumerate(["alone", "reduce", "reduce+destroy", "destroy"]):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": str(rundir / "site"),
            "RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
        }
        args = [sys.executable, "-c", COLLECTIVES, mode]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        record = json.loads((rundir / contract.JOINED / str(rank)).read_text())
        assert record["world"] == 1 and record["joined"] is not None, record
        ran[mode] = record["collectives"]
    assert ran["alone"] == 0 and ran["destroy"] == 0, ran
    assert ran["reduce"] >= 2 and ran["reduce+destroy"] >= 2, ran  # all-reduce and barrier
