"""run.logread: a log's last lines found from its end, and its bytes in bounded chunks."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sshddp.run.logread import chunks, tail_offset


def last_lines(data: bytes, n: int) -> bytes:
    """The reference: lines end with b"\\n" (a last line without one counts)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines = [line + b"\n" for line in lines[:-1]]
    else:
        lines = [line + b"\n" for line in lines[:-1]] + lines[-1:]
    return b"".join(lines[-n:]) if n > 0 else b""


@settings(deadline=None, max_examples=300)
@given(
    st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"x" * 40]), max_size=60),
    st.integers(0, 30),
    st.integers(1, 16),
)
def test_tail_offset_finds_the_last_lines(parts: list[bytes], n: int, block: int) -> None:
    import tempfile

    data = b"".join(parts)
    with tempfile.NamedTemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        start = tail_offset(Path(fh.name), n, block=block)
    assert data[start:] == last_lines(data, n)


def test_chunks_stream_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(bytes(range(256)) * 10)
    assert b"".join(chunks(path, 100, size=7)) == path.read_bytes()[100:]
    assert max(len(c) for c in chunks(path, 0, size=7)) == 7
