"""The host-side importer (remote/importer.py) in real interpreters: a node starts without the
modules of its rare paths, and shipped code runs on this Python and on 3.8."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_shipped_code_runs_on_this_python_and_on_3_8(
    tmp_path: Path, oldest_python: Path, which: str
) -> None:
    """The follower, shipped as every call ships code, compiled from its source on the
    host, answers the same on this Python and on 3.8; nothing is written to the user's
    cache."""
    python = sys.executable if which == "this" else str(oldest_python)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rundir = tmp_path / "run"
    rundir.mkdir()
    (rundir / "exit.json").write_text(json.dumps({"state": "failed", "reason": "exit 3"}))
    header = shipped.header("host_follow", {"rundir": str(rundir), "offset": 0, "mode": "status"})
    got = subprocess.run(
        [python, "-c", BOOTSTRAP], input=header, capture_output=True, env=env, timeout=60
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stderr)["state"] == "failed"
    assert not (tmp_path / "cache").exists()


#: Standard modules a node's launch session and supervisor use only on rare paths (removing
#: a run, reading a flight recorder dump, copying a workspace file): imported there, not at
#: the start every host of every launch pays for (docs/performance.md).
NOT_AT_START = ("shutil", "pickle", "bz2", "lzma", "tempfile", "importlib.resources")


def test_a_node_starts_without_the_modules_of_its_rare_paths() -> None:
    """The modules a node's session imports before it starts, and its supervisor's, loaded
    through the real bootstrap and importer in a fresh interpreter, as on a host."""
    entries = [f"sshddp.remote.node.{m}" for m in ("host_session", "host_boot", "host_follow")]
    entries.append("sshddp.remote.node.supervisor")
    modules = {m: shipped.source(m) for e in entries for m in shipped.closure(e)}
    modules["loaded"] = (
        "import importlib, json, sys\n"
        "def main(args):\n"
        "    for name in args:\n"
        "        importlib.import_module(name)\n"
        "    print(json.dumps(sorted(sys.modules)))\n"
    )
    head = {"importer": shipped.source(shipped.IMPORTER), "modules": modules}
    line = json.dumps({**head, "main": "loaded", "args": entries}).encode() + b"\n"
    got = subprocess.run([sys.executable, "-c", BOOTSTRAP], input=line, capture_output=True)
    assert got.returncode == 0, got.stderr
    loaded = set(json.loads(got.stdout))
    assert set(entries) <= loaded
    assert not loaded & set(NOT_AT_START)
