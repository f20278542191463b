"""Pure parts of fault handling: the disk preflight, the report of a lost node, a full
local log (exit 74), and the exact prefix a failed local write leaves."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from sshddp.cli.launch import report_result
from sshddp.cli.terminal import Terminal
from sshddp.errors import ExitCode, LogWriteFailed
from sshddp.model.checks import LOW_DISK, START_HEADROOM, Context, HostFacts, Status, evaluate
from sshddp.model.inventory import Host
from sshddp.model.report import run_report
from sshddp.model.state import NodeResult, NodeState, RunResult, peer_cause
from sshddp.run.sinks import NodeLogs


def disk_finding(free: int, code: int | None) -> tuple[Status, str]:
    facts = {"disk": {"path": "/w/runs", "free_bytes": free}}
    ctx = Context("10.0.0.1", 29500, code_bytes=code)
    report = evaluate([HostFacts(Host(host="h2", index=0), facts)], ctx)[0]
    found = report.get("disk")
    assert found is not None
    return found.status, found.message


def test_disk_check_fails_when_the_code_does_not_fit() -> None:
    status, message = disk_finding(4 << 20, 6 << 20)
    assert status is Status.FAIL
    assert "only 4.0 MB free under /w/runs" in message and "No space left on device" in message
    assert disk_finding((6 << 20) + START_HEADROOM, 6 << 20)[0] is Status.WARN  # fits, < 1 GiB
    assert disk_finding(LOW_DISK * 2, 6 << 20)[0] is Status.OK
    assert disk_finding(4 << 20, None)[0] is Status.WARN  # doctor: no code to weigh


def result(*nodes: tuple[str, str], **kw: object) -> RunResult:
    out = []
    for rank, (state, reason) in enumerate(nodes):
        out.append(NodeResult(rank, f"h{rank + 1}", NodeState(state), reason=reason))
    return RunResult("r1", out, **kw)  # type: ignore[arg-type]


def exit_of(res: RunResult) -> tuple[int, str]:
    err = io.StringIO()
    env = Terminal(
        stdout=io.StringIO(), stderr=err, stdout_bytes=io.BytesIO(), color=False, environ={}
    )
    return int(report_result(env, res)), err.getvalue()


def test_a_partitioned_node_is_named_from_the_supervisors_records() -> None:
    lost = "stopped: node 2 (h3) lost: node 2 (h3) went silent or lost its supervisor"
    res = result(("stopped", lost), ("stopped", lost), ("unreachable", "timed out"))
    assert peer_cause(res) == "node 2 (h3) lost: node 2 (h3) went silent or lost its supervisor"
    code, text = exit_of(res)
    assert code == ExitCode.RUN_FAILED
    assert "root cause (as the supervisors saw it): node 2 (h3) lost" in text
    assert "whose supervisors stop on their own" in text


def test_unreachable_without_a_verdict_still_means_unreachable() -> None:
    res = result(("running", ""), ("unreachable", "timed out"))
    assert peer_cause(res) == ""
    code, text = exit_of(res)
    assert code == ExitCode.UNREACHABLE and "the run may still be going" in text
    stopped_by_user = result(("stopped", "stopped with `sshddp stop`"), ("unreachable", "x"))
    assert peer_cause(stopped_by_user) == ""


def test_a_full_local_log_detaches_with_exit_74() -> None:
    why = "cannot write the local log /l/node0-h1.log: No space left on device"
    res = result(("running", ""), ("running", ""), detached=True, log_error=why)
    code, text = exit_of(res)
    assert code == ExitCode.LOG_WRITE_FAILED == 74
    assert "goes on without us (detached): cannot write the local log /l/node0-h1.log" in text
    assert "`sshddp attach r1`" in text
    plain = run_report(result(("running", ""), detached=True), [])
    assert plain.splitlines()[0] == "sshddp: run r1 goes on without us (detached)"


def test_a_failed_local_write_names_the_file_and_leaves_what_was_written(tmp_path: Path) -> None:
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    logs.write(0, b"kept\n")
    full = open("/dev/full", "wb")  # real ENOSPC on every write
    os.dup2(full.fileno(), logs._copies[0]._fd)
    with pytest.raises(LogWriteFailed) as err:
        logs.write(0, b"lost\n")
    assert err.value.message == (
        f"cannot write the local log {tmp_path / 'node0-h1.log'}: No space left on device"
    )
    assert err.value.exit_code == 74
    logs.close()
    assert (tmp_path / "node0-h1.log").read_bytes() == b"kept\n"
