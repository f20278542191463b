"""A launch whose code does not compile ends in the preflight: exit 3 with the file, line
and caret, and nothing started on any host (no run id, no run directory, no process)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import sshddp, write_inventory

from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

BROKEN = "import os\n\n\ndef main(x):\n    return (x,\n\n\nmain(1)\n"


def _workdir(tmp: Path) -> Path:
    """A --workdir whose script is fine, but a module it imports (via a package) is not."""
    tree = tmp / "code"
    (tree / "pkg").mkdir(parents=True)
    (tree / "train.py").write_text("import pkg.model\nprint('never')\n")
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "model.py").write_text("from . import layers\n")
    (tree / "pkg" / "layers.py").write_text("x = 1\nreturn x\n")
    return tree


@pytest.mark.parametrize("case", ["script", "workdir"])
def test_code_that_does_not_compile_starts_nothing(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
    case: str,
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    name = f"syntax-{case}"
    if case == "script":
        (tmp_path / "train.py").write_text(BROKEN)
        args: list[str | Path] = [inv, "train.py"]
        where, line, caret = "train.py:5: SyntaxError:", "    return (x,", "           ^"
    else:
        tree = _workdir(tmp_path)
        args = ["--workdir", tree, inv, tree / "train.py"]
        where = f"{tree / 'pkg' / 'layers.py'}:2: SyntaxError: 'return' outside function"
        line, caret = "    return x", "    ^^^^^^^^"
    proc = sshddp(ssh_env, tmp_path, "launch", "--name", name, *args)
    assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"sshddp: error: {where}"), proc.stderr
    assert lines[1:3] == [line, caret], proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) <= 5, proc.stderr
    assert "sshddp: run " not in proc.stderr  # no banner: the run never had an id
    assert not (workdir / "runs" / name).exists()
    assert not (tmp_path / "sshddp-logs" / name).exists()
    ps = sshddp(ssh_env, tmp_path, "ps", "--all")
    assert name not in ps.stdout + ps.stderr
    run_no_leak(name)
