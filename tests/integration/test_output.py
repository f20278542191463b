"""How ranks' output reaches the node log: a line-buffered pipe by default, a pty with --tty.

Ranks never flush here: sshddp's rank shim must make every plain `print` one whole, live
line, and the lines of ranks writing at the same time must never mix. (Checked by hand:
with torchrun's `python -u` instead of the shim, the mixing test finds thousands of broken
lines, and without any buffering change the live test never sees its line.)
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import SSHDDP, Run, cli_env, run_id_of, write_inventory

from sshddp.model import spans
from sshddp_lab.sshd import SshdCluster

STDIO = Path(__file__).parent / "payloads" / "stdio.py"
NPROC = 4


def _launch(cluster: SshdCluster, tmp: Path, port: int, opts: list[str], args: list[str]) -> Run:
    inv, workdir = write_inventory(cluster, tmp, port, hosts=[1], nproc=NPROC)
    proc = subprocess.run(
        [*SSHDDP, "launch", *opts, str(inv), str(STDIO), *args],
        cwd=tmp,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=180,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, run_id_of(proc.stderr), tmp, workdir)


@pytest.mark.parametrize(("opts", "tty"), [([], False), (["--tty"], True)])
def test_unflushed_lines_of_concurrent_ranks_never_mix(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
    opts: list[str],
    tty: bool,
) -> None:
    """Each rank's bytes, as node.idx attributes them, are exactly its lines, in order. In
    node.log itself no line is a mix of two ranks' bytes with pipes; with ptys a line may
    be (contract.py: a pty takes a long write in pieces, and a rank that stalls between
    them for PARTIAL_WAIT has its part so far written, as a progress bar's is), so there
    the index is what tells them apart, as the console and `sshddp logs` do."""
    count, size = 5000, 1000  # 5 MB per rank, each line one write below PIPE_BUF (4 KB)
    run = _launch(ssh_env, tmp_path, free_port(), opts, ["lines", str(count), str(size)])
    assert run.rc == 0, run.stderr
    data = run.local_log(0).read_bytes()
    assert data == run.remote_log(0).read_bytes()
    index = run.local_log(0).with_suffix(".idx").read_bytes()
    streams: dict[int, bytes] = {}
    for offset, length, source in spans.parse(index):
        streams[source] = streams.get(source, b"") + data[offset : offset + length]
    lines = data.decode().splitlines()
    for rank in range(NPROC):
        fill = chr(ord("a") + rank) * (size - len(f"r{rank} 000000 ") - 1)
        expected = [f"r{rank} {i:06d} {fill}" for i in range(count)]
        assert streams[rank].decode().splitlines() == [f"tty {tty} rank {rank}", *expected]
        if not tty:
            assert [ln for ln in lines if ln.startswith(f"r{rank} ")] == expected
    # Nothing else: every line of a rank is its own (torchrun's own lines aside).
    if not tty:
        assert len([ln for ln in lines if re.match(r"r\d ", ln)]) == NPROC * count
    run_no_leak(run.run_id)


def test_a_line_printed_without_flush_shows_up_live(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=2)
    proc = subprocess.Popen(
        [*SSHDDP, "launch", "--grace", "1", str(inv), str(STDIO), "live"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: set[str] = set()
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        seen.update(m.group(0) for m in [re.search(r"LIVE \d", line)] if m)
    # Both lines arrived while the ranks still run: nothing waited for a buffer to fill.
    assert seen == {"LIVE 0", "LIVE 1"}
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    run_no_leak(run_id_of(err.decode()))


def test_a_burst_of_binary_junk_and_a_last_line_without_newline_lose_nothing(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """50 MB of binary junk in one burst, then a last line with no newline: the node's log
    and the local copy hold every byte, in order; the console shows the unterminated line."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=1)
    proc = subprocess.run(
        [*SSHDDP, "launch", str(inv), str(STDIO), "junk", "50"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        timeout=300,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    run = Run(0, "", err, run_id_of(err), tmp_path, workdir)
    data = run.local_log(0).read_bytes()
    assert data == run.remote_log(0).read_bytes()
    expected = _junk(50)
    assert len(data) >= len(expected) and expected in data
    assert proc.stdout.rstrip(b"\n").endswith(b"tail without a newline")
    run_no_leak(run.run_id)


def _junk(mb: int) -> bytes:
    """What the payload's `junk MB` writes (the same generator, not imported: the payload
    runs its mode at import)."""
    return random.Random(mb).randbytes(mb << 20) + b"tail without a newline"


def test_second_ctrl_c_skips_the_grace_period(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Ranks ignore SIGTERM and --grace is 300 s: the first Ctrl-C asks them to stop, the
    second kills every process of the run at once (exit 130, nothing left)."""
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    proc = subprocess.Popen(
        [*SSHDDP, "launch", "--grace", "300", str(inv), str(STDIO), "stubborn"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen = b""
    while seen.count(b"STUBBORN") < 2:
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None  # still inside the 300 s grace period
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # far below the grace period
    assert proc.returncode == 130, err.decode()
    assert b"killing every process of the run now" in out + err
    run_no_leak(run_id_of(err.decode()))


def test_workers_the_script_spawns_print_live_and_whole(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Each rank starts two fresh interpreters (multiprocessing's spawn, and a `python`
    subprocess), whose stdout is the node's pipe: their unflushed lines show up while they
    run, and 2,000 lines of 1 KB from each of the four workers at once never mix. Without
    the node's sitecustomize they are block-buffered: nothing shows until they exit."""
    count, size = 2000, 1000
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=2)
    argv = [*SSHDDP, "launch", "--grace", "1", str(inv), str(STDIO), "spawned", str(count)]
    proc = subprocess.Popen(
        [*argv, str(size)],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen, lines = _read_spawned(proc, count, size, timeout=120)
        # Every worker's lines arrived, whole and in order, while they all still run.
        assert seen == {f"SPAWNED {r} {how}" for r in (0, 1) for how in ("mp", "py")}
        assert lines == {f"w{r}{h}": count for r in (0, 1) for h in "mp"}
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    run = Run(130, "", err.decode(), run_id_of(err.decode()), tmp_path, workdir)
    assert run.local_log(0).read_bytes() == run.remote_log(0).read_bytes()
    run_no_leak(run.run_id)


def _read_spawned(
    proc: subprocess.Popen[bytes], count: int, size: int, timeout: float
) -> tuple[set[str], dict[str, int]]:
    """The spawned workers' greetings, and how many whole lines each printed, in order,
    read from the console for up to ``timeout`` s (in a thread: a quiet pipe blocks)."""
    seen: set[str] = set()
    lines: dict[str, int] = {}
    bad: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode().rstrip("\n")
            if m := re.search(r"SPAWNED \d (mp|py)", line):
                seen.add(m.group(0))
            if m := re.search(r"(w\d[mp]) (\d{6}) x+$", line):
                whole = len(m.group(0)) == size - 1
                if whole and int(m.group(2)) == lines.get(m.group(1), 0):
                    lines[m.group(1)] = lines.get(m.group(1), 0) + 1
                else:
                    bad.append(line)  # broken, or out of order
            if sum(lines.values()) == 4 * count and len(seen) == 4:
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout)
    assert not bad, f"{len(bad)} broken or misordered lines, e.g. {bad[:2]}"
    return set(seen), dict(lines)
