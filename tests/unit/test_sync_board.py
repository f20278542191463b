"""``sshddp sync``'s progress board: a live line per host on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io

from sshddp.cli.sync import Board
from sshddp.cli.terminal import Terminal
from sshddp.model.sync import Progress, progress_line, progress_of


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def terminal(stderr: io.StringIO) -> Terminal:
    return Terminal(io.StringIO(), stderr, io.BytesIO(), environ={"COLUMNS": "40"})


def test_a_host_line_says_its_phase_and_what_uv_said() -> None:
    line = b'{"progress": "installing", "detail": "3 packages"}'
    assert progress_of(line) == Progress("installing", "3 packages")
    assert progress_of(b'{"status": "built"}') is None  # the answer, not progress
    assert progress_of(b"not json") is None
    assert progress_line("h1", Progress("done", "5.0 MiB")) == "h1: done 5.0 MiB"
    assert progress_line("h\x1b1", Progress("done")) == "h\\x1b1: done"


def test_not_a_terminal_gets_a_plain_line_per_step() -> None:
    err = io.StringIO()
    board = Board(terminal(err), ["a", "b"])
    board.show(1, "b", Progress("downloading"))
    board.show(0, "a", Progress("done", "1.0 MiB"))
    board.close()
    assert err.getvalue() == "b: downloading\na: done 1.0 MiB\n"


def test_a_terminal_gets_a_line_per_host_redrawn_in_place_then_erased() -> None:
    err = Tty()
    board = Board(terminal(err), ["a", "b"])
    board.show(1, "b", Progress("downloading"))
    board.show(0, "a", Progress("installing", "2 packages"))
    board.close()
    first = "\x1b[2Ka: checking\n\x1b[2Kb: downloading\n"
    second = "\x1b[2A\x1b[2Ka: installing 2 packages\n\x1b[2Kb: downloading\n"
    assert err.getvalue() == first + second + "\x1b[2A\x1b[J"
