"""What a launch's start gives the first attempt (with --port auto, the port node 0's probe
picked, and the script's arguments as given), and what a launch that never starts leaves:
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from launch_helpers import JOB, Run, sshddp, write_inventory

from sshddp_lab.sshd import SshdCluster


def _state(workdir: Path, run: str, node: int) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(
        (workdir / "runs" / run / f"n{node}" / "state.json").read_text()
    )
    return state


@pytest.mark.xdist_group("rdzv-29500")  # port 29500 and --port auto's range: one worker
def test_first_attempt_runs_with_the_picked_port_and_the_argv(
    ssh_env: SshdCluster, tmp_path: Path, run_no_leak: Callable[..., None]
) -> None:
    """With --port auto the port is picked by node 0's probe: every node's torchrun starts
    afresh with it when its supervisor starts (no standby for the first attempt), the
    script's arguments arrive as given, and the job's results are right on every node."""
    inv, workdir = write_inventory(ssh_env, tmp_path, 29500, hosts=[1, 2], nproc=2)
    args: list[str | Path] = ["--name", "start1", "--port", "auto", inv, JOB, "argv", "a b"]
    args += ["--flag=1", "ü"]
    got = sshddp(ssh_env, tmp_path, "launch", *args)
    assert got.returncode == 0, got.stderr
    run = Run(0, got.stdout, got.stderr, "start1", tmp_path, workdir)
    for node in range(2):
        summaries = [j for j in run.json_lines(node) if "argv" in j]
        assert sorted(s["rank"] for s in summaries) == [2 * node, 2 * node + 1], summaries
        assert all(s["argv"] == ["a b", "--flag=1", "ü"] and s["world"] == 4 for s in summaries)
        assert _state(workdir, "start1", node)["standby"] is False
        log = run.local_log(node).read_text()
        assert "RuntimeWarning" not in log, log  # torchrun's module ran as with -m
    run_no_leak("start1")


def test_a_failed_preflight_leaves_no_process_and_no_run_directory(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """h3's interpreter is missing, so the checks fail: by the time sshddp exits nothing of
    the run is left on h1 and h2, no process and no run directory."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=1)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][2]["python"] = "/nonexistent/python3"
    inv.write_text(yaml.safe_dump(doc))
    bad = sshddp(ssh_env, tmp_path, "launch", "--name", "cold1", inv, JOB, "ok")
    assert bad.returncode == 3, bad.stderr
    assert "nothing was started" in bad.stderr and "Traceback" not in bad.stderr
    assert not (workdir / "runs" / "cold1").exists()
    run_no_leak("cold1", timeout=0.5)  # ended before sshddp returned, not some time later
