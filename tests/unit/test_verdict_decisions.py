"""The run's verdicts (pure): a run that succeeded without forming its world, the root
cause of a hung run as its stacks say it, and the hints a failure's last lines give; and
the node's facts behind them, as its run directory holds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from test_stacks_model import node, proc, thread

from sshddp.errors import ExitCode
from sshddp.model import hang
from sshddp.model.report import failure_hints, run_report
from sshddp.model.state import NodeResult, NodeState, NodeWorld, RunResult, not_distributed
from sshddp.protocol import contract
from sshddp.protocol.contract import HangRecord
from sshddp.remote.node.joined import node_watch, node_world


def world(
    planned: int, ranks: int, joined: int, *sizes: int, ran: tuple[int, ...] = ()
) -> dict[str, Any]:
    return {
        "planned": planned,
        "ranks": ranks,
        "joined": joined,
        "sizes": list(sizes),
        "collectives": list(ran),
    }


def ended(*worlds: Optional[dict[str, Any]]) -> RunResult:
    nodes = []
    for k, w in enumerate(worlds):
        n = NodeResult(k, f"h{k + 1}")
        n.apply({"state": "succeeded", "returncode": 0, **({"world": w} if w else {})})
        nodes.append(n)
    return RunResult("r", nodes)


def test_a_run_whose_processes_never_joined_is_not_distributed() -> None:
    result = ended(world(4, 2, 0), world(4, 2, 0))
    assert result.ok and result.undistributed and result.exit_code is ExitCode.OK
    text = run_report(result, [])
    assert text.startswith("sshddp: run r succeeded\n"), text
    assert "sshddp: WARNING: run r was not distributed: none of its processes called" in text
    assert "never formed the planned world of 4" in text
    assert "node 0   h1                   0 of 2 process(es) joined a process group" in text
    assert "node 1   h2                   0 of 2 process(es) joined a process group" in text
    assert "`--env ACCELERATE_USE_CPU=1` or `Accelerator(cpu=True)`" in text
    assert "the exit code stays 0" in text


def test_worlds_of_another_size_are_named_with_their_size() -> None:
    result = ended(world(4, 2, 2, 2, 2), world(4, 2, 2, 2, 2))
    text = run_report(result, [])
    assert "formed process groups of size 2, never one of the planned world size 4" in text
    assert "2 of 2 process(es) joined a process group (world size 2)" in text
    assert "{nnodes}" in text and "ACCELERATE_USE_CPU" not in text


def test_a_distributed_run_or_one_a_node_cannot_tell_gets_no_warning() -> None:
    assert not ended(world(4, 2, 2, 4, 4), world(4, 2, 2, 4, 4)).undistributed
    assert "WARNING" not in run_report(ended(world(4, 2, 2, 4, 4), world(4, 2, 2, 4, 4)), [])
    assert not ended(world(4, 2, 0), None).undistributed  # an older host: no facts
    assert not not_distributed([])
    failed = ended(world(4, 2, 0), world(4, 2, 0))
    failed.nodes[0].state = NodeState.FAILED
    assert not failed.undistributed  # a failure has its own report


def test_a_world_formed_in_which_no_collective_ran_is_not_distributed() -> None:
    """accelerate and a Trainer on CPU hosts: every process joins the planned world, then
    trains alone; each said as it left that no collective ran on its groups."""
    result = ended(world(4, 2, 2, 4, 4, ran=(0, 0)), world(4, 2, 2, 4, 4, ran=(0, 0)))
    assert result.ok and result.undistributed and result.exit_code is ExitCode.OK
    text = run_report(result, [])
    assert "was not distributed: the world formed (size 4 of 4), but no collective ran" in text
    assert "2 of 2 process(es) joined a process group (world size 4)" in text
    assert "`--env ACCELERATE_USE_CPU=1`" in text and "TrainingArguments(use_cpu=True)" in text
    # what was seen comes before any guess, and the guess says it is one
    seen, guess = text.index("  seen: every process joined"), text.index("likely cause (a guess)")
    assert seen < guess < text.index("accelerate")


def test_one_collective_or_one_process_that_did_not_say_means_no_warning() -> None:
    """Say less rather than something wrong: a process killed or ended by ``os._exit`` (a
    multiprocessing worker) never says, and one collective anywhere is cooperation."""
    talked = ended(world(4, 2, 2, 4, 4, ran=(0, 0)), world(4, 2, 2, 4, 4, ran=(0, 7)))
    assert not talked.undistributed
    unsaid = ended(world(4, 2, 2, 4, 4, ran=(0, 0)), world(4, 2, 2, 4, 4, ran=(0,)))
    assert not unsaid.undistributed
    older = ended(world(4, 2, 2, 4, 4), world(4, 2, 2, 4, 4))  # no collectives recorded
    assert not older.undistributed


def test_a_one_process_run_has_no_world_to_form() -> None:
    """One process (one GPU, one host) planned: a world of 1 is no distribution to miss."""
    assert not ended(world(1, 1, 0)).undistributed
    assert not ended(world(1, 1, 1, 1, ran=(0,))).undistributed


def test_node_world_reads_only_well_formed_records() -> None:
    assert NodeWorld.of(world(4, 2, 1, 4)) == NodeWorld(4, 2, 1, (4,))
    assert NodeWorld.of(world(4, 2, 1, 4, ran=(3,))) == NodeWorld(4, 2, 1, (4,), (3,))
    assert NodeWorld.of({**world(4, 2, 1, 4), "collectives": ["3"]}) == NodeWorld(4, 2, 1, (4,))
    for bad in (None, [], {"planned": 4}, {**world(4, 2, 1), "sizes": ["4"]}, world(-1, 2, 0)):
        assert NodeWorld.of(bad) is None, bad
    assert NodeWorld.of({**world(4, 2, 1), "joined": True}) is None


def test_the_node_records_who_joined_which_world(tmp_path: Path) -> None:
    joined = tmp_path / contract.JOINED
    joined.mkdir()
    two = {"rank": 2, "entered": 1.0, "joined": 2.0, "world": 4, "collectives": 5}
    (joined / "2").write_text(json.dumps(two))
    (joined / "3").write_text(json.dumps({"rank": 3, "entered": 1.0, "joined": None}))
    (joined / "p77").write_text(json.dumps({"rank": 1, "joined": 2.0, "world": 2}))
    (joined / "p78").write_text(json.dumps({"rank": None, "joined": None, "world": None}))
    (joined / ".p79.79").write_text("partial")
    spec: contract.SpecRecord = {"node_rank": 1, "watch": {"nprocs": [2, 2]}}  # type: ignore[typeddict-item]
    assert node_world(str(tmp_path), spec) == world(4, 2, 2, 2, 4, ran=(5,))
    assert node_world(str(tmp_path), {"node_rank": 1}) is None
    facts = node_watch(str(tmp_path), since=0.0, now=0.0, world=2)  # p77 joined as rank 1
    assert (facts["entered"], facts["joined"]) == ([1, 2, 3], [1, 2])
    facts = node_watch(str(tmp_path), since=0.0, now=0.0, world=4)  # p77's world is not it
    assert (facts["entered"], facts["joined"]) == ([2, 3], [2])


def _record(node_rank: int, host: str, culprit: int, *ranks: int) -> HangRecord:
    waits = thread([("/c/train.py", 9, "main"), ("/v/site-packages/torch/c10d.py", 2, "wait")])
    sleeps = thread(
        [
            ("/c/train.py", 9, "main"),
            ("/c/train.py", 4, "sleep_before_allreduce"),
            ("/c/train.py", 1, "forever"),
            ("/usr/lib/python3.11/time.py", 5, "sleep"),
        ]
    )
    procs = [proc(100 + r, r, [sleeps if r == culprit else waits]) for r in ranks]
    stacks = node(node_rank, host, *procs).record
    assert stacks is not None
    return {
        "schema": contract.SCHEMA,
        "kind": contract.HANG_STALL,
        "reason": "no rank wrote output for 12 s (--stall-timeout 10)",
        "at": 0.0,
        "node_rank": node_rank,
        "action": contract.ON_STALL_STOP,
        "watch": {"entered": [], "joined": [], "quiet": 12.0},
        "stacks": stacks,
        "flight": [],
        "flight_late": [],
        "nccl": [],
    }


def test_a_hangs_root_cause_is_the_odd_one_out_not_the_last_node() -> None:
    hangs = [
        hang.NodeHang(n, f"h{n + 1}", _record(n, f"h{n + 1}", 3, 2 * n, 2 * n + 1))
        for n in range(3)
    ]
    node_rank, cause = hang.culprits(hangs)
    assert node_rank == 1
    assert cause == (
        "rank 3 on h2 (node 1) stands apart in forever (train.py, line 1), called from "
        "sleep_before_allreduce (train.py, line 4), while the other 5 ranks wait elsewhere "
        "(stacks above)"
    )
    nodes = [NodeResult(n, f"h{n + 1}", NodeState.STALLED, reason="stalled") for n in range(3)]
    result = RunResult("r", nodes, root_cause=node_rank, hang_cause=cause)
    text = run_report(result, ["READY 3"])
    assert "root cause: rank 3 on h2 (node 1) stands apart in forever" in text
    assert "node 2 on h3" not in text and "last 1 lines of node 1's output" in text


def test_no_odd_one_out_leaves_the_root_cause_to_the_watchdogs_finding() -> None:
    hangs = [hang.NodeHang(0, "h1", _record(0, "h1", -1, 0, 1))]
    assert hang.culprits(hangs) == (None, "")


def test_argparse_failures_of_launch_style_scripts_get_a_hint() -> None:
    usage = "usage: legacy.py [-h] --local_rank LOCAL_RANK"
    required = [usage, "legacy.py: error: the following arguments are required: --local_rank"]
    assert any("--local-rank-arg" in h for h in failure_hints(required))
    dashed = ["train.py: error: unrecognized arguments: --local-rank=0"]
    assert any("'--local-rank', '--local_rank'" in h for h in failure_hints(dashed))
    extra = ["train.py: error: unrecognized arguments: --local_rank=1"]
    assert any("without --local-rank-arg" in h for h in failure_hints(extra))
    literal = ["ValueError: invalid literal for int() with base 10: '{node_rank}'"]
    hints = failure_hints(literal)
    assert len(hints) == 1 and "--launcher node" in hints[0] and "`--`" in hints[0]
    assert failure_hints(["RuntimeError: boom", "usage: fine"]) == []
    node = NodeResult(0, "h1", NodeState.FAILED, returncode=2, reason="torchrun exited with code 2")
    text = run_report(RunResult("r", [node], root_cause=0), required)
    assert "\nhint: the script wants --local_rank" in text
