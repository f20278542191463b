"""The local registry of runs against real sshd hosts: two launches of one name at once, a
name reused in another workdir, ps asking every unfinished run at once (with a hung host),
ends recorded by whoever learns them, run directories gone, and a state directory that is
read-only, under a file, full or holds a malformed record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import pytest
from launch_helpers import JOB, SSHDDP, cli_env, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster, processes_with_env

BOUND = 120.0  # generous: launches import torch on 2 loaded cores
ANSWER_WINDOW = 10.0  # sshddp.run.ps.ANSWER_WINDOW: ps waits the connect timeout plus this


def sshddp(
    cluster: SshdCluster, cwd: Path, *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SSHDDP, *map(str, args)],
        cwd=cwd,
        env={**cli_env(cluster), **(env or {})},
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


def exit_state(workdir: Path, run: str, node: int) -> str | None:
    try:
        return str(json.loads((workdir / f"runs/{run}/n{node}/exit.json").read_text())["state"])
    except (OSError, ValueError, KeyError):
        return None


def detach(
    cluster: SshdCluster, cwd: Path, inv: Path, run: str, *job: str, **kw: Any
) -> subprocess.CompletedProcess[str]:
    r = sshddp(cluster, cwd, "launch", "--detach", "--name", run, inv, JOB, *job, **kw)
    assert r.returncode == 0, r.stderr
    return r


def ps_json(cluster: SshdCluster, cwd: Path, *args: str) -> dict[str, Any]:
    r = sshddp(cluster, cwd, "ps", "--all", "--json", *args)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["run_id"]: row for row in report["runs"]}


@contextmanager
def hung(cluster: SshdCluster, host: int) -> Iterator[None]:
    """Host ``host``'s sshd frozen (SIGSTOP): the kernel still accepts TCP connections, no
    SSH server ever answers them. The runs on the host go on: they need no sshd."""
    pid = cluster.sshd_pid(host)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a small tmpfs at a path (needs root, as CI has); unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path, size: str, *opts: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        options = ",".join((f"size={size}", "mode=0700", *opts))
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "sshddp-test", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs at {path} (needs root): {r.stderr.strip()}")
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> None:
    """Write into ``directory`` until its disk is full."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def inventory(cluster: SshdCluster, cwd: Path, port: int, name: str = "inv.yaml") -> Path:
    """An inventory of h1 and h2 (one rank each) on rendezvous ``port``, workdir cwd/remote:
    a run per port, so that runs that overlap never share one."""
    text = cluster.inventory_yaml(
        [1, 2],
        nproc=1,
        rdzv_port=port,
        workdir=str(cwd / "remote"),
        env={"GLOO_SOCKET_IFNAME": "lo"},
    )
    path = cwd / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ one name, one run


def test_two_launches_of_one_name_at_the_same_moment_one_is_refused_before_it_starts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Two terminals, one --name, two workdirs, launched at the same instant: exactly one
    runs; the other is refused before it reaches any host, and the registry holds the
    winner's plan and the winner's result."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    invs = []
    for d in dirs:
        d.mkdir()
        invs.append(write_inventory(ssh_env, d, free_port(), hosts=[1, 2], nproc=1))
    procs = [
        subprocess.Popen(
            [*SSHDDP, "launch", "--name", "twin", str(inv), str(JOB), "ok"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for inv, _ in invs
    ]
    outs = [p.communicate(timeout=BOUND)[1] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = [p.returncode for p in procs].index(2)
    winner = 1 - loser
    assert "--name twin: a run with that id exists already" in outs[loser], outs[loser]
    assert "Traceback" not in outs[loser]
    assert not (invs[loser][1] / "runs").exists(), "the refused launch reached a host"
    assert [exit_state(invs[winner][1], "twin", n) for n in range(2)] == ["succeeded"] * 2
    row = by_id(ps_json(ssh_env, tmp_path))["twin"]
    assert [n["state"] for n in row["nodes"]] == ["succeeded", "succeeded"]
    logs = sshddp(ssh_env, tmp_path, "logs", "twin", "--node", "1")
    remote = (invs[winner][1] / "runs/twin/n1/node.log").read_text()
    assert logs.returncode == 0 and logs.stdout == remote
    run_no_leak("twin")


def test_stopping_a_run_never_touches_another_of_the_same_name(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Two laptops (two registries) run `same` on the same hosts, in two workdirs. Stopping
    one stops exactly its own processes: the teardown marker is unique to each launch."""
    laptops = []
    for name in ("a", "b"):
        cwd = tmp_path / name
        cwd.mkdir()
        inv, workdir = write_inventory(ssh_env, cwd, free_port(), hosts=[1, 2], nproc=1)
        env = {"SSHDDP_STATE_DIR": str(cwd / "state")}
        detach(ssh_env, cwd, inv, "same", "wait", env=env)
        laptops.append((cwd, workdir, env))
    for _, workdir, _ in laptops:
        wait_until(
            lambda w=workdir: all(b"READY" in _log(w, "same", n) for n in range(2)),
            BOUND,
            "both runs to be ready",
        )
    (cwd_a, work_a, env_a), (cwd_b, work_b, env_b) = laptops
    before = {pid for pid, cmd in processes_with_env("SSHDDP_RUN_ID", "same") if str(work_b) in cmd}
    stop = sshddp(ssh_env, cwd_a, "stop", "same", env=env_a)
    assert stop.returncode == 0 and stop.stdout.count(": stopped") == 2, stop.stdout + stop.stderr
    assert [exit_state(work_a, "same", n) for n in range(2)] == ["stopped"] * 2
    time.sleep(1.0)  # whatever a wrong teardown would kill is dead by now
    after = {pid for pid, _ in processes_with_env("SSHDDP_RUN_ID", "same")}
    assert before and before <= after, "stopping run `same` in one workdir killed the other's"
    assert [exit_state(work_b, "same", n) for n in range(2)] == [None, None]
    assert sshddp(ssh_env, cwd_b, "stop", "same", env=env_b).returncode == 0
    run_no_leak("same", timeout=10.0)


def _log(workdir: Path, run: str, node: int) -> bytes:
    try:
        return (workdir / f"runs/{run}/n{node}/node.log").read_bytes()
    except OSError:
        return b""


# ------------------------------------------------------------------------------- ps


def test_ps_asks_every_unfinished_run_at_once_names_a_hung_host_and_records_ends(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
) -> None:
    """Five detached runs end while no coordinator watches. With one host hung, ps answers
    within one deadline (not one per run), saying which host did not answer. Once the host
    is back, ps records every end; from then on it asks no host about them, and shows each
    run's real duration, which no longer grows with the clock."""
    cluster = make_cluster(2)
    workdir = tmp_path / "remote"
    runs = [f"psr{i}" for i in range(5)]
    for run in runs:
        detach(
            cluster, tmp_path, inventory(cluster, tmp_path, free_port(), f"{run}.yaml"), run, "ok"
        )
    wait_until(
        lambda: all(exit_state(workdir, r, n) for r in runs for n in range(2)),
        BOUND,
        "every run to end",
    )
    timeout = 10.0
    with hung(cluster, 2):
        t0 = time.monotonic()
        r = sshddp(cluster, tmp_path, "ps", "--all", "--json", "--connect-timeout", f"{timeout:g}")
        took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    # One deadline for all: five runs asked one after another would take 5 x 10 s.
    assert took < timeout + ANSWER_WINDOW + 15, took
    rows = by_id(json.loads(r.stdout))
    h2 = cluster.host(2)
    for run in runs:
        n0, n1 = rows[run]["nodes"]
        assert n0["state"] == "succeeded", rows[run]
        assert n1["state"] == "unreachable" and h2.addr in n1["reason"], rows[run]
        assert not rows[run]["finished"]
    assert h2.addr in r.stderr, r.stderr  # the note names the host that did not answer
    live = ps_json(cluster, tmp_path)  # the host is back: every end is found and recorded
    assert all(by_id(live)[run]["finished"] for run in runs), live
    time.sleep(1.5)
    with hung(cluster, 2):  # the ends are recorded: no host is asked
        again = by_id(ps_json(cluster, tmp_path, "--connect-timeout", "2"))
    for run in runs:
        row, before = again[run], by_id(live)[run]
        assert [n["state"] for n in row["nodes"]] == ["succeeded", "succeeded"], row
        assert row["duration"] == before["duration"] and 0 < row["duration"] < BOUND, row
        assert set(row) == {
            "run_id",
            "started",
            "duration",
            "finished",
            "launching",
            "root_cause",
            "code_delivery",
            "nodes",
        }
        assert set(row["nodes"][0]) == {
            "node_rank",
            "host",
            "state",
            "reason",
            "returncode",
            "ended",
            "joined",  # null once the node has ended
            "quiet",
            "still",  # null without --stall-timeout
            "attempt",  # null without --max-restarts
            "attempts",
            "took",  # a spare: the node rank it took mid-run (else null)
            "replaced_by",  # a lost node: the spare's host that took its rank (else null)
        }
        node0 = row["nodes"][0]
        assert node0["took"] is None and node0["replaced_by"] is None
        assert node0["joined"] is None and node0["quiet"] is None and node0["still"] is None
    table = sshddp(cluster, tmp_path, "ps", "--all")
    assert all(f"{r}" in table.stdout for r in runs) and "0:succeeded 1:succeeded" in table.stdout
    for run in runs:
        run_no_leak(run)


def test_stop_and_logs_record_the_end_they_learn(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
) -> None:
    cluster = make_cluster(2)
    workdir = tmp_path / "remote"
    detach(cluster, tmp_path, inventory(cluster, tmp_path, free_port(), "a.yaml"), "stopme", "wait")
    detach(cluster, tmp_path, inventory(cluster, tmp_path, free_port(), "b.yaml"), "logme", "ok")
    wait_until(lambda: b"READY" in _log(workdir, "stopme", 1), BOUND, "stopme to run")
    wait_until(lambda: exit_state(workdir, "logme", 1), BOUND, "logme to end")
    assert sshddp(cluster, tmp_path, "stop", "stopme").returncode == 0
    logs = sshddp(cluster, tmp_path, "logs", "logme")
    assert logs.returncode == 0, logs.stderr
    with hung(cluster, 2):  # neither run is asked again: ps shows what stop and logs learned
        rows = by_id(ps_json(cluster, tmp_path, "--connect-timeout", "2"))
    assert [n["state"] for n in rows["stopme"]["nodes"]] == ["stopped", "stopped"], rows
    assert [n["state"] for n in rows["logme"]["nodes"]] == ["succeeded", "succeeded"], rows
    run_no_leak("stopme")
    run_no_leak("logme")


# ------------------------------------------------------------------ run directories gone


def test_attach_and_logs_follow_say_so_when_the_run_directories_are_gone(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Retention removes a finished run's directories (as shutil.rmtree). attach and
    logs --follow then say so and exit (2 when the end was never recorded here, the
    recorded end otherwise) instead of waiting forever for a log that will never come."""
    workdir = tmp_path / "remote"
    for run in ("gone1", "gone2"):
        detach(
            ssh_env, tmp_path, inventory(ssh_env, tmp_path, free_port(), f"{run}.yaml"), run, "ok"
        )
    wait_until(
        lambda: all(exit_state(workdir, r, n) for r in ("gone1", "gone2") for n in range(2)),
        BOUND,
        "both runs to end",
    )
    assert sshddp(ssh_env, tmp_path, "logs", "gone2").returncode == 0  # records gone2's end
    for run in ("gone1", "gone2"):
        shutil.rmtree(workdir / "runs" / run)
    att = sshddp(ssh_env, tmp_path, "attach", "gone1")
    assert att.returncode == 2, att.stderr
    assert "its run directories are gone from every host" in att.stderr, att.stderr
    follow = sshddp(ssh_env, tmp_path, "logs", "--follow", "gone1")
    assert follow.returncode == 2 and "nothing to follow" in follow.stderr, follow.stderr
    assert "run directory is gone from the host" in follow.stderr, follow.stderr
    att2 = sshddp(ssh_env, tmp_path, "attach", "gone2")
    assert att2.returncode == 0, att2.stderr
    assert "this is its end as recorded here" in att2.stderr
    assert "sshddp: run gone2 succeeded" in att2.stderr, att2.stderr
    follow2 = sshddp(ssh_env, tmp_path, "logs", "--follow", "gone2")
    assert follow2.returncode == 0, follow2.stderr
    assert "rank 1 line 49" in follow2.stdout  # the local copies, fetched before
    ps = by_id(ps_json(ssh_env, tmp_path))
    assert [n["state"] for n in ps["gone1"]["nodes"]] == ["gone", "gone"]
    for run in ("gone1", "gone2"):
        run_no_leak(run)


# ------------------------------------------------------------------ the state directory


def test_state_directory_problems_are_clear_errors_before_anything_starts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], tmpfs, run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    readonly = tmpfs(tmp_path / "ro", "1m", "ro")
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    full = tmpfs(tmp_path / "full", "64k")
    (full / "state" / "runs").mkdir(parents=True)
    fill(full)
    cases = [
        (readonly / "state", 2, "Read-only file system"),
        (afile / "state", 2, "Not a directory"),
        (full / "state", 74, "No space left on device"),
    ]
    for n, (state, code, why) in enumerate(cases):
        name = f"st{n}"
        env = {"SSHDDP_STATE_DIR": str(state)}
        r = sshddp(ssh_env, tmp_path, "launch", "--name", name, inv, JOB, "ok", env=env)
        assert r.returncode == code, r.stderr
        assert r.stderr.startswith("sshddp: error: the run registry: cannot "), r.stderr
        assert str(state) in r.stderr and why in r.stderr, r.stderr
        assert "SSHDDP_STATE_DIR" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (workdir / "runs" / name).exists()  # nothing reached any host
        run_no_leak(name, timeout=0.5)


def test_a_malformed_record_is_named_and_never_hides_the_others(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    state = tmp_path / "state"
    env = {"SSHDDP_STATE_DIR": str(state)}
    r = sshddp(ssh_env, tmp_path, "launch", "--name", "good", inv, JOB, "ok", env=env)
    assert r.returncode == 0, r.stderr
    runs = state / "runs"
    (runs / "bad.json").write_text("{not json")
    (runs / "worse.json").write_text('{"run_id": "worse", "nodes": 3}')
    ps = sshddp(ssh_env, tmp_path, "ps", "--all", env=env)
    assert ps.returncode == 0 and "good" in ps.stdout, ps.stdout + ps.stderr
    assert f"{runs / 'bad.json'} is malformed" in ps.stderr, ps.stderr
    assert f"{runs / 'worse.json'} is malformed" in ps.stderr, ps.stderr
    att = sshddp(ssh_env, tmp_path, "attach", "bad", env=env)
    assert att.returncode == 2 and f"{runs / 'bad.json'} is malformed" in att.stderr
    assert "Traceback" not in att.stderr + ps.stderr
    run_no_leak("good")


def test_a_run_whose_end_cannot_be_recorded_still_reports_it(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], tmpfs, run_no_leak
) -> None:
    """The state directory's disk fills up while the run goes on: the run succeeds, the
    report says so, with a warning that its end is not recorded, and the exit is 0."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    disk = tmpfs(tmp_path / "statedisk", "256k")
    env = {"SSHDDP_STATE_DIR": str(disk / "state")}
    proc = subprocess.Popen(
        [*SSHDDP, "launch", "--name", "nofile", str(inv), str(JOB), "stream", "400"],
        cwd=tmp_path,
        env={**cli_env(ssh_env), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: b"tick 5" in _log(workdir, "nofile", 1), BOUND, "the run to stream")
        fill(disk)
        _, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "sshddp: run nofile succeeded" in err, err
    assert "warning: the run's end is not recorded" in err and "No space left" in err, err
    assert "Traceback" not in err
    run_no_leak("nofile")
