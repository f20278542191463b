"""Ctrl-C at any moment: a real SIGINT to the real coordinator, at controlled moments of a
launch (preflight, staging, the instant after a node starts, while it runs) and of an
attach, many times over, against real sshd hosts.

Exit 130 must mean stopped everywhere: no process of the run survives on any host. A run
interrupted before any node started leaves nothing, neither on the hosts nor in the
registry; one that started is recorded as stopped, and every command (the launch's own
report, ps, attach, logs) calls it the same.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import JOB, SSHDDP, cli_env, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

BOUND = 90.0  # generous: a launch imports torch on 2 loaded cores
NODES = 2


def node_file(workdir: Path, run: str, node: int, name: str) -> Path:
    return workdir / "runs" / run / f"n{node}" / name


def exit_states(workdir: Path, run: str) -> list[str | None]:
    out = []
    for node in range(NODES):
        try:
            out.append(json.loads(node_file(workdir, run, node, "exit.json").read_text())["state"])
        except (OSError, ValueError):
            out.append(None)
    return out


def sshddp(cluster: SshdCluster, cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SSHDDP, *map(str, args)],
        cwd=cwd,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


# Each moment: what to wait for (given the workdir and run id), then a delay in seconds.
def _preflight(err: Path, run: str, workdir: Path) -> bool:
    """The run's local log directory is made before the preflight (its banner, after)."""
    return (err.parent / "sshddp-logs" / run).exists()


def _staged(err: Path, run: str, workdir: Path) -> bool:
    return all(node_file(workdir, run, n, "spec.json").exists() for n in range(NODES))


def _started(err: Path, run: str, workdir: Path) -> bool:
    return node_file(workdir, run, 0, "state.json").exists()


def _running(err: Path, run: str, workdir: Path) -> bool:
    log = node_file(workdir, run, NODES - 1, "node.log")
    return log.exists() and b"READY" in log.read_bytes()


MOMENTS = [
    ("preflight", _preflight, 0.0),
    ("preflight", _preflight, 0.15),
    ("staging", _staged, 0.0),
    ("started", _started, 0.0),
    ("started", _started, 0.003),
    ("started", _started, 0.01),
    ("started", _started, 0.03),
    ("started", _started, 0.08),
    ("started", _started, 0.2),
    ("running", _running, 0.0),
]


def _interrupt_launch(
    cluster: SshdCluster,
    tmp: Path,
    inv: Path,
    run: str,
    workdir: Path,
    moment: Callable[[Path, str, Path], bool],
    delay: float,
    opts: tuple[str, ...] = (),
) -> tuple[int, str, bool]:
    """Launch, SIGINT at the moment, wait for the exit; (code, stderr, whether it started)."""
    err_path = tmp / f"{run}.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [*SSHDDP, "launch", "--name", run, *opts, str(inv), str(JOB), "wait"],
            cwd=tmp,
            env=cli_env(cluster),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + BOUND
            while not moment(err_path, run, workdir) and proc.poll() is None:
                assert time.monotonic() < deadline, f"{run}: the moment never came"
                time.sleep(0.001)
            time.sleep(delay)
            started = any(node_file(workdir, run, n, "state.json").exists() for n in range(NODES))
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=BOUND)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    started = started or any(
        node_file(workdir, run, n, "state.json").exists() for n in range(NODES)
    )
    return code, err_path.read_text(), started


def _assert_agreed_stopped(cluster: SshdCluster, tmp: Path, run: str, workdir: Path) -> None:
    """Every command calls the run stopped, and attach ends at once."""
    assert exit_states(workdir, run) == ["stopped"] * NODES
    ps = sshddp(cluster, tmp, "ps", "--all")
    assert ps.returncode == 0, ps.stderr
    line = next(ln for ln in ps.stdout.splitlines() if f" {run} " in f" {ln} ")
    assert "0:stopped 1:stopped" in line, ps.stdout
    attach = sshddp(cluster, tmp, "attach", run)
    assert attach.returncode == 1, attach.stderr
    assert f"sshddp: run {run} was stopped: " in attach.stderr, attach.stderr
    assert "running" not in attach.stderr.split("was stopped", 1)[1], attach.stderr


def _assert_never_started(cluster: SshdCluster, tmp: Path, run: str, workdir: Path) -> None:
    """Nothing of the run anywhere: no record, no run directory, attach knows no such run."""
    wait_until(
        lambda: not (workdir / "runs" / run).exists(), BOUND, "the staged nodes to be removed"
    )
    ps = sshddp(cluster, tmp, "ps", "--all")
    assert run not in ps.stdout, ps.stdout
    attach = sshddp(cluster, tmp, "attach", run)
    assert attach.returncode == 2 and f"no run {run!r}" in attach.stderr, attach.stderr


@pytest.mark.timeout(1800)
def test_ctrl_c_at_any_moment_of_a_launch_stops_everything(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    seen = {"started": 0, "never": 0}
    for i, (what, moment, delay) in enumerate(MOMENTS):
        run = f"int{i}"
        code, err, started = _interrupt_launch(ssh_env, tmp_path, inv, run, workdir, moment, delay)
        where = f"{run} ({what} + {delay} s):\n{err}"
        assert code == 130, where
        assert "Traceback" not in err and "lost the connection" not in err, where
        run_no_leak(run, timeout=10.0)
        if started:
            seen["started"] += 1
            report = err.split(f"sshddp: run {run} was stopped: ", 1)
            assert len(report) == 2, where
            assert " running" not in report[1] and " starting" not in report[1], where
            _assert_agreed_stopped(ssh_env, tmp_path, run, workdir)
        else:
            seen["never"] += 1
            assert "nothing was started on any host" in err, where
            # The Ctrl-C line is said once the preflight passed, and only then: a Ctrl-C
            # after it finds the nodes staged. (Which side of it a "preflight" moment falls
            # on depends on how fast the preflight was.)
            passed = "Ctrl-C stops the run" in err
            assert passed == ("every node removed what it had staged" in err), where
            assert passed or what in ("preflight", "staging"), where
            _assert_never_started(ssh_env, tmp_path, run, workdir)
    # "preflight + 0" always finds nothing started; the later moments fall on either side
    # of the start, as fast as this machine's preflight is that day
    assert seen["started"] >= 5 and seen["never"] >= 1, seen


def test_ctrl_c_during_a_detached_launch_stops_what_started(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """--detach returns once the nodes started; a Ctrl-C before that still stops them."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    for i, delay in enumerate((0.0, 0.005, 0.02)):
        run = f"dint{i}"
        code, err, started = _interrupt_launch(
            ssh_env, tmp_path, inv, run, workdir, _started, delay, opts=("--detach",)
        )
        if code == 0:  # it had handed the run off already: it goes on, as it said
            assert f"follow it with `sshddp attach {run}`" in err, err
            assert sshddp(ssh_env, tmp_path, "stop", run).returncode == 0
        else:
            assert code == 130, err
            _assert_agreed_stopped(ssh_env, tmp_path, run, workdir)
        run_no_leak(run, timeout=10.0)


def test_ctrl_c_on_attach_stops_the_run_everywhere(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    for i, delay in enumerate((0.0, 0.01, 0.3)):
        run = f"aint{i}"
        r = sshddp(
            ssh_env, tmp_path, "launch", "--detach", "--name", run, str(inv), str(JOB), "wait"
        )
        assert r.returncode == 0, r.stderr
        wait_until(lambda run=run: _running(tmp_path, run, workdir), BOUND, f"{run} to run")
        err_path = tmp_path / f"{run}.attach.err"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(
                [*SSHDDP, "attach", run],
                cwd=tmp_path,
                env=cli_env(ssh_env),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            try:
                wait_until(lambda p=err_path: "attached to run" in p.read_text(), BOUND, "attached")
                time.sleep(delay)
                proc.send_signal(signal.SIGINT)
                code = proc.wait(timeout=BOUND)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        text = err_path.read_text()
        assert code == 130, text
        assert "lost the connection" not in text and "Traceback" not in text, text
        assert f"sshddp: run {run} was stopped: interrupted by the user (Ctrl-C)" in text, text
        run_no_leak(run, timeout=10.0)
        _assert_agreed_stopped(ssh_env, tmp_path, run, workdir)


def _typed_ctrl_c(cluster: SshdCluster, tmp: Path, inv: Path, run: str) -> tuple[int, str]:
    """Launch on a pseudo-terminal, as from a shell; type Ctrl-C once every rank is READY:
    the terminal sends SIGINT to its whole foreground process group. (status, output)."""
    import os
    import pty

    pid, master = pty.fork()
    if pid == 0:  # the child: a session of its own, the pty as its controlling terminal
        env = {**cli_env(cluster), "TERM": "xterm"}
        env.pop("NO_COLOR", None)
        os.chdir(tmp)
        os.execve(SSHDDP[0], [*SSHDDP, "launch", "--name", run, str(inv), str(JOB), "wait"], env)
    out = b""
    typed = False
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal (it exited)
            break
        if not data:
            break
        out += data
        if not typed and out.count(b"READY") >= NODES:
            os.write(master, b"\x03")  # Ctrl-C, as typed
            typed = True
    _, status = os.waitpid(pid, 0)
    os.close(master)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


def test_ctrl_c_typed_on_a_real_terminal(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """On a real terminal the whole foreground group gets SIGINT. With a `localhost` node
    (run through a local process, not SSH) next to an SSH one: exit 130, every node
    stopped, no spurious "lost the connection", no node left `running` in the report."""
    import sys

    inv = tmp_path / "pty.yaml"
    inv.write_text(
        f"defaults: {{python: {sys.executable}, workdir: {tmp_path}/remote, nproc: 1, "
        "env: {GLOO_SOCKET_IFNAME: lo}}\n"
        f"rendezvous: {{port: {free_port()}}}\n"
        "hosts:\n  - {host: localhost}\n  - {host: h2}\n"
    )
    for i in range(3):
        run = f"tty{i}"
        code, out = _typed_ctrl_c(ssh_env, tmp_path, inv, run)
        assert code == 130, out
        assert "lost the connection" not in out and "internal error" not in out, out
        report = out.split(f"sshddp: run {run} was stopped: interrupted by the user (Ctrl-C)")
        assert len(report) == 2, out
        assert " running" not in report[1] and " starting" not in report[1], out
        run_no_leak(run, timeout=10.0)
        assert exit_states(tmp_path / "remote", run) == ["stopped"] * NODES
