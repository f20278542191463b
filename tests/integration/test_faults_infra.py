"""Infrastructure faults injected for real: a network partition, sshd killed, the rendezvous
host lost, a remote disk full, a local log directory unwritable or full.

Nothing is mocked. Every test checks the run's outcome, the exit code, the report text,
that no process of the run survives on any host, and the local logs against the remote ones
where the fault leaves them comparable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from launch_helpers import JOB, SSHDDP, cli_env, finish, has_node_mark, sshddp, start, wait_until

from sshddp_lab.netns import INNER_IFNAME, Netns, NetnsCluster
from sshddp_lab.sshd import SshdCluster, processes_with_env

BOUND = 60.0  # generous upper bound for anything that should take seconds


# ----------------------------------------------------------------------------- helpers


def exit_record(workdir: Path, run: str, node: int) -> dict[str, Any] | None:
    path = workdir / "runs" / run / f"n{node}" / "exit.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def remote_log(workdir: Path, run: str, node: int) -> Path:
    return workdir / "runs" / run / f"n{node}" / "node.log"


def local_log(cwd: Path, run: str, node: int, log_dir: str = "sshddp-logs") -> Path:
    return cwd / log_dir / run / f"node{node}-h{node + 1}.log"


def contains(path: Path, text: str) -> bool:
    try:
        return text.encode() in path.read_bytes()
    except OSError:
        return False


def write_inv(
    tmp: Path, port: int, hosts: list[dict[str, Any]], workdir: Path, env: dict[str, str]
) -> Path:
    doc = {
        "defaults": {"python": sys.executable, "workdir": str(workdir), "env": env},
        "rendezvous": {"port": port},
        "hosts": hosts,
    }
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def loopback_inv(tmp: Path, port: int, n: int, **host_extra: dict[str, Any]) -> tuple[Path, Path]:
    """An inventory of session hosts h1..hn (1 rank each); ``h2={...}`` adds keys to h2."""
    workdir = tmp / "remote"
    hosts = [{"host": f"h{i}", "nproc": 1, **host_extra.get(f"h{i}", {})} for i in range(1, n + 1)]
    return write_inv(tmp, port, hosts, workdir, {"GLOO_SOCKET_IFNAME": "lo"}), workdir


def run_pids_in(net: Netns, host: int, run: str) -> list[tuple[int, str]]:
    """Processes of the run living in host ``host``'s network namespace."""
    inside = set(net.pids(host))
    return [(pid, cmd) for pid, cmd in processes_with_env("SSHDDP_RUN_ID", run) if pid in inside]


def assert_same_log(
    cwd: Path, workdir: Path, run: str, node: int, log_dir: str = "sshddp-logs"
) -> None:
    """The local copy of a node's log is byte for byte what the node wrote."""
    local = local_log(cwd, run, node, log_dir).read_bytes()
    assert local == remote_log(workdir, run, node).read_bytes(), f"node {node}: logs differ"


def ticks(text: str, rank: int) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"rank {rank} tick ")]


def assert_whole_ticks(text: str, rank: int, at_least: int = 1) -> None:
    """Rank ``rank``'s tick lines are 0, 1, 2, ... with no gap and no duplicate."""
    mine = ticks(text, rank)
    assert len(mine) >= at_least, f"rank {rank}: only {len(mine)} tick lines"
    assert mine == [f"rank {rank} tick {i}" for i in range(len(mine))], f"rank {rank}: gap/dup"


# ------------------------------------------------------------------- 1. network partition


def test_partitioned_node_stops_everywhere_and_is_reported(
    netns_cluster: NetnsCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Host h3 (node 2) loses its link mid-run. Nodes 0 and 1 hear nothing from it past the
    heartbeat timeout and stop; node 2, cut off from node 0's supervisor, stops itself. The
    coordinator reports h3 unreachable and the peers' verdict that it was lost."""
    net, cluster = netns_cluster.net, netns_cluster
    hosts = [{"host": f"h{i}", "nproc": 1, "addr": net.addr(i)} for i in (1, 2, 3)]
    workdir = tmp_path / "remote"
    inv = write_inv(tmp_path, free_port(), hosts, workdir, {"GLOO_SOCKET_IFNAME": INNER_IFNAME})
    run = "part"
    proc = start(
        cluster,
        tmp_path,
        "launch",
        "--name",
        run,
        "--heartbeat-timeout",
        "5",
        "--grace",
        "2",
        "--connect-timeout",
        "3",
        str(inv),
        str(JOB),
        "stream",
        "100000",
    )
    try:
        wait_until(
            lambda: all(
                contains(remote_log(workdir, run, n), f"rank {n} tick 20\n") for n in range(3)
            ),
            90,
            "every rank to stream",
        )
        net.cut(3)
        # The reachable nodes stop within the heartbeat timeout plus the grace, give or take.
        wait_until(
            lambda: all(exit_record(workdir, run, n) for n in (0, 1)),
            BOUND,
            "nodes 0 and 1 to stop",
        )
        for node in (0, 1):
            rec = exit_record(workdir, run, node)
            assert rec is not None and rec["state"] == "stopped", rec
            assert "node 2 (h3) lost" in rec["reason"], rec
        wait_until(
            lambda: not run_pids_in(net, 1, run) and not run_pids_in(net, 2, run),
            10,
            "no process of the run on h1 and h2",
        )
        rc, err = finish(proc, 150)  # h3's connection: dead-link detection, then reconnects
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, err  # the run failed: the supervisors lost node 2
    assert "Traceback" not in err
    assert "run part failed; lost contact with some hosts" in err, err
    assert "node 2   h3" in err and "unreachable" in err, err
    assert "root cause (as the supervisors saw it): node 2 (h3) lost" in err, err
    for node in (0, 1):  # reached throughout: the local copy is the remote log
        assert_same_log(tmp_path, workdir, run, node)
    partial = local_log(tmp_path, run, 2).read_bytes()
    assert remote_log(workdir, run, 2).read_bytes().startswith(partial)

    # Still cut off: h3's own supervisor stopped its node when it lost node 0's.
    assert not run_pids_in(net, 3, run), run_pids_in(net, 3, run)
    rec2 = exit_record(workdir, run, 2)
    assert rec2 is not None and rec2["state"] == "stopped", rec2
    assert "node 0 (h1) went silent" in rec2["reason"], rec2
    net.heal(3)
    run_no_leak(run, timeout=5.0)
    logs = sshddp(cluster, tmp_path, "logs", run, "--node", "2")  # the rest of h3's log
    assert logs.returncode == 0, logs.stderr
    for node in range(3):
        assert_same_log(tmp_path, workdir, run, node)
        assert_whole_ticks(local_log(tmp_path, run, node).read_text(), node, at_least=21)


# ------------------------------------------------------------------- 2. sshd killed


def _kill_sshd_and_sessions(cluster: SshdCluster, i: int) -> int:
    """Stop host ``i``'s listening sshd and SIGKILL its per-connection handlers."""
    from sshddp_lab.sshd import _connection_handlers

    h = cluster.host(i)
    cluster.stop_host(i)
    handlers = _connection_handlers({(h.addr, h.port)})
    for p in handlers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    return len(handlers)


def test_sshd_killed_mid_run_the_run_goes_on_and_the_coordinator_resumes(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """sshd on h2 dies with its sessions mid-run, then comes back.

    Killing only the listening sshd (what `systemctl restart ssh` does) cuts nothing: each
    connection has its own sshd process, so the coordinator's stream would never notice. A
    crash that takes the sessions too (OOM killer, `systemctl stop ssh` killing the unit's
    cgroup, a reboot of the network stack) is the real fault, so the test also SIGKILLs the
    connection handlers, found by their socket. The run must go on (its supervisor owns it,
    not SSH); the attached coordinator says it lost the connection, retries, reconnects once
    sshd is back, and resumes from its local copy's size: no gap, no duplicate, exit 0.
    h2 runs two ranks: its log's index (which rank wrote each span) resumes with the log.
    """
    inv, workdir = loopback_inv(tmp_path, free_port(), 2, h2={"nproc": 2})
    run, out = "sshdk", tmp_path / "coordinator.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [*SSHDDP, "launch", "--no-check", "--name", run, str(inv), str(JOB), "stream", "1500"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            text=True,
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
    try:
        wait_until(
            lambda: contains(local_log(tmp_path, run, 1), "rank 1 tick 100\n"),
            90,
            "node 1 to stream",
        )
        try:
            assert _kill_sshd_and_sessions(ssh_env, 2) >= 1, "no connection to h2 to cut"

            def node1_ticks() -> int:
                return len(ticks(remote_log(workdir, run, 1).read_text(), 1))

            before = node1_ticks()
            # The run goes on without sshd: node 1 keeps writing its log.
            wait_until(
                lambda: node1_ticks() > before + 100, BOUND, "node 1 to go on while sshd is down"
            )
            wait_until(
                lambda: "lost the connection to node 1 (h2)" in out.read_text(),
                BOUND,
                "the coordinator to notice",
            )
            assert proc.poll() is None, "the coordinator gave up while retrying"
        finally:
            ssh_env.start_host(2)
        rc, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err
    assert "Traceback" not in err and f"run {run} succeeded" in err, err
    assert "reconnecting for up to 30 s (the run goes on there)" in out.read_text()
    for node in range(2):
        local = local_log(tmp_path, run, node)
        assert local.read_bytes() == remote_log(workdir, run, node).read_bytes()
        assert_whole_ticks(local.read_text(), node, at_least=1500)
        assert len(ticks(local.read_text(), node)) == 1500
    index = local_log(tmp_path, run, 1).with_suffix(".idx").read_bytes()
    assert index == (remote_log(workdir, run, 1).parent / "node.idx").read_bytes()
    log = local_log(tmp_path, run, 1).read_bytes()
    mine: dict[int, bytes] = {0: b"", 1: b""}
    for offset, length, source in struct.iter_unpack("<QIi", index):
        if source >= 0:
            mine[source] += log[offset : offset + length]
    for local_rank, rank in ((0, 1), (1, 2)):  # each span of the node's ranks is theirs
        text = mine[local_rank].decode()
        assert ticks(text, rank) == [f"rank {rank} tick {i}" for i in range(1500)], rank
        assert not ticks(text, 3 - rank), f"rank {3 - rank}'s lines in rank {rank}'s spans"
    run_no_leak(run)


# ------------------------------------------------------------------- 3. node 0 lost


def test_rendezvous_host_lost_every_other_node_stops_itself(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Every process of the run on h1 (node 0: torchrun's store and the supervisors' hub) is
    SIGKILLed at once, as when the host dies. The other supervisors lose their connection to
    the hub and stop their nodes on their own; the coordinator reports node 0 lost."""
    inv, workdir = loopback_inv(tmp_path, free_port(), 3)
    run = "lost0"
    proc = start(
        ssh_env,
        tmp_path,
        "launch",
        "--no-check",
        "--name",
        run,
        "--grace",
        "2",
        "--heartbeat-timeout",
        "5",
        str(inv),
        str(JOB),
        "stream",
        "100000",
    )
    try:
        wait_until(
            lambda: all(
                contains(remote_log(workdir, run, n), f"rank {n} tick 20\n") for n in range(3)
            ),
            90,
            "every rank to stream",
        )
        supervisor = json.loads((workdir / "runs" / run / "n0" / "state.json").read_text())[
            "supervisor_pid"
        ]
        victims = [
            pid
            for pid, cmd in processes_with_env("SSHDDP_RUN_ID", run)
            if pid == supervisor or has_node_mark(pid, f"{run}/n0")
        ]
        assert supervisor in victims and len(victims) >= 3, victims  # and torchrun, the rank
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: all(exit_record(workdir, run, n) for n in (1, 2)),
            BOUND,
            "nodes 1 and 2 to stop",
        )
        rc, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    for node in (1, 2):
        rec = exit_record(workdir, run, node)
        assert rec is not None and rec["state"] == "stopped", rec
        assert "node 0 (h1)" in rec["reason"], rec
    assert exit_record(workdir, run, 0) is None  # nobody was left on h1 to write it
    assert rc == 1, err
    assert "Traceback" not in err and f"run {run} failed" in err, err
    assert "root cause: node 0 on h1: the node's supervisor died" in err, err
    assert "node 0   h1                   lost" in err, err
    run_no_leak(run)
    for node in range(3):
        local = local_log(tmp_path, run, node)
        assert local.read_bytes() == remote_log(workdir, run, node).read_bytes()
        assert_whole_ticks(local.read_text(), node, at_least=21)


# ------------------------------------------------------------------- 4. remote disk full


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a small tmpfs (a full disk to be) at a path; unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path, size: str = "4m", *opts: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        options = ",".join((f"size={size}", "mode=0700", *opts))
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "sshddp-test", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.fail(
                f"cannot mount a tmpfs at {path} (needs root; CI runs as root): {r.stderr.strip()}"
            )
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_remote_disk_too_small_for_the_code_is_refused_before_anything_starts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], small_disk, run_no_leak
) -> None:
    """h2's run directories live on a 4 MB disk; the script is 6 MB. The preflight's disk
    check names h2 and stops the launch with exit 3 before any node starts. With --no-check
    staging the code fails on h2 with "No space left on device": no node starts anywhere
    (every node stages before any starts), h1 removes what it staged, exit 1."""
    h2_workdir = tmp_path / "remote-h2"
    small_disk(h2_workdir / "runs")
    inv, workdir = loopback_inv(tmp_path, free_port(), 2, h2={"workdir": str(h2_workdir)})
    big = tmp_path / "big.py"
    big.write_text(JOB.read_text() + "\n# " + "x" * (6 << 20) + "\n")

    r = sshddp(ssh_env, tmp_path, "launch", "--name", "full1", str(inv), str(big), "ok")
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "Traceback" not in out and "nothing was started" in out, out
    assert "FAIL h2 disk: only" in out and "No space left on device" in out, out
    assert f"{h2_workdir}/runs" in out, out
    assert not (workdir / "runs").exists() and os.listdir(h2_workdir / "runs") == []
    run_no_leak("full1", timeout=1.0)

    r = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--no-check",
        "--name",
        "full2",
        "--grace",
        "2",
        str(inv),
        str(big),
        "ok",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out, out
    assert "root cause: node 1 on h2:" in out and "No space left on device" in out, out
    assert "not started: node 1 (h2) could not be staged" in out, out
    assert not (workdir / "runs" / "full2").exists(), "h1 kept a staged node"
    assert os.listdir(h2_workdir / "runs") == [], "h2 kept a half-written node"
    run_no_leak("full2")


def test_remote_log_disk_full_fails_the_node_with_a_clear_reason(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], small_disk, run_no_leak
) -> None:
    """Rank 1 prints 8 MB onto h2, whose run directory is a 4 MB disk. node.log stops growing
    when the disk is full; the supervisor then stops its node (output that cannot be kept
    must not vanish silently) and records why, the peers stop node 0, and the report names
    h2 and the full disk. The local copy is exactly what h2's node.log kept."""
    h2_workdir = tmp_path / "remote-h2"
    small_disk(h2_workdir / "runs")
    inv, workdir = loopback_inv(tmp_path, free_port(), 2, h2={"workdir": str(h2_workdir)})
    run = "logfull"
    r = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--no-check",
        "--name",
        run,
        "--grace",
        "2",
        str(inv),
        str(JOB),
        "flood",
        "8",
    )
    err = r.stderr[-3000:]  # the report's tail holds 20 lines of 1 KB
    assert r.returncode == 1, err
    assert "Traceback" not in r.stderr, err  # the ranks' own (stdout) may show one: SIGTERM
    rec1 = exit_record(h2_workdir, run, 1)
    assert rec1 is not None and rec1["state"] == "failed", rec1
    assert "is full (No space left on device): node.log cannot grow" in rec1["reason"], rec1
    assert "root cause: node 1 on h2: the disk of" in r.stderr, err
    assert "node.log cannot grow, so the node was stopped" in r.stderr, err
    rec0 = exit_record(workdir, run, 0)
    assert rec0 is not None and rec0["state"] == "stopped", rec0
    assert "node 1 (h2) failed" in rec0["reason"], rec0
    kept = remote_log(h2_workdir, run, 1).read_bytes()
    assert 0 < len(kept) < 4 << 20 and b"FLOODED 1" not in kept
    assert local_log(tmp_path, run, 1).read_bytes() == kept
    assert local_log(tmp_path, run, 0).read_bytes() == remote_log(workdir, run, 0).read_bytes()
    assert not (h2_workdir / "runs" / run / "n1" / "reserve").exists()
    run_no_leak(run)


# ------------------------------------------------------------------- 5. local log directory


def test_unwritable_log_dir_is_bad_input_before_anything_starts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], small_disk, run_no_leak
) -> None:
    """--log-dir on a read-only file system (root ignores mode bits, not a read-only mount),
    and under a regular file: exit 2, one paragraph naming the path, no host touched."""
    inv, workdir = loopback_inv(tmp_path, free_port(), 2)
    readonly = small_disk(tmp_path / "ro", "1m", "ro")
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    cases = ((readonly / "logs", "Read-only file system"), (afile / "x", "Not a directory"))
    for n, (log_dir, why) in enumerate(cases):
        name = f"ro{n}"
        r = sshddp(
            ssh_env,
            tmp_path,
            "launch",
            "--log-dir",
            str(log_dir),
            "--name",
            name,
            str(inv),
            str(JOB),
            "ok",
        )
        assert r.returncode == 2, r.stderr
        assert r.stdout == "" and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"sshddp: error: log directory {log_dir}/{name}: "), r.stderr
        assert f"cannot write there ({why}); pass --log-dir" in r.stderr, r.stderr
        assert r.stderr.count("\n") <= 2, r.stderr  # one paragraph (message and its fix)
        assert not (workdir / "runs").exists()  # nothing reached any host
        run_no_leak(name, timeout=0.5)
    ps = sshddp(ssh_env, tmp_path, "ps", "--all")
    assert ps.returncode == 0 and "ro0" not in ps.stdout and "ro1" not in ps.stdout


def test_local_log_disk_full_detaches_and_attach_completes_the_logs(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], small_disk, run_no_leak
) -> None:
    """The local --log-dir is a 2 MB disk and rank 1 prints 4 MB. The coordinator cannot
    keep the logs, so it detaches (exit 74) and says how to finish: the run goes on, the
    hosts keep every byte, and the local files hold an exact prefix (nothing half-written,
    nothing that passes as complete). With room again, `sshddp attach` completes them."""
    inv, workdir = loopback_inv(tmp_path, free_port(), 2)
    logs = small_disk(tmp_path / "small-logs", "2m")
    run = "lfull"
    r = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--no-check",
        "--name",
        run,
        "--log-dir",
        str(logs),
        str(inv),
        str(JOB),
        "flood",
        "4",
        "exit",
    )
    assert r.returncode == 74, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    full = re.search(r"cannot write the local log (\S+): No space left on device\. ", r.stderr)
    assert full and full.group(1) in {str(logs / run / f"node{n}-h{n + 1}.log") for n in (0, 1)}
    assert f"free space, then `sshddp attach {run}`" in r.stderr, r.stderr
    assert "node 0   h1                   running" in r.stderr, r.stderr
    wait_until(
        lambda: all(exit_record(workdir, run, n) for n in range(2)),
        BOUND,
        "the run to finish on the hosts",
    )
    for n in range(2):  # it went on after we left, to the end
        assert (exit_record(workdir, run, n) or {}).get("state") == "succeeded"
    local = [(logs / run / f"node{n}-h{n + 1}.log").read_bytes() for n in range(2)]
    remote = [remote_log(workdir, run, n).read_bytes() for n in range(2)]
    assert all(f"FLOODED {n}".encode() in remote[n] for n in range(2))
    assert all(remote[n].startswith(local[n]) for n in range(2)), "local logs: not a prefix"
    cut = int(Path(full.group(1)).name[len("node")])  # the node whose local log filled up
    assert len(local[cut]) < len(remote[cut])
    still_full = sshddp(ssh_env, tmp_path, "logs", run)  # never prints a cut copy as whole
    assert still_full.returncode == 74, still_full.stderr
    assert "No space left on device" in still_full.stderr and still_full.stdout == ""
    subprocess.run(["mount", "-o", "remount,size=64m", str(logs)], check=True)
    att = sshddp(ssh_env, tmp_path, "attach", run)
    assert att.returncode == 0, att.stderr
    for node in range(2):
        assert_same_log(tmp_path, workdir, run, node, log_dir=str(logs))
    run_no_leak(run)
