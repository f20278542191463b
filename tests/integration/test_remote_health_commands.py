"""The host side of ``doctor --health`` (remote/calls/host_health.py) running commands:
the user's ``health:`` command with the ranks' environment, its bounded output, and its
timeout (its whole process group killed); a launch's GPU subset, with an ``nvidia-smi``
that answers as a recorded one did."""

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


DATA = Path(__file__).parent.parent / "unit" / "data" / "health"  #: recorded answers


def _recorded_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str) -> Path:
    """An ``nvidia-smi`` first on PATH that answers ``-q`` with a recorded answer and leaves
    a mark that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "smi-ran"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ntouch {mark}\ncat {DATA / answer}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return mark


def test_a_launch_s_subset_asks_nothing_of_a_host_without_nvidia_s_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = _recorded_smi(tmp_path, monkeypatch, "smi-q-a100-broken.txt")
    monkeypatch.setattr(host_health, "NVIDIA_GPUS", str(tmp_path / "no-driver"))
    looks = host_health.start({"hardware": "gpus", "command": None}, {})
    assert host_health.finish(looks) == {"command": None}
    assert not mark.exists()  # a CPU host pays one failed listdir, not an nvidia-smi


def test_a_launch_s_subset_reads_the_gpus_where_the_driver_knows_some(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPUs' nvidia-smi -q and the driver's count, and nothing of doctor --health's
    slower looks (the kernel log, the ports)."""
    _recorded_smi(tmp_path, monkeypatch, "smi-q-a100-broken.txt")
    driver = tmp_path / "gpus"
    for bus in ("0000:07:00.0", "0000:0f:00.0"):
        (driver / bus).mkdir(parents=True)
    monkeypatch.setattr(host_health, "NVIDIA_GPUS", str(driver))
    facts = host_health.finish(host_health.start({"hardware": "gpus", "command": "true"}, {}))
    assert facts is not None and set(facts) == {"command", "smi", "gpu_dev_count"}
    assert facts["gpu_dev_count"] == 2 and facts["command"]["exit"] == 0
    assert facts["smi"]["output"] == (DATA / "smi-q-a100-broken.txt").read_text()
