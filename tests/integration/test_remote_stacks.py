"""The host side of ``sshddp stacks`` (remote/calls/host_stacks.py, with the ranks' sitecustomize),
run here as a host runs it, on this Python and on Python 3.8: a real process tree set up as
a node's (the node's marker, RANK, the run directory's site/ on PYTHONPATH), read by the
collector shipped as the coordinator ships it. Nothing it does may disturb the processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP
from sshddp.protocol import contract

TREE = """
import ctypes, multiprocessing as mp, os, signal, socket, subprocess, sys, threading, time

def forever():
    while True:
        time.sleep(3600)

def side_thread():
    forever()

def forked_child():
    forever()

def spawned_child():
    forever()

def on_signal(num, frame):
    with open("handled", "a") as fh:
        fh.write(signal.Signals(num).name + "\\n")

def recv_in_c():
    ours, theirs = socket.socketpair()

    def release():
        while not os.path.exists("release"):
            time.sleep(0.05)
        theirs.send(b"hello")

    threading.Thread(target=release, daemon=True).start()
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(16)
    with open("ready", "w") as fh:
        fh.write("ready")
    got = libc.recv(ours.fileno(), buf, 16, 0)
    with open("recv", "w") as fh:
        fh.write("%d %d" % (got, ctypes.get_errno()))
    forever()

if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGUSR2, on_signal)
    threading.Thread(target=side_thread, name="side", daemon=True).start()
    mp.get_context("fork").Process(target=forked_child, daemon=True).start()
    mp.get_context("spawn").Process(target=spawned_child, daemon=True).start()
    subprocess.Popen(["sleep", "600"])
    subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
    recv_in_c()
"""


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    return sys.executable if request.param == "this" else str(oldest_python)


class Node:
    """A node's run directory and a process tree standing in for one of its ranks."""

    def __init__(self, tmp: Path, python: str) -> None:
        self.python = python
        self.rundir = tmp / "runs" / "r1" / "n0"
        (self.rundir / contract.SITE).mkdir(parents=True)
        (self.rundir / contract.SITE / "sitecustomize.py").write_text(
            shipped.source("sshddp.remote.rankside.ranksite")
        )
        self.mark = f"r1/n0-{tmp.name}-{os.getpid()}"  # pid: xdist workers share tmp names
        spec = {"run_id": "r1", "node_rank": 0, "mark": self.mark}
        (self.rundir / contract.SPEC).write_text(json.dumps(spec))
        self.cwd = tmp / "cwd"
        self.cwd.mkdir()
        (self.cwd / "tree.py").write_text(TREE)
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(self.rundir / contract.SITE),
            contract.MARK_VAR: self.mark,
            "RANK": "3",
            "LOCAL_RANK": "1",
        }
        self.rank = subprocess.Popen(
            [python, "tree.py"], cwd=self.cwd, env=env, start_new_session=True
        )

    def wait_for(self, name: str, done: Callable[[str], bool] = bool, timeout: float = 60) -> str:
        """The text of file ``name`` in the tree's cwd, once ``done`` says it is there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            path = self.cwd / name
            if path.exists() and done(path.read_text()):
                return path.read_text()
            time.sleep(0.05)
        raise AssertionError(f"{name} never written as expected by the process tree")

    def collect(self, native: bool = False) -> dict[str, Any]:
        """The collector's answer, run with the node's Python as a host runs it."""
        args = {"rundir": str(self.rundir), "native": native, "timeout": 10.0}
        done = subprocess.run(
            [self.python, "-c", BOOTSTRAP],
            input=shipped.header("host_stacks", args),
            capture_output=True,
            timeout=120,
            env={**os.environ, "PATH": _path_without_py_spy()},
        )
        assert done.returncode == 0, done.stderr.decode()
        return dict(json.loads(done.stdout))

    def close(self) -> None:
        os.killpg(self.rank.pid, signal.SIGKILL)
        self.rank.wait()
        for pid in _marked(self.mark):  # anything that left the process group
            os.kill(pid, signal.SIGKILL)


def _marked(mark: str) -> list[int]:
    from sshddp_lab.sshd import processes_with_env

    return [pid for pid, _ in processes_with_env(contract.MARK_VAR, mark)]


@pytest.fixture
def node(tmp_path: Path, python: str) -> Iterator[Node]:
    made = Node(tmp_path, python)
    try:
        made.wait_for("ready")
        time.sleep(0.5)  # the spawned child is up by now (it imports little)
        yield made
    finally:
        made.close()


def funcs(proc: dict[str, Any]) -> list[set[str]]:
    return [{f["func"] for f in t["frames"]} for t in proc["threads"]]


def by_role(answer: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in answer["processes"] if p["role"] == role]


def test_every_process_is_read_and_none_is_disturbed(node: Node) -> None:
    first = node.collect()
    assert first["state"] == contract.STARTING and first["node_rank"] == 0
    (rank,) = by_role(first, contract.RANK)
    assert rank["pid"] == node.rank.pid and rank["rank"] == 3 and rank["local_rank"] == 1
    assert rank["source"] == "faulthandler" and rank["error"] == ""
    main, side, release = funcs(rank)  # the oldest first
    assert {"recv_in_c", "<module>"} <= main and {"side_thread", "forever"} <= side
    assert "release" in release
    recv = rank["threads"][0]["frames"][-1]
    assert (
        recv["func"] == "recv_in_c" and recv["code"] == "got = libc.recv(ours.fileno(), buf, 16, 0)"
    )
    # As the process names it: Python 3.8 keeps the relative name, read from its cwd.
    assert recv["file"] in ("tree.py", str(node.cwd / "tree.py"))
    workers = {
        frozenset().union(*funcs(w)): w for w in by_role(first, contract.WORKER) if w["threads"]
    }
    assert any("forked_child" in f for f in workers) and any("spawned_child" in f for f in workers)
    assert all(w["rank"] == 3 and w["ppid"] == node.rank.pid for w in workers.values())
    silent = {p["cmdline"]: p["error"] for p in first["processes"] if not p["threads"]}
    assert silent["sleep 600"] == "not a Python process (sleep)"
    (bare,) = [e for c, e in silent.items() if " -S -c " in c]
    assert bare.startswith("a Python process without sshddp's dump handler")

    second = node.collect()  # a second look reads only the new dump
    (again,) = by_role(second, contract.RANK)
    assert again["raw"].count("most recent call first") == 3 and funcs(again) == funcs(rank)

    (node.cwd / "release").write_text("go")
    assert node.wait_for("recv") == "5 0"  # libc's recv was not cut short (EINTR) by a dump
    for sig in (signal.SIGUSR1, signal.SIGUSR2):  # the script's own handlers still run
        os.kill(node.rank.pid, sig)
        node.wait_for("handled", lambda text, sig=sig: sig.name in text.split())
    assert node.rank.poll() is None and len(_marked(node.mark)) == len(first["processes"])


def test_a_dump_file_is_removed_once_its_process_is_gone(node: Node) -> None:
    answer = node.collect()
    worker = next(w for w in by_role(answer, contract.WORKER) if w["threads"])
    stacks = node.rundir / contract.STACKS
    assert any(name.startswith(f"{worker['pid']}-") for name in os.listdir(stacks))
    os.kill(worker["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(p["pid"] == worker["pid"] for p in node.collect()["processes"]):
        assert time.monotonic() < deadline, "the killed worker is still listed"
    assert not any(name.startswith(f"{worker['pid']}-") for name in os.listdir(stacks))


def test_a_node_that_has_ended_has_no_processes_to_read(tmp_path: Path, python: str) -> None:
    rundir = tmp_path / "runs" / "r1" / "n2"
    rundir.mkdir(parents=True)
    (rundir / contract.SPEC).write_text(json.dumps({"node_rank": 2, "mark": f"r1/n2-{tmp_path}"}))
    (rundir / contract.EXIT).write_text(json.dumps({"state": contract.SUCCEEDED}))
    args = {"rundir": str(rundir), "native": False, "timeout": 1.0}
    done = subprocess.run(
        [python, "-c", BOOTSTRAP], input=shipped.header("host_stacks", args), capture_output=True
    )
    answer = json.loads(done.stdout)
    assert answer["state"] == contract.SUCCEEDED and answer["processes"] == []
    args["rundir"] = str(tmp_path / "nowhere")
    done = subprocess.run(
        [python, "-c", BOOTSTRAP], input=shipped.header("host_stacks", args), capture_output=True
    )
    assert json.loads(done.stdout)["state"] == contract.UNKNOWN


def test_native_reads_through_py_spy_where_it_is_beside_the_interpreter(node: Node) -> None:
    """This environment has py-spy beside its interpreter (the test extras pin it); pyenv's
    3.8 has none, nor has PATH: there the answer says so and the signal reads Python frames."""
    answer = node.collect(native=True)
    (rank,) = by_role(answer, contract.RANK)
    beside = str(Path(node.python).parent / "py-spy")
    if node.python == sys.executable:
        assert answer["py_spy"] == beside and answer["note"] == ""
        assert rank["source"] == "py-spy"
        main = rank["threads"][0]
        assert main["name"] == "MainThread" and main["status"].startswith("idle")
        assert main["frames"][-1] == {
            "file": main["frames"][-1]["file"],
            "line": 0,
            "func": "recv",
            "code": "",
            "native": True,
        }
        python = [f for f in main["frames"] if not f["native"]]
        assert python[-1]["func"] == "recv_in_c" and python[-1]["code"].startswith("got = libc")
        (sleep,) = [p for p in answer["processes"] if p["cmdline"] == "sleep 600"]
        assert sleep["error"] == "not a Python process (sleep)"  # py-spy is not even tried
    else:
        assert answer["py_spy"] == "" and rank["source"] == "faulthandler"
        assert answer["note"].startswith(f"py-spy is not installed (looked for {beside} and on")
    (node.cwd / "release").write_text("go")
    assert node.wait_for("recv") == "5 0"  # py-spy's ptrace did not cut the recv short


def _path_without_py_spy() -> str:
    """PATH less the directories holding a py-spy (an activated virtualenv puts one there):
    the collector must find py-spy beside the node's interpreter or not at all."""
    dirs = os.environ["PATH"].split(os.pathsep)
    return os.pathsep.join(d for d in dirs if not os.access(os.path.join(d, "py-spy"), os.X_OK))


def test_two_collections_at_once_each_read_one_whole_dump(node: Node) -> None:
    """Two terminals at the same moment: each collector reads exactly one dump per process."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: node.collect(), range(2)))
    for answer in answers:
        (rank,) = by_role(answer, contract.RANK)
        assert len(rank["threads"]) == 3
        assert rank["raw"].count("most recent call first") == 3, rank["raw"]


def test_a_supervisor_can_collect_in_process_from_a_thread(node: Node) -> None:
    """What a supervisor's watchdog does: import the collector and call it, off its main
    thread, with the node's run directory; it gets the same records back."""
    from concurrent.futures import ThreadPoolExecutor

    from sshddp.remote.calls.host_stacks import collect

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(collect, str(node.rundir)).result(timeout=60)
    (rank,) = by_role(answer, contract.RANK)
    assert rank["pid"] == node.rank.pid and rank["source"] == "faulthandler"
    assert "recv_in_c" in funcs(rank)[0]


#: torch.distributed's module as far as the ranks' sitecustomize cares: it wraps
#: init_process_group when this loads (a real torch takes seconds, and Python 3.8 has none)
FAKE_C10D = """
def init_process_group(*args, **kwargs):
    pass

def get_rank():
    return 3

def get_world_size():
    return 4
"""

CHURN = """
import faulthandler, os, signal, threading, time
import torch.distributed.distributed_c10d as c10d

def work():
    sum(range(100))

def churn():  # threads made and ended all the time: where faulthandler's signal handler crashes
    while True:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

c10d.init_process_group("gloo")
# no dump handler left: the signal cannot be what answers
faulthandler.unregister(signal.SIGRTMIN + %d)
signal.signal(signal.SIGRTMIN + %d, signal.SIG_IGN)
with open("ready", "w") as fh:
    fh.write("ready")
churn()
"""


def test_the_samplers_ask_a_thread_never_a_signal_and_churn_crashes_nothing(
    tmp_path: Path,
) -> None:
    """The samplers that run unasked (``top``'s, the stall watchdog's) ask each rank's
    stacks thread (``by_request``), never faulthandler's signal handler: with threads made
    and ended all the time, that handler crashes CPython 3.11 (SIGSEGV within a few hundred
    signals, seen in CI under accelerate). Asked 300 times, the rank answers at least 290
    times with its main thread's stack, and lives. On this interpreter only (3.11, where the crash
    was seen): the churn costs CI a minute and a half a run."""
    python = sys.executable
    from sshddp.remote.calls.host_stacks import collect

    node = Node.__new__(Node)
    node.python = python
    node.rundir = tmp_path / "runs" / "r1" / "n0"
    (node.rundir / contract.SITE).mkdir(parents=True)
    (node.rundir / contract.SITE / "sitecustomize.py").write_text(
        shipped.source("sshddp.remote.rankside.ranksite")
    )
    node.mark = f"r1/n0-{tmp_path.name}-{os.getpid()}"
    spec = {"run_id": "r1", "node_rank": 0, "mark": node.mark}
    (node.rundir / contract.SPEC).write_text(json.dumps(spec))
    node.cwd = tmp_path / "cwd"
    package = node.cwd / "torch" / "distributed"
    package.mkdir(parents=True)
    (node.cwd / "torch" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "distributed_c10d.py").write_text(FAKE_C10D)
    offset = contract.STACKS_SIGNAL_OFFSET
    (node.cwd / "churn.py").write_text(CHURN % (offset, offset))
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{node.rundir / contract.SITE}{os.pathsep}{node.cwd}",
        contract.MARK_VAR: node.mark,
        "RANK": "3",
        "LOCAL_RANK": "1",
    }
    node.rank = subprocess.Popen(
        [python, "churn.py"], cwd=node.cwd, env=env, start_new_session=True
    )
    try:
        node.wait_for("ready")
        answered = 0
        for _ in range(300):
            (rank,) = by_role(
                collect(str(node.rundir), only={node.rank.pid}, unasked=True), contract.RANK
            )
            assert node.rank.poll() is None, f"the rank died ({node.rank.returncode})"
            if rank["threads"]:
                answered += 1
                main = rank["threads"][0]  # the oldest: the main thread
                assert main["frames"][0]["func"] == "<module>", rank["raw"]
                assert "churn" in {f["func"] for f in main["frames"]}
                assert "sshddp-stacks" not in rank["raw"] and "_serve" not in rank["raw"]
        assert answered >= 290  # a sample may miss while the churn holds the GIL
        signalled = collect(str(node.rundir), only={node.rank.pid})  # the signal: refused
        (rank,) = by_role(signalled, contract.RANK)
        assert rank["threads"] == [] and "dump handler" in rank["error"]
        pid = node.rank.pid
        assert [p.name for p in (node.rundir / contract.STACKS).glob(f"{pid}-*.ask")]
    finally:
        node.close()
    collect(str(node.rundir))  # prunes what the gone process left: its dump file and FIFO
    assert not [p.name for p in (node.rundir / contract.STACKS).glob(f"{pid}-*")]
