"""Staging a node's code (remote/node/host_boot.py), run here: archives that could write outside the
run directory, or are damaged, are refused and leave nothing behind."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from sshddp.remote.node import host_boot


def archive(*members: tuple[str, bytes | None, bytes]) -> bytes:
    """A gzip tar of (name, file bytes or None for a symlink, link target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, target in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, target.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def stage(tmp_path: Path, data: bytes) -> dict[str, Any]:
    args = {
        "rundir": str(tmp_path / "runs" / "r1" / "n0"),
        "spec": {"run_id": "r1", "node_rank": 0, "cwd": None},
        "env": {},
        "payload": {
            "kind": "tar",
            "name": "train.py",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        },
        "rank": "# rank shim\n",
        "agent": "# agent shim\n",
        "site": "# the ranks' sitecustomize\n",
        "wire": "# the standby wire's module\n",
        "remote_script": None,
    }
    answer: dict[str, Any] = host_boot.stage(args, io.BytesIO(data))
    return answer


def test_a_plain_archive_is_unpacked(tmp_path: Path) -> None:
    answer = stage(tmp_path, archive(("train.py", b"print(1)\n", b""), ("pkg/m.py", b"x", b"")))
    assert answer["ok"], answer
    code = tmp_path / "runs" / "r1" / "n0" / "code"
    assert (code / "train.py").read_bytes() == b"print(1)\n"
    assert (code / "pkg" / "m.py").read_bytes() == b"x"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../escape.py", b"x", b""), "refusing archive member '../escape.py'"),
        (("/abs.py", b"x", b""), "refusing archive member '/abs.py'"),
        (("link", None, b"/etc/passwd"), "refusing archive member 'link'"),
        (("link", None, b"../../../../x"), "refusing archive member 'link'"),
        (("pkg/link", None, b"../.."), "refusing archive member 'pkg/link'"),
    ],
)
def test_members_that_reach_outside_are_refused(
    tmp_path: Path, member: tuple[str, bytes | None, bytes], why: str
) -> None:
    answer = stage(tmp_path, archive(("train.py", b"ok", b""), ("pkg/m.py", b"x", b""), member))
    assert not answer["ok"] and answer["error"].startswith(why), answer
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*"))
    assert not (tmp_path / "escape.py").exists()


def test_links_that_stay_inside_are_made_again_and_nothing_goes_through_one(
    tmp_path: Path,
) -> None:
    inside = archive(
        ("real.py", b"X = 1\n", b""),
        ("pkg/m.py", b"x", b""),
        ("helper.py", None, b"real.py"),
        ("pkg/up.py", None, b"../real.py"),
        ("alias", None, b"pkg"),
    )
    answer = stage(tmp_path / "a", inside)
    assert answer["ok"], answer
    code = tmp_path / "a" / "runs" / "r1" / "n0" / "code"
    assert (code / "helper.py").is_symlink() and (code / "helper.py").read_bytes() == b"X = 1\n"
    assert str((code / "pkg" / "up.py").readlink()) == "../real.py"
    assert (code / "alias" / "m.py").read_bytes() == b"x"
    through = archive(("pkg/m.py", b"x", b""), ("alias", None, b"pkg"), ("alias/new.py", b"y", b""))
    answer = stage(tmp_path / "b", through)
    assert answer["error"] == "refusing archive member 'alias/new.py'", answer


def test_a_damaged_archive_is_refused(tmp_path: Path) -> None:
    data = archive(("train.py", b"print(1)\n" * 1000, b""))
    damaged = data[:40] + bytes(len(data) - 40)
    answer = stage(tmp_path, damaged)
    assert not answer["ok"] and "the shipped archive is damaged" in answer["error"], answer
    assert not (tmp_path / "runs" / "r1").exists()


def test_the_files_after_the_go_are_unpacked_into_the_args() -> None:
    """A launch sends the supervisor, rank shim, agent shim and sitecustomize packed after
    the go line; args that carry them inline are taken as they are."""
    files = {"supervisor": "S", "rank": "R", "agent": "A", "site": "T", "wire": "W"}
    packed = zlib.compress(json.dumps(files).encode())
    stream = io.BytesIO(packed + b"CODE")
    args = host_boot.unpack_files({"rundir": "r", "packed": len(packed)}, stream)
    assert args == {"rundir": "r", "packed": len(packed), **files}
    assert stream.read() == b"CODE"  # the code that follows is left for stage()
    inline = {"rundir": "r", **files}
    assert host_boot.unpack_files(inline, io.BytesIO(b"CODE")) == inline
    with pytest.raises(host_boot.BootError, match="cut short"):
        host_boot.unpack_files({"packed": len(packed)}, io.BytesIO(packed[:10]))


def test_retention_removes_a_run_whose_sessions_died_before_it_started(tmp_path: Path) -> None:
    """A node whose launch session died before its supervisor started (its staging lock
    free, no state or exit record) is removed by the next launch's retention; one whose
    session still stages (lock held), or that started, or an older sshddp's (no lock file),
    or one made less than a minute ago (its staging lock may not be taken yet) stays."""
    import fcntl
    import os

    runs = tmp_path / "runs"
    old = 1_000_000.0

    def node(run: str, *files: str, mtime: float = old) -> Path:
        path = runs / run / "n0"
        path.mkdir(parents=True)
        for name in files:
            (path / name).write_text("{}")
        os.utime(path, (mtime, mtime))
        return path

    node("died", "staging.lock")
    staging = node("staging", "staging.lock")
    node("started", "staging.lock", "state.json")
    node("older-sshddp")
    node("just-made", "staging.lock", mtime=os.path.getmtime(tmp_path))
    held = os.open(staging / "staging.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        host_boot._prune(str(runs), keep=10)
    finally:
        os.close(held)
    assert sorted(p.name for p in runs.iterdir()) == [
        "just-made",
        "older-sshddp",
        "staging",
        "started",
    ]
    host_boot._prune(str(runs), keep=10)  # its session has gone since
    assert not (runs / "staging").exists()


def test_staging_holds_its_lock_until_the_session_ends(tmp_path: Path) -> None:
    import fcntl
    import os

    rundir = tmp_path / "runs" / "r" / "n0"
    rundir.mkdir(parents=True)
    host_boot._hold_staging(str(rundir))
    probe = os.open(rundir / "staging.lock", os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
        os.close(host_boot._STAGING.pop())
