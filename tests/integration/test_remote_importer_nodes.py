"""The host-side importer (remote/importer.py) in real interpreters: a node starts without the
modules of its rare paths, and shipped code runs the same from an empty and a full cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.endswith(".tmp"))


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_shipped_code_runs_the_same_from_an_empty_and_a_full_cache(
    tmp_path: Path, oldest_python: Path, which: str
) -> None:
    """The follower, shipped as every call ships code, on this Python and on 3.8: the first
    call fills the cache (each shipped module and its parent packages), the second loads
    it and answers the same."""
    python = sys.executable if which == "this" else str(oldest_python)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rundir = tmp_path / "run"
    rundir.mkdir()
    (rundir / "exit.json").write_text(json.dumps({"state": "failed", "reason": "exit 3"}))
    header = shipped.header("follow", {"rundir": str(rundir), "offset": 0, "mode": "status"})
    code = tmp_path / "cache" / "sshddp" / "code"
    answers, counts = [], []
    for _ in range(2):
        got = subprocess.run(
            [python, "-c", BOOTSTRAP], input=header, capture_output=True, env=env, timeout=60
        )
        assert got.returncode == 0, got.stderr
        answers.append(json.loads(got.stderr))
        counts.append(len(entries(code)))
    assert answers[0] == answers[1] and answers[0]["state"] == "failed"
    assert counts == [len(shipped.closure("sshddp.remote.follow")) + 1] * 2  # and "sshddp"


#: Standard modules a node's launch session and supervisor use only on rare paths (removing
#: a run, reading a flight recorder dump, copying a workspace file): imported there, not at
#: the start every host of every launch pays for (docs/performance.md).
NOT_AT_START = ("shutil", "pickle", "bz2", "lzma", "tempfile", "importlib.resources")


def test_a_node_starts_without_the_modules_of_its_rare_paths() -> None:
    """The modules a node's session imports before it starts, and its supervisor's, loaded
    through the real bootstrap and importer in a fresh interpreter, as on a host."""
    entries = [f"sshddp.remote.{m}" for m in ("session", "boot", "follow", "prewarm")]
    entries.append("sshddp.remote.supervisor")
    modules = {m: shipped.source(m) for e in entries for m in shipped.closure(e)}
    modules["loaded"] = (
        "import importlib, json, sys\n"
        "def main(args):\n"
        "    for name in args:\n"
        "        importlib.import_module(name)\n"
        "    from sshddp.remote.prewarm import take_slot\n"
        "    slot = take_slot()  # a torchrun node's session takes one before its probe\n"
        "    if slot is not None:\n"
        "        import os\n"
        "        os.close(slot)\n"
        "    print(json.dumps(sorted(sys.modules)))\n"
    )
    head = {"importer": shipped.source(shipped.IMPORTER), "modules": modules}
    line = json.dumps({**head, "main": "loaded", "args": entries}).encode() + b"\n"
    got = subprocess.run([sys.executable, "-c", BOOTSTRAP], input=line, capture_output=True)
    assert got.returncode == 0, got.stderr
    loaded = set(json.loads(got.stdout))
    assert set(entries) <= loaded
    assert not loaded & set(NOT_AT_START)
