"""run.logread: a log's last lines found from its end, and its bytes in bounded chunks."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sshddp.run.logread import chunks, rank_tail, tail_offset


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


def test_a_reports_tail_holds_the_ranks_lines_not_torchruns(tmp_path: Path) -> None:
    """A stalled torchrun node's log ends with torchrun's agent's own traceback (its stop):
    the report shows the ranks' last lines, which the node's index tells apart; a log
    without an index has no such tail (the report shows all of it)."""
    import struct

    from sshddp.protocol.contract import INDEX_RECORD, SOURCE_NODE

    pieces = [
        (b"OMP_NUM_THREADS banner\n", SOURCE_NODE),
        (b"rank 0 epoch 1\n", 0),
        (b"rank 1 epoch 1\n", 1),
        (b"rank 1 waits in all_reduce\n", 1),
        (b"Traceback (most recent call last):\nSignalException: got signal: 15\n", SOURCE_NODE),
    ]
    log, index = tmp_path / "node0-h1.log", tmp_path / "node0-h1.idx"
    offset, records = 0, b""
    for data, source in pieces:
        records += struct.pack(INDEX_RECORD, offset, len(data), source)
        offset += len(data)
    log.write_bytes(b"".join(data for data, _ in pieces))
    index.write_bytes(records)
    assert rank_tail(log, 2) == ["rank 1 epoch 1", "rank 1 waits in all_reduce"]
    assert rank_tail(log, 10) == ["rank 0 epoch 1", "rank 1 epoch 1", "rank 1 waits in all_reduce"]
    index.unlink()
    assert rank_tail(log, 10) is None
