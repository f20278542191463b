"""model.escape: what the user's terminal gets of text from ranks, hosts and peers."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sshddp.model.escape import (
    RESET,
    TerminalStream,
    for_terminal,
    incomplete_tail,
    needs_filter,
    visible,
    visible_line,
)
from sshddp.run.sinks import Console

ATTACKS = [
    "\x1b]0;title\x07",  # OSC 0: retitle the terminal
    "\x1b]52;c;cm0gLXJmIH4K\x07",  # OSC 52: write the clipboard
    "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",  # OSC 8 hyperlink, ST-terminated
    "\x1bP1$r\x1b\\",  # DCS
    "\x1b[2J\x1b[H",  # clear the screen, cursor home
    "\x1b[6n",  # device status report: the terminal types its answer
    "\x1b[1A\x1b[2K",  # cursor up, erase the line: rewrite an earlier line
    "\x1bc",  # full reset
    "\x1b(0",  # line-drawing charset
    "\x9b31m",  # C1 CSI
    "\r",  # overprint
    "\x08\x08\x08",  # backspaces
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_visible_shows_every_control_character(attack: str) -> None:
    shown = visible(f"before {attack} after")
    assert not re.search("[\x00-\x1f\x7f-\x9f]", shown), shown
    assert shown.startswith("before ") and shown.endswith(" after")


def test_visible_names_what_it_escaped() -> None:
    assert visible("a\x1b]0;t\x07\r\n\t") == "a\\x1b]0;t\\x07\\r\\n\\t"
    assert visible("\u202eevil\u202c \u2028") == "\\u202eevil\\u202c \\u2028"
    assert visible("bytes \udc80") == "bytes \\udc80"  # not UTF-8 on the host: no crash
    assert visible("ünïcødé ✓ 日本") == "ünïcødé ✓ 日本"
    assert visible("two\nlines\tand\x1b[31m", multiline=True) == "two\nlines\tand\\x1b[31m"


def test_visible_line_drops_colours_and_escapes_the_rest() -> None:
    assert visible_line("\x1b[1;31mError\x1b[0m: \x1b]0;t\x07") == "Error: \\x1b]0;t\\x07"


@given(st.text())
def test_visible_never_leaves_a_control_character(text: str) -> None:
    assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", visible(text))


@pytest.mark.parametrize("attack", ATTACKS)
def test_for_terminal_drops_every_sequence_but_colour(attack: str) -> None:
    out = for_terminal(f"a {attack} b\n".encode())
    assert b"\x1b" not in out.replace(RESET, b""), out
    assert not {c for c in out if c < 0x20 and c not in (9, 10, 13)}, out
    assert b"\xc2\x9b" not in out


def test_for_terminal_keeps_colours_progress_bars_and_plain_text() -> None:
    assert (
        for_terminal(b"plain text, tabs\tand UTF-8 \xc3\xa9\n")
        == b"plain text, tabs\tand UTF-8 \xc3\xa9\n"
    )
    coloured = b"\x1b[1;31mred\x1b[0m and \x1b[38;2;1;2;3mrgb\x1b[m"
    assert for_terminal(coloured) == coloured + RESET
    assert for_terminal(b"10%\r50%\x1b[K\r100%") == b"10%\r50%\x1b[K\r100%" + RESET
    assert for_terminal(b"cut \x1b[3") == b"cut 3"  # a sequence cut short is dropped


def test_needs_filter_is_false_for_ordinary_output() -> None:
    assert not needs_filter(b"rank 3 tick 12\n" * 1000 + "é°".encode())
    assert needs_filter(b"x\ry") and needs_filter(b"\x1b[31m") and needs_filter("\x9b".encode())


def test_needs_filter_flags_every_control_byte_but_tab_and_newline_wherever_it_is() -> None:
    for byte in range(0x100):
        flagged = byte < 0x20 and byte not in (0x09, 0x0A) or 0x7F <= byte <= 0x9F
        for data in (bytes([byte]), b"a" * 5000 + bytes([byte]) + b"b" * 7):
            assert needs_filter(data) is flagged, hex(byte)


@pytest.mark.parametrize("c1", [b"\x9b2J", b"\x9d52;c;cm0K\x07", b"\x9d0;title\x9c", b"\x90q\x9c"])
def test_for_terminal_drops_raw_8_bit_c1_controls(c1: bytes) -> None:
    for before in (b"a ", "é ".encode(), "日".encode()):
        out = for_terminal(before + c1 + b" b\n")
        assert not {c for c in out if 0x80 <= c <= 0x9F} - set(before), out
        assert out.startswith(before) and needs_filter(before + c1)


@given(st.text())
def test_for_terminal_keeps_every_byte_of_utf_8_text(text: str) -> None:
    data = "".join(c for c in text if c.isprintable() and not 0x80 <= ord(c) <= 0x9F).encode()
    assert for_terminal(data) == data


def test_a_carriage_return_never_overprints_the_prefix() -> None:
    stream = io.BytesIO()
    console = Console(stream, color=False)
    console.add_node(1, "1 h2", 6)
    console.write(1, b"xxxxxxxx\rsshddp: run r succeeded\nbar 10%\rbar 100%\r\n\x1b]0;t\x07ok\n")
    assert stream.getvalue() == (b"[1 h2] sshddp: run r succeeded\n[1 h2] bar 100%\n[1 h2] ok\n")


def test_console_messages_escape_what_came_from_a_host() -> None:
    stream = io.BytesIO()
    Console(stream, color=False).message("sshddp: lost node 0: \x1b]0;t\x07 \r gone")
    assert stream.getvalue() == b"sshddp: lost node 0: \\x1b]0;t\\x07 \\r gone\n"


def test_a_character_split_between_two_chunks_is_held_back_not_dropped() -> None:
    """``logs`` of one node on a terminal filters its copy chunk by chunk: a UTF-8
    character cut at a chunk's end must reach the terminal whole (its continuation bytes,
    0x80-0xBF, would otherwise look like raw C1 controls to the next chunk's filter)."""
    text = "loss ─ 0.5 ✓ done 🚀 €\n".encode() + b"\x9b2J"
    for cut in range(1, len(text)):
        stream = TerminalStream()
        shown = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.end()
        assert shown == "loss ─ 0.5 ✓ done 🚀 €\n".encode() + b"2J", cut
    assert [incomplete_tail(b) for b in (b"", b"a", b"\xe2", b"\xe2\x94", b"\xe2\x94\x80")] == [
        0,
        0,
        1,
        2,
        0,
    ]
    assert incomplete_tail(b"\xf0\x9f\x9a") == 3 and incomplete_tail(b"\x9b") == 0
