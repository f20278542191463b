"""Tmux-free runs: detach, attach, logs, ps, stop, and teardown that needs no laptop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from launch_helpers import (
    JOB,
    RUN_BOUND,
    SSHDDP,
    cli_env,
    has_node_mark,
    sshddp,
    wait_until,
    write_inventory,
)

from sshddp_lab.sshd import SshdCluster


def detach(
    cluster: SshdCluster,
    tmp: Path,
    port: int,
    name: str,
    *job: str,
    hosts: list[int] | None = None,
    opts: tuple[str, ...] = (),
) -> Path:
    inv, workdir = write_inventory(cluster, tmp, port, hosts)
    r = sshddp(cluster, tmp, "launch", "--detach", "--name", name, *opts, str(inv), str(JOB), *job)
    assert r.returncode == 0, r.stderr
    assert f"sshddp attach {name}" in r.stderr
    return workdir


def remote_states(workdir: Path, run: str, n: int = 3) -> list[str]:
    import json

    out = []
    for i in range(n):
        p = workdir / "runs" / run / f"n{i}" / "exit.json"
        out.append(json.loads(p.read_text())["state"] if p.exists() else "running")
    return out


def test_detached_failure_stops_every_node_without_laptop(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    workdir = detach(ssh_env, tmp_path, free_port(), "dfail", "raise", "4")
    wait_until(
        lambda: "running" not in remote_states(workdir, "dfail"), RUN_BOUND, "all nodes to end"
    )
    assert remote_states(workdir, "dfail") == ["stopped", "stopped", "failed"]
    run_no_leak("dfail", timeout=3.0)
    ps = sshddp(ssh_env, tmp_path, "ps", "--all")
    assert ps.returncode == 0
    assert "dfail" in ps.stdout and "2:failed" in ps.stdout and "node 2 (h3) failed" in ps.stdout
    att = sshddp(ssh_env, tmp_path, "attach", "dfa")  # a unique prefix is enough
    assert att.returncode == 1, att.stderr
    assert "root cause: node 2 on h3" in att.stderr and "boom on rank 4" in att.stderr


def test_host_sigkilled_whole_is_noticed_by_the_others(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    opts = ("--heartbeat-timeout", "5")
    workdir = detach(ssh_env, tmp_path, free_port(), "dlost", "wait", opts=opts)
    log = workdir / "runs/dlost/n1/node.log"
    wait_until(lambda: log.exists() and "READY" in log.read_text(), RUN_BOUND, "node 1 ready")
    from sshddp_lab.sshd import processes_with_env

    victims = [
        pid
        for pid, cmd in processes_with_env("SSHDDP_RUN_ID", "dlost")
        if "runs/dlost/n1" in cmd or has_node_mark(pid, "dlost/n1")
    ]
    assert victims
    t0 = time.monotonic()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    took = wait_until(
        lambda: remote_states(workdir, "dlost") == ["stopped", "running", "stopped"],
        30,
        "the other nodes to stop",
    )
    assert time.monotonic() - t0 < 30 and took < 30
    run_no_leak("dlost", timeout=3.0)
    ps = sshddp(ssh_env, tmp_path, "ps", "--all")
    assert "1:lost" in ps.stdout, ps.stdout
    # ps learned of the end first: it quarantines the lost node's host, once
    assert "sshddp: run dlost: quarantined h2 until " in ps.stderr, ps.stderr
    assert ": lost (the node's supervisor died" in ps.stderr, ps.stderr
    assert "quarantined" not in sshddp(ssh_env, tmp_path, "ps", "--all").stderr
    listed = sshddp(ssh_env, tmp_path, "quarantine").stdout
    assert "h2" in listed and "dlost" in listed, listed


def test_kill9_coordinator_run_goes_on_then_attach_and_logs_match(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    proc = subprocess.Popen(
        [*SSHDDP, "launch", "--name", "k9", str(inv), str(JOB), "ok"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_until(lambda: (workdir / "runs/k9/n2/state.json").exists(), RUN_BOUND, "node 2 to start")
    proc.kill()  # kill -9: no teardown runs
    proc.wait()
    wait_until(
        lambda: remote_states(workdir, "k9") == ["succeeded"] * 3, RUN_BOUND, "the run to end"
    )
    att = sshddp(ssh_env, tmp_path, "attach", "k9")
    assert att.returncode == 0, att.stderr
    logs = sshddp(ssh_env, tmp_path, "logs", "k9", "--node", "2")
    assert logs.returncode == 0
    for node in range(3):
        local = tmp_path / "sshddp-logs" / "k9" / f"node{node}-h{node + 1}.log"
        remote = workdir / "runs" / "k9" / f"n{node}" / "node.log"
        assert local.read_bytes() == remote.read_bytes()
        text = local.read_text()
        for rank in (2 * node, 2 * node + 1):
            mine = [ln for ln in text.splitlines() if ln.startswith(f"rank {rank} line ")]
            assert mine == [f"rank {rank} line {i}" for i in range(50)]
    assert logs.stdout == (tmp_path / "sshddp-logs/k9/node2-h3.log").read_text()
    node0 = (tmp_path / "sshddp-logs/k9/node0-h1.log").read_text().splitlines(keepends=True)
    tail = sshddp(ssh_env, tmp_path, "logs", "k9", "--node", "0", "--tail", "3")
    assert tail.returncode == 0 and tail.stdout == "".join(node0[-3:])
    follow = sshddp(ssh_env, tmp_path, "logs", "k9", "--follow", "--tail", "1")
    assert follow.returncode == 0
    last = [ln.split("] ", 1)[0] for ln in follow.stdout.splitlines()]
    assert len(last) == 3, follow.stdout  # each node's last line, under the rank that wrote it
    for node, prefix in enumerate(last):
        a, b, host = 2 * node, 2 * node + 1, f"h{node + 1}"
        # torchrun's agent may write the last line (its exit barrier's complaint when a peer
        # agent left first, on a busy machine): that line carries the node's range
        assert prefix in (f"[{a} {host}", f"[{b} {host}", f"[{a}-{b} {host}"), prefix
    done = sshddp(ssh_env, tmp_path, "stop", "k9")  # a run that finished on its own: a no-op
    assert done.returncode == 0 and done.stdout.count("was already succeeded") == 3
    assert remote_states(workdir, "k9") == ["succeeded"] * 3
    run_no_leak("k9")


def test_stop_from_another_terminal_twice_and_after_the_end(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    workdir = detach(ssh_env, tmp_path, free_port(), "stp", "wait")
    wait_until(
        lambda: all((workdir / f"runs/stp/n{i}/state.json").exists() for i in range(3)),
        60,
        "all nodes to start",
    )
    first = sshddp(ssh_env, tmp_path, "stop", "stp")
    assert first.returncode == 0, first.stderr
    # Each node is stopped by this command, or by its peers a moment before its own stop
    # arrives (a stopping node stops the others): either way stopped, and nothing is left.
    lines = first.stdout.splitlines()
    assert len(lines) == 3 and first.stdout.count(": stopped") >= 1, first.stdout
    assert all(line.endswith((": stopped", ": was already stopped")) for line in lines), lines
    run_no_leak("stp", timeout=2.0)
    again = sshddp(ssh_env, tmp_path, "stop", "stp")
    assert again.returncode == 0 and again.stdout.count("was already stopped") == 3
    missing = sshddp(ssh_env, tmp_path, "stop", "nosuchrun")
    assert missing.returncode == 2 and "no run 'nosuchrun'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_two_runs_on_the_same_hosts_stop_one_keeps_other(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    wa = detach(ssh_env, a, free_port(), "twoa", "wait", hosts=[1, 2])
    wb = detach(ssh_env, b, free_port(), "twob", "wait", hosts=[1, 2])
    for w, run in ((wa, "twoa"), (wb, "twob")):
        wait_until(
            lambda w=w, run=run: all(
                (w / f"runs/{run}/n{i}/state.json").exists() for i in range(2)
            ),
            60,
            f"{run} to start",
        )
    assert sshddp(ssh_env, a, "stop", "twoa").returncode == 0
    run_no_leak("twoa", timeout=2.0)
    from sshddp_lab.sshd import processes_with_env

    assert processes_with_env("SSHDDP_RUN_ID", "twob"), "stopping one run touched the other"
    assert remote_states(wb, "twob", 2) == ["running", "running"]
    ps = sshddp(ssh_env, b, "ps")
    assert "twob" in ps.stdout and "0:running(" in ps.stdout and "1:running(" in ps.stdout
    assert sshddp(ssh_env, b, "stop", "twob").returncode == 0
    run_no_leak("twob", timeout=2.0)


def test_ps_with_a_host_unreachable_says_so(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    workdir = detach(ssh_env, tmp_path, free_port(), "psu", "wait", hosts=[1, 2])
    wait_until(lambda: (workdir / "runs/psu/n1/state.json").exists(), RUN_BOUND, "node 1 to start")
    ssh_env.stop_host(2)
    try:
        t0 = time.monotonic()
        ps = sshddp(ssh_env, tmp_path, "ps", "--connect-timeout", "3")
        assert time.monotonic() - t0 < 20
        assert "psu" in ps.stdout and "0:running" in ps.stdout and "1:unreachable" in ps.stdout
    finally:
        ssh_env.start_host(2)
    assert sshddp(ssh_env, tmp_path, "stop", "psu").returncode == 0
    run_no_leak("psu", timeout=2.0)


def test_coordinator_killed_mid_stream_reattach_has_no_gap_or_duplicate(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    argv = [*SSHDDP, "launch", "--name", "mid", str(inv), str(JOB), "stream", "600"]
    local = tmp_path / "sshddp-logs" / "mid" / "node1-h2.log"
    for tick in ("tick 50\n", "tick 250\n"):  # kill the coordinator twice mid-stream
        proc = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda t=tick: local.exists() and t in local.read_text(), RUN_BOUND, tick)
        proc.kill()
        proc.wait()
        argv = [*SSHDDP, "attach", "mid"]
        assert "running" in remote_states(workdir, "mid", 2)
    att = sshddp(ssh_env, tmp_path, "attach", "mid")
    assert att.returncode == 0, att.stderr
    for node in range(2):
        path = tmp_path / "sshddp-logs" / "mid" / f"node{node}-h{node + 1}.log"
        assert path.read_bytes() == (workdir / f"runs/mid/n{node}/node.log").read_bytes()
        lines = path.read_text().splitlines()
        for rank in (2 * node, 2 * node + 1):
            ticks = [ln for ln in lines if ln.startswith(f"rank {rank} tick ")]
            assert ticks == [f"rank {rank} tick {i}" for i in range(600)]
    run_no_leak("mid")


def test_attach_then_ctrl_backslash_says_the_nodes_run_on(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Ctrl-\\ (SIGQUIT) detaches an attach before any node wrote a new line: the summary
    says every node is running, as it is, not pending."""
    workdir = detach(ssh_env, tmp_path, free_port(), "aq", "wait", hosts=[1, 2])
    logs = [workdir / "runs" / "aq" / f"n{k}" / "node.log" for k in range(2)]
    wait_until(lambda: all(p.exists() and "READY" in p.read_text() for p in logs), 120, "READY")
    try:
        attach = subprocess.Popen(
            [*SSHDDP, "attach", "aq"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert attach.stderr is not None
        line = attach.stderr.readline()
        assert "attached to run aq" in line, line
        attach.send_signal(signal.SIGQUIT)  # the banner is out: Ctrl-\ detaches from now on
        _, err = attach.communicate(timeout=60)
        assert attach.returncode == 0, err
        assert "run aq goes on without us (detached)" in err, err
        for node, host in enumerate(["h1", "h2"]):
            assert f"node {node:<3} {host:<20} running" in err, err
        assert "pending" not in err, err
    finally:
        stopped = sshddp(ssh_env, tmp_path, "stop", "aq")
    assert stopped.returncode == 0, stopped.stderr
    run_no_leak("aq")


def test_logs_follow_interrupted_before_it_follows_says_what_it_says_while_following(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Ctrl-C while `logs -f` still prints what the node wrote (here: a reader that takes
    none of its 300 kB) says the same as a Ctrl-C once it follows: the run goes on."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), [1], nproc=1)
    write = "head -c 300000 /dev/zero | tr '\\0' x | fold -w 99; exec sleep 600"
    launch = ["launch", "--launcher", "node", "--detach", "--name", "lfi", str(inv)]
    r = sshddp(ssh_env, tmp_path, *launch, "--", "sh", "-c", write)
    assert r.returncode == 0, r.stderr
    try:
        remote = workdir / "runs" / "lfi" / "n0" / "node.log"
        wait_until(lambda: remote.exists() and remote.stat().st_size >= 303_000, 60, "the log")
        env = cli_env(ssh_env)
        logs = subprocess.Popen(
            [*SSHDDP, "logs", "-f", "lfi"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        local = tmp_path / "sshddp-logs" / "lfi" / "node0-h1.log"
        wait_until(lambda: local.exists() and local.stat().st_size >= 303_000, 60, "the copy")
        time.sleep(0.5)  # the copy is whole: now it prints, into a pipe nobody reads
        logs.send_signal(signal.SIGINT)
        err = logs.stderr.read().decode() if logs.stderr else ""
        assert logs.wait(timeout=30) == 130, err
        assert "stopped following run lfi; it goes on" in err, err
    finally:  # the run sleeps: it must not outlive a failed assertion
        assert sshddp(ssh_env, tmp_path, "stop", "lfi").returncode == 0
    run_no_leak("lfi")
