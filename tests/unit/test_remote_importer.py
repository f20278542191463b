"""The host-side importer's code cache (remote/importer.py): a shipped module is compiled
once per source and interpreter, then loaded; a cache others could write to, a bad entry,
or PYTHONDONTWRITEBYTECODE never change what runs."""

from __future__ import annotations

import io
import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP
from sshddp.remote import importer

SOURCE = "VALUE = 'compiled'\n"


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.endswith(".tmp"))


def test_a_module_is_compiled_once_then_loaded_from_the_cache(tmp_path: Path) -> None:
    cache = str(tmp_path)
    first = importer.code_of("m", SOURCE, cache)
    (entry,) = entries(tmp_path)
    assert entry.stat().st_mode & 0o777 == 0o600
    # What the entry holds is what runs: put other code there and it is that code that runs.
    other = compile("VALUE = 'from the cache'\n", importer.filename("m"), "exec")
    entry.write_bytes(marshal.dumps(other))
    namespace: dict[str, object] = {}
    exec(importer.code_of("m", SOURCE, cache), namespace)
    assert namespace["VALUE"] == "from the cache"
    exec(first, namespace)
    assert namespace["VALUE"] == "compiled"


def test_another_source_or_name_gets_its_own_entry(tmp_path: Path) -> None:
    for name, source in (("m", SOURCE), ("m", SOURCE + "X = 1\n"), ("n", SOURCE)):
        importer.code_of(name, source, str(tmp_path))
    assert len(entries(tmp_path)) == 3


def test_a_bad_entry_is_compiled_again_and_replaced(tmp_path: Path) -> None:
    importer.code_of("m", SOURCE, str(tmp_path))
    (entry,) = entries(tmp_path)
    for bad in (b"", b"\x00garbage", marshal.dumps(compile("x=1", "<elsewhere>", "exec"))):
        entry.write_bytes(bad)
        namespace: dict[str, object] = {}
        exec(importer.code_of("m", SOURCE, str(tmp_path)), namespace)
        assert namespace["VALUE"] == "compiled"
        assert marshal.loads(entry.read_bytes()).co_filename == importer.filename("m")


def test_the_cache_is_pruned_to_its_newest_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importer, "CACHE_KEEP", 10)
    for i in range(11):
        before = set(entries(tmp_path))
        importer.code_of(f"m{i}", SOURCE, str(tmp_path))
        (new,) = set(entries(tmp_path)) - before or {None}
        if new is not None:  # the 11th was pruned right away (it is not among the oldest)
            os.utime(new, (1000 + i, 1000 + i))
    kept = entries(tmp_path)
    assert len(kept) == 6  # 11 > 10: the 5 oldest went
    assert sorted(p.stat().st_mtime for p in kept)[0] >= 1005


def test_the_cache_is_used_only_where_it_is_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # this machine sets it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made = importer.cache_dir()
    assert made == str(tmp_path / "sshddp" / "code")
    assert os.stat(made).st_mode & 0o777 == 0o700
    os.chmod(made, 0o777)  # another user could plant code there
    assert importer.cache_dir() is None
    os.chmod(made, 0o700)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE
    assert importer.cache_dir() is None
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "linked").mkdir()
    os.symlink(target, tmp_path / "linked" / "sshddp")
    (target / "code").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "linked"))
    assert importer.cache_dir() == str(tmp_path / "linked" / "sshddp" / "code")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert importer.cache_dir() is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "linked"))
    os.rename(target / "code", target / "real")
    os.symlink(target / "real", target / "code")
    assert importer.cache_dir() is None  # the code directory itself a link: not used


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


def test_the_modules_follow_the_header_line_packed() -> None:
    """The header line names the size of what follows it: every module of the call's
    closure, as zlib-compressed JSON, a third of the sources' size or less."""
    sent = shipped.header("session", {"probe": None})
    line, _, rest = sent.partition(b"\n")
    head = json.loads(line)
    assert "modules" not in head and head["packed"] == len(rest)
    modules = importer.unpack(io.BytesIO(rest), head["packed"])
    closure = shipped.closure("sshddp.remote.session")
    assert modules == {m: shipped.source(m) for m in closure}
    assert len(rest) * 3 < sum(len(s) for s in modules.values())


def test_packed_modules_cut_short_are_refused() -> None:
    rest = shipped.header("follow", {}).partition(b"\n")[2]
    with pytest.raises(RuntimeError, match=f"cut short: {len(rest) - 1} of {len(rest)} bytes"):
        importer.unpack(io.BytesIO(rest[:-1]), len(rest))


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
