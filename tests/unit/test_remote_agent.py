"""The agent shim (remote/agent.py): torchrun through it ends as `python -m
torch.distributed.run` does (status, output, failure summary), only without the
interpreter's teardown of torch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.remote.agent import await_store, exit_code, program_name, store_endpoint
from sshddp.remote.standby import Spare, Standby

WORKER = r"""
import os, sys
rank = int(os.environ["RANK"])
os.write(1, ("worker %d %s\n" % (rank, sys.argv[1:])).encode())  # one write: no mixing
if sys.argv[1] == "fail" and rank == 1:
    raise RuntimeError("injected failure")
"""


@pytest.fixture()
def shim(tmp_path: Path) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(shipped.source("sshddp.remote.agent"))
    (tmp_path / "worker.py").write_text(WORKER)
    return path


def torchrun(tmp_path: Path, head: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, *head, "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_torchrun_through_the_shim_ends_as_with_dash_m(
    shim: Path, tmp_path: Path, mode: str
) -> None:
    via_m = torchrun(tmp_path, ["-m", "torch.distributed.run"], "worker.py", mode)
    via_shim = torchrun(tmp_path, [str(shim)], "worker.py", mode)
    assert via_shim.returncode == via_m.returncode == (0 if mode == "ok" else 1)
    for got in (via_m, via_shim):
        assert sorted(line for line in got.stdout.splitlines() if line.startswith("worker")) == [
            f"worker 0 ['{mode}']",
            f"worker 1 ['{mode}']",
        ]
    if mode == "fail":  # torchrun's failure summary, printed before the shim's exit
        assert "Root Cause (first observed failure)" in via_shim.stderr
        assert "ChildFailedError" in via_shim.stderr
        assert "exitcode  : 1" in via_shim.stderr


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["/r/n1/rank.py", "train.py", "--lr", "1"], "train.py"),
        (["/r/n1/rank.py", "-m", "pkg.train", "x"], "pkg.train"),
        (["/r/n1/rank.py", "cost$$.py"], "cost$.py"),  # as the script got it
        (["/r/n1/rank.py"], "/r/n1/rank.py"),  # nothing after the shim: left as it is
        (["train.py", "rank.py"], "train.py"),  # the program is not the shim
    ],
)
def test_torchruns_summary_names_the_script_the_rank_shim_runs(args: list[str], name: str) -> None:
    torchruns = next(arg for arg in args if not arg.startswith("-"))  # its rule, for python
    assert program_name(torchruns, list(args)) == name


def test_bad_torchrun_options_exit_as_argparse_does(shim: Path, tmp_path: Path) -> None:
    got = torchrun(tmp_path, [str(shim)], "--no-such-option", "worker.py")
    assert got.returncode == 2
    assert "unrecognized arguments: --no-such-option" in got.stderr


def test_exit_code_is_the_interpreters(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(SystemExit()) == 0
    assert exit_code(SystemExit(None)) == 0
    assert exit_code(SystemExit(3)) == 3
    assert exit_code(SystemExit(256 + 7)) == 7
    assert capsys.readouterr().err == ""
    assert exit_code(SystemExit("torchrun: bad")) == 1
    assert capsys.readouterr().err == "torchrun: bad\n"


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def test_a_standby_runs_torchrun_with_the_gos_argv_cwd_and_environment(
    shim: Path, tmp_path: Path
) -> None:
    """A launch's first standby starts before its port and working directory are final
    (remote/prewarm.py): the go's command line, directory and environment are what
    torchrun runs with, and its module runs as with -m (no runpy warning)."""
    early = [sys.executable, str(shim), "--standalone", "--nproc-per-node", "1", "worker.py"]
    standby = Standby.start([*early, "early"], dict(os.environ), str(Path.home()), 1)
    assert standby is not None
    final = [sys.executable, str(shim), "--standalone", "--nproc-per-node", "2", "worker.py"]
    read, write = os.pipe()
    env = {**os.environ, "SSHDDP_ATTEMPT": "1"}
    proc = standby.go(env, write, [*final, "late"], str(tmp_path))
    os.close(write)
    assert proc is not None
    out = _read_all(read)
    assert proc.wait(120) == 0, out
    assert sorted(line for line in out.splitlines() if line.startswith("worker")) == [
        "worker 0 ['late']",
        "worker 1 ['late']",
    ]
    assert "RuntimeWarning" not in out, out


def test_a_standby_started_with_another_environment_is_ended_not_used(
    shim: Path, tmp_path: Path
) -> None:
    """What torch read at import must be what torchrun would have read: a standby whose
    environment differs (but for sshddp's own variables) is not taken."""
    argv = [sys.executable, str(shim), "--standalone", "--nproc-per-node", "1", "worker.py"]
    base = {**os.environ, "SSHDDP_NODE_MARK": "r/n0"}
    standby = Standby.start(argv, {**base, "LD_LIBRARY_PATH": "/elsewhere"}, str(tmp_path), 1)
    assert standby is not None
    assert standby.fits({**base, "LD_LIBRARY_PATH": "/elsewhere", "SSHDDP_ATTEMPT": "1"})
    assert not standby.fits(base)
    marked = Standby.start(argv, base, str(tmp_path), 1, marked=True)  # a launch's first
    assert marked is not None
    assert marked.fits(base) and not marked.fits({**base, "SSHDDP_NODE_MARK": "r/n1"})
    marked.discard()

    class Output:  # the two things take() uses of the node's output
        slave = os.open(os.devnull, os.O_WRONLY)

        def close_writer(self) -> None:
            raise AssertionError("a standby that does not fit never gets the output")

    spare = Spare(argv, str(tmp_path), standby)
    assert spare.take(1, base, Output()) is None  # type: ignore[arg-type]
    assert standby.proc.returncode is not None  # ended and reaped
    os.close(Output.slave)


# ------------------------------------------------------------- node 0's store first


STATIC_1 = "--node-rank 1 --rdzv-backend static"


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (f"{STATIC_1} --rdzv-endpoint 10.0.0.1:29500", ("10.0.0.1", 29500)),
        ("--node_rank=2 --rdzv_backend=static --rdzv_endpoint=h1:7", ("h1", 7)),
        (f"{STATIC_1} --rdzv-endpoint [fd00::1]:29500", ("fd00::1", 29500)),
        # node 0 serves the store; another backend is torchrun's own business
        ("--node-rank 0 --rdzv-backend static --rdzv-endpoint h1:7", None),
        ("--node-rank 1 --rdzv-backend c10d --rdzv-endpoint h1:7", None),
        # the last of an option counts, as in argparse (the user's options come after ours)
        (f"{STATIC_1} --rdzv-endpoint h1:7 --rdzv-backend c10d", None),
        # no port, no endpoint, no rank: nothing to wait for
        (f"{STATIC_1} --rdzv-endpoint h1", None),
        (STATIC_1, None),
        ("--rdzv-backend static --rdzv-endpoint h1:7", None),
        # the program's own arguments are not torchrun's
        (f"{STATIC_1} --no-python python rank.py --rdzv-endpoint h9:9", None),
        (f"{STATIC_1} --rdzv-endpoint h1:7 --no-python python rank.py --node-rank 0", ("h1", 7)),
        ("--node-rank 1 --rdzv-backend", None),
    ],
)
def test_store_endpoint_is_node_0s_for_the_other_nodes_of_a_static_rendezvous(
    args: str, want: tuple[str, int] | None
) -> None:
    assert store_endpoint(args.split()) == want


def test_await_store_returns_once_the_endpoint_listens_and_leaves_no_connection(
    free_port: Callable[[], int],
) -> None:
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    listening = threading.Event()

    def listen_later() -> None:
        time.sleep(0.3)  # the node's tries are refused until then
        server.listen()
        listening.set()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert await_store("127.0.0.1", port, limit=60)
        assert listening.is_set()
        conn, _ = server.accept()  # the one try that got through, closed at once
        with conn:
            assert conn.recv(16) == b""
    finally:
        thread.join()
        server.close()


def test_await_store_gives_up_after_its_limit(free_port: Callable[[], int]) -> None:
    assert not await_store("127.0.0.1", free_port(), limit=0.2)
    assert not await_store("no-such-host.invalid", 1, limit=0.2)


def test_a_try_of_the_store_leaves_it_serving_its_clients(free_port: Callable[[], int]) -> None:
    """The try is a connection the store sees open and close with nothing sent; its clients
    connect and work as before."""
    from datetime import timedelta

    import torch.distributed as dist

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=30), False)
    for _ in range(3):
        assert await_store("127.0.0.1", port, limit=10)
    client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
    client.set("key", "value")
    assert server.get("key") == b"value"


def test_a_node_started_before_node_0_runs_torchrun_once_node_0s_store_is_up(
    shim: Path, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """Two nodes of a static rendezvous on this machine, node 1 started first: its torchrun
    (whose launcher logs at INFO) begins only after node 0 was started, and the rendezvous
    completes with both nodes' workers."""
    port = free_port()

    def node(rank: int) -> subprocess.Popen[str]:
        torchrun = f"--nnodes 2 --node-rank {rank} --nproc-per-node 1 --rdzv-backend static"
        argv = [sys.executable, str(shim), *torchrun.split(), "--rdzv-endpoint"]
        argv += [f"127.0.0.1:{port}", "worker.py", "ok"]
        env = {**os.environ, "LOGLEVEL": "INFO"}
        return subprocess.Popen(
            argv, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    first = node(1)
    began: list[float] = []

    def watch() -> None:
        assert first.stderr is not None
        for line in first.stderr:
            if "Starting elastic_operator" in line:
                began.append(time.monotonic())

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(3)  # node 1 has imported torch by now, on most machines, and waits
    node0_started = time.monotonic()
    zero = node(0)
    try:
        out0, _ = zero.communicate(timeout=120)
        first.wait(timeout=120)
    finally:
        for proc in (zero, first):
            proc.kill()
        watcher.join()
    assert first.stdout is not None
    out1 = first.stdout.read()
    assert (zero.returncode, first.returncode) == (0, 0)
    assert "worker 0 ['ok']" in out0 and "worker 1 ['ok']" in out1
    assert len(began) == 1 and began[0] > node0_started
