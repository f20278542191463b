"""Progress bars and per-rank output on the user's console, against real sshd hosts and real
torchrun + gloo ranks drawing real tqdm bars: on a terminal (a tmux pane, read with
``capture-pane``) one line per rank redrawn in place while the epoch runs; piped, sparse;
``--ranks`` shows only the ranks named; the logs keep every byte, the ``\\r``s included.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import SSHDDP, cli_env, wait_until, write_inventory

from sshddp import defaults
from sshddp_lab.sshd import SshdCluster

BARS = Path(__file__).parent / "payloads" / "bars.py"
LIGHTNING = Path(__file__).parent / "payloads" / "lightning_bars.py"
BOUND = 180.0
COLUMNS, ROWS = 150, 40


class Tmux:
    """A tmux server of this test's own (``-L``), one pane of COLUMNS x ROWS running a shell
    command; the screen is what ``capture-pane -p`` shows."""

    def __init__(self, env: dict[str, str]) -> None:
        self.home = tempfile.mkdtemp(prefix="tmux-", dir="/tmp")  # a socket path is short
        self.env = {**env, "TMUX_TMPDIR": self.home, "TERM": "xterm-256color"}
        self.env.pop("TMUX", None)
        self.socket = "sshddp-test"

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout

    def start(self, cwd: Path, command: str) -> None:
        shell = f"cd {shlex.quote(str(cwd))} && {command}; echo EXIT=$?; sleep 600"
        self.tmux("new-session", "-d", "-x", str(COLUMNS), "-y", str(ROWS), "bash", "-c", shell)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def history(self) -> str:
        """Every line the pane holds: what scrolled away, then the screen."""
        return self.tmux("capture-pane", "-p", "-S", "-")

    def stop(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def tmux(ssh_env: SshdCluster, tmp_path: Path) -> Iterator[Tmux]:
    """The pane; should a test fail midway, the run it left going is stopped (killing tmux
    only detaches sshddp from it)."""
    term = Tmux(cli_env(ssh_env))
    yield term
    if "EXIT=" not in term.screen():
        for run in ("bars", "sized"):
            subprocess.run(
                [*SSHDDP, "stop", "--force", run],
                cwd=tmp_path,
                env=cli_env(ssh_env),
                capture_output=True,
                timeout=BOUND,
            )
    term.stop()


def sshddp_line(*args: str | Path) -> str:
    return " ".join(shlex.quote(str(a)) for a in [*SSHDDP, *args])


def bar(rank: int, step: int, total: int = 10) -> re.Pattern[str]:
    """Rank ``rank``'s bar at ``step``, on its own prefixed line."""
    host = f"h{rank + 1}"
    return re.compile(rf"^\[{rank} {host}\] rank{rank}:\s+\d+%\|.*\| {step}/{total} ", re.M)


def shows_bars(tmux: Tmux, step: int) -> Callable[[], bool]:
    return lambda: all(bar(r, step).search(tmux.screen()) for r in range(3))


def assert_logs_whole(tmp: Path, workdir: Path, run: str, steps: int = 10) -> list[bytes]:
    local = [(tmp / "sshddp-logs" / run / f"node{n}-h{n + 1}.log").read_bytes() for n in range(3)]
    remote = [(workdir / f"runs/{run}/n{n}/node.log").read_bytes() for n in range(3)]
    assert local == remote
    for n, log in enumerate(local):  # every state of the bar, as the rank wrote it
        assert b"\r" in log and f"rank{n}: 100%".encode() in log, log
        assert f"| {steps}/{steps} ".encode() in log
        assert f"rank {n} epoch done\n".encode() in log
    return local


def test_each_ranks_bar_advances_live_on_a_terminal(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], tmux: Tmux, run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=1)
    gates = tmp_path / "gates"
    gates.mkdir()
    tmux.start(tmp_path, sshddp_line("launch", "--name", "bars", inv, BARS, 10, 0.05, gates))

    # Partway through the epoch, every rank's bar is on the screen, and then it advances.
    wait_until(shows_bars(tmux, 3), BOUND, f"every rank's bar at 3/10:\n{tmux.screen()}")
    assert "epoch done" not in tmux.screen()
    (gates / "3").touch()
    wait_until(shows_bars(tmux, 6), BOUND, f"every rank's bar at 6/10:\n{tmux.screen()}")
    screen = tmux.screen()
    assert "epoch done" not in screen and not bar(0, 3).search(screen), screen
    assert all(len(line) < COLUMNS for line in screen.splitlines()), screen  # no bar wraps
    (gates / "6").touch()

    wait_until(lambda: "EXIT=" in tmux.screen(), BOUND, f"the run's end:\n{tmux.screen()}")
    screen = tmux.history()
    assert "EXIT=0" in screen, screen
    for r in range(3):  # each bar's final state stays, as one line, and the lines after it
        assert bar(r, 10).search(screen) and f"[{r} h{r + 1}] rank {r} epoch done" in screen
        assert len(bar(r, 10).findall(screen)) == 1 and not bar(r, 6).search(screen), screen
    assert_logs_whole(tmp_path, workdir, "bars")
    run_no_leak("bars")


def test_piped_bars_are_sparse_and_ranks_shows_only_the_ranks_named(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=1)
    start = time.monotonic()
    r = subprocess.run(
        [*SSHDDP, "launch", "--ranks", "0,2", "--name", "piped", inv, BARS, "40", "0.25"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        timeout=BOUND,
    )
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert b"\r" not in r.stdout and "[1 h2]" not in out, out
    for rank in (0, 2):
        states = [
            ln for ln in out.splitlines() if ln.startswith(f"[{rank} h{rank + 1}] rank{rank}:")
        ]
        # The first state, one at most every 5 s after it, and the final one (40/40).
        assert 2 <= len(states) <= took / defaults.BAR_EVERY + 2, (took, states)
        assert states[-1].endswith("]") and "| 40/40 " in states[-1], states
        assert f"[{rank} h{rank + 1}] rank {rank} epoch done" in out
    logs = assert_logs_whole(tmp_path, workdir, "piped", steps=40)
    assert logs[1].count(b"\r") >= 40  # rank 1's every state is in its log, not on the console

    # logs --rank / --ranks: the same filter over the local copies; a bad one is refused.
    one = subprocess.run(
        [*SSHDDP, "logs", "piped", "--rank", "1"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        timeout=BOUND,
    )
    assert one.returncode == 0, one.stderr
    lines = one.stdout.decode().splitlines()
    assert lines and all(ln.startswith("[1 h2] ") for ln in lines), (lines, one.stderr)
    bad = subprocess.run(
        [*SSHDDP, "logs", "piped", "--ranks", "1,7"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        timeout=BOUND,
    )
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr, bad.stderr
    assert b"--ranks: run piped has ranks 0-2; there is no rank 7" in bad.stderr, bad.stderr
    run_no_leak("piped")


EPOCH = re.compile(r"^\[0 h1\] +Epoch 0/0 .* (\d+)/12 ", re.M)  # rank 0 draws Lightning's bars
VALIDATION = re.compile(r"^\[0 h1\] +Validation .* (\d+)/6 ", re.M)


def steps(pattern: re.Pattern[str], screen: str) -> list[int]:
    """The step counts of every line of ``screen`` that shows the bar ``pattern`` matches."""
    return [int(count) for count in pattern.findall(screen)]


def test_lightning_rich_bars_redraw_in_place_on_a_terminal(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], tmux: Tmux, run_no_leak
) -> None:
    """Lightning's RichProgressBar (a live display of a training row, and a validation row
    under it during validation) advances on the attached terminal while the epoch runs,
    each row redrawn in place, never one line per refresh."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=2)
    gates = tmp_path / "gates"
    gates.mkdir()
    tmux.start(tmp_path, sshddp_line("launch", "--name", "bars", inv, LIGHTNING, gates))
    log = tmp_path / "sshddp-logs" / "bars" / "node0-h1.log"

    def redraws() -> int:  # the frames rich drew with both rows, as the rank wrote them
        return log.read_bytes().count(b"\x1b[1A") if log.exists() else 0

    # Held at training step 5: the bar shows 5 of 12 steps, on one line of the pane.
    at_five = lambda: steps(EPOCH, tmux.history()) == [5]  # noqa: E731
    wait_until(at_five, BOUND * 2, f"the training bar at 5/12:\n{tmux.history()}")
    (gates / "train").touch()
    # Held at validation step 3: both rows, each once, however often rich redrew them.
    at_three = lambda: steps(VALIDATION, tmux.history()) == [3]  # noqa: E731
    wait_until(at_three, BOUND, f"the validation bar at 3/6:\n{tmux.history()}")
    redrawn = redraws()
    wait_until(lambda: redraws() >= redrawn + 3, BOUND, "rich to redraw both rows 3 times")
    history = tmux.history()
    assert steps(EPOCH, history) == [12] and steps(VALIDATION, history) == [3], history
    (gates / "val").touch()

    wait_until(lambda: "EXIT=" in tmux.screen(), BOUND, f"the run's end:\n{tmux.screen()}")
    history = tmux.history()
    assert "EXIT=0" in history, history
    # The display's last frame stays; the validation row it erased is gone. (Rich may end
    # with the cursor a row lower than its last frame, and draw that frame once more below:
    # a terminal then keeps both copies, and so does the console.)
    final = steps(EPOCH, history)
    assert set(final) == {12} and len(final) <= 2 and not VALIDATION.search(history), history
    assert re.search(r"^\[0 h1\] +fit done$", history, re.M), history
    remote = (workdir / "runs/bars/n0/node.log").read_bytes()
    assert log.read_bytes() == remote and b"\x1b[1A" in remote  # every frame, as drawn
    run_no_leak("bars")


def pty_size(workdir: Path, run: str, node: int) -> tuple[int, int]:
    """The columns and rows of node ``node``'s pty, read where its torchrun writes."""
    state = json.loads((workdir / f"runs/{run}/n{node}/state.json").read_text())
    fd = os.open(os.readlink(f"/proc/{state['pid']}/fd/1"), os.O_RDONLY | os.O_NOCTTY)
    try:
        rows, columns, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    finally:
        os.close(fd)
    return columns, rows


def test_tty_ranks_get_the_terminals_size_and_its_resizes(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], tmux: Tmux, run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2, 3], nproc=1)
    gates = tmp_path / "gates"
    gates.mkdir()
    launch = sshddp_line("launch", "--tty", "--name", "sized", inv, BARS, 10, 0.05, gates)
    tmux.start(tmp_path, launch)
    wait_until(shows_bars(tmux, 3), BOUND, f"every rank's bar at 3/10:\n{tmux.screen()}")
    screen = tmux.screen()
    for r in range(3):
        assert f"[{r} h{r + 1}] rank {r} size {COLUMNS}x{ROWS}" in screen, screen
    local = tmp_path / "sshddp-logs" / "sized"
    log = (local / "node0-h1.log").read_bytes()
    state = log.rsplit(b"\r", 1)[1].decode()  # the bar as rank 0 drew it: the pty's width
    assert state.startswith("rank0:") and len(state) == COLUMNS - 1, repr(state)  # tqdm's -1

    tmux.tmux("resize-window", "-x", "110", "-y", "30")  # the user's window shrinks
    for n in range(3):
        resized = lambda n=n: pty_size(workdir, "sized", n) == (110, 30)  # noqa: E731
        wait_until(resized, BOUND, f"node {n}'s pty to get the new size")
    (gates / "3").touch()
    wait_until(
        lambda: all(f"rank {r} size 110x30" in tmux.screen() for r in range(3)),
        BOUND,
        f"every rank to see the new size:\n{tmux.screen()}",
    )
    wait_until(shows_bars(tmux, 6), BOUND, f"every rank's bar at 6/10:\n{tmux.screen()}")
    screen = tmux.screen()  # the bars are redrawn at the new width, and fit it
    assert all(len(bar(r, 6).search(screen)[0]) > 0 for r in range(3))
    bars = [ln for ln in screen.splitlines() if re.match(r"\[\d h\d\] rank\d:", ln)]
    assert len(bars) == 3 and all(len(ln) < 110 for ln in bars), screen
    (gates / "6").touch()
    wait_until(lambda: "EXIT=" in tmux.screen(), BOUND, f"the run's end:\n{tmux.screen()}")
    assert "EXIT=0" in tmux.screen(), tmux.history()
    remote = [(workdir / f"runs/sized/n{n}/node.log").read_bytes() for n in range(3)]
    assert [(local / f"node{n}-h{n + 1}.log").read_bytes() for n in range(3)] == remote
    run_no_leak("sized")
