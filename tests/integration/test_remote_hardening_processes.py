"""The host-side hardening on real processes: processes named by pid and start time, groups
that count only while torchrun leads them, the supervisors' authenticated wire across
processes, staging into one workdir at once, and output that cannot hang on an escapee."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sshddp.remote import common, workdir
from sshddp.remote.node import host_follow, output, stop, supervisor
from standin_specs import stand_in
from wire_specs import KEY, free_port, spec


def _make_node_dir(args: tuple[str, Any]) -> str:
    rundir, barrier = args
    barrier.wait()
    try:
        workdir.make_rundir(rundir)
        return ""
    except workdir.Unsafe as exc:
        return str(exc)


def test_nodes_sharing_one_workdir_all_stage_when_they_create_it_at_once(
    tmp_path: Path,
) -> None:
    """A workdir on a file system every host mounts (an NFS home; here, this machine's disk
    shared by the test hosts): the nodes of a run create it at the same moment, and every
    one of them must succeed, not fail with 'File exists'."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    nodes = 8
    for attempt in range(20):
        runs = tmp_path / f"w{attempt}" / "runs" / "r1"
        barrier = ctx.Manager().Barrier(nodes)
        with ctx.Pool(nodes) as pool:
            errors = pool.map(
                _make_node_dir, [(str(runs / f"n{k}"), barrier) for k in range(nodes)]
            )
        assert errors == [""] * nodes, (attempt, errors)
        assert sorted(os.listdir(runs)) == [f"n{k}" for k in range(nodes)]


@pytest.fixture
def sleeper() -> Any:
    procs: list[subprocess.Popen[bytes]] = []

    def start(**kwargs: Any) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(["sleep", "60"], **kwargs))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_signal_reaches_a_process_only_under_its_start_time(sleeper: Any) -> None:
    proc = sleeper()
    started = common.start_time(proc.pid)
    assert isinstance(started, int)
    assert not common.send_signal(proc.pid, started + 1, signal.SIGTERM)
    assert proc.poll() is None
    assert common.send_signal(proc.pid, started, signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM


def test_a_group_counts_only_while_torchrun_leads_it(sleeper: Any) -> None:
    leader = sleeper(start_new_session=True)
    started = common.start_time(leader.pid)
    assert isinstance(started, int)
    state = {"pgid": leader.pid, "pid_start": started, "boot_id": common.boot_id()}
    assert stop.torchrun_group(state) == ((leader.pid, started), "")
    found = common.run_pids((leader.pid, started), "no-such-mark")
    assert found == {leader.pid: started}
    # The same number under another start time: a stranger's group, left alone.
    reused = {**state, "pid_start": started - 1}
    group, note = stop.torchrun_group(reused)
    assert group is None and f"pid {leader.pid}" in note and "left alone" in note
    assert common.run_pids((leader.pid, started - 1), "no-such-mark") == {}
    assert stop.torchrun_group({**state, "boot_id": "another-boot"})[0] is None
    assert stop.torchrun_group({"pgid": leader.pid}) == (None, "")  # never recorded


def test_a_supervisor_whose_pid_was_reused_counts_as_gone(tmp_path: Path, sleeper: Any) -> None:
    """The follower must not wait forever on a stranger that took the supervisor's pid."""
    stranger = sleeper()
    started = common.start_time(stranger.pid)
    assert isinstance(started, int)
    (tmp_path / "spec.json").write_text("{}")
    state = {"supervisor_pid": stranger.pid, "supervisor_start": started, "started": 1.0}
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert host_follow.node_status(str(tmp_path))["state"] == "running"
    (tmp_path / "state.json").write_text(json.dumps({**state, "supervisor_start": started - 1}))
    assert host_follow.node_status(str(tmp_path))["state"] == "lost"


def test_the_marker_finds_a_process_in_any_group(sleeper: Any) -> None:
    mark = f"t/{os.getpid()}/{time.monotonic_ns()}"
    marked = sleeper(start_new_session=True, env={**os.environ, "SSHDDP_NODE_MARK": mark})
    found = common.run_pids(None, mark)
    assert list(found) == [marked.pid]
    common.kill_run(None, mark, 0)
    assert marked.wait(10) == -signal.SIGKILL


def test_torchrun_exited_is_seen_without_reaping_it() -> None:
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while not supervisor.exited(proc):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert common._stat(proc.pid) is not None, "reaped: its pid could be reused"
    assert proc.wait() == 0
    assert supervisor.exited(proc)


def test_an_escapee_holding_the_output_is_named_and_not_waited_for(tmp_path: Path) -> None:
    out = output.NodeOutput(str(tmp_path), use_tty=False)
    escapee = subprocess.Popen(["sleep", "60"], stdout=out.slave, start_new_session=True, env={})
    out.close_writer()
    try:
        began = time.monotonic()
        held = out.drain(wait=0.5)
        took = time.monotonic() - began
        assert held == [{"pid": escapee.pid, "command": "sleep 60"}]
        assert took < 10 and escapee.poll() is None
    finally:
        escapee.kill()
        escapee.wait()
    assert out.drain(wait=0.5) == []  # nothing left to read


def test_command_of_shows_printable_text_only(sleeper: Any) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 60", "\x1b]0;title\x07"])
    try:
        time.sleep(0.2)
        assert "\x1b" not in output.command_of(proc.pid)
        assert output.command_of(proc.pid).startswith("sh -c sleep 60 ?]0;title?")
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    """This interpreter, and the oldest a host may have."""
    import sys

    return sys.executable if request.param == "this" else str(oldest_python)


def test_two_supervisors_authenticate_and_a_failure_stops_the_other(
    tmp_path: Path, python: str
) -> None:
    """Node 0's and node 1's real supervisors (``python -S supervisor.py RUNDIR``), each
    given the run's key on stdin, never in a file: node 1's torchrun stand-in
    fails, and node 0, which would wait an hour, is stopped by its hub's abort."""
    from sshddp.hosts import shipped

    port = free_port()
    source = shipped.standalone("supervisor")
    procs = []
    for rank, code in ((0, "import time; time.sleep(3600)"), (1, "raise SystemExit(3)")):
        rundir = tmp_path / f"n{rank}"
        rundir.mkdir()
        node = {**spec(rank, port), **stand_in(rundir, code), "mark": f"{tmp_path}/n{rank}"}
        node["peers"] = {**node["peers"], "nnodes": 2, "hosts": ["h1", "h2"]}
        (rundir / "spec.json").write_text(json.dumps(node))
        (rundir / "supervisor.py").write_text(source)
        with open(rundir / "supervisor.log", "wb") as log:
            argv = [python, "-S", str(rundir / "supervisor.py"), str(rundir)]
            sup = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=log)
            assert sup.stdin is not None
            sup.stdin.write(json.dumps({"env": {}, "peer_key": KEY.hex()}).encode() + b"\n")
            sup.stdin.close()
            procs.append(sup)
    try:
        for proc in procs:
            assert proc.wait(60) == 0
    finally:
        for proc in procs:
            proc.kill()
    ends = [json.loads((tmp_path / f"n{r}" / "exit.json").read_text()) for r in (0, 1)]
    assert ends[1]["state"] == "failed" and ends[1]["returncode"] == 3, ends
    assert ends[0]["state"] == "stopped", ends
    assert ends[0]["reason"] == "stopped: node 1 (h2) failed: torchrun exited with code 3", ends
    assert not [
        p for p in tmp_path.rglob("*") if p.is_file() and KEY.hex().encode() in p.read_bytes()
    ]
    assert "ignored" not in (tmp_path / "n0" / "supervisor.log").read_text()
