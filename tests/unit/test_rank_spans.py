"""Each line's rank on nodes of several ranks, the pure parts and the local files: the
supervisor's line assembly (``remote.rankout.Source``), node.idx and the follower's framed
stream (``model.spans``), the local copy of a log and its index (``run.sinks.NodeLogs``),
reading it back (``run.logread.attributed``), and the console's per-rank prefixes."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import pytest

from sshddp.model import spans
from sshddp.model.ranksel import source_ranks
from sshddp.protocol import contract
from sshddp.remote.node.host_follow import Spans
from sshddp.remote.rankside.rankout import PARTIAL_WAIT, Source, told_apart
from sshddp.run import logread
from sshddp.run.nodefeed import NodeFeed
from sshddp.run.sinks import Console, NodeLogs

NODE = contract.SOURCE_NODE


def framed(*pieces: tuple[int, bytes]) -> bytes:
    """What a follower sends for these (source, bytes) spans of a log, from its start."""
    out, at = [b"I"], 0
    for source, data in pieces:
        out.append(spans.pack(at, len(data), source) + data)
        at += len(data)
    return b"".join(out)


def test_the_index_record_is_16_bytes_little_endian() -> None:
    assert spans.WIDTH == contract.INDEX_BYTES == 16
    assert spans.pack(1, 2, -1) == struct.pack("<QIi", 1, 2, -1)
    assert spans.parse(spans.pack(5, 6, 1) + b"\0" * 7) == [(5, 6, 1)]  # a cut record: left out


def test_a_framed_stream_decodes_whatever_its_chunks() -> None:
    stream = framed((NODE, b"torchrun says\n"), (1, b"rank 1 a\n"), (0, b"rank 0 a\nrank 0 b\n"))
    spans_sent = [
        (NODE, b"torchrun says\n", 0),
        (1, b"rank 1 a\n", 14),
        (0, b"rank 0 a\nrank 0 b\n", 23),
    ]
    for size in (1, 3, 16, 17, len(stream)):
        reader = spans.StreamReader(framed=True)
        pieces = []
        for at in range(0, len(stream), size):
            pieces += reader.feed(stream[at : at + size])
        # A span comes in as many pieces as it took chunks, each where it lies in the log;
        # only its last carries its record.
        got, data, at = [], b"", 0
        for p in pieces:
            assert p.offset == at and p.data, size
            data, at = data + p.data, at + len(p.data)
            if p.record:
                start = at - len(data)
                assert spans.parse(p.record) == [(start, len(data), p.source)], size
                got.append((p.source, data, start))
                data = b""
        assert got == spans_sent and data == b"" and reader.pending == 0, size
    whole = spans.StreamReader(framed=True).feed(stream)
    assert [(p.source, p.data, p.offset) for p in whole] == spans_sent


def test_a_long_span_arrives_in_pieces_no_bigger_than_its_chunks() -> None:
    """A flood's span (1 MiB from the supervisor) is handed on as it comes, not held until
    it is whole: the coordinator never holds more than a chunk of it."""
    body = b"x" * 1000
    stream = framed((0, body), (NODE, b""), (1, b"tail\n"))
    reader = spans.StreamReader(framed=True)
    pieces = [p for at in range(0, len(stream), 64) for p in reader.feed(stream[at : at + 64])]
    assert max(len(p.data) for p in pieces) <= 64
    assert b"".join(p.data for p in pieces if p.source == 0) == body
    assert reader.pending == 0
    records = [spans.parse(p.record)[0] for p in pieces if p.record]
    assert records == [(0, 1000, 0), (1000, 0, NODE), (1000, 5, 1)]  # an empty span too
    cut = spans.StreamReader(framed=True)
    cut.feed(stream[:600])
    assert cut.pending == 600 - 1  # the record and the span's bytes so far, if it ends now


def test_a_raw_stream_is_the_nodes_own_and_an_unknown_marker_is_refused() -> None:
    reader = spans.StreamReader(framed=True)
    assert [(p.source, p.data, p.record) for p in reader.feed(b"Rhello\n")] == [
        (NODE, b"hello\n", b"")
    ]
    assert reader.feed(b"more") == [spans.Piece(b"more", NODE)]
    assert spans.StreamReader(framed=False).feed(b"Iraw") == [spans.Piece(b"Iraw", NODE)]
    with pytest.raises(ValueError, match="not I or R"):
        spans.StreamReader(framed=True).feed(b"hello")


def test_resume_at_finds_where_the_log_and_its_index_agree() -> None:
    last = spans.pack(100, 20, 0)
    assert spans.resume_at(b"", 0, 50) == (0, 0)  # no index yet: everything again
    assert spans.resume_at(last, 160, 120) == (120, 160)  # they agree
    assert spans.resume_at(last, 160, 150) == (120, 160)  # a span without its record: cut
    assert spans.resume_at(last, 165, 120) == (120, 160)  # a record cut short: dropped
    assert spans.resume_at(last, 160, 110) == (100, 144)  # a record whose span is not whole


def source(whole: bool = True) -> Source:
    read, write = os.pipe()
    os.close(write)
    return Source(read, 0, "pipe", whole)


def test_a_source_writes_whole_lines_and_holds_an_unfinished_one_briefly() -> None:
    s = source()
    s.feed(b"one\ntwo\nthr", 10.0)
    assert s.take(10.0) == b"one\ntwo\n"
    assert s.take(10.0) == b""  # "thr" waits for its end
    s.feed(b"ee\nfo", 10.01)
    assert s.take(10.01) == b"three\n"
    assert s.due(10.01) == pytest.approx(PARTIAL_WAIT)
    assert s.take(10.01 + PARTIAL_WAIT) == b"fo"  # a bar's state goes out after a moment
    s.feed(b"x" * (2 << 20), 11.0)
    assert len(s.take(11.0)) == 2 << 20  # past MAX_PENDING: out at once, line or not
    s.feed(b"tail", 12.0)
    s.close()
    assert s.take(12.0) == b"tail"  # its stream ended: nothing is held back


def test_a_line_cut_by_a_read_waits_for_its_rest_even_when_the_last_one_was_due() -> None:
    """A read that stopped mid-line (1 MB at a time from a full FIFO) while an earlier
    unfinished line was already due: the earlier line goes out ended, the new one waits
    (CI, 4 ranks printing 5 MB each under load: a rank's line was split by another's)."""
    s = source()
    s.feed(b"r0 0001 aa", 10.0)
    assert s.take(10.0) == b""
    s.feed(b"a\nr0 0002 bb", 10.0 + 3 * PARTIAL_WAIT)  # the supervisor was slow to read
    assert s.take(10.0 + 3 * PARTIAL_WAIT) == b"r0 0001 aaa\n"
    s.feed(b"b\n", 10.0 + 3.5 * PARTIAL_WAIT)
    assert s.take(10.0 + 3.5 * PARTIAL_WAIT) == b"r0 0002 bbb\n"


def test_without_an_index_every_byte_goes_out_as_it_comes() -> None:
    s = source(whole=False)
    s.feed(b"no newline", 1.0)
    assert s.take(1.0) == b"no newline"
    s.close()


def test_only_torchruns_ranks_are_told_apart() -> None:
    spec: contract.SpecRecord = {
        "node_rank": 1,
        "watch": {"init_timeout": 0, "stall_timeout": 0, "on_stall": "stop", "nprocs": [2, 4]},
    }
    assert told_apart(spec) == 4
    assert told_apart({**spec, "tty": True}) == 4  # each rank gets a terminal of its own
    assert told_apart({**spec, "launcher": contract.LAUNCH_NODE}) == 0  # not torchrun's ranks
    assert told_apart({"node_rank": 0}) == 0  # a spec without the world's shape


def test_a_lines_ranks_are_its_own_or_its_nodes() -> None:
    assert source_ranks(4, 4, 2) == range(6, 7)
    assert source_ranks(4, 4, NODE) == range(4, 8)
    assert source_ranks(4, 4, 9) == range(4, 8)  # a source the plan does not know


def test_the_console_prefixes_each_line_with_its_rank_and_filters_by_rank() -> None:
    stream = io.BytesIO()
    console = Console(stream, color=False)
    console.add_node(1, "2-3 h2", 10, shown=True)
    console.add_rank(1, 0, "2 h2", 10, shown=False)
    console.add_rank(1, 1, "3 h2", 10, shown=True)
    console.write(1, b"torchrun\n")
    console.write(1, b"rank 2 a\n", 0)
    console.write(1, b"rank 3 a\nrank 3 b", 1)
    console.write(1, b"rank 2 b\n", 0)
    console.flush_node(1)
    assert stream.getvalue().decode().splitlines() == [
        "[2-3 h2]   torchrun",
        "[3 h2]     rank 3 a",
        "[3 h2]     rank 3 b",
    ]


AGENT = (
    b"W1128 torch/distributed/run.py:792] Setting OMP_NUM_THREADS environment variable\n"
    b"sshddp: cannot start /usr/bin/python: [Errno 2] No such file\n"
    b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 9 got signal: 15\n"
)


@pytest.mark.parametrize("shown", [False, True])
def test_torchruns_own_lines_show_only_when_asked(shown: bool, tmp_path: Path) -> None:
    """A node that tells its ranks apart: what is not a rank's is torchrun's agent, left to
    the log (but for sshddp's own lines) unless asked (-v); a node that does not (no
    index: --tty, a node launcher) shows all it wrote."""
    stream = io.BytesIO()
    console = Console(stream, color=False, agent=shown)
    for node in (0, 1):
        console.add_node(node, f"{node} h{node + 1}", 6)
        console.add_rank(node, 0, f"{node} h{node + 1}", 6)
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    NodeFeed(logs, console, 0).feed(framed((NODE, AGENT), (0, b"mine\n")))
    assert logs.paths[0].read_bytes() == AGENT + b"mine\n"  # the log keeps every byte
    console.write(1, AGENT)  # a node without index: its lines, whoever wrote them
    lines = stream.getvalue().decode().splitlines()
    agent = [f"[0 h1] {line}" for line in AGENT.decode().splitlines()]
    assert lines[: len(agent) if shown else 1] == (agent if shown else [agent[1]])
    assert "[0 h1] mine" in lines
    assert lines[-3:] == [f"[1 h2] {line}" for line in AGENT.decode().splitlines()]


def test_each_ranks_unfinished_line_is_its_own() -> None:
    """Two ranks' partial lines interleaved in the log still show as two whole lines."""
    stream = io.BytesIO()
    console = Console(stream, color=False)
    console.add_node(0, "0-1 h1", 8)
    for local in (0, 1):
        console.add_rank(0, local, f"{local} h1", 8)
    for data, src in ((b"rank 0 he", 0), (b"rank 1 he", 1), (b"llo\n", 0), (b"llo\n", 1)):
        console.write(0, data, src)
    assert stream.getvalue().decode().splitlines() == [
        "[0 h1]   rank 0 hello",
        "[1 h1]   rank 1 hello",
    ]


def test_the_local_copy_and_its_index_resume_where_they_agree(tmp_path: Path) -> None:
    logs = NodeLogs(tmp_path)
    assert logs.open(0, "h1") == 0 and logs.index_size(0) == 0
    feed = NodeFeed(logs, None, 0)
    feed.feed(framed((NODE, b"agent\n"), (1, b"rank 1\n")))
    assert logs.size(0) == 13 and logs.index_size(0) == 32
    logs.write(0, b"rank 0\n")  # cut between the log and its index
    logs.close()
    (tmp_path / "node0-h1.idx").open("ab").write(spans.pack(13, 99, 0)[:5])  # a cut record

    again = NodeLogs(tmp_path)
    assert again.open(0, "h1") == 20 and again.index_size(0) == 32  # the log is never cut
    log, index = again.paths[0], again.index_paths[0]
    # The follower resumes from the index: its next span starts at 13, held already.
    NodeFeed(again, None, 0).feed(b"I" + spans.pack(13, 7, 0) + b"rank 0\n")
    again.close()
    assert log.read_bytes() == b"agent\nrank 1\nrank 0\n"
    assert spans.parse(index.read_bytes()) == [(0, 6, NODE), (6, 7, 1), (13, 7, 0)]


def test_a_copy_cut_inside_a_span_keeps_its_bytes_and_takes_the_rest(tmp_path: Path) -> None:
    """The pieces of a span reach the copy before its record: a copy cut between them holds
    part of a span and no record for it; reopened, it keeps that part, and of the span the
    follower (resuming from the index) sends again, only the bytes it lacks are added."""
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    stream = framed((NODE, b"agent\n"), (1, b"rank 1 writes a long line\n"))
    feed = NodeFeed(logs, None, 0)
    feed.feed(stream[:41])  # the second span's record and 2 of its bytes
    assert logs.paths[0].read_bytes() == b"agent\nra" and logs.index_size(0) == 16
    logs.close()
    again = NodeLogs(tmp_path)
    assert again.open(0, "h1") == 8 and again.index_size(0) == 16
    assert [d for d, _s in logread.attributed(again.paths[0], again.index_paths[0])] == [
        b"agent\n",
        b"ra",  # shown as it is, the node's own
    ]
    NodeFeed(again, None, 0).feed(b"I" + stream[23:])
    again.close()
    assert again.paths[0].read_bytes() == b"agent\nrank 1 writes a long line\n"
    assert spans.parse(again.index_paths[0].read_bytes()) == [(0, 6, NODE), (6, 26, 1)]


def test_a_copy_cut_inside_its_first_span_keeps_its_bytes(tmp_path: Path) -> None:
    """Cut before the first span's record (seen in CI: a full local disk, 61440 bytes of
    the first span written, no index made yet): reopened, the copy keeps its bytes and
    takes the rest of the span the follower, resuming from the empty index, sends again."""
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    stream = framed((1, b"rank 1 writes a long line\n"))
    NodeFeed(logs, None, 0).feed(stream[:20])  # part of the first span, no record
    cut = logs.paths[0].read_bytes()
    assert cut and b"rank 1 writes".startswith(cut) and not logs.index_paths[0].exists()
    logs.close()
    again = NodeLogs(tmp_path)
    assert again.open(0, "h1") == len(cut) and again.index_size(0) == 0
    assert not again.index_paths[0].exists()  # opening makes no index
    NodeFeed(again, None, 0).feed(stream)
    again.close()
    assert again.paths[0].read_bytes() == b"rank 1 writes a long line\n"
    assert spans.parse(again.index_paths[0].read_bytes()) == [(0, 26, 1)]


def test_a_span_past_the_end_of_the_copy_is_refused(tmp_path: Path) -> None:
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    feed = NodeFeed(logs, None, 0)
    feed.feed(framed((0, b"a\n")))
    with pytest.raises(ValueError, match="a span at 99, the log ends at 2"):
        feed.feed(spans.pack(99, 1, 0) + b"z")  # past a gap: never papered over
    assert logs.paths[0].read_bytes() == b"a\n" and logs.index_size(0) == 16
    logs.close()


def test_reading_a_copy_back_gives_each_piece_its_rank(tmp_path: Path) -> None:
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    NodeFeed(logs, None, 0).feed(framed((NODE, b"agent\n"), (1, b"one\ntwo\n"), (0, b"zero\n")))
    logs.close()
    log, index = logs.paths[0], logs.index_paths[0]
    assert list(logread.attributed(log, index)) == [
        (b"agent\n", NODE),
        (b"one\ntwo\n", 1),
        (b"zero\n", 0),
    ]
    # --tail: from an offset inside a span, binary-searched in the index.
    assert list(logread.attributed(log, index, 10)) == [(b"two\n", 1), (b"zero\n", 0)]
    assert list(logread.attributed(log, index, 19)) == []
    assert list(logread.attributed(log, None, 6)) == [(b"one\ntwo\nzero\n", NODE)]  # no index


def test_a_tail_that_starts_inside_a_rank_s_line_starts_that_rank_at_its_next_line(
    tmp_path: Path,
) -> None:
    """Rank 1's bar went out in two spans (its state, then its newline) with rank 0's line
    between them: a --tail whose first line is rank 0's starts inside rank 1's line, and
    rank 1 then starts at its next line, not with the bar's lone newline (the CI failure
    of test_rank_output's --tail). A source whose last byte before the tail is a newline
    starts where the tail does."""
    logs = NodeLogs(tmp_path)
    logs.open(0, "h1")
    parts = ((1, b"bar 1/3\rbar 3/3\r"), (0, b"zero\n"), (1, b"\n"), (1, b"one\n"), (0, b"z2\n"))
    NodeFeed(logs, None, 0).feed(framed(*parts))
    logs.close()
    log, index = logs.paths[0], logs.index_paths[0]
    start = log.read_bytes().index(b"zero\n") + len(b"zero\n")
    assert logread.unfinished(log, index, start) == {1}
    skip = logread.unfinished(log, index, start)
    got = list(logread.attributed(log, index, start, None, skip))
    assert got == [(b"one\n", 1), (b"z2\n", 0)] and skip == set()
    before_zero = log.read_bytes().index(b"zero\n")
    assert logread.unfinished(log, index, before_zero) == {1}  # rank 0 has written nothing
    assert logread.unfinished(log, index, 0) == set() == logread.unfinished(log, None, 9)


def test_the_follower_sends_spans_from_its_offset_and_then_what_no_record_names(
    tmp_path: Path,
) -> None:
    """remote/node/host_follow.py's Spans: the records from an index offset with their bytes; once
    the node has ended, the log's bytes past the last record as the node's own."""
    log = tmp_path / "node.log"
    index = tmp_path / "node.idx"
    log.write_bytes(b"agent\nrank 1\nappended")
    index.write_bytes(spans.pack(0, 6, NODE) + spans.pack(6, 7, 1))
    with open(index, "rb") as idx, open(log, "rb") as fh:
        sent = Spans(idx, fh, 16)  # resumed after the first record
        assert sent.read(1 << 20) == spans.pack(6, 7, 1) + b"rank 1\n"
        assert sent.read(1 << 20) == b""  # the node goes on: the rest may get its record yet
        sent.final = True
        assert sent.read(1 << 20) == spans.pack(13, 8, NODE) + b"appended"
        assert sent.read(1 << 20) == b""
