"""The CLI in-process: help, --dry-run (which connects to nothing), and bad command lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp import __version__
from sshddp.cli.app import COMMANDS as COMMAND_MODULES
from sshddp.errors import ExitCode

# Aliases that resolve nowhere: a dry run must not try to reach them.
INVENTORY = """\
defaults:
  python: /opt/venv/bin/python
  env: {NCCL_DEBUG: WARN}
hosts:
  - {host: gpu-a, gpus: 2}
  - {host: gpu-b, gpus: 2, addr: 10.0.0.2}
"""
COMMANDS = sorted(COMMAND_MODULES)


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


def nodes_of(out: str) -> list[str]:
    """The ``command:`` line of every node block of a --dry-run."""
    return [line for line in out.splitlines() if line.startswith("  command: ")]


def test_every_command_is_known() -> None:
    assert {"doctor", "launch"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_of_every_command(command: str, flag: str) -> None:
    result = sshddp([command, flag])
    assert result.code == ExitCode.OK, result.explain()
    assert result.out.startswith(f"Usage: sshddp {command} "), result.explain()
    assert result.err == ""


def test_top_level_help_lists_commands() -> None:
    result = sshddp(["--help"])
    assert result.code == ExitCode.OK
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", result.out, re.M), result.out


def test_version() -> None:
    result = sshddp(["--version"])
    assert (result.code, result.out.strip()) == (0, f"sshddp, version {__version__}")


def test_launch_help_says_options_go_before_the_inventory() -> None:
    out = " ".join(sshddp(["launch", "--help"]).out.split())
    assert "Options go before INVENTORY" in out


# ----------------------------------------------------------------- --dry-run


def test_dry_run_prints_every_node_and_masks_env(inv: Path, script: Path) -> None:
    result = sshddp(
        [
            "launch",
            "--dry-run",
            "--name",
            "dry1",
            "--env",
            "SECRET=hunter2",
            "--port",
            "4321",
            str(inv),
            str(script),
            "--lr",
            "0.1",
            "two words",
        ]
    )
    assert result.code == ExitCode.OK, result.explain()
    assert "hunter2" not in result.text
    assert "SECRET=***" in result.out
    assert "NCCL_DEBUG=WARN" in result.out
    commands = nodes_of(result.out)
    assert len(commands) == 2, result.out
    for rank, line in enumerate(commands):
        rundir = f"~/.sshddp/runs/dry1/n{rank}"
        assert line.startswith(f"  command: /opt/venv/bin/python '{rundir}/agent.py' ")
        assert "--nnodes 2" in line
        assert f"--node-rank {rank}" in line
        assert "--nproc-per-node 2" in line
        assert "--rdzv-backend static --rdzv-endpoint gpu-a:4321 --rdzv-id dry1" in line
        assert line.endswith("train.py --lr 0.1 'two words'")
    assert "run id:      dry1" in result.out
    assert "world size:  4 processes on 2 nodes" in result.out
    assert f"code:        file {script}" in result.out
    assert result.err == ""


def test_dry_run_env_from_the_local_environment_is_masked(inv: Path, script: Path) -> None:
    environ = {"WANDB_API_KEY": "s3cr3t-value"}
    result = sshddp(
        ["launch", "--dry-run", "--env", "WANDB_API_KEY", str(inv), str(script)], environ
    )
    assert result.code == ExitCode.OK, result.explain()
    assert "s3cr3t-value" not in result.text
    assert result.out.count("WANDB_API_KEY=***") == 2


def test_dry_run_module_and_nproc(inv: Path) -> None:
    result = sshddp(
        ["launch", "--dry-run", "--nproc-per-node", "3", "-m", "pkg.train", str(inv), "--x"]
    )
    assert result.code == ExitCode.OK, result.explain()
    commands = nodes_of(result.out)
    assert len(commands) == 2
    assert all(line.endswith(" -m pkg.train --x") for line in commands), commands
    assert all("--nproc-per-node 3" in line for line in commands)
    assert "world size:  6 processes on 2 nodes" in result.out


def test_dry_run_script_options_pass_through(inv: Path, script: Path) -> None:
    """After SCRIPT, even sshddp's own option names belong to the script."""
    result = sshddp(
        ["launch", "--dry-run", str(inv), str(script), "--dry-run", "--env", "X=1", "-h", "--"]
    )
    assert result.code == ExitCode.OK, result.explain()
    for line in nodes_of(result.out):
        assert line.endswith("train.py --dry-run --env X=1 -h --"), line
    assert "X=1" not in result.out.split("command:")[0]


def test_dry_run_is_stable_for_a_named_run(inv: Path, script: Path) -> None:
    args = ["launch", "--dry-run", "--name", "same", str(inv), str(script)]
    assert sshddp(args).out == sshddp(args).out


# ----------------------------------------------------------------- bad command lines


def test_option_after_the_inventory(inv: Path, script: Path) -> None:
    result = sshddp(["launch", str(inv), "--dry-run", str(script)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "options go before the inventory" in result.err
    assert "'--dry-run'" in result.err


def test_launch_without_script(inv: Path) -> None:
    result = sshddp(["launch", str(inv)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "missing SCRIPT" in result.err


def test_launch_dash_m_without_module(inv: Path) -> None:
    result = sshddp(["launch", "--dry-run", str(inv), "-m"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "-m needs a MODULE" in result.err


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "--bogus", "INV", "SCRIPT"],
        ["launch", "--dry-run", "--bogus", "INV", "SCRIPT"],
        ["doctor", "--bogus", "INV"],
        ["--bogus", "doctor", "INV"],
    ],
)
def test_unknown_option(args: list[str], inv: Path, script: Path) -> None:
    args = [str(inv) if a == "INV" else str(script) if a == "SCRIPT" else a for a in args]
    result = sshddp(args)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "No such option" in result.err and "--bogus" in result.err
    assert "not found" not in result.err


def test_unknown_command() -> None:
    result = sshddp(["lanch"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "lanch" in result.err


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--nproc-per-node", "0"], "'--nproc-per-node': 0 is not in the range"),
        (["--nproc-per-node", "two"], "two"),
        (["--port", "70000"], "--port 70000"),
        (["--name", "no spaces"], "--name 'no spaces'"),
        (["--env", "1BAD=x"], "--env '1BAD'"),
        (["--env", "NOT_SET_ANYWHERE"], "NOT_SET_ANYWHERE is not set locally"),
        (["--max-restarts", "-1"], "-1"),
        (["--workdir", "/nonexistent/dir"], "not a local directory"),
    ],
)
def test_bad_launch_values(options: list[str], needle: str, inv: Path, script: Path) -> None:
    result = sshddp(["launch", "--dry-run", *options, str(inv), str(script)], environ={})
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert needle in result.err


def test_script_that_is_a_directory(inv: Path, tmp_path: Path) -> None:
    result = sshddp(["launch", "--dry-run", str(inv), str(tmp_path)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "is a directory" in result.err


def test_missing_inventory_for_launch(tmp_path: Path, script: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = sshddp(["launch", "--dry-run", str(missing), str(script)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{missing}: inventory file not found" in result.err


def test_bad_inventory_for_launch_names_file_and_line(tmp_path: Path, script: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: a\n    gpu: 2\n")
    result = sshddp(["launch", "--dry-run", str(inv), str(script)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{inv}:3:" in result.err
    assert "hosts[0].gpu" in result.err and "did you mean 'gpus'" in result.err


def test_missing_ssh_config(inv: Path) -> None:
    result = sshddp(["doctor", "--ssh-config", "/nonexistent/ssh_config", str(inv)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "/nonexistent/ssh_config" in result.err


def test_traceback_flag_shows_the_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    plain = sshddp(["doctor", str(missing)])
    assert_clean_failure(plain, ExitCode.BAD_INPUT)
    shown = sshddp(["--traceback", "doctor", str(missing)])
    assert shown.code == ExitCode.BAD_INPUT
    assert "Traceback (most recent call last)" in shown.err
    assert "InventoryError" in shown.err


def test_ranks_are_checked_against_the_run_before_anything_starts(inv: Path, script: Path) -> None:
    ok = sshddp(["launch", "--dry-run", "--ranks", "0,3", str(inv), str(script)])
    assert ok.code == ExitCode.OK, ok.explain()
    over = sshddp(["launch", "--dry-run", "--ranks", "0,4-6", str(inv), str(script)])
    assert_clean_failure(over, ExitCode.BAD_INPUT)
    assert "--ranks: run " in over.err and "has ranks 0-3; there is no rank 4" in over.err
    bad = sshddp(["launch", "--ranks", "0,,1", str(inv), str(script)])
    assert_clean_failure(bad, ExitCode.BAD_INPUT)
    assert "--ranks 0,,1: '' is not a rank or a range" in bad.err, bad.explain()


def test_doctor_health_level(inv: Path, tmp_path: Path) -> None:
    """``--health`` takes no value or ``=deep``; a bare one before INVENTORY leaves it the
    inventory (click hands it the next word), so a missing file is named as the inventory."""
    bogus = sshddp(["doctor", "--health=bogus", str(inv)])
    assert_clean_failure(bogus, ExitCode.BAD_INPUT)
    assert "--health=bogus: expected --health or --health=deep" in bogus.err
    missing = tmp_path / "nope.yaml"
    before = sshddp(["doctor", "--health", str(missing)])
    assert_clean_failure(before, ExitCode.BAD_INPUT)
    assert str(missing) in before.err and "--health" not in before.err
