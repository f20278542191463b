"""run.registry under real processes: of many creates at once exactly one wins, and a launch
that died before starting is dropped."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry_records import record
from sshddp.errors import UsageError
from sshddp.run import registry
from sshddp.run.registry import Launcher


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSHDDP_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _create(run_id: str, state: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.environ["SSHDDP_STATE_DIR"] = state
    try:
        registry.create(record(run_id))
        out.put("created")
    except UsageError:
        out.put("refused")


def test_of_many_creates_at_once_exactly_one_wins(state: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_create, args=("twin", str(state), out)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    answers = sorted(out.get(timeout=5) for _ in procs)
    assert answers == ["created"] + ["refused"] * 7
    assert registry.load("twin").run_id == "twin"
    assert [p.name for p in (state / "runs").iterdir() if p.name.endswith(".tmp")] == []


def test_a_launch_that_died_before_starting_is_dropped(state: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    registry.create(record("gone", Launcher(int(dead.stdout), None)))
    registry.create(record("live", Launcher.me()))
    assert registry.drop_if_abandoned("gone") and not registry.exists("gone")
    assert not registry.drop_if_abandoned("live") and registry.exists("live")
    assert not Launcher(os.getpid(), 12345).alive()  # same pid, another start time
