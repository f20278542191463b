"""The working directory that outlives a run (remote/node/workspace.py), filled by Python 3.8."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workspace_trees import code_dir, tree

SRC = Path(__file__).resolve().parents[2] / "src"


def test_fill_runs_on_the_oldest_python(tmp_path: Path, oldest_python: Path) -> None:
    code = code_dir(tmp_path, {"train.py": b"v2", "a/b/c.txt": b"deep"})
    (code / "helper.py").symlink_to("train.py")
    space = tmp_path / "space"
    space.mkdir()
    (space / "train.py").write_bytes(b"v1")
    (space / "out.log").write_bytes(b"kept")
    program = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from sshddp.remote.node.workspace import fill; fill(sys.argv[2], sys.argv[3])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    subprocess.run(
        [str(oldest_python), "-S", "-c", program, str(SRC), str(code), str(space)],
        check=True,
        env=env,
        timeout=60,
    )
    assert tree(space) == {
        "a/b/c.txt": b"deep",
        "helper.py": b"v2",
        "out.log": b"kept",
        "train.py": b"v2",
    }
    assert os.readlink(space / "helper.py") == "train.py"
