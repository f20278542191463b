"""Each line under its own rank on nodes of several ranks, against real sshd hosts and real
torchrun + gloo: 3 hosts of 2 ranks, every rank writing lines that name it (from itself, a
DataLoader worker and a subprocess, to stdout and stderr, a 20 KB line and a ``\\r`` bar).
The console prefixes each line with its global rank; ``--ranks`` on launch and attach and
``logs --rank`` show only those ranks; node.log holds exactly what the ranks wrote, each
rank's bytes whole and in order, and node.idx says which rank wrote each span.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path
from typing import Callable

from launch_helpers import SSHDDP, cli_env, sshddp, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

RANKLINES = Path(__file__).parent / "payloads" / "ranklines.py"
BOUND = 240.0
LINES = 6
PREFIX = re.compile(r"^\[(\d+)(?:-(\d+))? (h\d)\] +(.*)$")


def expected(rank: int, lines: int = LINES) -> bytes:
    """What rank ``rank`` of payloads/ranklines.py writes, in order (stdout and stderr
    share its stream)."""
    out = []
    for i in range(lines):
        out.append(f"rank {rank} line {i}\n")
        out.append(f"rank {rank} err {i}\n")
        if i == lines // 2:
            out.append(f"rank {rank} long " + "x" * 20000 + "\n")
            out.append(f"rank {rank} worker item 0\n")
            out.append(f"rank {rank} worker item 1\n")
            out.append(f"rank {rank} child\n")
            out.append("".join(f"rank {rank} bar {s}/3\r" for s in range(4)) + "\n")
    return "".join(out).encode()


def shown(rank: int) -> list[str]:
    """The lines of rank ``rank`` as the console shows them (a bar as its last state)."""
    text = expected(rank).decode()
    return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")[:-1]]


BAR_STATE = re.compile(r"rank \d+ bar [0-2]/3")  # piped, a live bar's state may show once


def short(text: str) -> str:
    """``text`` for an assertion's message: its long line cut."""
    return re.sub("x{100,}", "x...", text)[-3000:]


def by_rank(out: str) -> tuple[dict[int, list[str]], list[str]]:
    """The console's lines of each rank (prefixed ``[r hK]``), and torchrun's own lines
    (prefixed with a node's range, ``[2-3 h2]``)."""
    ranks: dict[int, list[str]] = {}
    node: list[str] = []
    for line in out.splitlines():
        if line.startswith("sshddp: "):
            continue  # sshddp's own words
        m = PREFIX.match(line)
        assert m, f"a console line without a rank prefix: {short(line)!r}"
        first, last, host, text = int(m[1]), m[2], m[3], m[4]
        if last is not None:
            assert host == f"h{first // 2 + 1}" and int(last) == first + 1, line
            node.append(text)
            continue
        assert host == f"h{first // 2 + 1}", line  # global rank r runs on host r // 2 + 1
        if not BAR_STATE.fullmatch(text):
            ranks.setdefault(first, []).append(text)
    return ranks, node


def spans(workdir: Path, run: str, node: int) -> list[tuple[int, int, int]]:
    index = (workdir / f"runs/{run}/n{node}/node.idx").read_bytes()
    assert len(index) % 16 == 0, len(index)
    return list(struct.iter_unpack("<QIi", index))


def assert_log_is_what_ranks_wrote(cwd: Path, workdir: Path, run: str) -> None:
    """node.log and node.idx of every node, local and remote alike; each rank's spans, put
    together, are exactly what it wrote; torchrun's own spans hold only its lines."""
    for node in range(3):
        remote = workdir / f"runs/{run}/n{node}"
        local = cwd / "sshddp-logs" / run / f"node{node}-h{node + 1}"
        log = remote.joinpath("node.log").read_bytes()
        assert local.with_suffix(".log").read_bytes() == log, f"node {node}: logs differ"
        assert local.with_suffix(".idx").read_bytes() == (remote / "node.idx").read_bytes()
        streams: dict[int, bytes] = {}
        at = 0
        for offset, length, source in spans(workdir, run, node):
            assert offset == at, (node, offset, at)  # the spans cover node.log, no gap
            streams[source] = streams.get(source, b"") + log[offset : offset + length]
            at += length
        assert at == len(log)
        for local_rank in range(2):
            assert streams[local_rank] == expected(2 * node + local_rank), (node, local_rank)
        assert b"rank " not in streams.get(-1, b""), streams.get(-1)  # torchrun's own lines


def test_every_line_carries_its_rank_and_ranks_0_shows_only_rank_0(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=2)
    r = sshddp(ssh_env, tmp_path, "launch", "--ranks", "0", "--name", "rk0", inv, RANKLINES, LINES)
    assert r.returncode == 0, r.stderr
    ranks, node = by_rank(r.stdout)
    assert list(ranks) == [0] and ranks[0] == shown(0), short(r.stdout)  # none of rank 1's
    assert "rank 1 " not in r.stdout and "[1 h1]" not in r.stdout
    assert_log_is_what_ranks_wrote(tmp_path, workdir, "rk0")

    # The whole run from the local copies: every line under the rank that wrote it.
    every = sshddp(ssh_env, tmp_path, "logs", "rk0")
    assert every.returncode == 0, every.stderr
    ranks, node = by_rank(every.stdout)
    assert sorted(ranks) == list(range(6))
    for rank, lines in ranks.items():
        assert lines == shown(rank), (rank, short(str(lines)))
    assert all("rank " not in line for line in node), node

    one = sshddp(ssh_env, tmp_path, "logs", "rk0", "--rank", "3")
    assert one.returncode == 0, one.stderr
    ranks, node = by_rank(one.stdout)
    assert list(ranks) == [3] and ranks[3] == shown(3), short(one.stdout)
    # --tail counts node 1's lines (fewer than 30 come after rank 3's last), then filters.
    tail = sshddp(ssh_env, tmp_path, "logs", "rk0", "--ranks", "3", "--tail", "30")
    assert tail.returncode == 0, tail.stderr
    last = by_rank(tail.stdout)[0].get(3, [])
    assert last and last == shown(3)[-len(last) :], short(tail.stdout)
    run_no_leak("rk0")


def test_with_tty_every_line_keeps_its_rank_and_no_line_holds_two_ranks(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """--tty: each rank writes to a terminal of its own, so its lines are told apart as on a
    pipe: each under its global rank's prefix, never merged with another rank's."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=2)
    r = sshddp(ssh_env, tmp_path, "launch", "--tty", "--name", "ttyr", inv, RANKLINES, LINES)
    assert r.returncode == 0, r.stderr
    ranks, node = by_rank(r.stdout)  # every line carries one rank's prefix
    assert sorted(ranks) == list(range(6)), short(r.stdout)
    for rank, lines in ranks.items():
        assert lines == shown(rank), (rank, short(str(lines)))  # its own text, whole
    assert all("rank " not in line for line in node), node
    assert_log_is_what_ranks_wrote(tmp_path, workdir, "ttyr")
    run_no_leak("ttyr")


def test_attach_ranks_shows_only_that_rank_of_a_detached_run(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=2)
    gate = tmp_path / "gate"
    started = sshddp(
        ssh_env, tmp_path, "launch", "--detach", "--name", "att", inv, RANKLINES, LINES, gate
    )
    assert started.returncode == 0, started.stderr
    halfway = b"rank 3 child\n"
    log = workdir / "runs/att/n1/node.log"
    wait_until(lambda: log.exists() and halfway in log.read_bytes(), BOUND, "rank 3 halfway")
    with open(tmp_path / "attach.out", "w") as out:
        attach = subprocess.Popen(
            [*SSHDDP, "attach", "att", "--ranks", "3"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        wait_until(
            lambda: "[3 h2]" in (tmp_path / "attach.out").read_text(), BOUND, "attach to show"
        )
        gate.touch()  # the ranks write their second half while attach follows
        _, err = attach.communicate(timeout=BOUND)
    finally:
        if attach.poll() is None:
            attach.kill()
    assert attach.returncode == 0, err
    ranks, node = by_rank((tmp_path / "attach.out").read_text())
    assert list(ranks) == [3] and ranks[3] == shown(3), short(str(ranks))
    assert all("rank " not in line for line in node), node
    assert_log_is_what_ranks_wrote(tmp_path, workdir, "att")
    run_no_leak("att")
