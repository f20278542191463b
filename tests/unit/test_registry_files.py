"""run.registry: records created atomically, ends kept once, problems named with their path;
and ps's bounded fan-out, which never waits past its deadline."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from cli_helpers import sshddp
from registry_records import record
from sshddp import defaults
from sshddp.errors import ExitCode, RunNotFound, StateError, UsageError
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.run import registry
from sshddp.run.ps import bounded_map
from sshddp.run.registry import Launcher


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSHDDP_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_records_are_owner_only_and_round_trip(state: Path) -> None:
    rec = record(launcher=Launcher.me())
    registry.create(rec)
    path = state / "runs" / "r1.json"
    assert path.stat().st_mode & 0o777 == 0o600 and (state / "runs").stat().st_mode & 0o777 == 0o700
    assert registry.load("r1") == rec


def test_an_end_is_kept_once_and_the_duration_is_the_nodes(state: Path) -> None:
    registry.create(record())
    states = [
        {"state": "succeeded", "ended": 1000.0},
        {"state": "failed", "reason": "boom", "returncode": 1, "ended": 990.0},
    ]
    registry.record_end("r1", lambda r: r.ended_from(states))  # type: ignore[arg-type]
    kept = registry.load("r1")
    assert kept.finished and kept.ended == 1000.0 and kept.root_cause == 1
    later = RunResult("r1", [NodeResult(0, "h0", NodeState.STOPPED), NodeResult(1, "h1")])
    registry.record_end("r1", lambda r: r.ended_with(later))
    assert registry.load("r1") == kept  # a final end is never overwritten


def test_attempts_are_kept_so_a_report_from_the_registry_alone_has_them(state: Path) -> None:
    """--max-restarts: which attempt each node ended in, and why the earlier ones ended,
    survive in the record (from the hosts' statuses or from a coordinator's result)."""
    why = "node 1 (h1) failed: rank 1 exited with code 1"
    registry.create(record())
    states = [
        {"state": "stopped", "ended": 5.0, "attempt": 3, "attempts": 3, "earlier": [why, why]},
        {"state": "failed", "reason": "boom", "ended": 4.0, "attempt": 3, "attempts": 3},
    ]
    registry.record_end("r1", lambda r: r.ended_from(states))  # type: ignore[arg-type]
    nodes = registry.load("r1").recorded_result().nodes
    assert [(n.attempt, n.attempts, n.earlier) for n in nodes] == [(3, 3, (why, why)), (3, 3, ())]
    registry.create(record("r2"))
    ran = RunResult("r2", [NodeResult(0, "h0", NodeState.SUCCEEDED, attempt=2, attempts=3)])
    ran.nodes[0].earlier = (why,)
    registry.record_end("r2", lambda r: r.ended_with(ran))
    kept = registry.load("r2").recorded_result().nodes[0]
    assert (kept.attempt, kept.attempts, kept.earlier) == (2, 3, (why,))
    plain = json.loads((state / "runs" / "r1.json").read_text())
    assert "attempt" in plain["result"]["nodes"][0]
    registry.create(record("r3"))  # without restarts, the record is as it was
    registry.record_end("r3", lambda r: r.ended_from([{"state": "succeeded"}] * 2))
    once = json.loads((state / "runs" / "r3.json").read_text())["result"]["nodes"][0]
    assert sorted(once) == ["ended", "node_rank", "reason", "returncode", "state"]


def test_problems_name_the_path_and_never_hide_the_other_records(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.create(record("good"))
    (state / "runs" / "bad.json").write_text("{not json")
    (state / "runs" / "worse.json").write_text(json.dumps({"run_id": "worse", "nodes": 3}))
    runs, problems = registry.all_runs()
    assert [r.run_id for r in runs] == ["good"]
    assert sorted(p.split(" is malformed")[0] for p in problems) == [
        f"the run record {state / 'runs' / 'bad.json'}",
        f"the run record {state / 'runs' / 'worse.json'}",
    ]
    with pytest.raises(StateError) as bad:
        registry.resolve("bad")
    assert bad.value.exit_code == ExitCode.BAD_INPUT
    with pytest.raises(RunNotFound):
        registry.resolve("nosuch")
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("SSHDDP_STATE_DIR", str(afile / "state"))
    with pytest.raises(StateError) as under:
        registry.create(record())
    assert under.value.exit_code == ExitCode.BAD_INPUT and str(afile) in under.value.message


def test_a_record_nested_too_deep_is_named_and_hides_no_other(state: Path) -> None:
    registry.create(record("good"))
    deep = state / "runs" / "deep.json"
    deep.write_text("[" * 200_000)
    runs, problems = registry.all_runs()
    assert [r.run_id for r in runs] == ["good"]
    assert len(problems) == 1 and problems[0].startswith(f"the run record {deep} is malformed")
    registry.forget("good")  # ps would ask its (made-up) hosts how it is
    result = sshddp(["ps", "--all"])
    assert result.code == ExitCode.OK, result.explain()  # the problem is a note, as for others
    assert f"the run record {deep} is malformed" in result.err, result.explain()
    assert "internal error" not in result.text, result.explain()


def test_bounded_map_gives_each_item_its_window_from_its_turn() -> None:
    """A hung item costs one window, and another worker takes its place; items that wait
    for their turn (more items than workers) are never given up on for the wait: at 256
    hosts 32 at a time, ps named running nodes unreachable."""
    hang = threading.Event()
    started = time.monotonic()
    done = bounded_map(lambda i: hang.wait() if i == 3 else i * 2, list(range(6)), 2, 1.0)
    assert time.monotonic() - started < 5
    assert {i: o.value for i, o in done.items()} == {0: 0, 1: 2, 2: 4, 4: 8, 5: 10}
    failed = bounded_map(lambda i: 1 // i, [0, 1], 4, 5.0)
    assert isinstance(failed[0].error, ZeroDivisionError) and failed[1].value == 1
    hang.set()
    queued = bounded_map(lambda i: time.sleep(0.15) or i, list(range(8)), 1, 0.5)
    assert sorted(queued) == list(range(8))  # 1.2 s in all, each well within its 0.5 s


def test_commands_on_a_run_still_being_launched_say_so(state: Path) -> None:
    from sshddp.run.runs import started

    registry.create(record("busy", Launcher.me()))
    with pytest.raises(UsageError) as busy:
        started(registry.load("busy"))
    assert f"still being launched (pid {os.getpid()})" in busy.value.message
    registry.create(record("dead", Launcher(os.getpid(), -1)))
    with pytest.raises(RunNotFound):
        started(registry.load("dead"))
    assert not registry.exists("dead")
    registry.save(registry.load("busy").ended_from([{"state": "gone"}] * 2))  # type: ignore[list-item]
    assert started(registry.load("busy")).run_id == "busy"


def test_a_fifo_a_link_or_a_huge_file_as_a_record_is_named_and_skipped(state: Path) -> None:
    """What sits at runs/ID.json may be anything: a FIFO (reading it would wait for a writer
    forever), a link to /dev/zero (a read without end), a file too large. Each is named as
    a bad record, and the good runs are still listed (``ps --all``: a note, exit 0)."""
    registry.create(record("good"))
    runs = state / "runs"
    os.mkfifo(runs / "fifo.json")
    (runs / "zero.json").symlink_to("/dev/zero")
    (runs / "linked.json").symlink_to(runs / "good.json")  # even to a good record: not followed
    with open(runs / "huge.json", "wb") as fh:
        fh.truncate(defaults.RUN_RECORD_MAX + 1)  # sparse: costs no disk
    records, problems = registry.all_runs()
    assert [r.run_id for r in records] == ["good"]
    assert sorted(problems) == [
        f"the run record {runs / 'fifo.json'} is not a regular file; move it away or delete it",
        f"the run record {runs / 'huge.json'} is larger than a run record may be "
        f"({defaults.RUN_RECORD_MAX} bytes); move it away or delete it",
        f"the run record {runs / 'linked.json'} is a symbolic link, which sshddp does not "
        "follow; move it away or delete it",
        f"the run record {runs / 'zero.json'} is a symbolic link, which sshddp does not "
        "follow; move it away or delete it",
    ]
    with pytest.raises(StateError) as fifo:
        registry.resolve("fifo")
    assert fifo.value.exit_code == ExitCode.BAD_INPUT
    registry.save(registry.load("good").ended_from([{"state": "succeeded"}] * 2))  # type: ignore[list-item]
    listed = sshddp(["ps", "--all"])  # finished: read from the registry, no host asked
    assert listed.code == ExitCode.OK, listed.explain()
    assert "good" in listed.out and "succeeded" in listed.out, listed.explain()
    for name in ("fifo", "huge", "linked", "zero"):
        assert f"the run record {runs / name}.json " in listed.err, listed.explain()
    assert "internal error" not in listed.text and "Traceback" not in listed.text
