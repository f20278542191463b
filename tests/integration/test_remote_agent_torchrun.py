"""The agent shim (remote/rankside/agent.py) running real torchrun: through the shim it ends as
`python -m torch.distributed.run` does, a standby runs it with the go's argv, cwd and environment,
and a node started early waits for node 0's store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sshddp.hosts import shipped
from sshddp.protocol import contract
from sshddp.remote.node.standby import Spare, Standby

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
    path.write_text(shipped.source("sshddp.remote.rankside.agent"))
    # the standby reads its go with the wire's module beside it, as in a run directory
    (tmp_path / contract.STANDBY_WIRE).write_text(
        shipped.source("sshddp.protocol.standby_messages")
    )
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


def test_bad_torchrun_options_exit_as_argparse_does(shim: Path, tmp_path: Path) -> None:
    got = torchrun(tmp_path, [str(shim)], "--no-such-option", "worker.py")
    assert got.returncode == 2
    assert "unrecognized arguments: --no-such-option" in got.stderr


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def test_a_standby_runs_torchrun_with_the_gos_argv_cwd_and_environment(
    shim: Path, tmp_path: Path
) -> None:
    """The go's command line, directory and environment, not those the standby started
    with, are what torchrun runs with, and its module runs as with -m (no runpy warning)."""
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

    class Output:  # the two things take() uses of the node's output
        slave = os.open(os.devnull, os.O_WRONLY)

        def close_writer(self) -> None:
            raise AssertionError("a standby that does not fit never gets the output")

    spare = Spare(argv, str(tmp_path))
    spare.standby = standby
    assert spare.take(1, base, Output()) is None  # type: ignore[arg-type]
    assert standby.proc.returncode is not None  # ended and reaped
    os.close(Output.slave)


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
