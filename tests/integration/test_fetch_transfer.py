"""``fetch`` through the host named ``localhost`` (a real process running
remote/calls/host_fetch.py, on this Python and on Python 3.8): a file and a directory arrive whole
and verified; a copy whose bytes were changed or cut on the way never takes its place; paths that
cannot be fetched say why."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

from sshddp.errors import RemoteError, UsageError
from sshddp.hosts import calls
from sshddp.hosts.calls import FetchStream
from sshddp.hosts.local import LocalTransport
from sshddp.model.inventory import Host
from sshddp.model.layout import NodeLayout
from sshddp.run.fetch import TMP_PREFIX, NodeCopy, NoProgress, _receive, check_dest, summary


def node_on(python: str) -> NodeLayout:
    host = Host("localhost", 0, nproc=1, python=python)
    return NodeLayout(host, 0, 1, 0, rundir="", cwd="")


def fetch(python: str, cwd: Path | str, path: str, dest: Path, rundir: str = "") -> NodeCopy:
    node = node_on(python)
    check_dest(dest)
    stream = calls.fetch_path(LocalTransport(node.host), rundir, str(cwd), path)
    try:
        return _receive(node, stream, dest / "node0-localhost", NoProgress())
    finally:
        stream.close()


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    return sys.executable if request.param == "this" else str(oldest_python)


def test_a_file_arrives_byte_identical_and_verified(python: str, tmp_path: Path) -> None:
    data = random.Random(1).randbytes(3 << 20)
    (tmp_path / "space").mkdir()
    (tmp_path / "space" / "ckpt.pt").write_bytes(data)
    copy = fetch(python, tmp_path / "space", "ckpt.pt", tmp_path / "dest")
    local = tmp_path / "dest" / "node0-localhost" / "ckpt.pt"
    assert copy.error is None and copy.target == local and copy.kind == "file"
    assert local.read_bytes() == data and copy.size == len(data)
    assert summary([copy]) == [
        f"node 0 (localhost): file {local} (3.1 MB, sha256 {copy.sha256[:16]}, verified)"
    ]


def test_a_directory_arrives_whole_without_links(python: str, tmp_path: Path) -> None:
    out = tmp_path / "space" / "out"
    (out / "sub" / "deeper").mkdir(parents=True)
    (out / "empty").mkdir()
    (out / "a.bin").write_bytes(os.urandom(70_000))
    (out / "sub" / "b.txt").write_text("b")
    (out / "sub" / "deeper" / "c.txt").write_text("c" * 513)
    (out / "link").symlink_to("/etc/passwd")
    copy = fetch(python, tmp_path / "space", "out", tmp_path / "dest")
    local = tmp_path / "dest" / "node0-localhost" / "out"
    assert copy.error is None and copy.kind == "dir" and copy.target == local
    assert tree(local) == tree(out) and (local / "empty").is_dir()
    assert not (local / "link").exists() and copy.skipped == ("out/link",)
    assert "skipped (links, devices, unreadable): out/link" in summary([copy])[1]
    # a second fetch into the same place replaces the files it brings, keeps the others
    (local / "mine.txt").write_text("local notes")
    (out / "sub" / "b.txt").write_text("b, later")
    fetch(python, tmp_path / "space", "out", tmp_path / "dest")
    assert tree(local) == {**tree(out), "mine.txt": b"local notes"}


class Corrupting(FetchStream):
    """The stream as a broken link would deliver it: one byte flipped, or cut short."""

    def __init__(self, inner: FetchStream, cut: bool) -> None:
        super().__init__(inner.proc, inner.header, b"")
        self.inner, self.cut, self.seen = inner, cut, 0

    def read(self, n: int = 1 << 20) -> bytes:
        data = self.inner.read(n)
        if self.cut and self.seen > 1000:
            while self.inner.read(n):  # the host goes on; its bytes never arrive
                pass
            return b""
        if data and not self.seen and not self.cut:
            data = bytes([data[0] ^ 1]) + data[1:]
        self.seen += len(data)
        return data


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("what", ["ckpt.pt", "out"])
def test_a_copy_that_does_not_match_never_takes_its_place(
    tmp_path: Path, cut: bool, what: str
) -> None:
    space = tmp_path / "space"
    (space / "out").mkdir(parents=True)
    (space / "ckpt.pt").write_bytes(os.urandom(1 << 20))
    (space / "out" / "x.bin").write_bytes(os.urandom(1 << 20))
    node = node_on(sys.executable)
    inner = calls.fetch_path(LocalTransport(node.host), "", str(space), what)
    into = tmp_path / "dest" / "node0-localhost"
    check_dest(into.parent)
    try:
        with pytest.raises(RemoteError, match="does not match what the host sent") as caught:
            _receive(node, Corrupting(inner, cut), into, NoProgress())
    finally:
        inner.close()
    assert f"SHA-256 {caught.value.message.split('SHA-256 ')[-1]}" in caught.value.message
    assert list(into.iterdir()) == []  # nothing half-copied, no temporary left


def test_paths_that_cannot_be_fetched_say_why(tmp_path: Path) -> None:
    space = tmp_path / "space"
    space.mkdir()
    os.mkfifo(space / "pipe")
    for path, why in (("nope.pt", "not found"), ("pipe", "is neither a file nor a directory")):
        with pytest.raises(UsageError) as caught:
            fetch(sys.executable, space, path, tmp_path / "dest")
        assert caught.value.message == f"localhost: {space / path}: {why}"
    assert not any(p.name.startswith(TMP_PREFIX) for p in tmp_path.rglob("*"))


def test_a_relative_path_is_taken_from_the_run_s_spec_when_no_cwd_was_recorded(
    tmp_path: Path,
) -> None:
    rundir = tmp_path / "runs" / "r1" / "n0"
    rundir.mkdir(parents=True)
    (tmp_path / "space").mkdir()
    (tmp_path / "space" / "ckpt.pt").write_bytes(b"weights")
    (rundir / "spec.json").write_text(json.dumps({"cwd": str(tmp_path / "space")}))
    copy = fetch(sys.executable, "", "ckpt.pt", tmp_path / "dest", str(rundir))
    assert copy.target is not None and copy.target.read_bytes() == b"weights"
    with pytest.raises(UsageError, match="the run's working directory is unknown"):
        fetch(sys.executable, "", "ckpt.pt", tmp_path / "dest", str(tmp_path / "gone"))
    absolute = fetch(sys.executable, "", str(tmp_path / "space" / "ckpt.pt"), tmp_path)
    assert absolute.target is not None and absolute.target.read_bytes() == b"weights"


@pytest.mark.parametrize("name", ["..", "../escape", "a/b", ""])
def test_a_name_that_would_leave_dest_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "space").mkdir()
    (tmp_path / "space" / "f").write_bytes(b"x")
    node = node_on(sys.executable)
    stream = calls.fetch_path(LocalTransport(node.host), "", str(tmp_path / "space"), "f")
    stream.header["name"] = name  # what a hostile host could send
    try:
        with pytest.raises(RemoteError, match="refusing the name"):
            _receive(node, stream, tmp_path / "dest" / "node0-localhost", NoProgress())
    finally:
        stream.close()
    assert not (tmp_path / "dest").exists() and not (tmp_path / "escape").exists()


def test_a_name_too_long_for_the_local_file_system_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "space").mkdir()
    name = "n" * 250
    (tmp_path / "space" / name).write_bytes(b"x")
    dest = tmp_path
    while len(str(dest)) < os.pathconf("/", "PC_PATH_MAX") - 300:
        dest /= "d" * 200
    with pytest.raises(UsageError, match="a name in it is too long for the local file system"):
        fetch(sys.executable, tmp_path / "space", name, dest)
    assert os.listdir(dest / "node0-localhost") == []
