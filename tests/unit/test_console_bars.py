"""The console's view of progress bars (model.bars) and the Console that draws them."""

from __future__ import annotations

import io
import json
import os
import pty
import re
from pathlib import Path
from typing import Optional

import pytest

from sshddp.model.bars import LineState, Sparse, bar_line, last_state, screen_rows, settle
from sshddp.remote.node.winsize import resize
from sshddp.remote.rankside.rankout import set_size
from sshddp.run.sinks import Console, goes_nowhere, terminal_size


def test_a_redrawn_line_settles_to_what_a_terminal_leaves() -> None:
    assert last_state(b"\r 10%|#    |\r100%|#####|") == b"100%|#####|"
    assert last_state(b"bar 100%\r") == b"bar 100%"  # a bar that ends each state with \r
    assert last_state(b"\rbar 50%\r          \rsaved\r") == b"saved"  # tqdm.write over a bar
    assert last_state(b"\r   \r") == b""
    assert settle(b"a\n\r1%\r2%\nb") == b"a\n2%\nb"
    plain = b"no carriage return\n" * 3
    assert settle(plain) is plain


def test_the_unfinished_line_is_a_live_bar_only_once_a_cr_redraws_it() -> None:
    state = LineState()
    first = state.feed(b"epoch 0\n\r  0%|")
    assert first.lines == b"epoch 0" and first.bar == b"  0%|"
    assert state.feed(b"     |").bar == b"  0%|     |"  # a state written in two pieces
    assert state.feed(b"\r 50%|##   |").bar == b" 50%|##   |"
    done = state.feed(b"\r100%|#####|\nloss 0.1")
    assert done.lines == b"100%|#####|" and done.bar is None
    assert state.finish() == b"loss 0.1" and state.finish() is None


def test_a_bar_redrawn_for_hours_keeps_a_bounded_line() -> None:
    state = LineState(max_partial=64 * 1024)
    for i in range(20000):
        update = state.feed(b"\r%5d/20000 |####|" % i)
        assert update.lines is None  # never printed as a line of its own
    assert update.bar == b"19999/20000 |####|"
    assert len(state.partial) < 5000
    assert state.feed(b"\r   \rdone\n").lines == b"done"


def test_a_bar_line_never_wraps_and_drops_colours() -> None:
    state = b"\x1b[32m50%|\xe2\x96\x88\xe2\x96\x88|\x1b[0m\t1/2"
    assert bar_line(state, 80) == "50%|██| 1/2".encode()
    assert bar_line(state, 7) == "50%…1/2".encode()  # the middle goes: both ends stay
    assert bar_line(b"short   ", 5) == b"short"
    assert bar_line(b"xy", 1) == b"x" and bar_line(b"x", -3) == b""


def test_sparse_shows_a_bar_at_most_every_period_and_at_once_after_it_ended() -> None:
    sparse = Sparse(5.0)
    assert sparse.due(0, 100.0) and sparse.due(1, 100.5)
    assert not sparse.due(0, 104.9)
    assert sparse.due(0, 105.0)
    sparse.done(0)
    assert sparse.due(0, 105.1)


def _console(live: bool, clock: list[float]) -> tuple[io.BytesIO, Console]:
    stream = io.BytesIO()
    console = Console(stream, color=False, live=live, bar_every=5.0, clock=lambda: clock[0])
    console.add_node(0, "0 h1", 6)
    console.add_node(1, "1 h2", 6)
    return stream, console


def test_piped_bars_are_sparse_and_end_with_their_final_state() -> None:
    clock = [0.0]
    stream, console = _console(False, clock)
    for i in range(100):  # 100 states over 10 s: the first, and one each 5 s
        clock[0] = i / 10
        console.write(0, b"\r%3d%%" % i)
    console.write(0, b"\r100%\ntrained\n")
    assert stream.getvalue() == b"[0 h1]   0%\n[0 h1]  50%\n[0 h1] 100%\n[0 h1] trained\n"


def test_on_a_terminal_each_bar_is_one_line_below_the_scrolling_output() -> None:
    clock = [0.0]
    stream, console = _console(True, clock)
    console.write(0, b"\r 10%")
    assert stream.getvalue() == b"[0 h1]  10%\x1b[0m\n"
    console.write(1, b"\r 20%")  # the region is erased and drawn again, one line per node
    assert stream.getvalue().endswith(b"\x1b[1A\x1b[J[0 h1]  10%\x1b[0m\n[1 h2]  20%\x1b[0m\n")
    console.write(1, b"\rhello\n")  # a finished line scrolls above the bars
    assert stream.getvalue().endswith(b"\x1b[2A\x1b[J[1 h2] hello\n[0 h1]  10%\x1b[0m\n")
    console.message("sshddp: note")
    assert stream.getvalue().endswith(b"\x1b[1A\x1b[Jsshddp: note\n[0 h1]  10%\x1b[0m\n")
    console.flush_node(0)  # the node ended: its last state stays, as a line
    assert stream.getvalue().endswith(b"\x1b[1A\x1b[J[0 h1]  10%\n")


def test_a_node_that_ranks_leaves_out_prints_nothing() -> None:
    stream = io.BytesIO()
    console = Console(stream, color=False)
    console.add_node(0, "0 h1", 6, shown=False)
    console.add_node(1, "1 h2", 6)
    console.write(0, b"zero\n")
    console.write(1, b"one\n")
    console.flush_node(0)
    assert stream.getvalue() == b"[1 h2] one\n"


def test_rows_to_erase_follow_a_narrower_window() -> None:
    assert screen_rows([], 80) == 0
    assert screen_rows([79, 10], 80) == 2
    assert screen_rows([149, 10], 110) == 3  # the 149-character line now wraps once
    assert screen_rows([0], 80) == 1


def test_the_terminal_size_is_the_first_terminal_s_else_80x24() -> None:
    assert terminal_size(io.BytesIO(), io.StringIO()) == (80, 24)
    master, slave = pty.openpty()
    try:
        set_size(slave, [132, 43])  # what the host does to the ranks' pty
        with open(slave, "wb", closefd=False) as stream:
            assert terminal_size(io.BytesIO(), stream) == (132, 43)
        set_size(slave, [0, 99999])  # out of range: clamped, never an error
        assert terminal_size(open(slave, "wb", closefd=False)) == (1, 0xFFFF)
    finally:
        os.close(master)
        os.close(slave)


def test_resizing_a_node_without_a_terminal_says_why(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text(json.dumps({"tty": False}))
    assert resize(str(tmp_path), 100, 30) == "the node has no terminal (launched without --tty)"
    (tmp_path / "spec.json").write_text(json.dumps({"tty": True}))
    (tmp_path / "state.json").write_text(json.dumps({"pid": 1, "pid_start": -5}))
    assert resize(str(tmp_path), 100, 30) == "the node's torchrun is not running"


def test_a_console_that_goes_to_dev_null_formats_nothing(tmp_path: Path) -> None:
    """Output nobody can read is not prefixed or filtered: a flood sent to /dev/null costs
    the coordinator only its log copy. A file, a pipe or a terminal still gets every line."""
    read, write = os.pipe()
    with open(os.devnull, "wb") as null, open(tmp_path / "out", "wb") as fh:
        assert goes_nowhere(null)
        assert not goes_nowhere(fh) and not goes_nowhere(io.BytesIO())
        with os.fdopen(write, "wb") as pipe:
            assert not goes_nowhere(pipe)
        os.close(read)
        formatted: list[bytes] = []

        class Watched(Console):
            def _prefixed(self, key: tuple[int, int], lines: bytes) -> bytes:
                formatted.append(lines)
                return super()._prefixed(key, lines)

        for stream in (null, fh):
            console = Watched(stream, color=False)
            console.add_node(0, "0 h1", 6)
            console.write(0, b"one\ntwo\n")
            console.flush_node(0)
    assert formatted == [b"one\ntwo"]  # the file's; /dev/null's were never formatted
    assert (tmp_path / "out").read_bytes() == b"[0 h1] one\n[0 h1] two\n"


class _Frames:
    """Real rich output (a live Progress, as Lightning's RichProgressBar draws it), read
    chunk by chunk as a rank's pipe would deliver it, into one stream's LineState."""

    def __init__(self) -> None:
        from rich.console import Console as RichConsole

        self.out = io.StringIO()
        self.rich = RichConsole(
            file=self.out, force_terminal=True, force_interactive=True, width=60, height=20
        )
        self.state = LineState()
        self.read = 0
        self.lines: list[bytes] = []

    def feed(self, chunk: int = 0) -> Optional[bytes]:
        """Feed what rich wrote since the last call (in pieces of ``chunk`` bytes: a
        sequence may be cut anywhere); the rows shown live after it."""
        data = self.out.getvalue()[self.read :].encode()
        self.read += len(data.decode())
        bar = None
        for at in range(0, len(data), chunk or len(data) or 1):
            update = self.state.feed(data[at : at + (chunk or len(data))])
            if update.lines is not None:
                self.lines += update.lines.split(b"\n")
            bar = update.bar
        return bar


def _plain(data: bytes) -> str:
    return bar_line(data.replace(b"\n", b"|"), 10_000).decode()


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_a_live_display_of_two_bars_redraws_its_rows_in_place(chunk: int) -> None:
    from rich.progress import Progress, TextColumn

    frames = _Frames()
    columns = (TextColumn("{task.description} {task.completed}/{task.total}"),)
    with Progress(*columns, console=frames.rich, auto_refresh=False) as progress:
        train = progress.add_task("train", total=10)
        progress.refresh()
        assert _plain(frames.feed(chunk) or b"") == "train 0/10"
        val = progress.add_task("val", total=4)
        for step in range(1, 4):  # the validation bar under the training bar, both redrawn
            progress.update(train, completed=6 + step)
            progress.update(val, completed=step)
            progress.refresh()
            shown = _plain(frames.feed(chunk) or b"")
            assert shown == f"train {6 + step}/10|val {step}/4", shown
            assert frames.lines == [], frames.lines  # no row printed once per redraw
        progress.console.print("saved a checkpoint")  # printed above the live rows
        progress.update(val, visible=False)
        progress.refresh()
        assert _plain(frames.feed(chunk) or b"") == "train 9/10"
    frames.feed(chunk)
    assert [_plain(ln) for ln in frames.lines] == ["saved a checkpoint", "train 9/10"]
    assert frames.state.finish() is None


def test_a_row_reached_by_cursor_up_is_drawn_again_not_printed_again() -> None:
    """tqdm's nested bars: the inner bar one row down, then the cursor back up."""
    state = LineState()
    assert state.feed(b"\router 0/2").bar == b"outer 0/2"
    first = state.feed(b"\n\rinner 0/3\x1b[A\router 0/2")
    # printed once: until the cursor came back up, nothing said that row would be redrawn
    assert first.lines == b"outer 0/2" and first.bar == b"outer 0/2\ninner 0/3"
    for i in range(1, 4):
        update = state.feed(b"\n\rinner %d/3\x1b[A\router 1/2" % i)
        assert update.lines is None and update.bar == b"outer 1/2\ninner %d/3" % i, update
    update = state.feed(b"\router 2/2\n\rdone\n")  # a row finishes once out of reach
    assert update.lines == b"outer 2/2" and update.bar == b"done", update
    assert state.finish() == b"done"


def test_on_a_terminal_a_live_display_keeps_its_rows_below_the_output() -> None:
    stream, console = _console(True, [0.0])
    console.write(0, b"\x1b[?25l\r\x1b[2Ktrain 1/9\nval 1/4")
    assert stream.getvalue() == b"[0 h1] train 1/9\x1b[0m\n[0 h1] val 1/4\x1b[0m\n"
    console.write(0, b"\r\x1b[2K\x1b[1A\x1b[2Ktrain 2/9\nval 2/4")  # both rows redrawn
    region = b"[0 h1] train 2/9\x1b[0m\n[0 h1] val 2/4\x1b[0m\n"
    assert stream.getvalue().endswith(b"\x1b[2A\x1b[J" + region)
    console.write(0, b"\r\x1b[2K\x1b[1A\x1b[2Ktrain 2/9\n")  # a redraw in two pieces:
    assert stream.getvalue().endswith(region)  # the row between them shows what it held
    console.write(0, b"val 2/4")
    console.write(1, b"step\n")  # another node's line scrolls above the live rows
    assert stream.getvalue().endswith(b"\x1b[2A\x1b[J[1 h2] step\n" + region)
    console.write(0, b"\r\x1b[2K\x1b[1A\x1b[2Ktrain 2/9\n\x1b[?25h")  # the display ended
    assert stream.getvalue().endswith(b"\x1b[2A\x1b[J[0 h1] train 2/9\n")
    finished = re.findall(rb"\[0 h1\] [^\x1b\n]*\n", stream.getvalue())  # not region rows
    assert finished == [b"[0 h1] train 2/9\n"], finished


def test_piped_a_live_display_shows_its_rows_sparsely_and_its_last_frame() -> None:
    clock = [0.0]
    stream, console = _console(False, clock)
    console.write(0, b"\x1b[?25l\r\x1b[2Ktrain 1/9\nval 1/4")
    for step in range(2, 9):
        clock[0] = step
        console.write(0, b"\r\x1b[2K\x1b[1A\x1b[2Ktrain %d/9\nval 1/4" % step)
    console.write(0, b"\r\x1b[2K\x1b[1A\x1b[2Ktrain 9/9\n\x1b[?25hdone\n")
    assert stream.getvalue().decode().splitlines() == [
        *("[0 h1] train 1/9", "[0 h1] val 1/4"),  # the first state, at once
        *("[0 h1] train 5/9", "[0 h1] val 1/4"),  # then at most every 5 s
        "[0 h1] train 9/9",  # the last frame, and what followed it
        "[0 h1] done",
    ]
