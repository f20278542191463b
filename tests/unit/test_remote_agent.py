"""The agent shim (remote/agent.py): torchrun through it ends as `python -m
torch.distributed.run` does (status, output, failure summary), only without the
interpreter's teardown of torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.remote.agent import exit_code

WORKER = r"""
import os, sys
rank = int(os.environ["RANK"])
os.write(1, ("worker %d %s\n" % (rank, sys.argv[1:])).encode())  # one write: no mixing
if sys.argv[1] == "fail" and rank == 1:
    raise RuntimeError("injected failure")
"""


@pytest.fixture()
def shim(tmp_path: Path) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(shipped.source("sshddp.remote.agent"))
    (tmp_path / "worker.py").write_text(WORKER)
    return path


def torchrun(tmp_path: Path, head: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, *head, "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_torchrun_through_the_shim_ends_as_with_dash_m(
    shim: Path, tmp_path: Path, mode: str
) -> None:
    via_m = torchrun(tmp_path, ["-m", "torch.distributed.run"], "worker.py", mode)
    via_shim = torchrun(tmp_path, [str(shim)], "worker.py", mode)
    assert via_shim.returncode == via_m.returncode == (0 if mode == "ok" else 1)
    for got in (via_m, via_shim):
        assert sorted(line for line in got.stdout.splitlines() if line.startswith("worker")) == [
            f"worker 0 ['{mode}']",
            f"worker 1 ['{mode}']",
        ]
    if mode == "fail":  # torchrun's failure summary, printed before the shim's exit
        assert "Root Cause (first observed failure)" in via_shim.stderr
        assert "ChildFailedError" in via_shim.stderr
        assert "exitcode  : 1" in via_shim.stderr


def test_bad_torchrun_options_exit_as_argparse_does(shim: Path, tmp_path: Path) -> None:
    got = torchrun(tmp_path, [str(shim)], "--no-such-option", "worker.py")
    assert got.returncode == 2
    assert "unrecognized arguments: --no-such-option" in got.stderr


def test_exit_code_is_the_interpreters(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(SystemExit()) == 0
    assert exit_code(SystemExit(None)) == 0
    assert exit_code(SystemExit(3)) == 3
    assert exit_code(SystemExit(256 + 7)) == 7
    assert capsys.readouterr().err == ""
    assert exit_code(SystemExit("torchrun: bad")) == 1
    assert capsys.readouterr().err == "torchrun: bad\n"
