"""Outputs that survive: what a run writes in its working directory is there for the next run
of the same directory, and retention never removes it; ``--fresh-cwd`` opts out."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from launch_helpers import write_inventory

from cli_helpers import sshddp
from sshddp_lab.sshd import SshdCluster

RESUME = Path(__file__).parent / "payloads" / "resume.py"
RETENTION = 50  # docs/runs.md "Retention": run directories a host keeps
MORE_RUNS = RETENTION + 11  # enough that retention removes the first run's directory


def launch_resume(cluster: SshdCluster, inv: Path, log_dir: Path, *extra: str) -> dict[str, Any]:
    """One launch of resume.py (in this process); its one JSON line, with its run id."""
    opts = ["--ssh-config", str(cluster.ssh_config), "--log-dir", str(log_dir)]
    args = [a for a in extra if a.startswith("--")]
    script_args = [a for a in extra if not a.startswith("--")]
    result = sshddp(["launch", *opts, *args, inv, RESUME, *script_args])
    assert result.code == 0, result.explain()
    run_id = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
    (log,) = (log_dir / run_id).glob("node0-*.log")
    (line,) = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    assert line["run"] == run_id
    return line


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 62 launches, 60 without torchrun: about 1 s each idle
def test_a_checkpoint_is_found_by_the_next_run_and_survives_sixty_more(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=1)
    log_dir = tmp_path / "logs"
    first = launch_resume(ssh_env, inv, log_dir, "first")
    assert first["found"] is None and first["checkpoint"] is None
    space = Path(first["cwd"])
    assert space.parent == workdir / "work"
    assert (space / "checkpoint.pt").read_text() == f"weights of {first['run']}"
    previous = first["run"]
    for i in range(MORE_RUNS):
        # Between the first and the last, the script runs as a node launcher without the
        # preflight (no torchrun, no torch import: a quarter of the time); retention counts
        # every run alike, and the workspace is the same whichever way the script starts.
        fast = ["--launcher=node", "--no-check"] if i < MORE_RUNS - 1 else []
        line = launch_resume(ssh_env, inv, log_dir, *fast)
        assert line["cwd"] == str(space), f"run {i + 2}"
        assert line["found"] == previous, f"run {i + 2} did not find run {i + 1}'s snapshot"
        assert line["checkpoint"] == f"weights of {first['run']}", f"run {i + 2}"
        previous = line["run"]
    run_no_leak(previous)
    runs = os.listdir(workdir / "runs")
    assert len(runs) == RETENTION and first["run"] not in runs  # retention did run
    assert (space / "checkpoint.pt").read_text() == f"weights of {first['run']}"
    assert (space / "resume.py").read_bytes() == RESUME.read_bytes()

    fresh = launch_resume(ssh_env, inv, log_dir, "--fresh-cwd")
    assert fresh["found"] is None and fresh["checkpoint"] is None
    assert fresh["cwd"] == str(workdir / "runs" / fresh["run"] / "n0" / "code")
    assert (space / "snapshot.txt").read_text() == previous  # the workspace is left alone
