"""The host side of the code's hand-off (``remote/node/host_handoff.py``), over real sockets
on loopback: a copy is kept only whole and with the coordinator's SHA-256; a stranger gets
nothing; a source that dies or lies costs the receiver its copy, never a partial one."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from sshddp.remote.node import host_handoff, host_share, wire

KEY = os.urandom(32)
RUN = "r1"
DATA = os.urandom(3 * host_share.CHUNK + 123)
SHA = hashlib.sha256(DATA).hexdigest()


def what(workdir: Path, data: bytes = DATA) -> dict[str, Any]:
    return {"workdir": str(workdir), "sha256": SHA, "size": len(data)}


def leftovers(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / host_handoff.FOLDER).iterdir())


def test_a_copy_from_stdin_is_kept_once_whole_and_found_by_the_next_launch(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    assert host_handoff.answer("payload-have", what(work), io.BytesIO()) == {"have": False}
    rest = b"the next order"
    took = host_handoff.answer("payload-take", what(work), io.BytesIO(DATA + rest))
    assert took == {"ok": True}
    assert leftovers(work) == [SHA]
    assert host_handoff.answer("payload-have", what(work), io.BytesIO()) == {"have": True}


def test_a_copy_cut_short_or_changed_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    work = tmp_path / "w"
    short = host_handoff.answer("payload-take", what(work), io.BytesIO(DATA[:-1]))
    assert "cut short" in short["error"] and leftovers(work) == []
    changed = bytes([DATA[0] ^ 1]) + DATA[1:]
    bad = host_handoff.answer("payload-take", what(work), io.BytesIO(changed))
    assert "SHA-256" in bad["error"] and "refused" in bad["error"]
    assert leftovers(work) == []


def test_a_kept_copy_that_changed_is_named_and_removed(tmp_path: Path) -> None:
    work = tmp_path / "w"
    host_handoff.answer("payload-take", what(work), io.BytesIO(DATA))
    kept = work / host_handoff.FOLDER / SHA
    kept.write_bytes(bytes([DATA[0] ^ 1]) + DATA[1:])  # changed, whatever DATA's first byte
    said = host_handoff.answer("payload-have", what(work), io.BytesIO())
    assert said["have"] is False and "failed its SHA-256 check" in said["bad"]
    assert leftovers(work) == []


def serving(folder: Path, name: str) -> host_share.Server:
    order = {"cwd": str(folder), "paths": [name], "key": KEY.hex(), "run": RUN, "timeout": 10}
    sock = socket.create_server(("127.0.0.1", 0))
    return host_share.Server(order, sock)


def pull(work: Path, port: int, key: bytes = KEY) -> dict[str, Any]:
    order = {**what(work), "addr": "127.0.0.1", "port": port, "key": key.hex(), "run": RUN}
    order.update(rank=1, source="node 0 (h1)", timeout=10, connect_timeout=1)
    return host_handoff.answer("payload-pull", order, io.BytesIO())


def test_a_copy_handed_on_is_checked_and_a_changed_one_refused_naming_its_source(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / SHA).write_bytes(DATA)
    server = serving(source, SHA)
    try:
        assert pull(tmp_path / "good", server.sock.getsockname()[1])["ok"] is True
        assert leftovers(tmp_path / "good") == [SHA]
        (source / SHA).write_bytes(DATA[:-1] + b"!")  # tampered on the source
        bad = pull(tmp_path / "bad", server.sock.getsockname()[1])
    finally:
        sent = server.stop()
    assert "from node 0 (h1)" in bad["error"] and "refused" in bad["error"], bad
    assert leftovers(tmp_path / "bad") == []
    assert sent["files"] == 2


def test_a_stranger_without_the_key_gets_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / SHA).write_bytes(DATA)
    server = serving(source, SHA)
    try:
        said = pull(tmp_path / "w", server.sock.getsockname()[1], key=os.urandom(32))
    finally:
        sent = server.stop()
    assert said.get("error") and not said.get("ok"), said
    assert sent == {"sent": 0, "files": 0}
    assert leftovers(tmp_path / "w") == []


def test_a_source_that_dies_mid_transfer_leaves_no_partial_copy(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def half() -> None:  # authenticates, promises every byte, sends half, dies
        sock, addr = listener.accept()
        conn, _ = wire.offer(sock, KEY, RUN, f"{addr[0]}:{addr[1]}")
        conn.receive()
        conn.send({"size": len(DATA)})
        sock.sendall(DATA[: len(DATA) // 2])
        sock.close()

    thread = threading.Thread(target=half, daemon=True)
    thread.start()
    said = pull(tmp_path / "w", listener.getsockname()[1])
    thread.join(5)
    listener.close()
    assert "node 0 (h1) closed the connection" in said["error"], said
    assert leftovers(tmp_path / "w") == []


@pytest.mark.parametrize("sha", ["../../etc/passwd", "0" * 63, "G" * 64])
def test_a_name_that_is_no_sha256_is_refused(tmp_path: Path, sha: str) -> None:
    said = host_handoff.answer("payload-have", {**what(tmp_path), "sha256": sha}, io.BytesIO())
    assert "not a SHA-256" in said["error"]
