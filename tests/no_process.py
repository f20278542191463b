"""The unit tier's guard: a unit test starts no process.

tests/unit is pure code (STYLE.md, "Three test tiers"): a test that runs a real program, a
host script under another interpreter or a second Python belongs in tests/integration, where
the suite's slow half lives. Every way this Python starts a process ends in one of the
functions patched here, so a test that starts one fails, naming the call, even when the code
under test catches the error. tests/unit/conftest.py installs it.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Generator, Iterator
from typing import Any, Callable

import pytest

MOVE_IT = "unit tests start no process: move this test to tests/integration"

# os.spawn*, os.popen, pty.fork and multiprocessing's fork start method end in os's; subprocess
# (and asyncio's subprocesses) in Popen._execute_child; multiprocessing's spawn and
# forkserver in _posixsubprocess.fork_exec.
_STARTERS = (
    *((os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
    *((os, name) for name in ("execv", "execve", "execvp", "execvpe", "execl", "execle")),
    *((os, name) for name in ("execlp", "execlpe")),
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
)

_REPORTED = pytest.StashKey[bool]()


class ProcessStartInUnitTest(BaseException):
    """A BaseException, so that code under test catching OSError or Exception (as code that
    starts processes does) does not swallow it."""


def _refuse(where: Any, name: str, starts: list[str]) -> Callable[..., Any]:
    label = f"{where.__name__}.{name}"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        starts.append(label)
        raise ProcessStartInUnitTest(f"{MOVE_IT} (it called {label})")

    # Pickled by reference as where.name, as the real one is (a test may pickle os.system).
    refuse.__module__, refuse.__qualname__, refuse.__name__ = where.__name__, name, name
    return refuse


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.excinfo is not None and call.excinfo.errisinstance(ProcessStartInUnitTest):
        item.stash[_REPORTED] = True
    return report


@pytest.fixture(autouse=True)
def _no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    starts: list[str] = []
    for where, name in _STARTERS:
        if hasattr(where, name):
            monkeypatch.setattr(where, name, _refuse(where, name, starts))
    yield
    # A refusal the code under test swallowed: the test may even have passed.
    if starts and not request.node.stash.get(_REPORTED, False):
        pytest.fail(f"{MOVE_IT} (it called {', '.join(starts)})", pytrace=False)
