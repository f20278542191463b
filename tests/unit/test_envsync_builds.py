"""``remote/calls/envsync.py``'s leftover builds on a workdir that several machines may share."""

from __future__ import annotations

from pathlib import Path

from sshddp.remote.calls import envsync

GONE = 2**22 + 7  # above Linux's largest pid: no process has it


def test_only_this_machines_interrupted_builds_are_removed(tmp_path: Path) -> None:
    here = envsync._machine()
    other = "0" * 8 if here != "0" * 8 else "1" * 8
    mine = tmp_path / f".build-abc-{GONE}-{here}-x1"
    theirs = tmp_path / f".build-abc-{GONE}-{other}-x2"  # its pid means nothing here
    unnamed = tmp_path / f".build-abc-{GONE}-x3"  # named before machines were: this one's
    env = tmp_path / "abc"
    for path in (mine, theirs, unnamed, env):
        path.mkdir()
    envsync._prune_builds(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([theirs.name, env.name])
