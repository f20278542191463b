"""The ranks' sitecustomize (remote/rankside/ranksite.py), run here as a node's Python processes run
it, on this Python and on Python 3.8: output line-buffered in every process that has it on
PYTHONPATH, the sitecustomize it shadows still runs, and in a run directory every process
dumps its stacks on the dump signal into its own file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.protocol import contract

PROBE = "import sys, sitecustomize; print(sys.stdout.line_buffering, sys.stderr.line_buffering)"


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    return sys.executable if request.param == "this" else str(oldest_python)


def site_dirs(tmp_path: Path, other: str | None) -> str:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(shipped.source("sshddp.remote.rankside.ranksite"))
    paths = [str(site)]
    if other is not None:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "sitecustomize.py").write_text(other)
        paths.append(str(theirs))
    return os.pathsep.join(paths)


def run(python: str, pythonpath: str, code: str = PROBE) -> str:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    env.pop("PYTHONUNBUFFERED", None)
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_output_is_line_buffered_though_it_is_a_pipe(tmp_path: Path, python: str) -> None:
    assert run(python, site_dirs(tmp_path, None)) == "True True\n"
    plain = "import sys; print(sys.stdout.line_buffering)"
    assert run(python, "", plain) == "False\n"  # a pipe without it: block-buffered


def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path, python: str) -> None:
    theirs = "import builtins\nbuiltins.THEIRS = 'ran'\n"
    out = run(python, site_dirs(tmp_path, theirs), PROBE + "; print(THEIRS)")
    assert out == "True True\nran\n"


FORKS = """
import os, signal, sys, time

def parent_waits():
    while True:
        time.sleep(3600)

def child_waits():
    while True:
        time.sleep(3600)

child = os.fork()
if child == 0:
    child_waits()
print(os.getpid(), child, flush=True)
parent_waits()
"""


def start_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_every_process_dumps_its_own_stacks_a_forked_child_too(tmp_path: Path, python: str) -> None:
    """In a run directory, each process writes its stacks to stacks/<pid>-<start time> on
    SIGRTMIN+6; a child forked from Python opens its own file."""
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    (rundir / "spec.json").write_text("{}")
    site = Path(site_dirs(rundir, None))
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.Popen([python, "-c", FORKS], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        parent, child = (int(x) for x in proc.stdout.readline().split())
        signum = int(signal.SIGRTMIN) + contract.STACKS_SIGNAL_OFFSET
        files = {pid: rundir / "stacks" / f"{pid}-{start_of(pid)}" for pid in (parent, child)}
        for pid, needle in ((parent, "in parent_waits"), (child, "in child_waits")):
            deadline = time.monotonic() + 30
            while needle not in (files[pid].read_text() if files[pid].exists() else ""):
                assert time.monotonic() < deadline, f"no dump of {pid} in {files[pid]}"
                os.kill(pid, signum)  # again: the child may not have reached child_waits
                time.sleep(0.2)
        assert "child_waits" not in files[parent].read_text()
        assert "parent_waits" not in files[child].read_text()
        assert proc.poll() is None  # the dumps ended nobody
    finally:
        proc.kill()
        proc.wait()
        os.kill(child, signal.SIGKILL)


def test_outside_a_run_directory_no_handler_is_registered(tmp_path: Path, python: str) -> None:
    code = "import signal; print(signal.getsignal(signal.SIGRTMIN + 6) == signal.SIG_DFL)"
    assert run(python, site_dirs(tmp_path, None), code) == "True\n"
    assert not (tmp_path / "stacks").exists()


def test_a_dump_asked_for_once_the_handler_is_gone_ends_nobody(tmp_path: Path, python: str) -> None:
    """faulthandler lets go of the dump signal at the interpreter's end; a dump asked for
    then (the node's sampler asks every second) is dropped instead of ending the rank."""
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    (rundir / "spec.json").write_text("{}")
    code = (
        "import faulthandler, os, signal, time; s = signal.SIGRTMIN + 6; "
        "faulthandler.unregister(s); os.kill(os.getpid(), s); time.sleep(0.2); print('alive')"
    )
    env = {**os.environ, "PYTHONPATH": site_dirs(rundir, None)}
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "alive\n"), done
