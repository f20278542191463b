"""The watchdogs' pure parts: when a run counts as hung (``remote/watchdog.verdict``), what
the finding says, a node's facts as its run directory holds them, the NCCL flight
recorder's environment, the hang report, ``ps``'s per-node text, the state and exit code,
the plan's watch spec."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import pytest
from test_stacks_model import node, proc, thread

from sshddp.errors import ExitCode, UsageError
from sshddp.model import hang
from sshddp.model.plan import LaunchOptions, validate_options
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.protocol import contract
from sshddp.protocol.contract import ExitRecord, HangRecord, NodeWatch, WatchSpec
from sshddp.remote.node.host_flight import dumps as nccl_dumps
from sshddp.remote.node.host_watchdog import has_gpu, nccl_env, ranges, verdict, world_text
from sshddp.remote.node.joined import node_watch
from sshddp.run import ps
from sshddp.run.ps import PsRow

HOSTS = ["h1", "h2", "h3"]
NPROCS = [2, 2, 2]


def watch(init: float = 0, stall: float = 0, on_stall: str = "stop") -> WatchSpec:
    return {"init_timeout": init, "stall_timeout": stall, "on_stall": on_stall, "nprocs": NPROCS}


def fact(
    entered: list[int], joined: list[int], quiet: float = 0.0, still: Optional[float] = None
) -> NodeWatch:
    return {
        "entered": entered,
        "joined": joined,
        "quiet": quiet,
        "still": quiet if still is None else still,
    }


FORMED = {0: fact([0, 1], [0, 1]), 1: fact([2, 3], [2, 3]), 2: fact([4, 5], [4, 5])}
NODE1_BLOCKED = {0: fact([0, 1], []), 1: fact([], []), 2: fact([4, 5], [])}


def test_init_fires_once_the_timeout_passed_and_names_who_joined_and_who_never_did() -> None:
    assert verdict(watch(init=30), NPROCS, NODE1_BLOCKED, 29.9, HOSTS) is None
    found = verdict(watch(init=30), NPROCS, NODE1_BLOCKED, 30.0, HOSTS)
    assert found is not None
    kind, reason = found
    assert kind == contract.HANG_INIT
    assert reason == (
        "the world did not form within 30 s (--init-timeout): "
        "node 0 (h1): 0/2 joined, ranks 0-1 wait in init_process_group; "
        "node 1 (h2): 0/2 joined, ranks 2-3 never called init_process_group; "
        "node 2 (h3): 0/2 joined, ranks 4-5 wait in init_process_group"
    )


def test_init_does_not_fire_on_a_formed_world_when_off_or_without_torch_distributed() -> None:
    assert verdict(watch(init=30), NPROCS, FORMED, 100, HOSTS) is None
    assert verdict(watch(init=0), NPROCS, NODE1_BLOCKED, 100, HOSTS) is None
    nobody = {0: fact([], []), 1: fact([], []), 2: fact([], [])}  # a script without it
    assert verdict(watch(init=30), NPROCS, nobody, 100, HOSTS) is None


def test_a_node_that_never_reported_keeps_the_world_unformed_and_is_named() -> None:
    facts = {0: fact([0, 1], [0, 1]), 2: fact([4, 5], [4, 5])}
    found = verdict(watch(init=30), NPROCS, facts, 31, HOSTS)
    assert found is not None and "node 1 (h2): never reported (ranks 2-3)" in found[1]
    assert "node 0 (h1): 2/2 joined" in found[1]


def test_stall_fires_only_when_every_node_has_been_quiet_that_long() -> None:
    quiet = {r: fact(f["entered"], f["joined"], 12.0) for r, f in FORMED.items()}
    found = verdict(watch(stall=10), NPROCS, quiet, 50, HOSTS, formed_for=40)
    assert found == (contract.HANG_STALL, stalled(12, 12, 10))
    one_speaks = {**quiet, 1: fact([2, 3], [2, 3], 3.0)}
    assert verdict(watch(stall=10), NPROCS, one_speaks, 50, HOSTS, formed_for=40) is None
    missing = {r: f for r, f in quiet.items() if r != 2}  # node 2 has not reported yet
    assert verdict(watch(stall=10), NPROCS, missing, 50, HOSTS, formed_for=40) is None
    assert verdict(watch(stall=0), NPROCS, quiet, 50, HOSTS, formed_for=40) is None


def test_the_stall_clock_starts_when_the_world_forms() -> None:
    """Quiet while torch imports, or in a script that never forms a world: no stall. Once
    the world formed, the quiet counts from then at most."""
    importing = {r: fact([], [], 100.0) for r in range(3)}
    assert verdict(watch(stall=10), NPROCS, importing, 100, HOSTS) is None
    quiet = {r: fact(f["entered"], f["joined"], 100.0) for r, f in FORMED.items()}
    assert verdict(watch(stall=10), NPROCS, quiet, 100, HOSTS, formed_for=9) is None
    found = verdict(watch(stall=10), NPROCS, quiet, 100, HOSTS, formed_for=11)
    assert found == (contract.HANG_STALL, stalled(11, 11, 10))


def stalled(quiet: float, still: float, stall: float) -> str:
    return (
        f"no rank wrote output for {quiet:.0f} s, nor were the ranks seen working (stacks and"
        f" CPU time still) for {still:.0f} s (--stall-timeout {stall:g})"
    )


def test_a_quiet_run_whose_ranks_work_is_no_stall_until_they_stop_working() -> None:
    """Every node quiet for 60 s, but node 2's ranks were seen working 3 s ago: no stall.
    Once they too have been still for the stall timeout, the run has stalled."""
    working = {r: fact(f["entered"], f["joined"], 60.0) for r, f in FORMED.items()}
    working[2] = fact([4, 5], [4, 5], 60.0, still=3.0)
    assert verdict(watch(stall=10), NPROCS, working, 100, HOSTS, formed_for=90) is None
    working[2] = fact([4, 5], [4, 5], 60.0, still=10.0)
    found = verdict(watch(stall=10), NPROCS, working, 100, HOSTS, formed_for=90)
    assert found == (contract.HANG_STALL, stalled(60, 10, 10))


def test_world_text_counts_partial_joins() -> None:
    facts = {0: fact([0, 1], [0]), 1: fact([2], [2]), 2: fact([4, 5], [4, 5])}
    assert world_text(NPROCS, facts, HOSTS) == (
        "node 0 (h1): 1/2 joined, ranks 1 wait in init_process_group; "
        "node 1 (h2): 1/2 joined, ranks 3 never called init_process_group; "
        "node 2 (h3): 2/2 joined"
    )


@pytest.mark.parametrize(
    ("numbers", "text"), [([], ""), ([3], "3"), ([0, 1, 2, 5], "0-2,5"), ([7, 5, 6], "5-7")]
)
def test_ranges(numbers: list[int], text: str) -> None:
    assert ranges(numbers) == text


def test_node_watch_reads_joined_records_and_the_log_age(tmp_path: Path) -> None:
    joined = tmp_path / contract.JOINED
    joined.mkdir()
    (joined / "2").write_text(json.dumps({"rank": 2, "entered": 1.0, "joined": 2.0}))
    (joined / "3").write_text(json.dumps({"rank": 3, "entered": 1.0, "joined": None}))
    (joined / ".3.123").write_text("partial")  # a record being written
    (joined / "4").write_text("{not whole")
    log = tmp_path / contract.LOG
    log.write_bytes(b"x\n")
    os.utime(log, (1000.0, 1000.0))
    facts = node_watch(str(tmp_path), since=900.0, now=1010.0)
    assert facts == {"entered": [2, 3], "joined": [2], "quiet": 10.0, "still": 10.0}
    log.unlink()  # no output yet: quiet since the node started
    assert node_watch(str(tmp_path), since=1005.0, now=1010.0)["quiet"] == 5.0


def test_nccl_flight_recorder_is_armed_unless_the_user_set_it(tmp_path: Path) -> None:
    env = nccl_env(str(tmp_path), {}, gpu=True)
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / contract.NCCL / "trace_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / contract.NCCL / "pipe_"),
    }
    assert (tmp_path / contract.NCCL).is_dir()
    theirs = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert set(nccl_env(str(tmp_path), theirs, gpu=True)) == {
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    }
    assert nccl_dumps(str(tmp_path)) == []
    os.mkfifo(tmp_path / contract.NCCL / "pipe_0.pipe")  # a rank's pipe is not a dump
    (tmp_path / contract.NCCL / "trace_1").write_bytes(b"pickle")
    (tmp_path / contract.NCCL / "trace_0").write_bytes(b"pickle")
    assert nccl_dumps(str(tmp_path)) == [
        str(tmp_path / contract.NCCL / "trace_0"),
        str(tmp_path / contract.NCCL / "trace_1"),
    ]


def test_nccl_flight_recorder_stays_off_on_a_host_without_a_gpu(tmp_path: Path) -> None:
    """torch 2.13's gloo records every collective into the flight recorder too: a CPU
    host (no GPU driver's device node) gets none of its settings."""
    assert nccl_env(str(tmp_path), {}, gpu=False) == {}
    assert not (tmp_path / contract.NCCL).exists()
    nvidia = tmp_path / "nvidiactl"
    assert not has_gpu([str(nvidia), str(tmp_path / "kfd")])
    nvidia.write_bytes(b"")
    assert has_gpu([str(nvidia), str(tmp_path / "kfd")])


def hang_record(node_rank: int, host: str, nccl: list[str], *ranks: int) -> HangRecord:
    waits = thread([("train.py", 9, "main"), ("distributed_c10d.py", 2, "all_reduce")])
    sleeps = thread([("train.py", 9, "main"), ("train.py", 4, "sleep_before_allreduce")])
    procs = [proc(100 + r, r, [sleeps if r == 3 else waits]) for r in ranks]
    stacks = node(node_rank, host, *procs).record
    assert stacks is not None
    return {
        "schema": contract.SCHEMA,
        "kind": contract.HANG_STALL,
        "reason": "no rank wrote output for 12 s (--stall-timeout 10)",
        "at": time.time(),
        "node_rank": node_rank,
        "action": contract.ON_STALL_STOP,
        "watch": fact([], [], 12.0),
        "stacks": stacks,
        "flight": [],
        "flight_late": [],
        "nccl": nccl,
    }


def test_hang_report_names_the_odd_one_out_first_and_the_nccl_dumps() -> None:
    hangs = [
        hang.NodeHang(0, "h1", hang_record(0, "h1", [], 0, 1)),
        hang.NodeHang(1, "h2", hang_record(1, "h2", ["/w/runs/r/n1/nccl/trace_3"], 2, 3)),
        hang.NodeHang(2, "h3", error="Connection refused"),
    ]
    text = hang.render("r", hangs)
    assert text.startswith("sshddp: run r: the stall watchdog fired at ")
    assert "and stopped the run:\n  no rank wrote output for 12 s" in text
    odd = text.index("=== odd one out: rank 3 on h2 (1 rank) ===")
    rest = text.index("=== ranks 0-2 on h1,h2 (3 ranks) ===")
    assert odd < rest
    assert 'File "train.py", line 4, in sleep_before_allreduce' in text[odd:rest]
    assert "node 2 (h3): no stacks: Connection refused" in text
    assert "NCCL flight recorder dump on h2: /w/runs/r/n1/nccl/trace_3" in text
    assert hang.render("r", [hang.NodeHang(0, "h1")]) == ""  # nothing recorded


def test_ps_shows_joined_ranks_and_quiet_seconds_of_running_nodes() -> None:
    states: tuple[contract.ExitRecord, ...] = (
        {"state": "running", "joined": 2, "quiet": 12.4},
        {"state": "running", "joined": 0, "quiet": 0.2},
        {"state": "stalled", "reason": "no rank wrote output"},
        {"state": "running", "joined": 2, "quiet": 40.0, "still": 2.0},
        {"state": "running", "joined": 2, "quiet": 40.0, "still": 40.0},
    )
    hosts = ("h1", "h2", "h3", "h4", "h5")
    row = PsRow("r", 0.0, 1.0, hosts, states, "", False, nprocs=(2, 2, 2, 2, 2))
    texts = [row.node_text(i) for i in range(5)]
    assert texts == [
        "0:running(2/2 joined, quiet 12s)",
        "1:running(0/2 joined, quiet 0s)",
        "2:stalled",
        "3:running(2/2 joined, quiet 40s, working)",  # quiet, its ranks seen working 2 s ago
        "4:running(2/2 joined, quiet 40s)",
    ]
    nodes = row.to_json()["nodes"]
    assert [n["joined"] for n in nodes] == [2, 0, None, 2, 2]
    assert [n["quiet"] for n in nodes] == [12.4, 0.2, None, 40.0, 40.0]
    assert [n["still"] for n in nodes] == [None, None, None, 2.0, 40.0]


def test_a_stalled_node_is_final_bad_and_the_run_exits_6() -> None:
    assert NodeState.STALLED.final and NodeState.STALLED.bad
    nodes = [NodeResult(0, "h1", NodeState.STALLED), NodeResult(1, "h2", NodeState.STALLED)]
    result = RunResult("r", nodes, root_cause=0)
    assert result.hung and result.exit_code is ExitCode.HUNG == 6
    failed = RunResult("r", [NodeResult(0, "h1", NodeState.FAILED)], root_cause=0)
    assert not failed.hung and failed.exit_code is ExitCode.RUN_FAILED


def test_negative_timeouts_are_refused() -> None:
    for bad in (LaunchOptions(script="t.py", init_timeout=-1), LaunchOptions(stall_timeout=-2)):
        with pytest.raises(UsageError, match="must not be negative"):
            validate_options(bad, "r1")


def test_the_hang_report_escapes_what_came_from_the_hosts() -> None:
    record = hang_record(0, "h1", [], 0, 1)
    record["reason"] = "stall \x1b[2J\x07 here"
    text = hang.render("r", [hang.NodeHang(0, "h1", record)])
    assert "\x1b" not in text and "\x07" not in text
    assert "stall \\x1b[2J\\x07 here" in text


def test_a_node_records_its_hang_then_stops_only_when_told_to_stop(tmp_path: Path) -> None:
    """The watchdog's node side, on this host: hang.json with the node's stacks (no process
    runs here) and its facts; "report" leaves the node running, "stop" sets the verdict
    and wakes the supervisor."""
    from sshddp.remote.node.host_watchdog import Watchdog
    from sshddp.remote.node.node_events import Hang, decide, initial
    from sshddp.remote.node.node_inbox import Inbox

    spec = {"schema": 3, "run_id": "r", "node_rank": 1, "mark": "r/n1/x", "watch": watch(stall=5)}
    (tmp_path / contract.SPEC).write_text(json.dumps(spec))
    inbox = Inbox()
    dog = Watchdog(str(tmp_path), spec, time.time(), inbox)  # type: ignore[arg-type]
    node = decide(initial(spec), Hang(contract.HANG_STALL, "quiet", "report"))[0]  # type: ignore[arg-type]
    assert node.stacks
    dog.hang(contract.HANG_STALL, "quiet", contract.ON_STALL_REPORT)
    record = json.loads((tmp_path / contract.HANG).read_text())
    assert record["kind"] == "stall" and record["action"] == "report" and record["node_rank"] == 1
    assert record["stacks"]["node_rank"] == 1 and record["stacks"]["processes"] == []
    assert record["watch"]["entered"] == [] and record["nccl"] == []
    woken = inbox.take()
    node = decide(node, woken[0])[0]
    assert node.verdict is None and not node.stacks
    dog.hang(contract.HANG_INIT, "no world", contract.ON_STALL_STOP)
    woken += inbox.take()
    node = decide(node, woken[1])[0]
    assert node.verdict == (contract.HANG_INIT, "no world") and len(woken) == 2
    assert json.loads((tmp_path / contract.HANG).read_text())["kind"] == "init"


def test_ps_blames_no_node_for_a_stall_and_the_earliest_for_a_failure() -> None:
    """A stalled run's nodes all end STALLED, the deciding node first: the node that
    stopped first is not the one that hung (the report names the odd ones out from the
    stacks), so ``ps`` names no node for it. A failure still names the earliest to fail."""
    reason = "no rank wrote output for 12 s (--stall-timeout 10)"
    stalled: list[ExitRecord] = [
        {"state": "stalled", "reason": reason, "ended": 1.0},
        {"state": "stalled", "reason": reason, "ended": 2.0},
    ]
    assert ps.root_cause(stalled, ["h1", "h2"]) == f"stalled: {reason}"
    failed: list[ExitRecord] = [
        {"state": "stopped", "reason": "a peer failed", "ended": 1.0},
        {"state": "failed", "reason": "rank 3 exited with 1", "ended": 0.5},
    ]
    assert ps.root_cause(failed, ["h1", "h2"]) == "node 1 (h2) failed: rank 3 exited with 1"
