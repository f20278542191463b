"""The host-side importer's code cache (remote/importer.py): a shipped module is compiled
once per source and interpreter, then loaded; a cache others could write to, a bad entry,
or PYTHONDONTWRITEBYTECODE never change what runs."""

from __future__ import annotations

import io
import json
import marshal
import os
import sys
from pathlib import Path

import pytest

from sshddp.hosts import shipped
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
