"""Restarts of the whole run (--max-restarts): node 0's decision, what the records say,
how the report, the console and ``logs`` show attempts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_plan import plan_of

from sshddp.model.plan import LaunchOptions
from sshddp.model.report import attempt_line, attempt_marks, attempts_lines, run_report
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.protocol import contract
from sshddp.remote.node.host_attempts import read_summary, summary
from sshddp.remote.node.restarts import failure_text, refusal
from sshddp.run import logread
from sshddp.run.ps import PsRow

SUMMARY = b"""[rank4]: RuntimeError: Connection closed by peer
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_04:30:01
  host      : h3
  rank      : 5 (local_rank: 1)
  exitcode  : 1 (pid: 4242)
============================================================
"""


@pytest.mark.parametrize(
    ("attempt", "ended", "abort", "says"),
    [
        (1, set(), None, ""),
        (2, set(), None, ""),
        (3, set(), None, "no attempts left (3 made)"),
        (1, {2}, None, "node(s) 2 ended already"),
        (1, set(), "interrupted", "the run is stopping: interrupted"),
    ],
)
def test_node_0_restarts_only_with_attempts_left_and_no_node_ended(
    attempt: int, ended: set[int], abort: str | None, says: str
) -> None:
    assert refusal(attempt, 3, ended, abort) == says


def test_failure_text_names_the_rank_from_torchruns_summary_of_this_attempt(
    tmp_path: Path,
) -> None:
    log = tmp_path / "node.log"
    log.write_bytes(b"attempt 1\n" + SUMMARY)
    assert failure_text(str(log), 0, "torchrun exited with code 1") == ("rank 5 exited with code 1")
    later = log.stat().st_size  # a new attempt: the first one's summary is not its own
    log.write_bytes(log.read_bytes() + b"attempt 2: killed\n")
    assert failure_text(str(log), later, "torchrun was killed by SIGKILL") == (
        "torchrun was killed by SIGKILL"
    )
    assert failure_text(str(tmp_path / "missing"), 0, "why") == "why"


def test_attempts_summary_from_the_record_and_nothing_from_a_broken_one(tmp_path: Path) -> None:
    history: list[contract.AttemptRecord] = [
        {"attempt": 1, "offset": 0, "started": 1.0, "reason": "", "standby": False},
        {"attempt": 2, "offset": 120, "started": 9.0, "reason": "node 2 (h3) x", "standby": True},
    ]
    assert summary(1, history) == {}
    expected = {"attempt": 2, "attempts": 3, "earlier": ["node 2 (h3) x"]}
    assert summary(3, history) == {**expected, "offsets": [0, 120]}
    path = tmp_path / contract.ATTEMPTS
    path.write_text(json.dumps({"schema": 4, "max_attempts": 3, "attempts": history}))
    assert read_summary(str(tmp_path)) == {**expected, "offsets": [0, 120]}
    path.write_text('{"attempts": 5}')
    assert read_summary(str(tmp_path)) == {}
    path.write_text("{not json")
    assert read_summary(str(tmp_path)) == {}


def _result(records: list[dict[str, Any]]) -> RunResult:
    nodes = []
    for rank, record in enumerate(records):
        node = NodeResult(rank, f"h{rank + 1}")
        node.apply(record)
        nodes.append(node)
    return RunResult("r1", nodes, root_cause=2)


def test_the_report_says_the_attempt_and_why_each_earlier_one_ended() -> None:
    why = "node 2 (h3) failed: rank 5 exited with code 1"
    ended = {"attempt": 3, "attempts": 3, "earlier": [why, why]}
    result = _result(
        [
            {"state": "stopped", "reason": "stopped: node 2 (h3) failed", **ended},
            {"state": "stopped", "reason": "stopped: node 2 (h3) failed", **ended},
            {"state": "failed", "reason": "torchrun exited with code 1", **ended},
        ]
    )
    assert result.nodes[2].state is NodeState.FAILED and result.nodes[2].earlier == (why, why)
    lines = attempts_lines(result)
    assert lines == [
        "attempt 3 of 3",
        f"  attempt 1 ended: {why}; every node restarted",
        f"  attempt 2 ended: {why}; every node restarted",
    ]
    text = run_report(result, SUMMARY.decode().splitlines())
    assert "\n".join(lines) in text and "root cause: node 2 on h3, global rank 5" in text
    plain = _result([{"state": "failed", "reason": "x"}])  # no restarts: no attempt lines
    assert attempts_lines(plain) == [] and plain.nodes[0].attempt == 1


def test_a_hosts_odd_attempt_fields_read_as_one_attempt() -> None:
    node = NodeResult(0, "h1")
    node.apply({"state": "failed", "attempt": True, "attempts": "3", "earlier": "x"})
    assert (node.attempt, node.attempts, node.earlier) == (1, 1, ())


def test_console_line_and_logs_marks_escape_what_came_from_a_host() -> None:
    assert attempt_line(2, 3, "node 2 (h3) failed: rank 5 exited with code 1") == (
        "sshddp: attempt 2 of 3: node 2 (h3) failed: rank 5 exited with code 1; "
        "restarting every node"
    )
    assert "\x1b" not in attempt_line(2, 3, "evil \x1b[2J")
    status = {"offsets": [0, 40, 90], "earlier": ["a", "b\x1b[2J"], "attempts": 3}
    marks = attempt_marks("node 1 (h2)", status)
    assert [m[0] for m in marks] == [40, 90]
    assert marks[0][1] == "sshddp: node 1 (h2): attempt 2 of 3 starts here; attempt 1 ended: a"
    assert "\x1b" not in marks[1][1]
    assert attempt_marks("node 0 (h1)", {"state": "running"}) == []


def test_logread_chunks_stop_at_an_end(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"0123456789")
    assert b"".join(logread.chunks(path, 2, size=3, end=7)) == b"23456"
    assert b"".join(logread.chunks(path, 7, size=3)) == b"789"
    assert b"".join(logread.chunks(path, 5, end=5)) == b""


def test_torchrun_never_restarts_alone_and_the_spec_carries_the_restarts() -> None:
    p = plan_of(LaunchOptions(script="t.py", max_restarts=2))
    argv = list(p.argv(p.nodes[1]))
    assert argv[argv.index("--max-restarts") + 1] == "0"
    assert p.spec(p.nodes[1])["restarts"] == 2


# --------------------------------------------------- a real supervisor of one node


def test_ps_shows_a_running_nodes_attempt() -> None:
    running = {"state": "running", "joined": 2, "quiet": 3.0, "attempt": 2, "attempts": 3}
    row = PsRow("r1", 0.0, 1.0, ("h1", "h2"), (running, {"state": "running"}), "", False)
    assert row.node_text(0) == "0:running(2 joined, quiet 3s, attempt 2/3)"
    assert row.node_text(1) == "1:running"
    nodes = row.to_json()["nodes"]
    assert (nodes[0]["attempt"], nodes[0]["attempts"]) == (2, 3)
    assert nodes[1]["attempt"] is None
