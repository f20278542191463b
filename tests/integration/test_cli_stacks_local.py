"""`sshddp stacks` on nodes on ``localhost`` (the local transport, no SSH) with real processes:
a live rank printed and saved, and runs that have ended or lost their directories."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode
from sshddp.hosts import shipped
from sshddp.protocol import contract
from sshddp.run import registry
from sshddp.run.registry import RunRecord
from stacks_records import local, record

NAPS = "import time\nprint('ready', flush=True)\ndef nap():\n    time.sleep(600)\nnap()\n"


def ended(run: RunRecord, node: int, state: str) -> None:
    rundir = Path(run.nodes[node].rundir)
    rundir.mkdir(parents=True)
    (rundir / "spec.json").write_text(
        json.dumps({"node_rank": node, "mark": f"r1/n{node}-{os.getpid()}"})
    )
    (rundir / "exit.json").write_text(json.dumps({"state": state}))


def test_a_run_that_has_ended_has_no_stacks(tmp_path: Path) -> None:
    run = record(tmp_path, local(0), local(1))
    ended(run, 0, "succeeded")
    ended(run, 1, "failed")
    result = sshddp(["stacks", "r1"])
    assert_clean_failure(result, ExitCode.NOT_RUNNING)
    assert result.err == (
        "sshddp: error: run r1 is not running (node 0 (localhost) succeeded, node 1 "
        "(localhost) failed): it has no stacks to collect; `sshddp logs r1` shows its output\n"
    )
    assert not (tmp_path / "logs" / "r1" / "stacks").exists()


def test_a_run_whose_directories_are_gone_is_not_running(tmp_path: Path) -> None:
    record(tmp_path, local(0))  # its run directory was never made, or was removed
    result = sshddp(["stacks", "r1"])
    assert_clean_failure(result, ExitCode.NOT_RUNNING)
    assert "run r1 is not running (node 0 (localhost) unknown)" in result.err


@pytest.fixture
def live(tmp_path: Path) -> Iterator[RunRecord]:
    """A run of one node on localhost with one rank, napping (no torchrun needed)."""
    run = record(tmp_path, local(0))
    rundir = Path(run.nodes[0].rundir)
    (rundir / contract.SITE).mkdir(parents=True)
    site = rundir / contract.SITE / "sitecustomize.py"
    site.write_text(shipped.source("sshddp.remote.rankside.ranksite"))
    mark = f"r1/n0-{tmp_path.name}-{os.getpid()}"
    (rundir / contract.SPEC).write_text(json.dumps({"node_rank": 0, "mark": mark}))
    env = {"PYTHONPATH": str(site.parent), contract.MARK_VAR: mark, "RANK": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", NAPS], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.2)
        yield run
    finally:
        proc.kill()
        proc.wait()


def test_a_live_rank_on_localhost_is_printed_and_saved(live: RunRecord) -> None:
    result = sshddp(["stacks", "r1"])
    assert result.code == ExitCode.OK, result.explain()
    assert result.out.startswith("=== rank 0 on localhost (1 rank) ===\n"), result.out
    assert '  File "<string>", line 4, in nap\n' in result.out
    assert "sshddp: run r1: 1 rank on 1 host in 1 group, collected in " in result.err
    saved = Path(result.err.split("full dumps (one file per process): ")[1].split()[0])
    names = sorted(p.name for p in saved.iterdir())
    assert names[-1] == "stacks.json" and names[0].startswith("rank0-node0-localhost-pid")


def test_stacks_that_cannot_be_saved_are_printed_then_the_error(live: RunRecord) -> None:
    blocker = Path(live.log_dir).parent / "a-file"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("")
    registry.save(dataclasses.replace(live, log_dir=str(blocker / "r1")))
    result = sshddp(["stacks", "r1"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert result.out.startswith("=== rank 0 on localhost (1 rank) ===\n"), result.out
    assert f"sshddp: error: cannot save the stacks under {blocker}" in result.err, result.err
    assert "full dumps" not in result.err
