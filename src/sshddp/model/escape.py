"""Text that ranks, hosts and peers wrote, made safe for the user's terminal.

Pure. Two policies, for two kinds of output:

* ``visible`` (and ``visible_line``): sshddp's own messages, the run report, its reasons,
  ``ps`` and ``stop``. Every control character becomes a visible escape (``\\x1b``,
  ``\\r``, ``\\u202e``), so nothing a rank or a peer wrote can retitle the terminal (OSC 0),
  write the clipboard (OSC 52), move the cursor or overprint a line (``\\r``) to forge
  sshddp's verdict.
* ``for_terminal``: the ranks' own output on the live console, and ``sshddp logs`` on a
  terminal. Colours and progress bars keep working: SGR sequences (colour and style),
  ``ESC[K`` (erase to the end of the line), ``\\r`` and tabs pass; every other escape
  sequence (OSC, DCS, APC, PM, SOS, cursor movement, screen and mode changes, device
  queries) and every other control character is dropped, C1 (``\\x9b`` is CSI) as UTF-8 or
  as a raw byte. The log files keep every byte.
"""

from __future__ import annotations

import codecs
import re

# Control characters (C0, DEL, C1), bidirectional-text controls (they reorder what follows
# on the line) and the Unicode line and paragraph separators, plus lone surrogates (bytes
# that were not UTF-8): all shown as escapes.
_OTHERS = "\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_RE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_MULTILINE_RE = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")  # keeps \t and \n
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}
_SGR_RE = re.compile("\x1b\\[[0-9;:]*m")

# Bytes that can start something a terminal acts on: C0 but tab and newline, and DEL.
_TRIGGERS = tuple(bytes([c]) for c in (*range(0x20), 0x7F) if c not in (0x09, 0x0A))
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")  # C1 controls (U+0080-U+009F) as UTF-8
# A raw C1 byte (0x80-0x9f) that is no part of a UTF-8 character: an 8-bit terminal acts on
# it (0x9b is CSI, 0x9d OSC). One that may continue a lead byte before it is kept, so no
# UTF-8 text loses a byte. Valid UTF-8 holds none: only text that does not decode is searched.
_STRAY_C1_RE = re.compile(
    rb"(?<![\xc2-\xf4])(?<![\xe0-\xf4][\x80-\xbf])(?<![\xf0-\xf4][\x80-\xbf]{2})[\x80-\x9f]"
)
# What a terminal must not get; whatever is left is kept. SGR (``ESC[...m``) and erase to
# the end of the line (``ESC[K``) are the only escape sequences that survive. One pattern
# with no callback: the substitution runs in C, ~40x faster than choosing per match.
_KEPT = rb"(?!\[[0-9;:]*m|\[0?K)"  # after an ESC: not the start of a kept sequence
_TERMINAL_RE = re.compile(
    rb"\x1b" + _KEPT + rb"\[[0-?]*[ -/]*[@-~]"  # any other CSI: cursor, screen, modes, queries
    rb"|\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?"  # OSC, DCS, SOS, PM, APC strings
    rb"|\x1b" + _KEPT + rb"[ -/]*[0-~]"  # any other escape sequence (charsets, reset, ...)
    rb"|\x1b"
    + _KEPT  # an escape cut short
    + rb"|\xc2[\x80-\x9f]"  # C1 controls, as UTF-8
    rb"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"  # other controls but tab, LF and CR
)
RESET = b"\x1b[0m"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, multiline: bool = False) -> str:
    """``text`` with every control character shown as an escape; ``multiline`` keeps line
    breaks and tabs (a message of several lines), and nothing else."""
    pattern = _UNSAFE_MULTILINE_RE if multiline else _UNSAFE_RE
    return pattern.sub(_escape, text)


def visible_line(text: str) -> str:
    """One line of a rank's output inside sshddp's report: colours dropped, every other
    control character shown as an escape."""
    return visible(_SGR_RE.sub("", text))


def needs_filter(data: bytes) -> bool:
    """Whether ``data`` holds anything ``for_terminal`` would change (or a ``\\r``); most
    output does not. One memchr per trigger byte: no copy of ``data`` (a ``translate``
    copied it, and a flood's fresh buffers cost more in page faults than the scan)."""
    if any(byte in data for byte in _TRIGGERS):
        return True
    if data.isascii():
        return False
    return (b"\xc2" in data and _C1_UTF8.search(data) is not None) or _has_stray_c1(data)


def _has_stray_c1(data: bytes) -> bool:
    """Whether ``data`` holds a raw C1 byte outside UTF-8: a decode in C first (it may end
    inside a character), the slower search only when that fails."""
    if data.isascii():
        return False
    try:
        codecs.utf_8_decode(data, "strict", False)
    except UnicodeDecodeError:
        return _STRAY_C1_RE.search(data) is not None
    return False


def incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character that the next chunk
    completes (0 to 3): filtered apart, its continuation bytes would look like raw C1
    controls and be dropped."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # a lead byte: its sequence is 2, 3 or 4 bytes long
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < need else 0
    return 0


class TerminalStream:
    """``for_terminal`` over a stream cut into arbitrary chunks: a character split between
    two chunks is held back until it is whole."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        chunk, self.held = self.held + chunk, b""
        keep = len(chunk) - incomplete_tail(chunk)
        self.held = chunk[keep:]
        return for_terminal(chunk[:keep])

    def end(self) -> bytes:
        held, self.held = self.held, b""
        return for_terminal(held)


def for_terminal(data: bytes) -> bytes:
    """The ranks' bytes as a terminal may show them: SGR colour, ``ESC[K``, ``\\r``, tab and
    newline kept, every other escape sequence and control character dropped. When a colour
    survives, the text ends with a reset, so it never carries over into sshddp's lines."""
    if not needs_filter(data):
        return data
    if _has_stray_c1(data):  # first: what removing them joins up, the pattern below takes
        data = _STRAY_C1_RE.sub(b"", data)
    out = _TERMINAL_RE.sub(b"", data)
    return out + RESET if b"\x1b" in out else out
