"""The host side of ``doctor --health`` (remote/calls/host_health.py) running commands:
the user's ``health:`` command with the ranks' environment, its bounded output, and its
timeout (its whole process group killed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sshddp.remote.calls import host_health


def run(command: str, timeout: float = 5.0, keep: int = 4096) -> dict[str, object]:
    looks = host_health.start(
        {"command": command, "timeout": timeout, "keep": keep}, dict(os.environ, CHECK="x")
    )
    facts = host_health.finish(looks)
    assert facts is not None
    result = facts["command"]
    assert isinstance(result, dict)
    return result


def test_a_failing_command_with_the_ranks_environment() -> None:
    result = run('echo "checked $CHECK"; echo broken >&2; exit 3')
    assert result == {"exit": 3, "timed_out": False, "output": "checked x\nbroken\n"}
    assert run("true") == {"exit": 0, "timed_out": False, "output": ""}


def test_only_the_last_bytes_are_kept() -> None:
    result = run("seq 1 100000", keep=12)
    assert result["output"] == "99999\n100000\n"[-12:]


def test_past_the_timeout_the_whole_group_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    result = run(f"sleep 60 & echo $! > {pidfile}; echo waiting; wait", timeout=0.5)
    assert result == {"exit": None, "timed_out": True, "output": "waiting\n"}
    assert time.monotonic() - started < 5
    _gone(int(pidfile.read_text()))


def _gone(pid: int) -> None:
    """``pid`` ends within 2.5 s (killed with its group; reaped by init meanwhile)."""
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the command's child {pid} outlived its health check")


def test_no_command_and_nothing_asked() -> None:
    assert host_health.start(None, {}) is None
    assert host_health.finish(None) is None
    facts = host_health.finish(host_health.start({"timeout": 1}, dict(os.environ)))
    assert facts is not None and facts["command"] is None


def test_what_a_passing_command_leaves_running_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    result = run(f"sleep 60 & echo $! > {pidfile}; echo done")
    assert result == {"exit": 0, "timed_out": False, "output": "done\n"}
    assert time.monotonic() - started < 5
    _gone(int(pidfile.read_text()))
