"""The probe's new looks, in-process: name resolution, a picked port pair that stays held,
and the lookups that the standard library answers."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from port_binds import bound
from sshddp.remote.calls import network, probe
from sshddp.remote.common import temp_dir, which


def test_an_unresolvable_name_is_an_error() -> None:
    found = network.facts("no-such-host.invalid")
    assert found["target"] is None and "cannot resolve no-such-host.invalid" in found["error"]


def test_a_picked_pair_stays_held_and_a_second_pick_moves_on(free_port: Any) -> None:
    first = free_port()
    holds = probe.Holds()
    picked = probe._pick_pair(first, holds)
    assert picked == {"port": first, "free": True, "error": None, "peer_free": True, "auto": first}
    try:
        # P answers connects (the rendezvous check); P+1 refuses them and any bind.
        socket.create_connection(("127.0.0.1", first), timeout=5).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", first + 1), timeout=5)
        assert not bound(first + 1, reuse=True) and not bound(first + 1, reuse=False)
        other = probe.Holds()
        again = probe._pick_pair(first, other)
        assert again["port"] is not None and again["port"] >= first + 2, again
        other.release_all()
        holds.release_listeners()
        assert bound(first, reuse=True) and not bound(first + 1, reuse=True)
    finally:
        holds.release_all()
    assert bound(first + 1, reuse=False)


def test_a_pair_let_go_for_its_run_stays_claimed_until_the_pick_s_session_ends(
    free_port: Any,
) -> None:
    """From the go (P let go for torchrun) and the start (P+1 for the supervisor) until they
    bind them, both ports are free; a second launch picking then must not take them. Seen
    in CI: two launches at one instant on one first host picked the same pair."""
    first = free_port()
    holds = probe.Holds()
    assert probe._pick_pair(first, holds)["port"] == first
    holds.release_all()  # the go and the start: both ports free, no one bound them yet
    assert bound(first, reuse=False) and bound(first + 1, reuse=False)
    other = probe.Holds()
    again = probe._pick_pair(first, other)
    assert again["port"] is not None and again["port"] >= first + 2, again
    other.release_all()
    for fd in holds.claims + other.claims:  # the sessions end
        os.close(fd)
    last = probe.Holds()
    try:
        assert probe._pick_pair(first, last)["port"] == first
    finally:
        last.release_all()
        for fd in last.claims:
            os.close(fd)


def test_which_finds_what_shutil_which_finds(tmp_path: Path, monkeypatch: Any) -> None:
    """The probe's own PATH lookup (shutil stays unimported on a host) against the standard
    library's, for a program on PATH, one shadowed by a directory or a file without the
    execute bit, and one nowhere."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
    for folder, name, mode in [
        (first, "tool", 0o644),
        (second, "tool", 0o755),
        (second, "x", 0o755),
    ]:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(mode)
    (first / "x").mkdir()  # a directory named like the program, first on PATH
    monkeypatch.setenv("PATH", f"{first}{os.pathsep}{second}")
    for name in ("tool", "x", "nowhere"):
        assert which(name) == shutil.which(name), name
    assert which("tool") == str(second / "tool")


def test_free_space_is_what_the_standard_library_reports(tmp_path: Path) -> None:
    facts = probe._disk(str(tmp_path / "not" / "made"))  # the nearest folder that exists
    assert facts["path"] == str(tmp_path)
    assert abs(facts["free_bytes"] - shutil.disk_usage(tmp_path).free) < 64 << 20


@pytest.mark.parametrize("tmpdir", ["set", "missing", "unset"])
def test_temp_dir_is_the_one_tempfile_picks(tmp_path: Path, monkeypatch: Any, tmpdir: str) -> None:
    """Where the sessions of a machine put their lock files (tempfile stays unimported)."""
    import tempfile

    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    if tmpdir != "unset":
        monkeypatch.setenv("TMPDIR", str(tmp_path if tmpdir == "set" else tmp_path / "gone"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # its cached pick
    assert temp_dir() == tempfile.gettempdir()
