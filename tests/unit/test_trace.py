"""The coordinator's trace (-v, SSHDDP_LOG) in-process: the formatter, where the trace goes,
what it refuses, and that it costs no formatting while off. A --dry-run connects to nothing."""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp import trace
from sshddp.errors import ExitCode

INVENTORY = (
    "hosts:\n  - {host: gpu-a, gpus: 2, env: {INV_TOKEN: inv-s3cret}}\n  - {host: gpu-b, gpus: 2}\n"
)
LINE = re.compile(r"^sshddp\[\+\d+\.\d{3}s\] ")
HOST_COMMANDS = ["attach", "doctor", "exec", "fetch", "launch", "logs", "ps", "smoke", "stacks"]


@pytest.fixture
def dry_run(tmp_path: Path) -> list[str]:
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    return ["launch", "--dry-run", "--env", "API_TOKEN=cli-s3cret", str(inv), str(script)]


def env(**extra: str) -> dict[str, str]:
    """The test's environment without a developer's own SSHDDP_LOG, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k != trace.ENV}, **extra}


def traced(text: str) -> list[str]:
    return [line for line in text.splitlines() if LINE.match(line)]


def test_formatter_counts_from_the_start_and_escapes_control_characters() -> None:
    now = [10.0]
    formatter = trace.Formatter(start=9.588, clock=lambda: now[0])
    record = logging.LogRecord("sshddp", logging.INFO, "", 0, "connect %s: %s", ("h2", "ok"), None)
    assert formatter.format(record) == "sshddp[+0.412s] connect h2: ok"
    record.args = ("h2\x1b[2J", "ok\nforged line")
    assert formatter.format(record) == "sshddp[+0.412s] connect h2\\x1b[2J: ok\\x0aforged line"


def test_off_by_default_and_formats_nothing() -> None:
    class Boom:
        def __str__(self) -> str:
            raise AssertionError("formatted while the trace is off")

    assert not trace.on()
    trace.log.info("%s", Boom())  # lazy %-args: never rendered


def test_verbose_traces_to_stderr_and_keeps_secrets_out(dry_run: list[str]) -> None:
    quiet = sshddp(dry_run, env())
    assert quiet.code == ExitCode.OK, quiet.explain()
    assert traced(quiet.err) == []
    loud = sshddp(["launch", "-v", *dry_run[1:]], env())
    assert loud.code == ExitCode.OK, loud.explain()
    lines = traced(loud.err)
    assert lines[0].endswith(f"launch (pid {os.getpid()})"), loud.explain()
    assert any(" plan: node 1 on gpu-b, run dir " in line for line in lines), loud.explain()
    assert re.search(r" exit 0 after \d+\.\d{3} s$", lines[-1]), loud.explain()
    assert "cli-s3cret" not in loud.err and "inv-s3cret" not in loud.err
    assert not trace.on()  # the command's end ends its trace


def test_sshddp_log_file_is_appended_0600_and_stderr_stays_quiet(
    dry_run: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "trace.log"
    for _ in range(2):
        result = sshddp(["launch", "-v", *dry_run[1:]], env(SSHDDP_LOG=str(path)))
        assert result.code == ExitCode.OK, result.explain()
        assert traced(result.err) == []
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert all(LINE.match(line) for line in lines)
    assert sum(" sshddp " in line and "launch (pid" in line for line in lines) == 2
    assert "cli-s3cret" not in path.read_text()


def test_sshddp_log_dash_is_stderr_without_the_flag(dry_run: list[str]) -> None:
    result = sshddp(dry_run, env(SSHDDP_LOG="-"))
    assert result.code == ExitCode.OK, result.explain()
    assert any(" plan: run " in line for line in traced(result.err)), result.explain()


def test_sshddp_log_never_writes_through_a_symlink(dry_run: list[str], tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    link = tmp_path / "trace.log"
    link.symlink_to(target)
    result = sshddp(dry_run, env(SSHDDP_LOG=str(link)))
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"SSHDDP_LOG={link}: is a symbolic link" in result.err, result.explain()
    assert not target.exists()


def test_sshddp_log_of_ours_that_others_can_read_or_a_fifo_is_refused(
    dry_run: list[str], tmp_path: Path
) -> None:
    """An existing file is appended to only if it is private: the trace names hosts and
    addresses. A FIFO is no file (and opening it must not wait for a reader)."""
    shared = tmp_path / "shared.log"
    shared.write_text("")
    shared.chmod(0o644)
    result = sshddp(dry_run, env(SSHDDP_LOG=str(shared)))
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert (
        f"SSHDDP_LOG={shared}: can be read or written by other users (mode 0644)" in result.err
    ), result.explain()
    assert shared.read_text() == "" and stat.S_IMODE(shared.stat().st_mode) == 0o644
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: the open would succeed
    try:
        result = sshddp(dry_run, env(SSHDDP_LOG=str(fifo)))
    finally:
        os.close(reader)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"SSHDDP_LOG={fifo}: is not a regular file" in result.err, result.explain()


def test_sshddp_log_that_cannot_be_opened_is_bad_input(dry_run: list[str], tmp_path: Path) -> None:
    result = sshddp(dry_run, env(SSHDDP_LOG=str(tmp_path / "no" / "dir" / "trace.log")))
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "SSHDDP_LOG=" in result.err and "cannot open it" in result.err, result.explain()


@pytest.mark.parametrize("command", [*HOST_COMMANDS, "stop"])
def test_every_command_that_reaches_hosts_takes_verbose(command: str) -> None:
    result = sshddp([command, "--help"], env())
    assert result.code == ExitCode.OK, result.explain()
    assert "-v, --verbose" in result.out and "trace" in result.out, result.explain()
