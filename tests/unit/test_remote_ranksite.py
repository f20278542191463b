"""The ranks' sitecustomize (remote/ranksite.py), run here as a node's Python processes run
it, on this Python and on Python 3.8: output line-buffered in every process that has it on
PYTHONPATH, and the sitecustomize it shadows still runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshddp.hosts import shipped

PROBE = "import sys, sitecustomize; print(sys.stdout.line_buffering, sys.stderr.line_buffering)"


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    return sys.executable if request.param == "this" else str(oldest_python)


def site_dirs(tmp_path: Path, other: str | None) -> str:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(shipped.source("sshddp.remote.ranksite"))
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
