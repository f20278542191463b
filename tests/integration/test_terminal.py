"""What reaches the user's terminal from ranks and hosts, against real sshd hosts: the live
console and ``logs`` keep colours and ``\\r`` progress bars but drop every other control
sequence; the report, reasons and ``ps`` show control characters as escapes; the local logs
keep every byte, owner-only; ``logs`` streams, whatever the log's size.
"""

from __future__ import annotations

import os
import pty
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

from launch_helpers import JOB, SSHDDP, cli_env, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

HOSTILE = Path(__file__).parent / "payloads" / "hostile_output.py"
BOUND = 120.0
SGR = re.compile(rb"\x1b\[[0-9;:]*m")
ESCAPE = re.compile(rb"\x1b")


def sshddp(
    cluster: SshdCluster, cwd: Path, *args: str | Path
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*SSHDDP, *map(str, args)],
        cwd=cwd,
        env=cli_env(cluster),
        capture_output=True,
        timeout=BOUND,
    )


def on_a_terminal(cluster: SshdCluster, cwd: Path, *args: str | Path) -> tuple[int, bytes]:
    """Run sshddp with a pseudo-terminal as stdout (a real TTY, as a user's); what it showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*SSHDDP, *map(str, args)],
        cwd=cwd,
        env={**cli_env(cluster), "TERM": "xterm"},
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.DEVNULL,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=BOUND), b"".join(chunks)


def assert_only_colours(shown: bytes, what: str) -> None:
    """No escape sequence but SGR colours, no control character but tab, newline and CR."""
    bare = SGR.sub(b"", shown)
    assert not ESCAPE.search(bare), f"{what}: an escape sequence got through:\n{shown!r}"
    controls = {c for c in bare if c < 0x20 and c not in (9, 10, 13)} | ({0x7F} & set(bare))
    assert not controls, f"{what}: control characters {controls} got through"


def assert_no_controls(text: bytes, what: str) -> None:
    """sshddp's own messages: no control character at all but newline and tab."""
    controls = {c for c in text if (c < 0x20 and c not in (9, 10)) or c == 0x7F}
    assert not controls, f"{what}: control characters {controls} in:\n{text!r}"
    assert "\u202e" not in text.decode("utf-8", "replace"), what


def test_rank_output_never_drives_the_terminal_and_the_logs_keep_every_byte(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    r = sshddp(ssh_env, tmp_path, "launch", "--name", "hostile", inv, HOSTILE)
    assert r.returncode == 1, r.stderr
    remote = [(workdir / f"runs/hostile/n{n}/node.log").read_bytes() for n in range(2)]
    local_dir = tmp_path / "sshddp-logs" / "hostile"
    local = [(local_dir / f"node{n}-h{n + 1}.log").read_bytes() for n in range(2)]
    assert local == remote and all(b"\x1b]52;c;" in log for log in local)  # every byte kept

    # The live console: colours, nothing else; a line a \r redraws shows its last state after
    # its prefix, so no \r overprints a prefix (forged or not).
    assert_only_colours(r.stdout, "console")
    assert b"\x1b[31mred 1\x1b[0m plain" in r.stdout and b"\r" not in r.stdout
    # A chunk that held a colour ends with a reset (no colour leaks past it): whether the
    # bar's line shares a chunk with the red one depends on timing, so ignore that reset.
    shown = r.stdout.replace(b"\x1b[0m\n", b"\n")
    assert b"] progress 100%\n" in shown and b"progress 50%" not in shown
    for line in r.stdout.splitlines():
        assert line.startswith((b"[0 h1] ", b"[1 h2] ")), line
    # The report: control characters shown, not obeyed; the rank's lines framed.
    assert_no_controls(r.stderr, "report")
    report = r.stderr.decode()
    assert "  | \\x1b]52;c;cm0gLXJmIH4K\\x07clipboard written" in report, report
    assert "\\rsshddp: run hostile succeeded" in report, report
    assert not [ln for ln in report.splitlines() if ln.startswith("sshddp: run hostile succ")]

    # logs: as the console for every node; one node raw into a pipe, filtered on a TTY
    logs = sshddp(ssh_env, tmp_path, "logs", "hostile")
    assert logs.returncode == 0 and b"clipboard written" in logs.stdout
    assert_only_colours(logs.stdout, "logs")
    raw = sshddp(ssh_env, tmp_path, "logs", "hostile", "--node", "1")
    assert raw.returncode == 0 and raw.stdout == remote[1]
    code, shown = on_a_terminal(ssh_env, tmp_path, "logs", "hostile", "--node", "1")
    assert code == 0 and b"clipboard written" in shown and b"\x1b[31mred 1" in shown
    assert_only_colours(shown, "logs --node on a terminal")

    # Local logs are owner-only, as the hosts' copies are.
    for path in (tmp_path / "sshddp-logs", local_dir):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for n in range(2):
        assert stat.S_IMODE((local_dir / f"node{n}-h{n + 1}.log").stat().st_mode) == 0o600
    run_no_leak("hostile")


def test_reasons_from_the_hosts_are_escaped_in_ps_stop_and_attach(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """A reason with terminal controls in a node's exit.json (whoever could write the run
    directory, or a peer, put it there) shows escaped in ps, and in attach's report."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    r = sshddp(ssh_env, tmp_path, "launch", "--detach", "--name", "evil", inv, JOB, "wait")
    assert r.returncode == 0, r.stderr
    wait_until(
        lambda: b"READY" in _read(workdir / "runs/evil/n1/node.log"), BOUND, "the run to run"
    )
    forged = "\x1b]0;owned\x07\x1b[2J\rsshddp: run evil succeeded\x9b6n"
    (workdir / "runs/evil/n0/stop-reason").write_text(forged)
    stop = sshddp(ssh_env, tmp_path, "stop", "evil")
    assert stop.returncode == 0, stop.stderr
    ps = sshddp(ssh_env, tmp_path, "ps", "--all")
    assert ps.returncode == 0 and b"evil" in ps.stdout
    assert_no_controls(ps.stdout + ps.stderr + stop.stdout + stop.stderr, "ps and stop")
    attach = sshddp(ssh_env, tmp_path, "attach", "evil")
    assert attach.returncode == 1, attach.stderr
    assert_no_controls(attach.stderr, "attach")
    assert b"\\x1b]0;owned\\x07" in attach.stderr, attach.stderr
    run_no_leak("evil")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "with open(sys.argv[1], 'wb') as out:\n"
    "    code = subprocess.run(sys.argv[2:], stdout=out).returncode\n"
    "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def peak_rss_kb(cluster: SshdCluster, cwd: Path, out: Path, *args: str) -> int:
    """Run ``sshddp ARGS`` with stdout to ``out``; its peak resident memory, in KB."""
    r = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(out), *SSHDDP, *args],
        cwd=cwd,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=BOUND * 2,
    )
    code, rss = r.stdout.split()
    assert code == "0", r.stderr
    return int(rss)


def test_logs_streams_a_big_log_and_tail_seeks_from_the_end(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """A 256 MB node log: `logs` fetches and prints it, and `--tail 5` finds its last lines,
    with no more memory than for a tiny log (reading it whole took more than the log)."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    for run in ("small", "big"):
        r = sshddp(ssh_env, tmp_path, "launch", "--name", run, inv, JOB, "ok")
        assert r.returncode == 0, r.stderr
    remote = workdir / "runs/big/n0/node.log"
    line = b"%09d " + b"x" * 90 + b"\n"
    with open(remote, "ab") as fh:  # the node wrote 256 MB more, after the launch left
        block = b"".join(line % i for i in range(10_000))
        for _ in range(256 * 1024 * 1024 // len(block)):
            fh.write(block)
        fh.write(b"the very end\n")
    small = peak_rss_kb(ssh_env, tmp_path, tmp_path / "small.out", "logs", "small", "--node", "0")
    big = peak_rss_kb(ssh_env, tmp_path, tmp_path / "big.out", "logs", "big", "--node", "0")
    tail = peak_rss_kb(ssh_env, tmp_path, tmp_path / "tail.out", "logs", "big", "--tail", "5")
    assert (tmp_path / "big.out").stat().st_size == remote.stat().st_size
    with open(tmp_path / "big.out", "rb") as a, open(remote, "rb") as b:
        while chunk := a.read(1 << 20):
            assert chunk == b.read(1 << 20)
    shown = (tmp_path / "tail.out").read_bytes().splitlines()
    assert len(shown) == 10 and shown[4] == b"[0 h1] the very end", shown  # 5 lines a node
    log_kb = remote.stat().st_size // 1024
    assert big - small < log_kb // 4, (small, big, log_kb)
    assert tail - small < log_kb // 4, (small, tail, log_kb)
    for run in ("small", "big"):
        run_no_leak(run)
