"""The host-side hardening, run here on real files, processes and sockets: new files only
(nothing planted is followed), checked directories, processes named by pid and start time,
the supervisors' authenticated wire, and a node's output that cannot hang on an escapee."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sshddp.remote import common, follow, output, peers, stop, supervisor, wire, workdir
from sshddp.remote.contract import SpecRecord

# ------------------------------------------------------------------ files and directories


def test_a_new_file_never_follows_or_reuses_what_is_there(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("link", "dangling", "victim"):
        with pytest.raises(FileExistsError):
            common.write_new(str(tmp_path / name), b"x")
    assert victim.read_bytes() == b"precious" and not (tmp_path / "nowhere").exists()
    common.write_new(str(tmp_path / "fresh"), b"x")
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o600


def test_json_is_replaced_whole_through_an_unguessable_temporary(tmp_path: Path) -> None:
    leak = tmp_path / "leak"
    leak.touch()
    target = tmp_path / "env.json"
    (tmp_path / f"env.json.tmp.{os.getpid()}").symlink_to(leak)  # the old, guessable name
    common.atomic_write_json(str(target), {"TOKEN": "s3cr3t"})
    assert json.loads(target.read_text()) == {"TOKEN": "s3cr3t"}
    assert leak.read_bytes() == b""
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "env.json",
        f"env.json.tmp.{os.getpid()}",
        "leak",
    ]


def test_a_node_directory_is_made_private_and_never_reused(tmp_path: Path) -> None:
    node = tmp_path / "w" / "runs" / "r1" / "n0"
    workdir.make_rundir(str(node))
    for path in (node, node.parent, node.parent.parent):
        assert path.stat().st_mode & 0o777 == 0o700, path
    with pytest.raises(workdir.Unsafe, match="already exists on this host"):
        workdir.make_rundir(str(node))
    workdir.make_rundir(str(node.parent / "n1"))  # another node of the run, same host


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


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda w: (w / "runs").mkdir(mode=0o777) or (w / "runs").chmod(0o777), "writable by"),
        (lambda w: (w / "runs").symlink_to(w.parent), "is a symlink"),
        (lambda w: os.chown(w, 65534, 65534), "belongs to uid 65534"),
        (lambda w: w.chmod(0o775), "writable by other users (mode 0775)"),
    ],
)
def test_a_directory_others_control_is_refused_and_inspect_says_so(
    tmp_path: Path, setup: Any, message: str
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    setup(work)
    with pytest.raises(workdir.Unsafe, match=re.escape(message)) as refused:
        workdir.make_rundir(str(work / "runs" / "r1" / "n0"))
    assert refused.value.fix, "no fix given"
    found = workdir.inspect(str(work))
    assert message in found["problem"] and found["fix"] == refused.value.fix, found
    assert not (tmp_path / "r1").exists()


def test_inspect_of_a_workdir_to_be_made_looks_at_its_parent(tmp_path: Path) -> None:
    found = workdir.inspect(str(tmp_path / "not" / "yet"))
    assert found == {"path": str(tmp_path), "readonly": False, "problem": None}


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda above: os.chown(above, 65534, 65534), "belongs to uid 65534"),
        (lambda above: above.chmod(0o777), "is writable by other users (mode 0777, not sticky)"),
    ],
)
def test_a_directory_above_the_workdir_that_others_control_is_refused(
    tmp_path: Path, setup: Any, message: str
) -> None:
    """Whoever may rename what is in a directory above the workdir could swap the workdir
    for their own after the check."""
    above = tmp_path / "above"
    (above / "w").mkdir(parents=True)
    setup(above)
    with pytest.raises(workdir.Unsafe, match=re.escape(f"{above}, above workdir")) as refused:
        workdir.make_rundir(str(above / "w" / "runs" / "r1" / "n0"))
    assert message in refused.value.what and refused.value.fix
    assert message in workdir.inspect(str(above / "w"))["problem"]
    assert not (above / "w" / "runs").exists()


def test_a_workdir_through_links_of_ours_is_used_by_its_real_path_only(tmp_path: Path) -> None:
    """A link of ours, in a sticky world-writable directory (as /tmp), is followed once:
    the node directory, and the paths under the workdir, are the real ones from then on."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (shared / "hop").symlink_to("../real")
    (shared / "work").symlink_to(shared / "hop")
    given = str(shared / "work" / "runs" / "r1" / "n0")
    made = workdir.make_rundir(given)
    assert made == str(real / "runs" / "r1" / "n0") and os.path.isdir(made)
    assert workdir.moved(str(shared / "work" / "work" / "p-1"), given, made) == str(
        real / "work" / "p-1"
    )
    assert workdir.moved("/elsewhere/x", given, made) == "/elsewhere/x"


# ------------------------------------------------------------------ processes


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
    assert follow.node_status(str(tmp_path))["state"] == "running"
    (tmp_path / "state.json").write_text(json.dumps({**state, "supervisor_start": started - 1}))
    assert follow.node_status(str(tmp_path))["state"] == "lost"


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


def test_a_planted_log_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "node.log").symlink_to(victim)
    with pytest.raises(FileExistsError):
        output.NodeOutput(str(tmp_path), use_tty=False)
    (tmp_path / "node.log").unlink()
    (tmp_path / "reserve").symlink_to(victim)
    with pytest.raises(FileExistsError):
        output.NodeOutput(str(tmp_path), use_tty=False)
    assert victim.read_bytes() == b"precious"


def test_command_of_shows_printable_text_only(sleeper: Any) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 60", "\x1b]0;title\x07"])
    try:
        time.sleep(0.2)
        assert "\x1b" not in output.command_of(proc.pid)
        assert output.command_of(proc.pid).startswith("sh -c sleep 60 ?]0;title?")
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ the wire

KEY = bytes(range(32))


def pair(
    spoke_key: bytes = KEY, spoke_run: str = "r1", rank: int = 1
) -> tuple[Any, Any, socket.socket]:
    """Both ends of a handshake over a real socket pair: (hub's result, spoke's, the
    spoke's raw socket)."""
    hub_sock, spoke_sock = socket.socketpair()
    result: dict[str, Any] = {}

    def hub() -> None:
        try:
            result["hub"] = wire.offer(hub_sock, KEY, "r1", "test")
        except wire.Refused as exc:
            result["hub"] = exc
            hub_sock.close()

    thread = threading.Thread(target=hub)
    thread.start()
    try:
        spoke: Any = wire.join(spoke_sock, spoke_key, spoke_run, rank, "test")
    except wire.Refused as exc:
        spoke = exc
        spoke_sock.close()
    thread.join(30)
    return result["hub"], spoke, spoke_sock


def test_both_sides_prove_the_key_and_lines_are_maced_and_sequenced() -> None:
    (hub, rank), spoke, raw = pair()
    assert rank == 1
    assert spoke.send({"hb": 1}) and spoke.send({"done": 1, "state": "failed"})
    assert hub.receive() == {"run": "r1", "seq": 0, "hb": 1}
    assert hub.receive()["state"] == "failed"
    assert hub.send({"abort": "why"}) and spoke.receive()["abort"] == "why"
    # A replayed line, a tampered one and an overlong one are noise; the next real one counts.
    body = '{"run":"r1","seq":0,"hb":1}'
    replay = f"{wire.mac(spoke.key, 'spoke', body)} {body}\n".encode()
    tampered = replay.replace(b'"hb":1', b'"hb":2')
    raw.sendall(replay + tampered + b"y" * (wire.MAX_LINE * 3) + b"\n")
    assert spoke.send({"bye": 0})
    assert hub.receive() == {"run": "r1", "seq": 2, "bye": 0}


def test_a_wrong_key_is_refused() -> None:
    """The hub hangs up on a spoke that cannot prove the key (the spoke tries again until
    its deadline); a hub that cannot prove it is not taken for this run's."""
    hub, spoke, _ = pair(spoke_key=b"x" * 32)
    assert isinstance(hub, wire.Refused) and "does not prove" in str(hub)
    assert isinstance(spoke, wire.Refused) and "closed before its answer" in str(spoke)
    hub_sock, spoke_sock = socket.socketpair()
    impostor = threading.Thread(target=lambda: impersonate(hub_sock))
    impostor.start()
    with pytest.raises(wire.Refused, match="did not prove it holds this run's key") as refused:
        wire.join(spoke_sock, KEY, "r1", 1, "test")
    assert not refused.value.retry
    impostor.join(30)


def impersonate(sock: socket.socket) -> None:
    """A hub that knows the run id but not the key."""
    sock.sendall(b'{"v": 1, "run": "r1", "nonce": "%s"}\n' % (b"0" * 32))
    sock.recv(4096)
    sock.sendall(b'{"mac": "' + b"0" * 64 + b'"}\n')


def test_a_spoke_of_another_run_says_whose_port_it_reached() -> None:
    hub, spoke, _ = pair(spoke_run="r2")
    assert isinstance(spoke, wire.Refused) and not spoke.retry
    assert "it belongs to another run ('r1'), not to run r2" in str(spoke)
    assert isinstance(hub, wire.Refused)


def spec(rank: int, port: int) -> SpecRecord:
    return {
        "schema": 2,
        "run_id": "r1",
        "node_rank": rank,
        "argv": [],
        "cwd": None,
        "grace": 1,
        "mark": "r1/n0",
        "peers": {"nnodes": 3, "addr": "127.0.0.1", "port": port, "timeout": 30, "hosts": []},
        "tty": False,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_hub_obeys_only_its_run_and_a_node_reports_for_itself() -> None:
    port = free_port()
    hub = peers.peers_for(spec(0, port), KEY)
    assert isinstance(hub, peers.Hub)
    hub.start()
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", port)) as stranger:
        stranger.recv(4096)
        stranger.sendall(b'{"done": 2, "state": "failed", "reason": "forged"}\n')
        stranger.recv(4096)  # until the hub hangs up
    spoke = peers.peers_for(spec(1, port), KEY)
    assert isinstance(spoke, peers.Spoke)
    spoke.start()
    deadline = time.monotonic() + 30
    while spoke.conn is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert spoke.conn.send({"done": 2, "state": "succeeded", "reason": ""})  # claims rank 2
    deadline = time.monotonic() + 30
    while 1 not in hub.done:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert hub.done == {1: ("succeeded", "")} and hub.abort is None


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
        node = {**spec(rank, port), "argv": ["python", "-c", code], "mark": f"{tmp_path}/n{rank}"}
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
