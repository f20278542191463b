"""A launch session starts its node's torchrun importing torch before the preflight
(remote/node/first_standby.py): the first attempt runs on that standby, with the command line and
environment it gets at the start, and a launch that never starts leaves nothing of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from launch_helpers import JOB, Run, sshddp, standby_slots, write_inventory

from sshddp.remote.node.first_standby import slot_count, take_slot
from sshddp_lab.sshd import SshdCluster


def _epoch_of(ticks: int) -> float:
    """A process start time (clock ticks since boot, /proc/PID/stat) as time.time()."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    raise AssertionError("no btime in /proc/stat")


def _state(workdir: Path, run: str, node: int) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(
        (workdir / "runs" / run / f"n{node}" / "state.json").read_text()
    )
    return state


@pytest.mark.xdist_group("rdzv-29500")  # port 29500 and --port auto's range: one worker
def test_first_attempt_runs_on_the_standby_with_the_final_port_and_argv(
    ssh_env: SshdCluster, tmp_path: Path, run_no_leak: Callable[..., None]
) -> None:
    """With --port auto the port is picked by node 0's probe, after the standbys started:
    the go gives torchrun its final command line. A standby node's torchrun was started
    before its supervisor began (its process is older); as many nodes start on a standby as
    this machine has slots (both hosts are this machine); the job's results are right on
    every node."""
    inv, workdir = write_inventory(ssh_env, tmp_path, 29500, hosts=[1, 2], nproc=2)
    args: list[str | Path] = ["--name", "standby1", "--port", "auto", inv, JOB, "argv", "a b"]
    args += ["--flag=1", "ü"]
    got = sshddp(ssh_env, tmp_path, "launch", *args)
    assert got.returncode == 0, got.stderr
    run = Run(0, got.stdout, got.stderr, "standby1", tmp_path, workdir)
    standby = []
    for node in range(2):
        summaries = [j for j in run.json_lines(node) if "argv" in j]
        assert sorted(s["rank"] for s in summaries) == [2 * node, 2 * node + 1], summaries
        assert all(s["argv"] == ["a b", "--flag=1", "ü"] and s["world"] == 4 for s in summaries)
        state = _state(workdir, "standby1", node)
        standby.append(state["standby"])
        if state["standby"]:
            assert _epoch_of(state["pid_start"]) < state["started"], state  # torchrun first
        log = run.local_log(node).read_text()
        assert "RuntimeWarning" not in log, log  # torchrun's module ran as with -m
    assert sum(standby) == standby_slots(2), standby
    run_no_leak("standby1")


def test_a_machine_with_no_slot_free_starts_torchrun_cold(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Every early-import slot of this machine is held (by this test): the node's torchrun
    starts when its supervisor does, and the run is the same."""
    held = [take_slot() for _ in range(slot_count())]
    try:
        assert None not in held and take_slot() is None
        inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=1)
        got = sshddp(ssh_env, tmp_path, "launch", "--name", "cold2", inv, JOB, "ok")
        assert got.returncode == 0, got.stderr
    finally:
        for fd in held:
            if fd is not None:
                os.close(fd)
    assert _state(workdir, "cold2", 0)["standby"] is False
    run_no_leak("cold2")


def test_a_failed_preflight_leaves_no_standby_and_no_run_directory(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """h3's interpreter is missing, so the checks fail after h1's and h2's torchruns began
    importing torch: by the time sshddp exits they are gone, and so is what they used."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=1)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][2]["python"] = "/nonexistent/python3"
    inv.write_text(yaml.safe_dump(doc))
    bad = sshddp(ssh_env, tmp_path, "launch", "--name", "cold1", inv, JOB, "ok")
    assert bad.returncode == 3, bad.stderr
    assert "nothing was started" in bad.stderr and "Traceback" not in bad.stderr
    assert not (workdir / "runs" / "cold1").exists()
    run_no_leak("cold1", timeout=0.5)  # ended before sshddp returned, not some time later
