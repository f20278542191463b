"""A launch session starts its node's torchrun importing torch before the preflight
(remote/prewarm.py): the first attempt runs on that standby, with the command line and
environment it gets at the start, and a launch that never starts leaves nothing of it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import JOB, SSHDDP, Run, cli_env, write_inventory

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


def test_first_attempt_runs_on_the_standby_with_the_final_port_and_argv(
    ssh_env: SshdCluster, tmp_path: Path, run_no_leak: Callable[..., None]
) -> None:
    """With --port auto the port is picked by node 0's probe, after every standby started:
    the go gives torchrun its final command line. Each node's torchrun was started before
    its supervisor began (its process is older), and the job's results are right."""
    inv, workdir = write_inventory(ssh_env, tmp_path, 29500, hosts=[1, 2], nproc=2)
    got = subprocess.run(
        [*SSHDDP, "launch", "--name", "warm1", "--port", "auto", str(inv), str(JOB)]
        + ["argv", "a b", "--flag=1", "ü"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert got.returncode == 0, got.stderr
    run = Run(0, got.stdout, got.stderr, "warm1", tmp_path, workdir)
    for node in range(2):
        summaries = [j for j in run.json_lines(node) if "argv" in j]
        assert sorted(s["rank"] for s in summaries) == [2 * node, 2 * node + 1], summaries
        assert all(s["argv"] == ["a b", "--flag=1", "ü"] and s["world"] == 4 for s in summaries)
        state = _state(workdir, "warm1", node)
        assert state["warm"] is True, state
        assert _epoch_of(state["pid_start"]) < state["started"], state  # torchrun came first
        log = run.local_log(node).read_text()
        assert "RuntimeWarning" not in log, log  # torchrun's module ran as with -m
    run_no_leak("warm1")


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
    bad = subprocess.run(
        [*SSHDDP, "launch", "--name", "cold1", str(inv), str(JOB), "ok"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert bad.returncode == 3, bad.stderr
    assert "nothing was started" in bad.stderr and "Traceback" not in bad.stderr
    assert not (workdir / "runs" / "cold1").exists()
    run_no_leak("cold1", timeout=0.5)  # ended before sshddp returned, not some time later
