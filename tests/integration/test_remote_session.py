"""A node's whole life through the launch session (remote/node/host_session.py), run here as the
host's shell would run it, on this Python and on Python 3.8, the oldest a host may have:
probe, go, stage, start (the supervisor forked off the session), then the node's log and
its exit record, exactly as the coordinator reads them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP
from sshddp.protocol import session_messages as msgs
from standin_specs import torchrun_node

STAND_IN = "import runpy\nrunpy.run_path('train.py', run_name='__main__')\n"
SCRIPT = b"import sys\nprint('hello from', sys.version_info[:2])\nprint('no newline', end='')\n"


def answer(stream: IO[bytes], kind: str) -> dict[str, Any]:
    """The session's next line, a reply of ``kind``: what it carries."""
    line = stream.readline()
    assert line.endswith(b"\n"), line
    reply = msgs.decode_reply(line)
    assert reply is not None and reply["kind"] == kind, line
    return msgs.carried(reply)


def session_clock(stream: IO[bytes], sent: float) -> float:
    """The session's first line, its clock, read at once: the host's time.time() between
    ``sent`` (before the header was written) and now; returned."""
    line = stream.readline()
    first = msgs.decode_reply(line)
    assert first is not None and first["kind"] == "clock", line
    assert sent <= first["clock"] <= time.time(), first
    return float(first["clock"])


def boot_args(rundir: Path) -> dict[str, Any]:
    return {
        "rundir": str(rundir),
        "spec": {
            "run_id": "r1",
            "node_rank": 0,
            **torchrun_node(),
            "cwd": str(rundir / "code"),
            "grace": 5,
            "mark": f"r1/n0-{rundir.parent.name}-{os.getpid()}",
            "peers": {},
            "tty": False,
        },
        "env": {"SECRET_TOKEN": "s3cr3t"},
        "payload": {
            "kind": "file",
            "name": "train.py",
            "size": len(SCRIPT),
            "sha256": hashlib.sha256(SCRIPT).hexdigest(),
        },
        "supervisor": shipped.standalone("supervisor"),
        "rank": shipped.source("sshddp.remote.rankside.rank"),
        "agent": STAND_IN,  # the node's torchrun: it runs train.py as python would
        "wire": shipped.source("sshddp.protocol.standby_messages"),
        "site": shipped.source("sshddp.remote.rankside.ranksite"),
        "remote_script": None,
        "keep_runs": 50,
    }


def start_session(python: str) -> subprocess.Popen[bytes]:
    """The launch session's interpreter, as the host's shell starts it."""
    return subprocess.Popen(
        [python, "-c", BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_a_node_lives_and_ends_through_its_session(
    tmp_path: Path, oldest_python: Path, which: str
) -> None:
    python = sys.executable if which == "this" else str(oldest_python)
    rundir = tmp_path / "runs" / "r1" / "n0"
    probe = {
        "workdir": str(tmp_path),
        "deep": False,
        "listen_port": None,
        "connect": None,
        "script": None,
    }
    proc = start_session(python)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        sent = time.time()
        proc.stdin.write(shipped.header("host_session", {"probe": probe}))
        proc.stdin.flush()
        session_clock(proc.stdout, sent)  # before the probe, which would take time
        facts = answer(proc.stdout, "facts")
        expected = subprocess.check_output([python, "--version"], text=True).split()[1]
        assert facts["python"]["version"] == expected, facts

        proc.stdin.write(msgs.encode(msgs.go(boot_args(rundir))) + SCRIPT)
        proc.stdin.flush()
        assert answer(proc.stdout, "released") == {}
        assert answer(proc.stdout, "staged") == {"ok": True, "rundir": str(rundir)}
        assert (rundir / "code" / "train.py").read_bytes() == SCRIPT

        proc.stdin.write(msgs.encode(msgs.start(True)))
        proc.stdin.flush()
        started = answer(proc.stdout, "started")
        assert started["ok"] and started["state"]["state"] in ("running", "succeeded"), started

        log = proc.stdout.read()  # the node's log, streamed until the node has ended
        record = json.loads(proc.stderr.read().decode().strip().splitlines()[-1])
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    version = "(3, 8)" if which == "3.8" else str(tuple(sys.version_info[:2]))
    assert log == b"R" + f"hello from {version}\nno newline".encode()  # R: no node.idx
    assert log[1:] == (rundir / "node.log").read_bytes()
    assert record["state"] == "succeeded" and record["returncode"] == 0, record
    state = json.loads((rundir / "state.json").read_text())
    assert isinstance(state["supervisor_start"], int) and state["supervisor_pid"] != proc.pid
    assert not (rundir / "env.json").exists()  # the secret lived only in the processes
    assert b"s3cr3t" not in (rundir / "supervisor.log").read_bytes() + log


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_a_torchrun_node_runs_torchrun_through_its_session(
    tmp_path: Path, oldest_python: Path, which: str
) -> None:
    """A torchrun node's session stages the agent shim and, at the start, its supervisor runs
    torchrun through it, afresh (no standby for the first attempt). On Python 3.8, which has
    no torch here, torchrun fails into the node's log, saying why."""
    python = sys.executable if which == "this" else str(oldest_python)
    rundir = tmp_path / "runs" / "r1" / "n0"
    args = boot_args(rundir)
    args["spec"]["torchrun"]["options"] = ["--standalone"]
    args["agent"] = shipped.source("sshddp.remote.rankside.agent")  # torchrun itself
    proc = start_session(python)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        sent = time.time()
        proc.stdin.write(shipped.header("host_session", {"probe": None}))
        go = msgs.encode(msgs.go(args))
        proc.stdin.write(go + SCRIPT + msgs.encode(msgs.start(True)))
        proc.stdin.flush()
        session_clock(proc.stdout, sent)
        assert answer(proc.stdout, "released") == {}
        assert answer(proc.stdout, "staged") == {"ok": True, "rundir": str(rundir)}
        started = answer(proc.stdout, "started")
        assert started["ok"], started
        log = proc.stdout.read()
        record = json.loads(proc.stderr.read().decode().strip().splitlines()[-1])
        proc.stdin.close()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    state = json.loads((rundir / "state.json").read_text())
    assert state["standby"] is False, state
    if which == "this":
        assert b"hello from" in log and record["state"] == "succeeded", (log, record)
    else:
        assert b"No module named 'torch'" in log and record["state"] == "failed", log
    assert not (rundir / "env.json").exists()
