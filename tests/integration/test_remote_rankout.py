"""Each rank's own stream on the host: real processes started with the node's sitecustomize
(``remote/rankside/ranksite.py``) write into the supervisor's ``NodeOutput``
(``remote/node/output.py``, ``remote/rankside/rankout.py``), which copies them into node.log and
records in node.idx which rank wrote each span. No torch: the rank environment torchrun gives is set
by hand."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sshddp.hosts import shipped
from sshddp.model import spans
from sshddp.protocol import contract
from sshddp.remote.node.output import NodeOutput
from sshddp.remote.rankside.rankout import rank_ptys, set_size, told_apart

RANK = """
import subprocess, sys
rank = sys.argv[1]
for i in range(200):
    print(f"rank {rank} line {i}")
    print(f"rank {rank} err {i}", file=sys.stderr)
subprocess.run([sys.executable, "-c", f"print('rank {rank} child')"], check=True)
sys.stdout.write(f"rank {rank} no newline")
"""


def expected(rank: int) -> bytes:
    lines = "".join(f"rank {rank} line {i}\nrank {rank} err {i}\n" for i in range(200))
    return f"{lines}rank {rank} child\nrank {rank} no newline".encode()


def site(rundir: Path) -> Path:
    (rundir / "site").mkdir(parents=True)
    (rundir / "site" / "sitecustomize.py").write_text(
        shipped.source("sshddp.remote.rankside.ranksite")
    )
    return rundir / "site"


def start(output: NodeOutput, path: Path, local: str | None, **extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(path), **output.env, **extra}
    if local is not None:
        env.update(LOCAL_RANK=local, TORCHELASTIC_RUN_ID="r1")
    argv = [sys.executable, "-c", RANK, str(local if local is not None else "agent")]
    return subprocess.Popen(argv, env=env, stdout=output.slave, stderr=output.slave)


def by_source(rundir: Path) -> dict[int, bytes]:
    log = (rundir / contract.LOG).read_bytes()
    streams: dict[int, bytes] = {}
    at = 0
    for offset, length, source in spans.parse((rundir / contract.INDEX).read_bytes()):
        assert offset == at  # the spans cover node.log with no gap
        streams[source] = streams.get(source, b"") + log[offset : offset + length]
        at += length
    assert at == len(log)
    return streams


def test_each_rank_and_what_it_starts_write_to_its_own_stream(tmp_path: Path) -> None:
    rundir = tmp_path / "n0"
    path = site(rundir)
    output = NodeOutput(str(rundir), False, None, ranks=2)
    procs = [start(output, path, "0"), start(output, path, "1"), start(output, path, None)]
    output.close_writer()
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        output.pump(0.05)
    assert [p.wait(5) for p in procs] == [0, 0, 0]
    assert output.drain(wait=5) == []
    output.close()
    streams = by_source(rundir)
    assert streams[0] == expected(0) and streams[1] == expected(1)
    agent = streams[contract.SOURCE_NODE]  # not a rank (no LOCAL_RANK): torchrun's stream
    assert agent.replace(b"agent", b"0") == expected(0)
    assert sorted(os.listdir(rundir / contract.OUTPUTS)) == ["0", "1"]


def test_a_rank_whose_stdout_is_not_the_nodes_pipe_is_left_alone(tmp_path: Path) -> None:
    rundir = tmp_path / "n0"
    path = site(rundir)
    output = NodeOutput(str(rundir), False, None, ranks=1)
    env = {
        **os.environ,
        "PYTHONPATH": str(path),
        **output.env,
        "LOCAL_RANK": "0",
        "TORCHELASTIC_RUN_ID": "r1",
    }
    done = subprocess.run(
        [sys.executable, "-c", "print('mine')"], env=env, capture_output=True, timeout=60
    )
    assert done.stdout == b"mine\n"  # its own pipe (torchrun's --redirects, a test harness)
    output.close_writer()
    assert output.drain(wait=5) == []
    output.close()
    assert (rundir / contract.LOG).read_bytes() == b""


def test_without_ranks_told_apart_the_log_is_the_pipe_and_there_is_no_index(
    tmp_path: Path,
) -> None:
    rundir = tmp_path / "n0"
    path = site(rundir)
    output = NodeOutput(str(rundir), False, None)  # --launcher node: no FIFOs
    assert output.env == {}
    proc = start(output, path, "0")
    output.close_writer()
    while output.pump(0.05):
        pass
    assert proc.wait(30) == 0
    output.close()
    assert (rundir / contract.LOG).read_bytes() == expected(0)
    assert not (rundir / contract.INDEX).exists() and not (rundir / contract.OUTPUTS).exists()


TTY_RANK = """
import os, sys
rank = sys.argv[1]
size = os.get_terminal_size(1)
print(f"rank {rank} on {size.columns}x{size.lines}", sys.stdout.isatty(), sys.stderr.isatty())
for i in range(200):
    sys.stdout.write(f"rank {rank} line {i}\\n")
    sys.stdout.write(f"\\rrank {rank} bar {i}")
"""


def test_with_tty_each_rank_writes_to_a_terminal_of_its_own(tmp_path: Path) -> None:
    """--tty: each rank's stdout and stderr move onto its own pty, the node's size, so two
    ranks' bytes never share a line; what is not a rank's stays on the node's pty."""
    rundir = tmp_path / "n0"
    path = site(rundir)
    spec: contract.SpecRecord = {"tty": True, "node_rank": 0, "watch": {"nprocs": [2]}}  # type: ignore[typeddict-item]
    assert told_apart(spec) == 2
    output = NodeOutput(str(rundir), True, [100, 30], ranks=2)
    procs = []
    for local in ("0", "1", None):
        env = {**os.environ, "PYTHONPATH": str(path), **output.env}
        if local is not None:
            env.update(LOCAL_RANK=local, TORCHELASTIC_RUN_ID="r1")
        argv = [sys.executable, "-c", TTY_RANK, str(local if local is not None else "agent")]
        procs.append(subprocess.Popen(argv, env=env, stdout=output.slave, stderr=output.slave))
    output.close_writer()
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        output.pump(0.05)
    assert [p.wait(5) for p in procs] == [0, 0, 0]
    ptys = rank_ptys(str(rundir))
    assert len(ptys) == 2 and all(p.startswith("/dev/pts/") for p in ptys), ptys
    for pts in ptys:  # what winsize resizes: the ranks' own ptys, still open
        fd = os.open(pts, os.O_RDWR | os.O_NOCTTY)
        try:
            set_size(fd, [120, 40])
            assert os.get_terminal_size(fd) == (120, 40)
        finally:
            os.close(fd)
    assert output.drain(wait=5) == []
    output.close()
    streams = by_source(rundir)
    for rank in ("0", "1", "agent"):
        source = contract.SOURCE_NODE if rank == "agent" else int(rank)
        steps = "".join(f"rank {rank} line {i}\n\rrank {rank} bar {i}" for i in range(200))
        wrote = f"rank {rank} on 100x30 True True\n{steps}"
        assert streams[source].decode() == wrote  # every byte its own, in its order


def spans_of(rundir: Path) -> list[bytes]:
    log = (rundir / contract.LOG).read_bytes()
    return [log[o : o + n] for o, n, _ in spans.parse((rundir / contract.INDEX).read_bytes())]


def test_a_trickle_of_lines_is_read_and_written_as_one_span(tmp_path: Path) -> None:
    """After a wakeup that read little, the FIFOs fill for ``gather`` seconds: the lines a
    rank prints one at a time reach node.log in one write with one record, and a byte on the
    wakeup pipe still ends the wait at once."""
    rundir = tmp_path / "n0"
    rundir.mkdir()
    output = NodeOutput(str(rundir), False, None, ranks=1)
    output.gather = 600.0  # longer than the test: only a wakeup or drain ends it
    rank = os.open(rundir / contract.OUTPUTS / "0", os.O_WRONLY)
    wake_read, wake_write = os.pipe()
    try:
        os.write(rank, b"first\n")
        output.pump(5.0, wake_read)
        for i in range(3):
            os.write(rank, b"line %d\n" % i)
            output.pump(0.01, wake_read)
        assert (rundir / contract.LOG).read_bytes() == b"first\n"  # still in the FIFO
        os.write(wake_write, b"x")
        assert output.pump(600.0, wake_read)  # returns at once, the byte read
        os.set_blocking(wake_read, False)
        assert _empty(wake_read)
    finally:
        os.close(rank)
        for fd in (wake_read, wake_write):
            os.close(fd)
    output.close_writer()
    assert output.drain(wait=5) == []
    output.close()
    assert spans_of(rundir) == [b"first\n", b"line 0\nline 1\nline 2\n"]


def test_a_flood_is_read_at_once_after_each_wakeup(tmp_path: Path) -> None:
    """A wakeup that read a lot does not wait: a chatty rank's output is never held back."""
    rundir = tmp_path / "n0"
    rundir.mkdir()
    output = NodeOutput(str(rundir), False, None, ranks=1)
    output.gather = 600.0
    rank = os.open(rundir / contract.OUTPUTS / "0", os.O_WRONLY)
    block = b"x" * 1023 + b"\n"
    try:
        os.write(rank, block * 64)  # what a FIFO holds before it grows: 64 KiB
        output.pump(5.0)
        os.write(rank, b"next\n")
        output.pump(5.0)
        assert (rundir / contract.LOG).read_bytes() == block * 64 + b"next\n"
    finally:
        os.close(rank)
    output.close_writer()
    assert output.drain(wait=5) == []
    output.close()


def _empty(fd: int) -> bool:
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return True
