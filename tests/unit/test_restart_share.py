"""``--share`` at a restart (``remote/node/restart_share.py``): node 0's ``again`` offers its
latest shared files and every other node, a seated spare included, pulls those whose copy
differs before its attempt starts. The message's checks, the loop's state, and the
transfer itself over real sockets on loopback."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sshddp.protocol import peer_messages as pm
from sshddp.remote.node import restart_share
from sshddp.remote.node.node_events import Node0Said, decide, initial

KEY = os.urandom(32)
SHA = "ab" * 32


def offer(files: Any, port: Any = 4000) -> dict[str, Any]:
    raw = pm.encode(pm.again(2, "why"))
    return {**raw, "share": {"port": port, "files": files}}


def test_an_again_with_node_0s_files_reads_back() -> None:
    files = [{"path": "ckpt/model.pt", "size": 12, "sha256": SHA}]
    msg = pm.decode(offer(files))
    assert msg == pm.with_share(pm.again(2, "why"), {"port": 4000, "files": files})


@pytest.mark.parametrize(
    "files, port",
    [
        ([{"path": "/etc/passwd", "size": 1, "sha256": SHA}], 4000),  # absolute
        ([{"path": "../../.bashrc", "size": 1, "sha256": SHA}], 4000),  # out of the cwd
        ([{"path": "a/../../b", "size": 1, "sha256": SHA}], 4000),
        ([{"path": "ckpt.pt", "size": -1, "sha256": SHA}], 4000),
        ([{"path": "ckpt.pt", "size": 1, "sha256": "AB" * 32}], 4000),  # not lower hex
        ([{"path": "ckpt.pt", "size": 1, "sha256": "ab"}], 4000),
        ([{"path": "ckpt.pt", "size": True, "sha256": SHA}], 4000),
        (["ckpt.pt"], 4000),
        ({"path": "ckpt.pt"}, 4000),
        ([], 0),
        ([], 70000),
        ([], "4000"),
    ],
)
def test_an_offer_that_is_not_plainly_files_in_the_cwd_is_noise(files: Any, port: Any) -> None:
    assert pm.decode(offer(files, port)) is None


def test_a_node_keeps_node_0s_offer_for_the_attempt_it_starts() -> None:
    spec: Any = {"node_rank": 1, "restarts": 1, "peers": {"nnodes": 2, "hosts": ["a", "b"]}}
    share: pm.ShareOffer = {"port": 4000, "files": [{"path": "c.pt", "size": 1, "sha256": SHA}]}
    state, _ = decide(initial(spec), Node0Said(pm.with_share(pm.again(2, "why"), share)))
    assert state.share == share
    state, _ = decide(state, Node0Said(pm.again(3, "why")))
    assert state.share is None  # the next attempt's word offered none


def spec_for(cwd: Path, nnodes: int = 2, **more: Any) -> Any:
    peers = {"nnodes": nnodes, "addr": "127.0.0.1", "port": 1, "timeout": 5.0, "hosts": []}
    return {
        "run_id": "r1",
        "cwd": str(cwd),
        "share": ["ckpt.json", "sub/w.bin"],
        "peers": peers,
        **more,
    }


def files(cwd: Path) -> dict[str, bytes]:
    return {p: (cwd / p).read_bytes() for p in ("ckpt.json", "sub/w.bin") if (cwd / p).exists()}


def test_node_0s_latest_copies_reach_a_node_that_lacks_or_differs_and_no_other(
    tmp_path: Path,
) -> None:
    zero, one = tmp_path / "n0", tmp_path / "n1"
    (zero / "sub").mkdir(parents=True)
    one.mkdir()
    (zero / "ckpt.json").write_text(json.dumps({"step": 9}))
    (zero / "sub" / "w.bin").write_bytes(os.urandom(3 << 20))
    server, share = restart_share.offer(spec_for(zero), KEY, None)
    try:
        assert share is not None and server is not None
        sha = hashlib.sha256((zero / "ckpt.json").read_bytes()).hexdigest()
        assert share["files"][0] == {"path": "ckpt.json", "size": 11, "sha256": sha}
        assert restart_share.refresh(spec_for(one), share, KEY, 1) == ""
        assert files(one) == files(zero)  # a spare with nothing: both files
        (one / "ckpt.json").write_text(json.dumps({"step": 3}))  # node 1's own, older
        assert restart_share.refresh(spec_for(one), share, KEY, 1) == ""
        assert files(one) == files(zero) and server.sent == 2 * 11 + (3 << 20)
        assert restart_share.refresh(spec_for(one), share, KEY, 1) == ""
        assert server.sent == 2 * 11 + (3 << 20)  # the same copies: nothing sent
    finally:
        restart_share.close(server)


def test_a_node_without_the_runs_key_gets_nothing_and_says_why(tmp_path: Path) -> None:
    zero, one = tmp_path / "n0", tmp_path / "n1"
    zero.mkdir()
    one.mkdir()
    (zero / "ckpt.json").write_text("{}")
    server, share = restart_share.offer(spec_for(zero), KEY, None)
    try:
        assert share is not None
        why = restart_share.refresh(spec_for(one), share, os.urandom(32), 1)
        assert why.startswith("could not get node 0's --share files before the attempt: ")
        assert files(one) == {}
    finally:
        restart_share.close(server)


def test_nothing_is_served_without_files_a_key_or_another_node(tmp_path: Path) -> None:
    (tmp_path / "ckpt.json").write_text("{}")
    assert restart_share.offer(spec_for(tmp_path, nnodes=1), KEY, None) == (None, None)
    alone = {k: v for k, v in spec_for(tmp_path).items() if k != "peers"}  # one node's spec
    assert restart_share.offer(alone, KEY, None) == (None, None)
    assert restart_share.offer(spec_for(tmp_path), None, None) == (None, None)
    assert restart_share.offer(spec_for(tmp_path / "empty"), KEY, None) == (None, None)
    assert restart_share.offer({**spec_for(tmp_path), "share": []}, KEY, None) == (None, None)


def test_node_0_and_a_node_with_no_offer_pull_nothing(tmp_path: Path) -> None:
    spec: Any = {"node_rank": 0, "restarts": 1, "peers": {"nnodes": 2, "hosts": ["a", "b"]}}
    share: pm.ShareOffer = {"port": 1, "files": [{"path": "c.pt", "size": 1, "sha256": SHA}]}
    zero = decide(initial(spec), Node0Said(pm.with_share(pm.again(2, "w"), share)))[0]
    handover = restart_share.Handover(spec_for(tmp_path), KEY)
    assert handover.refresh(zero) == ""  # node 0 is the source
    assert handover.refresh(initial({**spec, "node_rank": 1})) == ""  # nothing offered


def test_node_0s_again_says_where_its_files_are_and_nothing_else_changes(
    tmp_path: Path,
) -> None:
    (tmp_path / "ckpt.json").write_text("{}")
    handover = restart_share.Handover(spec_for(tmp_path), KEY)
    try:
        halt = pm.halt(1, "why")
        assert handover.offered(halt) == halt
        said = handover.offered(pm.again(2, "why"))
        assert said["t"] == "again" and said["share"]["files"][0]["path"] == "ckpt.json"
        assert pm.decode(pm.encode(said)) == said
        first = handover.server
        handover.offered(pm.again(3, "why"))  # the next attempt's: the last server stopped
        assert handover.server is not first and first is not None and first.sock.fileno() == -1
    finally:
        handover.close()
