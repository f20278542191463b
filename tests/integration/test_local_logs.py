"""Local logs never lose a byte, whatever command opens them, and live only where they are
ours: real runs on the sshd lab (``--launcher node`` and ``--tty`` nodes keep no index), a
host made unreachable, two followers of one run, and a real second local user."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import JOB, SSHDDP, cli_env, sshddp, wait_until, write_inventory

from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

LINES = 40
SCRIPT = (
    "import os\n"
    "node = os.environ.get('GROUP_RANK') or os.environ.get('NODE_RANK')\n"
    f"for i in range({LINES}):\n"
    "    print(f'node {node} line {i}', flush=True)\n"
)


def copies(tmp: Path, run: str) -> dict[str, bytes]:
    """Every file of the run's local log directory, by name."""
    return {p.name: p.read_bytes() for p in sorted((tmp / "sshddp-logs" / run).iterdir())}


def remote_log(workdir: Path, run: str, node: int) -> bytes:
    return (workdir / "runs" / run / f"n{node}" / "node.log").read_bytes()


def launch_lines(cluster: SshdCluster, tmp: Path, port: int, run: str, opts: list[str]) -> Path:
    """A finished run of two nodes that printed LINES lines each; its remote workdir."""
    script = tmp / "lines.py"
    script.write_text(SCRIPT)
    inv, workdir = write_inventory(cluster, tmp, port, [1, 2], nproc=1)
    done = sshddp(cluster, tmp, "launch", "--name", run, *opts, inv, script)
    assert done.returncode == 0, done.stderr
    for node in range(2):
        assert (tmp / "sshddp-logs" / run / f"node{node}-h{node + 1}.log").read_bytes() == (
            remote_log(workdir, run, node)
        )
    return workdir


@pytest.mark.parametrize("opts", [["--launcher", "node"], ["--tty"]], ids=["node", "tty"])
def test_logs_of_a_run_without_index_print_it_all_and_keep_every_byte(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    opts: list[str],
    run_no_leak: Callable[..., None],
) -> None:
    run = "noidx"
    launch_lines(ssh_env, tmp_path, free_port(), run, opts)
    before = copies(tmp_path, run)
    assert all(before.values()), before.keys()
    for args in ([], ["--node", "1"], [], ["--tail", "3"], ["--follow"]):
        shown = sshddp(ssh_env, tmp_path, "logs", run, *args)
        assert shown.returncode == 0, shown.stderr
        assert copies(tmp_path, run) == before, f"logs {args} changed the local copies"
        node = 1 if args == ["--node", "1"] else 0
        assert f"node {node} line {LINES - 1}" in shown.stdout, (args, shown.stdout)
    whole = sshddp(ssh_env, tmp_path, "logs", run, "--node", "0")
    assert whole.stdout.encode() == before["node0-h1.log"]
    again = sshddp(ssh_env, tmp_path, "attach", run)
    assert again.returncode == 0, again.stderr
    assert copies(tmp_path, run) == before
    run_no_leak(run)


def test_an_unreachable_host_s_local_copy_is_kept_and_shown(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
    run_no_leak: Callable[..., None],
) -> None:
    private = make_cluster(2)
    monkeypatch.setenv("SSHDDP_SSH_CONFIG", str(private.ssh_config))
    run = "gone2"
    launch_lines(private, tmp_path, free_port(), run, ["--launcher", "node"])
    before = copies(tmp_path, run)
    private.stop_host(2)
    for args in ([], ["--node", "1"], ["--node", "0"]):
        shown = sshddp(private, tmp_path, "logs", run, *args)
        assert shown.returncode == 0, shown.stderr
        assert copies(tmp_path, run) == before, f"logs {args} changed the local copies"
        if args != ["--node", "0"]:
            assert "node 1 (h2) unreachable; showing the local copy only" in shown.stderr
            assert f"node 1 line {LINES - 1}" in shown.stdout, shown.stdout
    run_no_leak(run)


def test_a_planted_symlink_as_a_local_log_is_refused_naming_it(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run = "linked"
    launch_lines(ssh_env, tmp_path, free_port(), run, ["--launcher", "node"])
    victim = tmp_path / "victim"
    victim.write_bytes(b"not a log\n")
    log = tmp_path / "sshddp-logs" / run / "node1-h2.log"
    log.unlink()
    log.symlink_to(victim)
    for command in ("logs", "attach"):
        refused = sshddp(ssh_env, tmp_path, command, run)
        assert refused.returncode == ExitCode.BAD_INPUT, refused.stderr
        assert f"{log} is a symbolic link" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert victim.read_bytes() == b"not a log\n"


def _detach(cluster: SshdCluster, tmp: Path, port: int, run: str, *job: str) -> Path:
    inv, workdir = write_inventory(cluster, tmp, port, [1, 2], nproc=1)
    started = sshddp(cluster, tmp, "launch", "--detach", "--name", run, inv, JOB, *job)
    assert started.returncode == 0, started.stderr
    return workdir


def test_logs_follow_interrupted_exits_130_and_leaves_the_run_going(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = "fwait"
    workdir = _detach(ssh_env, tmp_path, free_port(), run, "wait")
    log = workdir / "runs" / run / "n1" / "node.log"
    wait_until(lambda: log.exists() and b"READY" in log.read_bytes(), 90, "node 1 ready")
    out = tmp_path / "follow.out"
    with open(out, "wb") as sink:
        follow = subprocess.Popen(
            [*SSHDDP, "logs", "--follow", run],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=sink,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: out.read_bytes().count(b"READY") >= 2, 60, "logs -f to show both")
            follow.send_signal(signal.SIGINT)
            _out, err = follow.communicate(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait()
    assert follow.returncode == ExitCode.INTERRUPTED, err
    assert b"stopped following run fwait; it goes on" in err and b"Traceback" not in err
    assert not (workdir / "runs" / run / "n0" / "exit.json").exists()  # still running
    stopped = sshddp(ssh_env, tmp_path, "stop", run)
    assert stopped.returncode == 0, stopped.stderr
    run_no_leak(run)


def test_two_attach_of_one_run_both_follow_it_to_its_end(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = "twice"
    workdir = _detach(ssh_env, tmp_path, free_port(), run, "stream", "300")
    procs = [
        subprocess.Popen(
            [*SSHDDP, "attach", run],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        outcomes = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for proc, (_out, err) in zip(procs, outcomes):
        assert proc.returncode == 0, err.decode()
        assert b"lost the connection" not in err and b"a span at" not in err, err.decode()
    # one writes the local copies, the other says it leaves them to it; both show the end
    assert sum(b"being written by another sshddp" in err for _out, err in outcomes) == 1
    for out, _err in outcomes:
        assert b"rank 0 tick 299" in out and b"rank 1 tick 299" in out, out[-500:]
    for node in range(2):
        local = tmp_path / "sshddp-logs" / run / f"node{node}-h{node + 1}.log"
        assert local.read_bytes() == remote_log(workdir, run, node)
    run_no_leak(run)


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A real second local user (made here, as root, and removed afterwards)."""
    if os.geteuid() != 0:
        pytest.fail("this test makes a second local user: it needs root")
    name = f"sshddp-o{os.getpid() % 100000}"
    shell = "/usr/sbin/nologin"
    subprocess.run(["useradd", "--no-create-home", "--shell", shell, name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def test_a_shared_log_dir_prepared_by_another_user_is_refused(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    other_user: pwd.struct_passwd,
    run_no_leak: Callable[..., None],
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a shared --log-dir, like /tmp
    planted = shared / "leak"
    planted.mkdir()
    (planted / "node0-h1.log").write_bytes(b"")
    for path in (planted, planted / "node0-h1.log"):
        os.chown(path, other_user.pw_uid, other_user.pw_gid)
    planted.chmod(0o777)
    (planted / "node0-h1.log").chmod(0o666)
    script = tmp_path / "secret.py"
    script.write_text("print('the secret', flush=True)\n")
    inv, _workdir = write_inventory(ssh_env, tmp_path, free_port(), [1, 2], nproc=1)
    launch = [*SSHDDP, "launch", "--launcher", "node", "--log-dir", shared]
    refused = subprocess.run(
        [*map(str, launch), "--name", "leak", str(inv), str(script)],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == ExitCode.BAD_INPUT, refused.stderr
    assert f"{planted} is owned by another user (uid {other_user.pw_uid})" in refused.stderr
    assert (planted / "node0-h1.log").read_bytes() == b""
    # a run of ours, its directory renamed away and replaced by the other user's
    ok = subprocess.run(
        [*map(str, launch), "--name", "mine", str(inv), str(script)],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    mine = shared / "mine"
    assert mine.stat().st_mode & 0o777 == 0o700 and mine.stat().st_uid == os.getuid()
    mine.rename(shared / "mine.away")
    mine.mkdir(mode=0o700)
    os.chown(mine, other_user.pw_uid, other_user.pw_gid)
    for command in ("logs", "attach"):
        again = sshddp(ssh_env, tmp_path, command, "mine")
        assert again.returncode == ExitCode.BAD_INPUT, again.stderr
        assert f"{mine} is owned by another user" in again.stderr, again.stderr
    assert list(mine.iterdir()) == []
    run_no_leak("mine")
