"""The host-side hardening, run here on real files and sockets, in-process: new files only
(nothing planted is followed), checked directories, and the supervisors' authenticated wire."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sshddp.protocol import peer_messages
from sshddp.remote import common, workdir
from sshddp.remote.node import output, peers, wire
from wire_specs import KEY, free_port, spec

# ------------------------------------------------------------------ files and directories


def test_a_new_file_never_follows_or_reuses_what_is_there(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("link", "dangling", "victim"):
        with pytest.raises(FileExistsError):
            common.write_new(str(tmp_path / name), b"x")
    assert victim.read_bytes() == b"precious" and not (tmp_path / "nowhere").exists()
    common.write_new(str(tmp_path / "fresh"), b"x")
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o600


def test_json_is_replaced_whole_through_an_unguessable_temporary(tmp_path: Path) -> None:
    leak = tmp_path / "leak"
    leak.touch()
    target = tmp_path / "env.json"
    (tmp_path / f"env.json.tmp.{os.getpid()}").symlink_to(leak)  # the old, guessable name
    common.atomic_write_json(str(target), {"TOKEN": "s3cr3t"})
    assert json.loads(target.read_text()) == {"TOKEN": "s3cr3t"}
    assert leak.read_bytes() == b""
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "env.json",
        f"env.json.tmp.{os.getpid()}",
        "leak",
    ]


def test_a_node_directory_is_made_private_and_never_reused(tmp_path: Path) -> None:
    node = tmp_path / "w" / "runs" / "r1" / "n0"
    workdir.make_rundir(str(node))
    for path in (node, node.parent, node.parent.parent):
        assert path.stat().st_mode & 0o777 == 0o700, path
    with pytest.raises(workdir.Unsafe, match="already exists on this host"):
        workdir.make_rundir(str(node))
    workdir.make_rundir(str(node.parent / "n1"))  # another node of the run, same host


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda w: (w / "runs").mkdir(mode=0o777) or (w / "runs").chmod(0o777), "writable by"),
        (lambda w: (w / "runs").symlink_to(w.parent), "is a symlink"),
        (lambda w: os.chown(w, 65534, 65534), "belongs to uid 65534"),
        (lambda w: w.chmod(0o775), "writable by other users (mode 0775)"),
    ],
)
def test_a_directory_others_control_is_refused_and_inspect_says_so(
    tmp_path: Path, setup: Any, message: str
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    setup(work)
    with pytest.raises(workdir.Unsafe, match=re.escape(message)) as refused:
        workdir.make_rundir(str(work / "runs" / "r1" / "n0"))
    assert refused.value.fix, "no fix given"
    found = workdir.inspect(str(work))
    assert message in found["problem"] and found["fix"] == refused.value.fix, found
    assert not (tmp_path / "r1").exists()


def test_inspect_of_a_workdir_to_be_made_looks_at_its_parent(tmp_path: Path) -> None:
    found = workdir.inspect(str(tmp_path / "not" / "yet"))
    assert found == {"path": str(tmp_path), "readonly": False, "problem": None}


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda above: os.chown(above, 65534, 65534), "belongs to uid 65534"),
        (lambda above: above.chmod(0o777), "is writable by other users (mode 0777, not sticky)"),
    ],
)
def test_a_directory_above_the_workdir_that_others_control_is_refused(
    tmp_path: Path, setup: Any, message: str
) -> None:
    """Whoever may rename what is in a directory above the workdir could swap the workdir
    for their own after the check."""
    above = tmp_path / "above"
    (above / "w").mkdir(parents=True)
    setup(above)
    with pytest.raises(workdir.Unsafe, match=re.escape(f"{above}, above workdir")) as refused:
        workdir.make_rundir(str(above / "w" / "runs" / "r1" / "n0"))
    assert message in refused.value.what and refused.value.fix
    assert message in workdir.inspect(str(above / "w"))["problem"]
    assert not (above / "w" / "runs").exists()


def test_a_workdir_through_links_of_ours_is_used_by_its_real_path_only(tmp_path: Path) -> None:
    """A link of ours, in a sticky world-writable directory (as /tmp), is followed once:
    the node directory, and the paths under the workdir, are the real ones from then on."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (shared / "hop").symlink_to("../real")
    (shared / "work").symlink_to(shared / "hop")
    given = str(shared / "work" / "runs" / "r1" / "n0")
    made = workdir.make_rundir(given)
    assert made == str(real / "runs" / "r1" / "n0") and os.path.isdir(made)
    assert workdir.moved(str(shared / "work" / "work" / "p-1"), given, made) == str(
        real / "work" / "p-1"
    )
    assert workdir.moved("/elsewhere/x", given, made) == "/elsewhere/x"


# ------------------------------------------------------------------ processes


def test_a_planted_log_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "node.log").symlink_to(victim)
    with pytest.raises(FileExistsError):
        output.NodeOutput(str(tmp_path), use_tty=False)
    (tmp_path / "node.log").unlink()
    (tmp_path / "reserve").symlink_to(victim)
    with pytest.raises(FileExistsError):
        output.NodeOutput(str(tmp_path), use_tty=False)
    assert victim.read_bytes() == b"precious"


# ------------------------------------------------------------------ the wire


def pair(
    spoke_key: bytes = KEY, spoke_run: str = "r1", rank: int = 1
) -> tuple[Any, Any, socket.socket]:
    """Both ends of a handshake over a real socket pair: (hub's result, spoke's, the
    spoke's raw socket)."""
    hub_sock, spoke_sock = socket.socketpair()
    result: dict[str, Any] = {}

    def hub() -> None:
        try:
            result["hub"] = wire.offer(hub_sock, KEY, "r1", "test")
        except wire.Refused as exc:
            result["hub"] = exc
            hub_sock.close()

    thread = threading.Thread(target=hub)
    thread.start()
    try:
        spoke: Any = wire.join(spoke_sock, spoke_key, spoke_run, rank, "test")
    except wire.Refused as exc:
        spoke = exc
        spoke_sock.close()
    thread.join(30)
    return result["hub"], spoke, spoke_sock


def test_both_sides_prove_the_key_and_lines_are_maced_and_sequenced() -> None:
    (hub, rank), spoke, raw = pair()
    assert rank == 1
    assert spoke.send({"hb": 1}) and spoke.send({"done": 1, "state": "failed"})
    assert hub.receive() == {"run": "r1", "seq": 0, "hb": 1}
    assert hub.receive()["state"] == "failed"
    assert hub.send({"abort": "why"}) and spoke.receive()["abort"] == "why"
    # A replayed line, a tampered one and an overlong one are noise; the next real one counts.
    body = '{"run":"r1","seq":0,"hb":1}'
    replay = f"{wire.mac(spoke.key, 'spoke', body)} {body}\n".encode()
    tampered = replay.replace(b'"hb":1', b'"hb":2')
    raw.sendall(replay + tampered + b"y" * (wire.MAX_LINE * 3) + b"\n")
    assert spoke.send({"bye": 0})
    assert hub.receive() == {"run": "r1", "seq": 2, "bye": 0}


def test_a_wrong_key_is_refused() -> None:
    """The hub hangs up on a spoke that cannot prove the key (the spoke tries again until
    its deadline); a hub that cannot prove it is not taken for this run's."""
    hub, spoke, _ = pair(spoke_key=b"x" * 32)
    assert isinstance(hub, wire.Refused) and "does not prove" in str(hub)
    assert isinstance(spoke, wire.Refused) and "closed before its answer" in str(spoke)
    hub_sock, spoke_sock = socket.socketpair()
    impostor = threading.Thread(target=lambda: impersonate(hub_sock))
    impostor.start()
    with pytest.raises(wire.Refused, match="did not prove it holds this run's key") as refused:
        wire.join(spoke_sock, KEY, "r1", 1, "test")
    assert not refused.value.retry
    impostor.join(30)


def impersonate(sock: socket.socket) -> None:
    """A hub that knows the run id but not the key."""
    sock.sendall(b'{"v": 1, "run": "r1", "nonce": "%s"}\n' % (b"0" * 32))
    sock.recv(4096)
    sock.sendall(b'{"mac": "' + b"0" * 64 + b'"}\n')


def test_a_spoke_of_another_run_says_whose_port_it_reached() -> None:
    hub, spoke, _ = pair(spoke_run="r2")
    assert isinstance(spoke, wire.Refused) and not spoke.retry
    assert "it belongs to another run ('r1'), not to run r2" in str(spoke)
    assert isinstance(hub, wire.Refused)


def test_the_hub_obeys_only_its_run_and_a_node_reports_for_itself() -> None:
    port = free_port()
    hub = peers.peers_for(spec(0, port), KEY)
    assert isinstance(hub, peers.PeerServer)
    hub.start()
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", port)) as stranger:
        stranger.recv(4096)
        stranger.sendall(b'{"done": 2, "state": "failed", "reason": "forged"}\n')
        stranger.recv(4096)  # until the hub hangs up
    spoke = peers.peers_for(spec(1, port), KEY)
    assert isinstance(spoke, peers.PeerClient)
    spoke.start()
    deadline = time.monotonic() + 30
    while spoke.conn is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    claim = peer_messages.encode(peer_messages.done(2, "succeeded", ""))  # claims rank 2
    assert spoke.conn.send(claim)
    deadline = time.monotonic() + 30
    while 1 not in hub.done:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert hub.done == {1: ("succeeded", "")} and hub.abort is None
