"""The root-cause report (pure): its reading of a failed node's log, its verdict, and what
it shows of the hosts' and ranks' text."""

from __future__ import annotations

from sshddp.errors import ExitCode
from sshddp.model.report import run_report, torchrun_failure, user_tail
from sshddp.model.state import NodeResult, NodeState, RunResult, peer_cause, stop_reason

SUMMARY = """\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
job.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 5 (local_rank: 1)
  exitcode  : -15 (pid: 13097)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 4 (local_rank: 0)
  exitcode  : 1 (pid: 13094)
============================================================""".splitlines()


def _log(root_lines: int, follow_on_lines: int) -> list[str]:
    own = ["[rank4]: Traceback (most recent call last):"]
    own += [f"[rank4]:   frame {i}" for i in range(root_lines)]
    own += ["[rank4]: RuntimeError: boom on rank 4"]
    other = ["[rank5]: Traceback (most recent call last):"]
    other += [f"[rank5]:   frame {i}" for i in range(follow_on_lines)]
    other += ["[rank5]: RuntimeError: Connection closed by peer"]
    return ["step 1", "step 2", *own, *other, *SUMMARY]


def test_the_root_cause_ranks_traceback_survives_a_peers_longer_follow_on_error() -> None:
    lines = _log(root_lines=6, follow_on_lines=30)
    info = torchrun_failure(lines)
    assert (info["rank"], info["local_rank"], info["exitcode"]) == (4, 0, 1)
    tail = user_tail(lines, rank=info["rank"])
    assert tail[0] == "[rank4]: Traceback (most recent call last):"
    assert tail[-1] == "[rank4]: RuntimeError: boom on rank 4"
    assert not any("rank5" in line for line in tail)


def test_a_long_root_traceback_keeps_its_last_lines() -> None:
    lines = _log(root_lines=40, follow_on_lines=2)
    tail = user_tail(lines, n=20, rank=4)
    assert len(tail) == 20 and tail[-1] == "[rank4]: RuntimeError: boom on rank 4"


def test_without_rank_prefixes_the_tail_stops_above_torchruns_summary() -> None:
    lines = ["step 1", "ValueError: plain", *SUMMARY]
    assert user_tail(lines, rank=4) == ["step 1", "ValueError: plain"]
    assert user_tail(lines) == ["step 1", "ValueError: plain"]


def _stopped_run(interrupted: bool) -> RunResult:
    reasons = ["interrupted by the user (Ctrl-C)", "stopped: node 0 (h1) stopped: interrupted"]
    nodes = [
        NodeResult(i, f"h{i + 1}", NodeState.STOPPED, reason=reason)
        for i, reason in enumerate(reasons)
    ]
    return RunResult("r1", nodes, interrupted=interrupted)


def test_a_stopped_run_reads_the_same_to_the_launch_and_to_a_later_attach() -> None:
    launch, attach = _stopped_run(True), _stopped_run(False)
    verdict = "sshddp: run r1 was stopped: interrupted by the user (Ctrl-C)"
    assert run_report(launch, []).splitlines()[0] == verdict
    assert run_report(attach, []).splitlines()[0] == verdict
    assert stop_reason(attach) == "interrupted by the user (Ctrl-C)" and not peer_cause(attach)
    assert launch.exit_code == ExitCode.INTERRUPTED and attach.exit_code == ExitCode.RUN_FAILED
    running = RunResult("r1", [NodeResult(0, "h1", NodeState.RUNNING)], interrupted=True)
    assert stop_reason(running) == ""


def test_the_report_shows_what_hosts_and_ranks_wrote_escaped_and_framed() -> None:
    node = NodeResult(0, "h1", NodeState.FAILED, 1, reason="\x1b]0;t\x07boom\r")
    result = RunResult("r1", [node], root_cause=0)
    tail = ["\x1b[31mTraceback\x1b[0m", "x\rsshddp: run r1 succeeded", "\x1b]52;c;AA\x07"]
    report = run_report(result, tail)
    assert not any(c in report for c in "\x1b\r\x07")
    assert "  | Traceback" in report and "  | x\\rsshddp: run r1 succeeded" in report
    assert "\\x1b]0;t\\x07boom\\r" in report
    assert not [ln for ln in report.splitlines() if ln.startswith("sshddp: run r1 succeeded")]


BANNER = "E1202 10:00:01.5 8649 torch/distributed/elastic/multiprocessing/api.py:1002] failed"


def _failed_node() -> RunResult:
    node = NodeResult(0, "h1", NodeState.FAILED, 1, reason="torchrun exited with code 1")
    return RunResult("r1", [node], root_cause=0)


def test_the_tail_is_the_ranks_own_lines_without_torchruns_banner() -> None:
    ranks = ["step 1", "[rank0]: ValueError: boom"]
    full = ["step 1", "[rank0]: ValueError: boom", f"{BANNER} (exitcode: 1) local_rank: 0"]
    report = run_report(_failed_node(), [*full, *SUMMARY], ranks)
    assert "  | [rank0]: ValueError: boom" in report
    assert "E1202" not in report


def test_where_no_rank_wrote_the_tail_is_torchruns_own_error() -> None:
    full = ["usage: torchrun [-h] ...", "torchrun: error: argument --monitor-interval: "]
    full[-1] += "invalid float value: 'abc'"
    report = run_report(_failed_node(), full, [])
    assert "--- last 2 lines of node 0's output ---" in report
    assert "  | torchrun: error: argument --monitor-interval: invalid float value: 'abc'" in report
