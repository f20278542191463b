"""A spare seated mid-run is named as the node it took: its status says which (attempts.json's
``node_rank``), its local log and console lines become that node's (run.sinks), ``ps --json``
says who replaced whom and ``top`` shows it in the rank it holds. No process, no socket."""

from __future__ import annotations

import io
import json
from pathlib import Path

from sshddp.model.inventory import Host
from sshddp.model.layout import NodeLayout, RunLayout
from sshddp.model.report import replacement
from sshddp.model.sync import HostSync, SyncStatus
from sshddp.protocol import contract
from sshddp.protocol.contract import SOURCE_NODE, TopRecord
from sshddp.remote.node.host_attempts import read_summary
from sshddp.run import top as run_top
from sshddp.run.ps import PsRow
from sshddp.run.sinks import Console, NodeLogs, seat_spare, seat_spares
from sshddp.run.sync import _synced_spares

HOSTS = ("h1", "h2", "h3", "h4")


def layout() -> RunLayout:
    """3 nodes × 2 ranks and a spare (slot 3, its ranks past the world until seated)."""
    nodes = tuple(
        NodeLayout(Host(host=h, index=i), i, 2, 2 * i, f"/w/n{i}", "") for i, h in enumerate(HOSTS)
    )
    return RunLayout("r", "logs", nodes, 1.0, frozenset({3}))


def sinks(tmp: Path) -> tuple[NodeLogs, Console, io.BytesIO]:
    logs, out = NodeLogs(tmp / "r", fresh=True), io.BytesIO()
    console = Console(out, color=False)
    console.width = len("[6-7 h4]")
    for n in layout().nodes:
        logs.open(n.node_rank, n.host.host)
        label = f"{n.first_rank}-{n.first_rank + 1} {n.host.host}"
        console.add_node(n.node_rank, label, console.width)
        for local, rank in enumerate(n.ranks):
            console.add_rank(n.node_rank, local, f"{rank} {n.host.host}", console.width)
    return logs, console, out


def test_a_seated_spares_attempts_say_the_node_rank_it_holds(tmp_path: Path) -> None:
    history = [
        {
            "attempt": 2,
            "offset": 0,
            "started": 9.0,
            "reason": "node 2 (h3) lost (x); h4 took its place",
        }
    ]
    record = {"schema": contract.SCHEMA, "max_attempts": 2, "attempts": history}
    (tmp_path / contract.ATTEMPTS).write_text(json.dumps(record))
    assert "node_rank" not in read_summary(str(tmp_path))  # an older host's: no seat known
    history[0]["node_rank"] = 2
    (tmp_path / contract.ATTEMPTS).write_text(json.dumps(record))
    assert read_summary(str(tmp_path))["node_rank"] == 2


def test_a_seated_spare_writes_the_log_named_for_its_rank_and_shows_its_ranks(
    tmp_path: Path,
) -> None:
    logs, console, out = sinks(tmp_path)
    assert seat_spare(layout(), logs, console, 3, {"state": "running"}) is None  # not seated
    assert seat_spare(layout(), logs, console, 1, {"node_rank": 2}) is None  # not a spare
    assert seat_spare(layout(), logs, console, 3, {"node_rank": 2}) == 2
    logs.write(3, b"attempt 2 rank 4\n")
    console.write(3, b"mine\n", 1)
    console.write(3, b"the node's\n", SOURCE_NODE)
    names = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert names == ["node0-h1.log", "node1-h2.log", "node2-h3.log", "node2-h4.log"]
    assert (tmp_path / "r" / "node2-h4.log").read_bytes() == b"attempt 2 rank 4\n"
    assert logs.paths[3].name == "node2-h4.log" and logs.seats == {3: 2}
    assert out.getvalue() == b"[5 h4]   mine\n[4-5 h4] the node's\n"
    seat_spares(layout(), logs, console, {3: {"node_rank": 2}, 0: None})  # again: no change
    assert logs.size(3) == len(b"attempt 2 rank 4\n")
    logs.close()


def test_a_spare_seated_again_later_resumes_the_copy_named_for_its_rank(tmp_path: Path) -> None:
    """``logs``/``attach`` after the run: the copy named for the rank it took is resumed,
    the empty one named for its slot goes."""
    logs, console, _ = sinks(tmp_path)
    seat_spare(layout(), logs, console, 3, {"node_rank": 2})
    logs.write(3, b"held\n")
    logs.close()
    again = NodeLogs(tmp_path / "r")
    again.open(3, "h4")  # what open_sinks does first: the slot's name
    assert (tmp_path / "r" / "node3-h4.log").exists()
    again.seat(3, 2, "h4")
    assert again.size(3) == len(b"held\n")
    assert not (tmp_path / "r" / "node3-h4.log").exists()
    again.close()


def test_ps_json_says_who_replaced_whom() -> None:
    lost = {"state": "replaced", "reason": "lost mid-run; h4 took its place"}
    states = (
        {"state": "succeeded"},
        {"state": "succeeded"},
        lost,
        {"state": "succeeded", "node_rank": 2},
    )
    row = PsRow("r", 0.0, 1.0, HOSTS, states, "", True, spares=frozenset({3}))
    nodes = row.to_json()["nodes"]
    assert [n["took"] for n in nodes] == [None, None, None, 2]
    assert [n["replaced_by"] for n in nodes] == [None, None, "h4", None]
    # a node renumbered by min_nodes (not a spare) replaces nobody
    renumbered = PsRow("r", 0.0, 1.0, HOSTS[:3], ({}, lost, {"node_rank": 1}), "", True)
    assert [n["replaced_by"] for n in renumbered.to_json()["nodes"]] == [None, None, None]


def answer(node_rank: int, attempt: int = 2) -> TopRecord:
    sample = {"at": 1.0, "cpu": 1.0, "rss": 1, "gpus": [], "ranks": []}
    return {
        "schema": contract.SCHEMA,
        "node_rank": node_rank,
        "state": "running",
        "attempt": attempt,
        "sample": sample,  # type: ignore[typeddict-item]
        "tails": {},
        "history": {},
        "now": 2.0,
        "waits": {},
    }


def test_top_shows_a_seated_spare_in_the_rank_it_holds() -> None:
    nodes = list(layout().nodes)
    answers: dict[int, run_top.Answer] = {
        0: answer(0),
        1: answer(1),
        2: "unreachable",
        3: answer(2),
    }
    got = run_top._snapshot(layout(), 0.0, nodes, answers)
    assert [(n.node_rank, n.host) for n in got.nodes] == [(0, "h1"), (1, "h2"), (2, "h4")]
    assert got.nodes[2].replaced == "node 2: h4 since attempt 2 (h3 lost)"
    only = run_top._snapshot(layout(), 0.0, nodes, answers, only=2)
    assert [(n.node_rank, n.host) for n in only.nodes] == [(2, "h4")]
    waiting = run_top._snapshot(layout(), 0.0, nodes, {**answers, 2: answer(2), 3: answer(3)})
    assert [(n.node_rank, n.host) for n in waiting.nodes][2:] == [(2, "h3"), (3, "h4")]
    assert replacement(2, "h4", "h3", None) == "node 2: h4 (h3 lost)"


def test_sync_leaves_out_a_spare_that_got_no_environment() -> None:
    spares = (Host(host="h4", index=0), Host(host="h5", index=1))
    results = [
        HostSync(3, "h4", SyncStatus.READY, "k", "/w/envs/k/bin/python"),
        HostSync(4, "h5", SyncStatus.UNREACHABLE, error="connection refused"),
    ]
    kept, left = _synced_spares(spares, results, ">=3.11")
    assert [(h.host, h.python) for h in kept] == [("h4", "/w/envs/k/bin/python")]
    assert left == [
        "sshddp: sync: spare h5: unreachable: connection refused; it is left out of this run"
    ]
    assert _synced_spares(spares, [], ">=3.11") == (spares, [])


def test_attach_leaves_out_a_lost_host_whose_rank_a_spare_holds() -> None:
    from sshddp.errors import HostUnreachable
    from sshddp.run.coordinator import _replaced

    refused = HostUnreachable("h3", "connection refused")
    found = {0: {"state": "running"}, 1: {"state": "running"}, 3: {"node_rank": 2}}
    got = _replaced(layout(), found, {2: refused})  # type: ignore[arg-type]
    assert got == {2: {"state": "replaced", "reason": "lost mid-run; h4 took its place"}}
    try:
        _replaced(layout(), {**found, 3: {"state": "running"}}, {2: refused})  # type: ignore[arg-type]
    except HostUnreachable as exc:
        assert "cannot reach every host of the run: " in exc.message
    else:
        raise AssertionError("a node out of reach that no spare holds fails the attach")
