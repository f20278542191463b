"""Quarantine for real: a host killed mid-run (its sshd stopped, its processes SIGKILLed) is
quarantined with the reason, listed, keeps the next launch of the same inventory out until
it is cleared; a rank that raises quarantines nobody. No process of a run survives."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Callable

from launch_helpers import JOB, finish, has_node_mark, sshddp, start, wait_until
from test_faults_infra import _kill_sshd_and_sessions, contains, loopback_inv, remote_log

from sshddp_lab.sshd import SshdCluster, processes_with_env


def _kill_node(run: str, workdir: Path, node: int) -> None:
    """SIGKILL every process of node ``node`` (its supervisor, torchrun, its ranks)."""
    state = json.loads((workdir / "runs" / run / f"n{node}" / "state.json").read_text())
    victims = [
        pid
        for pid, _ in processes_with_env("SSHDDP_RUN_ID", run)
        if pid == state["supervisor_pid"] or has_node_mark(pid, f"{run}/n{node}")
    ]
    assert state["supervisor_pid"] in victims, victims
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_host_killed_mid_run_is_quarantined_until_cleared(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
) -> None:
    cluster = make_cluster(3)
    inv, workdir = loopback_inv(tmp_path, free_port(), 3)
    run = "quar"
    opts = ["--no-check", "--grace", "2", "--heartbeat-timeout", "5"]
    proc = start(
        cluster, tmp_path, "launch", *opts, "--name", run, str(inv), str(JOB), "stream", "100000"
    )
    try:
        wait_until(
            lambda: all(
                contains(remote_log(workdir, run, n), f"rank {n} tick 20\n") for n in range(3)
            ),
            90,
            "every rank to stream",
        )
        assert _kill_sshd_and_sessions(cluster, 3) >= 1, "no connection to h3 to cut"
        _kill_node(run, workdir, 2)
        rc, err = finish(proc, 150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1 and "Traceback" not in err, err  # the run ends as it always did
    assert "root cause (as the supervisors saw it): node 2 (h3) lost" in err, err
    said = [line for line in err.splitlines() if line.startswith("sshddp: quarantined")]
    assert len(said) == 1 and said[0].startswith("sshddp: quarantined h3 until "), err
    assert ": lost (node 2 (h3) lost" in said[0], said
    run_no_leak(run)

    listed = sshddp(cluster, tmp_path, "quarantine", "--json")
    (entry,) = json.loads(listed.stdout)["hosts"]
    assert entry["host"] == "h3" and entry["reason"] == "lost" and entry["run_id"] == run
    assert "h3" in sshddp(cluster, tmp_path, "quarantine").stdout

    cluster.start_host(3)
    again = sshddp(cluster, tmp_path, "launch", "--no-check", "--name", "quar2", inv, JOB, "ok")
    assert again.returncode == 3 and "Traceback" not in again.stderr, again.stderr
    (refusal,) = again.stderr.strip().splitlines()
    assert "h3 is quarantined until" in refusal and "sshddp quarantine --clear h3" in refusal
    assert "--ignore-quarantine" in refusal

    cleared = sshddp(cluster, tmp_path, "quarantine", "--clear", "h3")
    assert cleared.returncode == 0, cleared.stderr
    ok = sshddp(cluster, tmp_path, "launch", "--no-check", "--name", "quar3", inv, JOB, "ok")
    assert ok.returncode == 0, ok.stderr
    assert "quarantined" not in ok.stderr
    run_no_leak("quar3")


def test_a_rank_that_raises_quarantines_nobody(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, _ = loopback_inv(tmp_path, free_port(), 3)
    failed = sshddp(
        ssh_env, tmp_path, "launch", "--no-check", "--name", "qraise", inv, JOB, "raise", "1"
    )
    assert failed.returncode == 1 and "RuntimeError" in failed.stderr, failed.stderr
    assert "quarantined" not in failed.stderr, failed.stderr
    listed = sshddp(ssh_env, tmp_path, "quarantine", "--json")
    assert json.loads(listed.stdout) == {"hosts": []}, listed.stderr
    run_no_leak("qraise")


def test_a_host_unreachable_at_launch_is_quarantined_doctor_marks_it_and_it_can_be_ignored(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
) -> None:
    cluster = make_cluster(2)
    inv, _ = loopback_inv(tmp_path, free_port(), 2)
    cluster.stop_host(2)
    down = sshddp(
        cluster, tmp_path, "launch", "--connect-timeout", "3", "--name", "qdown", inv, JOB, "ok"
    )
    assert down.returncode == 3 and "Traceback" not in down.stderr, down.stderr
    said = [line for line in down.stderr.splitlines() if line.startswith("sshddp: quarantined")]
    assert len(said) == 1 and "quarantined h2 until" in said[0], down.stderr
    assert "unreachable at launch" in said[0] and "connection refused" in said[0], said

    cluster.start_host(2)
    doctor = sshddp(cluster, tmp_path, "doctor", "--json", inv)
    hosts = {h["host"]: h["findings"] for h in json.loads(doctor.stdout)["hosts"]}
    marks = [f for f in hosts["h2"] if f["check"] == "quarantine"]
    assert [m["status"] for m in marks] == ["warn"], hosts["h2"]
    assert marks[0]["fix"] == "sshddp quarantine --clear h2"
    assert not [f for f in hosts["h1"] if f["check"] == "quarantine"]

    ok = sshddp(
        cluster,
        tmp_path,
        "launch",
        "--no-check",
        "--ignore-quarantine",
        "--name",
        "qign",
        inv,
        JOB,
        "ok",
    )
    assert ok.returncode == 0, ok.stderr
    assert [
        e["host"]
        for e in json.loads(sshddp(cluster, tmp_path, "quarantine", "--json").stdout)["hosts"]
    ] == ["h2"]
    run_no_leak("qign")
