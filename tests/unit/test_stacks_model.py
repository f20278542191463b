"""model/stacks: grouping, ordering and rendering a run's stacks (pure, no host)."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sshddp.model import stacks
from sshddp.model.stacks import HostStacks
from sshddp.protocol import contract
from sshddp.protocol.contract import FrameRecord, NodeStacks, ProcessStacks, ThreadRecord

WAIT = [
    ("/x/train.py", 10, "<module>"),
    ("/x/train.py", 5, "main"),
    ("/t/c10d.py", 80, "all_reduce"),
]
SLEEP = [("/x/train.py", 10, "<module>"), ("/x/train.py", 7, "main"), ("/x/train.py", 2, "nap")]


def frame(file: str, line: int, func: str, native: bool = False) -> FrameRecord:
    return {"file": file, "line": line, "func": func, "code": f"code of {func}", "native": native}


def thread(frames: list[tuple[str, int, str]], name: str = "") -> ThreadRecord:
    return {
        "id": "0x1",
        "name": name,
        "status": "",
        "current": False,
        "frames": [frame(*f) for f in frames],
    }


def proc(
    pid: int,
    rank: Optional[int],
    threads: list[ThreadRecord],
    role: str = contract.RANK,
    error: str = "",
    source: str = "faulthandler",
) -> ProcessStacks:
    return {
        "pid": pid,
        "ppid": 1,
        "role": role,
        "rank": rank,
        "local_rank": None if rank is None else rank % 2,
        "cmdline": "python rank.py train.py",
        "source": source if threads else "",
        "threads": threads,
        "raw": "",
        "error": error,
    }


def node(node_rank: int, host: str, *procs: ProcessStacks) -> HostStacks:
    record: NodeStacks = {
        "schema": 1,
        "node_rank": node_rank,
        "state": contract.RUNNING,
        "processes": list(procs),
        "py_spy": None,
        "note": "",
        "elapsed": 0.1,
    }
    return HostStacks(node_rank, host, record)


def three_nodes(culprit: int = 3) -> list[HostStacks]:
    """Ranks 0-5, two per host h1..h3; rank ``culprit`` naps, the others wait."""
    return [
        node(
            n,
            f"h{n + 1}",
            *(
                proc(100 * n + r, r, [thread(SLEEP if r == culprit else WAIT)])
                for r in (2 * n, 2 * n + 1)
            ),
            proc(100 * n + 50, None, [thread([("/t/run.py", 9, "_invoke_run")])], contract.AGENT),
        )
        for n in range(3)
    ]


@pytest.mark.parametrize(
    ("numbers", "text"),
    [([], ""), ([3], "3"), ([0, 1, 2, 4, 5], "0-2,4-5"), ([5, 4, 4, 9], "4-5,9"), ([1, 3], "1,3")],
)
def test_ranges(numbers: list[int], text: str) -> None:
    assert stacks.ranges(numbers) == text


@given(st.sets(st.integers(0, 300)))
def test_ranges_name_exactly_the_numbers_given(numbers: set[int]) -> None:
    named: set[int] = set()
    for part in filter(None, stacks.ranges(numbers).split(",")):
        first, _, last = part.partition("-")
        named.update(range(int(first), int(last or first) + 1))
    assert named == numbers


def test_the_lone_rank_comes_first_as_the_odd_one_out() -> None:
    groups = stacks.group(three_nodes())
    assert [g.header() for g in groups] == [
        "rank 3 on h2 (1 rank)",
        "ranks 0-2,4-5 on h1,h2,h3 (5 ranks)",
        "torchrun agents of nodes 0-2 on h1,h2,h3 (3 processes)",
    ]
    assert [g.odd for g in groups] == [True, False, False]
    text = stacks.render(groups, [])
    assert text.startswith("=== odd one out: rank 3 on h2 (1 rank) ===\n")
    culprit = text.split("\n\n")[0].splitlines()
    assert culprit[1:] == [
        "Thread 1 of 1 (most recent call last):",
        '  File "/x/train.py", line 10, in <module>',
        "    code of <module>",
        '  File "/x/train.py", line 7, in main',
        "    code of main",
        '  File "/x/train.py", line 2, in nap',
        "    code of nap",
    ]


def test_same_code_at_other_paths_on_other_hosts_is_one_group() -> None:
    there = [(f.replace("/x/", "/home/bob/run/n1/"), line, func) for f, line, func in WAIT]
    nodes = [node(0, "a", proc(1, 0, [thread(WAIT)])), node(1, "b", proc(2, 1, [thread(there)]))]
    (group,) = stacks.group(nodes)
    assert group.header() == "ranks 0-1 on a,b (2 ranks)" and not group.odd


def test_thread_order_ids_names_and_native_frames_do_not_split_a_group() -> None:
    native = thread([*WAIT, ("libc.so.6", 0, "recv")], name="MainThread")
    native["frames"][-1]["native"] = True
    one = proc(1, 0, [thread(WAIT), thread(SLEEP)])
    other = proc(2, 1, [thread(SLEEP), native], source="py-spy")
    (group,) = stacks.group([node(0, "a", one, other)])
    assert group.threads is other["threads"]  # the one with native frames is shown
    lines = stacks.render([group], []).splitlines()
    assert 'Thread 2 of 2, "MainThread" (most recent call last):' in lines
    assert "  [native] recv (libc.so.6)" in lines


def test_equal_groups_have_no_odd_one_out_and_keep_rank_order() -> None:
    nodes = [node(0, "h1", proc(1, 0, [thread(WAIT)]), proc(2, 1, [thread(SLEEP)]))]
    groups = stacks.group(nodes)
    assert [g.header() for g in groups] == ["rank 0 on h1 (1 rank)", "rank 1 on h1 (1 rank)"]
    assert not any(g.odd for g in groups)


def test_workers_group_apart_from_ranks_and_name_their_rank_and_pids() -> None:
    worker = [("/x/train.py", 30, "load_batch")]
    nodes = [
        node(
            0,
            "h1",
            proc(1, 0, [thread(WAIT)]),
            proc(11, 0, [thread(worker)], contract.WORKER),
            proc(12, 0, [thread(worker)], contract.WORKER),
            proc(13, 0, [], contract.WORKER, error="not a Python process (sleep)"),
        ),
        node(1, "h2", proc(2, 1, [thread(WAIT)]), proc(21, 1, [thread(worker)], contract.WORKER)),
    ]
    groups = stacks.group(nodes)
    assert [g.header() for g in groups] == [
        "ranks 0-1 on h1,h2 (2 ranks)",
        "workers of ranks 0-1 on h1,h2 (3 processes: pid 11, 12, 21)",
    ]
    missing = stacks.without_stacks(nodes)
    text = stacks.render(groups, missing)
    assert text.endswith(
        "=== no stack (1 process) ===\n"
        "  worker of rank 0 on h1 (pid 13): not a Python process (sleep)\n"
    )
    assert stacks.summary(nodes, groups) == (
        "2 ranks on 2 hosts in 1 group; 4 other processes of the run"
    )


def test_summary_counts_the_odd_ones_out() -> None:
    nodes = three_nodes()
    assert stacks.summary(nodes, stacks.group(nodes)) == (
        "6 ranks on 3 hosts in 2 groups, 1 odd one out; 3 other processes of the run"
    )


def test_notes_and_unknown_lines_render_as_written() -> None:
    cut: ThreadRecord = thread(WAIT)
    cut["frames"].insert(0, {"file": "", "line": 0, "func": "...", "code": "", "native": False})
    cut["frames"][-1]["code"] = ""
    lines = stacks.render_threads([cut])
    assert lines[1] == "  ..." and lines[-1] == '  File "/t/c10d.py", line 80, in all_reduce'


def test_saved_dump_names_and_text() -> None:
    where = node(1, "gpu b", proc(812, 3, [thread(SLEEP)]))
    assert where.record is not None
    rank = where.record["processes"][0]
    rank["raw"] = "Current thread 0x1 (most recent call first):\n"
    assert stacks.dump_name(where, rank) == "rank3-node1-gpu_b-pid812.txt"
    worker = proc(813, 3, [], contract.WORKER)
    agent = proc(790, None, [], contract.AGENT)
    assert stacks.dump_name(where, worker) == "rank3-worker-node1-gpu_b-pid813.txt"
    assert stacks.dump_name(where, agent) == "agent-node1-gpu_b-pid790.txt"
    text = stacks.dump_text(where, rank, "2026-01-02 03:04:05")
    assert text.splitlines()[:3] == [
        "rank 3 on gpu b (pid 812), local rank 1",
        "command: python rank.py train.py",
        "collected: 2026-01-02 03:04:05, by faulthandler",
    ]
    assert text.endswith(
        "--- as faulthandler wrote it ---\nCurrent thread 0x1 (most recent call first):\n"
    )


def test_json_document_names_every_node_and_group() -> None:
    nodes = [*three_nodes(), HostStacks(3, "h4", error="h4: connection refused")]
    doc: dict[str, Any] = stacks.json_doc("r1", nodes, stacks.group(nodes), elapsed=0.5)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["run_id"] == "r1" and doc["elapsed"] == 0.5
    assert [(n["node_rank"], n["host"], n["error"]) for n in doc["nodes"]][-1] == (
        3,
        "h4",
        "h4: connection refused",
    )
    assert doc["nodes"][0]["state"] == "running" and len(doc["nodes"][0]["processes"]) == 3
    first = doc["groups"][0]
    assert first["odd"] and first["role"] == "rank" and first["header"] == "rank 3 on h2 (1 rank)"
    assert first["members"] == [{"node_rank": 1, "host": "h2", "pid": 103, "rank": 3}]
    assert first["threads"][0]["frames"][-1]["func"] == "nap"


def test_under_a_node_launcher_the_node_processes_are_titled_node_launchers() -> None:
    """--launcher node: the node's one process is a node launcher, not a torchrun agent,
    in the group titles, the labels and the saved dumps' names."""
    nodes = three_nodes()
    for h in nodes:
        assert h.record is not None
        for p in h.record["processes"]:
            if p["role"] == contract.AGENT:
                p["role"] = contract.LAUNCHER
    groups = stacks.group(nodes)
    assert groups[-1].header() == "node launcher processes of nodes 0-2 on h1,h2,h3 (3 processes)"
    assert "torchrun" not in stacks.render(groups, [])
    launcher = groups[-1].members[0]
    assert launcher.label() == "node launcher of node 0 on h1 (pid 50)"
    assert stacks.dump_name(nodes[0], launcher.process) == "launcher-node0-h1-pid50.txt"
    one = stacks.Group(contract.LAUNCHER, (launcher,))
    assert one.header() == "node launcher process of node 0 on h1 (1 process)"
