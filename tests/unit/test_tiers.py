"""The unit tier's guard (tests/no_process.py) fails a test that starts a process, and only
such a test."""

from __future__ import annotations

import pytest

from no_process import MOVE_IT

pytest_plugins = ["pytester"]

TESTS = """
import multiprocessing, os, pty, subprocess

def test_subprocess():
    subprocess.run(["true"])

def test_fork():
    os.fork()

def test_pty():
    pty.fork()

def test_system():
    os.system("true")

def test_spawn():
    multiprocessing.get_context("spawn").Process(target=print).start()

def test_forkserver():
    multiprocessing.get_context("forkserver").Process(target=print).start()

def test_swallowed():
    try:
        subprocess.run(["true"])
    except BaseException:
        pass

def test_pickled_by_reference():
    import os, pickle
    assert pickle.loads(pickle.dumps(os.system)) is os.system

def test_pure():
    import json, sshddp.cli.app  # importing modules starts nothing
    assert json.loads("1") == 1
"""


def test_a_unit_test_that_starts_a_process_fails_and_says_where_it_belongs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest("from no_process import _no_process, pytest_runtest_makereport")
    pytester.makepyfile(test_guarded=TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    outcomes = {r.nodeid.split("::")[1]: (r.when, r.outcome) for r in _failures(result)}
    assert outcomes == {
        **{name: ("call", "failed") for name in ("test_subprocess", "test_fork", "test_pty")},
        **{name: ("call", "failed") for name in ("test_system", "test_spawn", "test_forkserver")},
        "test_swallowed": ("teardown", "failed"),
    }
    assert result.stdout.str().count(MOVE_IT) >= len(outcomes)
    result.assert_outcomes(passed=3, failed=6, errors=1)


def _failures(result: pytest.RunResult) -> list[pytest.TestReport]:
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    return [r for r in reports if r.failed]
