"""--max-restarts across nodes against real runs: real sshd hosts, real torchrun, gloo on
CPU, 3 hosts x 2 ranks; attached and detached (no coordinator: the supervisors restart).

``payloads/flaky.py``: rank 5 (node 2, h3) exits with code 1 in the first attempt only, or
in every attempt. Every rank starts a child process that must not survive a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any, Callable

from launch_helpers import has_node_mark, sshddp, wait_until, write_inventory
from test_watchdogs import wait_finished

from sshddp_lab.sshd import SshdCluster, processes_with_env

FLAKY = Path(__file__).parent / "payloads" / "flaky.py"
RUN_FAILED = 1
WHY = "node 2 (h3) failed: rank 5 exited with code 1"
SUM = 126.0  # ranks 1..6 all-reduced (21), then all-reduced again by 6 ranks


def node_dir(workdir: Path, run: str, node: int) -> Path:
    return workdir / "runs" / run / f"n{node}"


def attempts_of(workdir: Path, run: str, node: int) -> dict[str, Any]:
    return dict(json.loads((node_dir(workdir, run, node) / "attempts.json").read_text()))


def exit_of(workdir: Path, run: str, node: int) -> dict[str, Any]:
    return dict(json.loads((node_dir(workdir, run, node) / "exit.json").read_text()))


def summaries(log: bytes) -> list[dict[str, Any]]:
    lines = log.decode().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def assert_second_attempt_succeeded(workdir: Path, run: str) -> None:
    """Every node ran attempt 2 from where attempts.json says, all-reduced the right sum
    there, and its first attempt's output (rank 5's failure, on node 2) lies before."""
    for node in range(3):
        record = attempts_of(workdir, run, node)
        assert record["max_attempts"] == 3, record
        first, second = record["attempts"]
        assert (first["attempt"], first["offset"], first["reason"]) == (1, 0, ""), record
        assert first["standby"] is False, record  # attempt 1's torchrun starts with the node
        assert second["attempt"] == 2, record
        # attempt 2's torchrun was the standby started with attempt 1 (torch imported)
        assert second["standby"] is True, record
        assert second["reason"] == "node 2 (h3) failed: rank 5 exited with code 1", record
        log = (node_dir(workdir, run, node) / "node.log").read_bytes()
        before, after = log[: second["offset"]], log[second["offset"] :]
        assert b"attempt 1 rank" in before and b"attempt 1 rank" not in after, log
        assert b"attempt 2 rank" not in before, log
        done = summaries(after)
        assert sorted(d["rank"] for d in done) == [2 * node, 2 * node + 1], log
        assert all(d["sum"] == SUM and d["attempt"] == 2 for d in done), done
        ended = exit_of(workdir, run, node)
        assert ended["state"] == "succeeded" and ended["attempt"] == 2, ended
        assert ended["attempts"] == 3 and len(ended["earlier"]) == 1, ended
    assert b"attempt 1 rank 5 fails" in (node_dir(workdir, run, 2) / "node.log").read_bytes()


def assert_three_attempts_failed(workdir: Path, run: str) -> None:
    for node in range(3):
        record = attempts_of(workdir, run, node)
        assert [a["attempt"] for a in record["attempts"]] == [1, 2, 3], record
        assert [a["standby"] for a in record["attempts"]][1:] == [True, True], record
        ended = exit_of(workdir, run, node)
        assert ended["attempt"] == 3 and ended["attempts"] == 3, ended
        assert ended["earlier"] == ["node 2 (h3) failed: rank 5 exited with code 1"] * 2, ended
        assert ended["state"] == ("failed" if node == 2 else "stopped"), ended
    log = (node_dir(workdir, run, 2) / "node.log").read_bytes()
    assert [f"attempt {k} rank 5 fails".encode() in log for k in (1, 2, 3)] == [True] * 3


def test_a_rank_that_fails_once_restarts_every_node_and_the_run_succeeds(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Attached, --max-restarts 2: rank 5 fails in attempt 1; every node stops, then all
    start attempt 2 together and succeed. The console says so; the report says attempt 2
    of 3 and why attempt 1 ended; the local logs are the nodes' bytes."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--name", "rs1", "--max-restarts", "2", str(inv), str(FLAKY), "once", "5"]
    done = sshddp(ssh_env, tmp_path, "launch", *args, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    said = f"sshddp: attempt 2 of 3: {WHY}; restarting every node"
    assert said in done.stdout, done.stdout  # the console: among the ranks' lines
    report = done.stderr[done.stderr.index("sshddp: run rs1 succeeded") :]
    assert f"\nattempt 2 of 3\n  attempt 1 ended: {WHY}; every node restarted" in report
    assert_second_attempt_succeeded(workdir, "rs1")
    for node in range(3):
        local = tmp_path / "sshddp-logs" / "rs1" / f"node{node}-h{node + 1}.log"
        assert local.read_bytes() == (node_dir(workdir, "rs1", node) / "node.log").read_bytes()
    run_no_leak("rs1")


def test_a_rank_that_always_fails_ends_after_three_attempts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Attached, --max-restarts 2: rank 5 fails every time: 3 attempts, then the report
    (attempt 3 of 3, why attempts 1 and 2 ended, the root cause) and exit code 1."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--name", "rs2", "--max-restarts", "2", str(inv), str(FLAKY), "always", "5"]
    done = sshddp(ssh_env, tmp_path, "launch", *args, timeout=300)
    assert done.returncode == RUN_FAILED, done.stderr
    report = done.stderr[done.stderr.index("sshddp: run rs2 failed") :]
    assert "\nattempt 3 of 3\n" in report, report
    why = "node 2 (h3) failed: rank 5 exited with code 1; every node restarted"
    assert f"  attempt 1 ended: {why}\n  attempt 2 ended: {why}\n" in report, report
    assert "root cause: node 2 on h3, global rank 5 (local rank 1)" in report, report
    assert_three_attempts_failed(workdir, "rs2")
    run_no_leak("rs2")


def test_detached_restart_succeeds_with_no_coordinator(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached: the supervisors restart every node on their own; attempt 2 succeeds."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--detach", "--name", "rs3", "--max-restarts", "2", str(inv), str(FLAKY)]
    started = sshddp(ssh_env, tmp_path, "launch", *args, "once", "5")
    assert started.returncode == 0, started.stderr
    row = wait_finished(ssh_env, tmp_path, "rs3", 240)
    assert [n["state"] for n in row["nodes"]] == ["succeeded"] * 3, row
    assert_second_attempt_succeeded(workdir, "rs3")
    shown = sshddp(ssh_env, tmp_path, "logs", "rs3")
    assert shown.returncode == 0, shown.stderr
    for node in range(3):
        mark = f"sshddp: node {node} (h{node + 1}): attempt 2 of 3 starts here; attempt 1 ended: "
        assert mark + WHY in shown.stdout + shown.stderr, shown
    alone = sshddp(ssh_env, tmp_path, "logs", "--node", "1", "rs3")  # stdout: the node's bytes
    assert alone.stdout.encode() == (node_dir(workdir, "rs3", 1) / "node.log").read_bytes()
    assert "attempt 2 of 3 starts here" in alone.stderr, alone.stderr
    run_no_leak("rs3")


def test_detached_always_failing_rank_ends_after_three_attempts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached: 3 attempts, then the run ends failed with no coordinator."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--detach", "--name", "rs4", "--max-restarts", "2", str(inv), str(FLAKY)]
    started = sshddp(ssh_env, tmp_path, "launch", *args, "always", "5")
    assert started.returncode == 0, started.stderr
    row = wait_finished(ssh_env, tmp_path, "rs4", 300)
    assert [n["state"] for n in row["nodes"]] == ["stopped", "stopped", "failed"], row
    assert_three_attempts_failed(workdir, "rs4")
    run_no_leak("rs4")


def test_a_lost_node_is_not_restarted_into_a_hang(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached, --max-restarts 2, every rank all-reducing: node 1's supervisor, torchrun
    and ranks are SIGKILLed (its host is gone). The others' ranks fail, but node 0 does not
    restart a run that lost a node: nodes 0 and 2 end in attempt 1 of 3."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--detach", "--name", "rs5", "--max-restarts", "2", str(inv), str(FLAKY)]
    started = sshddp(ssh_env, tmp_path, "launch", *args, "loop", "0")
    assert started.returncode == 0, started.stderr
    logs = [node_dir(workdir, "rs5", n) / "node.log" for n in range(3)]
    wait_until(lambda: all(b"ready" in p.read_bytes() for p in logs if p.exists()), 120, "ready")
    wait_until(lambda: sum(p.read_bytes().count(b" ready") for p in logs) == 6, 120, "6 ranks")
    state = json.loads((node_dir(workdir, "rs5", 1) / "state.json").read_text())
    victims = [
        pid
        for pid, _ in processes_with_env("SSHDDP_RUN_ID", "rs5")
        if pid == state["supervisor_pid"] or has_node_mark(pid, "rs5/n1")
    ]
    assert state["supervisor_pid"] in victims and len(victims) >= 4, victims
    for pid in victims:  # the supervisor first: it must not see its node end
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    ended = [node_dir(workdir, "rs5", n) / "exit.json" for n in (0, 2)]
    wait_until(lambda: all(p.exists() for p in ended), 120, "nodes 0 and 2 to end")
    for node in (0, 2):
        record = exit_of(workdir, "rs5", node)
        assert record["state"] in ("stopped", "failed"), record
        assert (record["attempt"], record["earlier"]) == (1, []), record
        assert len(attempts_of(workdir, "rs5", node)["attempts"]) == 1
    reason = exit_of(workdir, "rs5", 0)["reason"]
    assert "node 1 (h2)" in reason, reason
    run_no_leak("rs5")
