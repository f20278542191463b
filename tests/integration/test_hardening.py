"""Hardening, attacked for real on sshd hosts: nothing outside a run is ever touched, no one
outside it can steer it, and every wait stays bounded.

Each test reproduces the attack or the fault as it happened (a pid really reused through
/proc/sys/kernel/ns_last_pid, symlinks planted as real files, forged lines from a real
socket, a second real run on the same port, a process that really escapes with the node's
output) and fails on the code before the fix; each ends by scanning /proc for the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
import yaml
from launch_helpers import (
    exit_record,
    finish,
    node_dir,
    sshddp,
    start,
    wait_until,
    write_inventory,
)

from sshddp.remote.node.peers import MAX_PENDING
from sshddp_lab.sshd import SshdCluster, processes_with_env

PAYLOAD = Path(__file__).parent / "payloads" / "hardening.py"
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
BOUND = 90.0  # generous upper bound for what should take seconds on a loaded machine


# ----------------------------------------------------------------------------- helpers


def log_has(workdir: Path, run: str, node: int, text: str) -> bool:
    try:
        return text.encode() in (node_dir(workdir, run, node) / "node.log").read_bytes()
    except OSError:
        return False


def wait_ready(workdir: Path, run: str, nodes: int) -> None:
    wait_until(
        lambda: all(log_has(workdir, run, n, f"READY {n}") for n in range(nodes)),
        BOUND,
        f"every rank of {run} to start",
    )


def with_workdir(inv: Path, node: int, workdir: Path) -> None:
    """Give inventory host ``node`` its own workdir."""
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][node]["workdir"] = str(workdir)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))


def spawn_with_pid(pid: int, tries: int = 500) -> subprocess.Popen[bytes]:
    """A stranger's process, leader of its own session and process group, given pid ``pid``
    for real: the kernel hands out ns_last_pid + 1 next (other processes of this busy
    machine may take it first: then try again)."""
    for _ in range(tries):
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"could not get pid {pid} through {NS_LAST_PID} in {tries} tries")


# --------------------------------------------------------- 1. a reused process group


def test_stop_after_the_supervisor_died_leaves_a_reused_process_group_alone(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """The node's supervisor and torchrun die (SIGKILL); torchrun's pid, which was also its
    process group's number, is then given to a stranger's new process group, for real.
    `sshddp stop` must stop what is left of the run (the rank, found by its marker) and
    leave the stranger alone: it once killed whatever group had the recorded number."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=1)
    run = "pgreuse"
    r = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--detach",
        "--name",
        run,
        "--grace",
        "2",
        str(inv),
        str(PAYLOAD),
        "wait",
    )
    assert r.returncode == 0, r.stderr
    wait_ready(workdir, run, 1)
    state = json.loads((node_dir(workdir, run, 0) / "state.json").read_text())
    supervisor, torchrun = state["supervisor_pid"], state["pgid"]
    assert state["pid"] == torchrun, state
    ranks = [
        p for p, _ in processes_with_env("SSHDDP_RUN_ID", run) if p not in (supervisor, torchrun)
    ]
    assert ranks, "no rank of the run found"
    os.kill(supervisor, signal.SIGKILL)
    os.kill(torchrun, signal.SIGKILL)
    for pid in ranks:  # a rank left in torchrun's group would keep its number in use
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == torchrun:
                os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{torchrun}").exists(), BOUND, "torchrun to be reaped")
    stranger = spawn_with_pid(torchrun)
    try:
        assert os.getpgid(stranger.pid) == torchrun
        stopped = sshddp(ssh_env, tmp_path, "stop", run)
        alive = stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert alive, "sshddp stop signalled a stranger's process group that reused torchrun's pid"
    rec = exit_record(workdir, run, 0)
    assert rec is not None and rec["state"] == "stopped", rec
    assert rec["reason"].startswith("stopped after its supervisor was lost"), rec
    assert f"pid {torchrun} (torchrun's" in rec["reason"] and "left alone" in rec["reason"], rec
    assert "left alone" in stopped.stdout, stopped.stdout
    run_no_leak(run)


# ----------------------------------------------------------- 2. planted files, modes


def test_an_existing_run_directory_with_planted_links_is_refused(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Someone made the next run's directory on h2 first, with node.log and reserve linked
    to a file of the user's and env.json.tmp.<pid> linked, for every pid, to a
    world-readable file. The run must refuse the directory: it once appended to and zeroed
    the first file and copied the run's secrets into the second."""
    secret = "s3cr3t-hardening-value"
    inv, workdir = write_inventory(
        ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1, env={"API_TOKEN": secret}
    )
    run = "planted"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    leak = tmp_path / "leak.json"
    leak.touch()
    leak.chmod(0o644)
    node = node_dir(workdir, run, 1)
    node.mkdir(parents=True)
    (node / "node.log").symlink_to(victim)
    (node / "reserve").symlink_to(victim)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(1, min(pid_max, 1 << 16) + 1):
        (node / f"env.json.tmp.{pid}").symlink_to(leak)
    r = sshddp(ssh_env, tmp_path, "launch", "--name", run, str(inv), str(PAYLOAD), "wait")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"run directory {node} already exists on this host" in r.stderr, r.stderr
    assert "pick another --name" in r.stderr, r.stderr
    assert victim.read_bytes() == b"precious\n", "a planted link was followed"
    assert leak.read_bytes() == b"" and secret not in r.stderr
    assert not node_dir(workdir, run, 0).exists(), "h1 kept what it staged"
    run_no_leak(run)


@pytest.mark.parametrize("problem", ["runs/ writable by all", "workdir of another user"])
def test_a_workdir_others_can_write_is_refused_before_and_at_staging(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], problem: str, run_no_leak
) -> None:
    """A workdir (or its runs/) that someone else may write to lets them plant files in a
    run. The preflight names the host, the directory and the fix (exit 3); with --no-check
    staging refuses it (exit 1). Both used to go ahead."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    h2 = tmp_path / "remote-h2"
    with_workdir(inv, 1, h2)
    if problem.startswith("runs/"):
        bad = h2 / "runs"
        bad.mkdir(parents=True)
        bad.chmod(0o777)
        expected = f"the runs directory {bad} is writable by other users (mode 0777)"
        fix = f"chmod go-w {bad}"
    else:
        bad = h2
        bad.mkdir()
        os.chown(bad, 65534, 65534)
        expected = f"workdir {bad} belongs to uid 65534, not to this user (uid {os.geteuid()})"
        fix = "point `workdir:` to a directory of your own"
    checked = sshddp(
        ssh_env, tmp_path, "launch", "--name", "unsafe1", str(inv), str(PAYLOAD), "wait"
    )
    out = checked.stdout + checked.stderr
    assert checked.returncode == 3, out
    assert f"FAIL h2 workdir: {expected}" in out and fix in out, out
    unchecked = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--no-check",
        "--name",
        "unsafe2",
        str(inv),
        str(PAYLOAD),
        "wait",
    )
    assert unchecked.returncode == 1, unchecked.stderr
    assert "Traceback" not in unchecked.stderr
    assert f"root cause: node 1 on h2: {expected}" in unchecked.stderr, unchecked.stderr
    assert not (bad / "unsafe2").exists() and not (h2 / "runs" / "unsafe2").exists()
    assert not (workdir / "runs" / "unsafe2").exists()
    run_no_leak("unsafe1")
    run_no_leak("unsafe2")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a read-only file system (a tmpfs mounted ro: root ignores modes)."""
    path = tmp_path / "ro"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "sshddp-test", str(path)]
    r = subprocess.run(mount, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {path} (needs root; CI runs as root): {r.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_read_only_workdir_is_reported_as_read_only_not_as_no_space(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], read_only_dir: Path
) -> None:
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=1)
    workdir = read_only_dir / "w"
    with_workdir(inv, 0, workdir)
    checked = sshddp(ssh_env, tmp_path, "launch", "--name", "ro1", str(inv), str(PAYLOAD), "wait")
    out = checked.stdout + checked.stderr
    assert checked.returncode == 3, out
    assert f"FAIL h1 workdir: {read_only_dir} is on a read-only file system" in out, out
    assert "space" not in out, out
    unchecked = sshddp(
        ssh_env, tmp_path, "launch", "--no-check", "--name", "ro2", str(inv), str(PAYLOAD), "wait"
    )
    err = unchecked.stderr
    assert unchecked.returncode == 1, err
    assert f"cannot create {workdir}: it is on a read-only file system" in err, err
    assert "point `workdir:` of this host to a writable directory" in err, err
    assert "space" not in err and "Errno" not in err, err


# ------------------------------------------------- 4. a process escapes with the output


def test_a_process_that_escaped_with_the_output_open_cannot_hang_the_run(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Rank 0 leaves `setsid env -i sleep 600` behind, holding the node's output pipe: out
    of the session and the environment, nothing proves it is the run's. The node must
    still finish (it once waited for EOF forever, and so did the coordinator): exit.json
    names the process, the report too, and it is not signalled."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    proc = start(ssh_env, tmp_path, "launch", "--name", "escape", str(inv), str(PAYLOAD), "escape")
    escaped: list[int] = []
    try:
        wait_until(lambda: log_has(workdir, "escape", 0, "ESCAPED "), BOUND, "the escape")
        log = (node_dir(workdir, "escape", 0) / "node.log").read_text()
        escaped.append(int(re.search(r"ESCAPED (\d+)", log).group(1)))  # type: ignore[union-attr]
        rc, err = finish(proc, 120)
        assert Path(f"/proc/{escaped[0]}").exists(), "the escaped process was signalled"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in escaped:  # this test's own process, by the pid it printed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    pid = escaped[0]
    assert rc == 0, err
    rec = exit_record(workdir, "escape", 0)
    assert rec is not None and rec["state"] == "succeeded", rec
    assert rec["escaped"] == [{"pid": pid, "command": "sleep 600"}], rec
    assert "1 process(es) left the run's session and environment" in err, err
    assert f"pid {pid} (sleep 600)" in err, err
    assert (exit_record(workdir, "escape", 1) or {}).get("state") == "succeeded"
    run_no_leak("escape")


# --------------------------------------------------- 6. the supervisors' port (P + 1)


def forged(run: str) -> list[bytes]:
    """Lines a stranger sends: every message the supervisors know, a fake hello for this
    run, a fake MACed line and an overlong line. Their texts all say PWNED."""
    return [
        b'{"hb": 1}\n',
        b'{"done": 1, "state": "succeeded", "reason": ""}\n',
        b'{"done": 2, "state": "failed", "reason": "\\u001b]0;PWNED\\u0007 node 2"}\n',
        b'{"abort": "PWNED abort \\u001b[2J"}\n',
        b'{"v": 1, "run": "%s", "rank": 1, "nonce": "00000000000000000000", "mac": "00"}\n'
        % run.encode(),
        b"0" * 64 + b' {"run": "%s", "seq": 0, "abort": "PWNED"}\n' % run.encode(),
        b"x" * 100_000,
    ]


def forge(addr: str, port: int, lines: list[bytes]) -> int:
    """Send every forged line, each on its own connection, then open more connections than
    the hub takes at once; the number of challenges the hub sent (it stops counting when
    the port closes: the hub obeyed a line and its run ended)."""
    challenges = 0
    for line in lines:
        try:
            with socket.create_connection((addr, port), timeout=10) as sock:
                challenges += b'"nonce"' in sock.recv(4096)  # the hub speaks first
                with contextlib.suppress(OSError):  # it may hang up mid-line (too long)
                    sock.sendall(line)
                    sock.recv(4096)  # until the hub hangs up on it
        except OSError:
            return challenges
    crowd = [socket.create_connection((addr, port), timeout=10) for _ in range(MAX_PENDING + 24)]
    time.sleep(1)  # silent: each holds a slot until the hub's handshake times out
    for sock in crowd:
        sock.close()
    return challenges


def test_forged_lines_on_the_supervisors_port_neither_stop_a_run_nor_hide_a_failure(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """A stranger connects to node 0's supervisor port and sends every message the
    supervisors know (a heartbeat for node 1, node 1 "succeeded", node 2 "failed" with
    terminal escapes, an abort), a fake hello, an overlong line and MAX_PENDING + 24
    connections at once.
    The run goes on; then node 1 really fails, and that failure stops the run. A forged
    line once stopped a 3-node run, and a forged "succeeded" hid a real failure."""
    port = free_port()
    inv, workdir = write_inventory(ssh_env, tmp_path, port, hosts=[1, 2, 3], nproc=1)
    go, run = tmp_path / "go", "spoofed"
    proc = start(
        ssh_env,
        tmp_path,
        "launch",
        "--name",
        run,
        "--grace",
        "2",
        str(inv),
        str(PAYLOAD),
        "until",
        str(go),
        "1",
    )
    try:
        wait_ready(workdir, run, 3)
        lines = forged(run)
        challenged = forge(ssh_env.host(1).addr, port + 1, lines)
        time.sleep(2)  # time enough to obey, were anything obeyed
        assert not [n for n in range(3) if exit_record(workdir, run, n)], "a forged line stopped it"
        assert challenged == len(lines), "the hub did not answer every connection"
        go.touch()
        rc, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, err
    assert "root cause: node 1 on h2" in err, err
    for node in (0, 2):
        rec = exit_record(workdir, run, node)
        assert rec is not None and rec["state"] == "stopped", rec
        assert "node 1 (h2) failed" in rec["reason"], rec
    records = [json.dumps(exit_record(workdir, run, n)) for n in range(3)]
    assert not [r for r in records + [err] if "PWNED" in r], records
    assert not [n for n in range(3) if (node_dir(workdir, run, n) / "peers.key").exists()]
    log = (node_dir(workdir, run, 0) / "supervisor.log").read_text()
    assert "sshddp peers: ignored " in log and "does not prove it holds this run's key" in log
    assert f"over {MAX_PENDING} connections awaiting authentication" in log, log
    assert "\x1b" not in log, "noise reached the log unescaped"
    run_no_leak(run)


def test_a_second_run_on_the_same_port_cannot_take_over_a_node(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Run B is launched with --no-check on run A's hosts and port. Its supervisors reach
    A's node 0 supervisor, which is not theirs: B fails and says so, and A goes on to its
    own end, untouched. B once took over A's node slot and killed A with a wrong cause."""
    port = free_port()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    inv_a, work_a = write_inventory(ssh_env, tmp_path / "a", port, hosts=[1, 2, 3], nproc=1)
    inv_b, work_b = write_inventory(ssh_env, tmp_path / "b", port, hosts=[1, 2, 3], nproc=1)
    go = tmp_path / "go"
    a = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--detach",
        "--name",
        "runa",
        str(inv_a),
        str(PAYLOAD),
        "until",
        str(go),
    )
    assert a.returncode == 0, a.stderr
    try:
        wait_ready(work_a, "runa", 3)
        b = sshddp(
            ssh_env,
            tmp_path,
            "launch",
            "--no-check",
            "--name",
            "runb",
            "--grace",
            "1",
            "--heartbeat-timeout",
            "5",
            str(inv_b),
            str(PAYLOAD),
            "until",
            str(go),
        )
        assert b.returncode == 1, b.stderr
        assert "Traceback" not in b.stderr
        time.sleep(2)
        assert not [n for n in range(3) if exit_record(work_a, "runa", n)], "run B stopped run A"
    finally:
        go.touch()
    wait_until(lambda: all(exit_record(work_a, "runa", n) for n in range(3)), BOUND, "A's end")
    for node in range(3):
        rec = exit_record(work_a, "runa", node)
        assert rec is not None and rec["state"] == "succeeded", rec
    spokes = [exit_record(work_b, "runb", n) or {} for n in (1, 2)]
    told = [s.get("reason", "") for s in spokes]
    assert any("is not node 0's supervisor of this run" in t and "runa" in t for t in told), told
    log = (node_dir(work_a, "runa", 0) / "supervisor.log").read_text()
    assert "sshddp peers: ignored " in log, log
    run_no_leak("runa")
    run_no_leak("runb")


# ------------------------------------------------------------- 9. shipping a workdir


def test_a_workdir_streams_to_every_host_intact(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """A workdir of 24 MB of binary data in nested directories, streamed to three hosts at
    once in bounded chunks and unpacked as it arrives: every host holds exactly the local
    files (the .gitignore'd one excepted) and its code.sha256."""
    proj = tmp_path / "proj"
    (proj / "data" / "deep").mkdir(parents=True)
    (proj / "job.py").write_bytes(PAYLOAD.read_bytes())
    files = {"job.py": PAYLOAD.read_bytes(), ".gitignore": b"*.tmp\n"}
    for i in range(3):
        files[f"data/deep/part{i}.bin"] = os.urandom(8 << 20)
    files["data/odd name \u00e9.txt"] = "caf\u00e9\n".encode()
    for rel, data in files.items():
        (proj / rel).write_bytes(data)
    (proj / "scratch.tmp").write_bytes(b"ignored")
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=1)
    r = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--workdir",
        str(proj),
        "--name",
        "wdship",
        str(inv),
        str(proj / "job.py"),
        "long",
        "1",
        "100",
    )
    assert r.returncode == 0, r.stderr
    for node in range(3):
        code = node_dir(workdir, "wdship", node) / "code"
        got = {str(p.relative_to(code)): p.read_bytes() for p in code.rglob("*") if p.is_file()}
        assert got == files, f"node {node}: {sorted(got)}"
        assert (node_dir(workdir, "wdship", node) / "code.sha256").is_file()
        assert code.stat().st_mode & 0o777 == 0o700
    run_no_leak("wdship")


# ------------------------------------------------------------- 14. --tty long lines


def test_tty_lines_longer_than_the_pty_buffer_stay_whole(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Three ranks of one node print 100 lines of 20 KB each at once into one pty, whose
    reader gets about 4 KB per read: every line must arrive whole, not cut by another
    rank's (print() wrote a long line's text and its newline separately)."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=3)
    r = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--tty",
        "--name",
        "longtty",
        str(inv),
        str(PAYLOAD),
        "long",
        "100",
        "20000",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = (node_dir(workdir, "longtty", 0) / "node.log").read_bytes().split(b"\n")
    shape = re.compile(rb"rank (\d) line (\d+) x+ end")
    whole = [m for m in map(shape.fullmatch, lines) if m and len(m.group(0)) == 20000]
    assert len(whole) == 300, [
        ln[:60] + b"..." + ln[-20:] for ln in lines if not shape.fullmatch(ln)
    ][:5]
    assert sorted((int(m.group(1)), int(m.group(2))) for m in whole) == [
        (rank, i) for rank in range(3) for i in range(100)
    ]
    run_no_leak("longtty")
