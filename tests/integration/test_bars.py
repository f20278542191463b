"""Progress bars and per-rank output on the user's console, against real sshd hosts and real
torchrun + gloo ranks drawing real tqdm bars: on a terminal (a tmux pane, read with
``capture-pane``) one line per rank redrawn in place while the epoch runs; piped, sparse;
``--ranks`` shows only the ranks named; the logs keep every byte, the ``\\r``s included.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import SSHDDP, cli_env, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

BARS = Path(__file__).parent / "payloads" / "bars.py"
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
    term = Tmux(cli_env(ssh_env))
    yield term
    term.stop()


def sshddp_line(*args: str | Path) -> str:
    return " ".join(shlex.quote(str(a)) for a in [*SSHDDP, *args])


def bar(rank: int, step: int, total: int = 10) -> re.Pattern[str]:
    """Rank ``rank``'s bar at ``step``, on its own prefixed line."""
    host = f"h{rank + 1}"
    return re.compile(rf"^\[{rank} {host}\] rank{rank}:\s+\d+%\|.*\| {step}/{total} ", re.M)


def shows_bars(tmux: Tmux, step: int) -> Callable[[], bool]:
    return lambda: all(bar(r, step).search(tmux.screen()) for r in range(3))


def assert_logs_whole(tmp: Path, workdir: Path, run: str) -> list[bytes]:
    local = [(tmp / "sshddp-logs" / run / f"node{n}-h{n + 1}.log").read_bytes() for n in range(3)]
    remote = [(workdir / f"runs/{run}/n{n}/node.log").read_bytes() for n in range(3)]
    assert local == remote
    for n, log in enumerate(local):  # every state of the bar, as the rank wrote it
        assert b"\r" in log and f"rank{n}: 100%".encode() in log, log
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
