"""The console's tracebacks: the first failure's whole, later ones one line each."""

from __future__ import annotations

import io

from sshddp.model.victims import MAX_LINES, WINDOW, Folds, Writer
from sshddp.run.sinks import Console

ROOT = b"""\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/w/train.py", line 40, in <module>
[rank3]:     main()
[rank3]:   File "/w/train.py", line 31, in main
[rank3]:     raise ValueError("bad batch 17")
[rank3]: ValueError: bad batch 17"""
VICTIM = b"""\
[rank%d]: Traceback (most recent call last):
[rank%d]:   File "/w/train.py", line 40, in <module>
[rank%d]:     main()
[rank%d]:   File "/w/train.py", line 29, in main
[rank%d]:     loss.backward()
[rank%d]:   File "/v/torch/_tensor.py", line 625, in backward
[rank%d]:     torch.autograd.backward(
[rank%d]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] \
Connection closed by peer [127.0.0.42]:46127"""
# Chained, as Lightning's strategy re-raises: two tracebacks, one exception at the end.
CHAINED = b"""\
Traceback (most recent call last):
  File "/w/fit.py", line 9, in fit
    trainer.fit(model)
torch.distributed.DistBackendError: Connection reset by peer

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/w/fit.py", line 12, in <module>
    main()
RuntimeError: Lightning's worker died
Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:670
frame #0: c10::Error::Error() + 0x96 (0x7f in libc10.so)
frame #1: <unknown function> + 0x5c (0x7f in libtorch_cpu.so)"""


def victim(rank: int) -> bytes:
    return VICTIM.replace(b"%d", str(rank).encode())


def folds(*ranks: int) -> Folds:
    f = Folds()
    for rank in ranks:
        f.add(rank, Writer(f"rank {rank}", f"node{rank // 2}-h{rank // 2 + 1}.log"))
    return f


def test_the_first_failure_is_whole_and_its_victims_one_line_each() -> None:
    f = folds(0, 1, 2, 3)
    assert f.lines(3, b"epoch 1\n" + ROOT, 0.0) == b"epoch 1\n" + ROOT
    for rank in (0, 1, 2):
        shown = f.lines(rank, victim(rank) + b"\nafter", 1.0)
        assert shown == (
            b"[rank%d]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            b"Connection closed by peer [127.0.0.42]:46127 (after rank 3's traceback; this "
            b"one whole in node%d-h%d.log)\nafter" % (rank, rank // 2, rank // 2 + 1)
        )


def test_a_victim_that_reaches_the_console_first_is_whole_and_so_is_the_root() -> None:
    """Two nodes' streams race: the peer's death may arrive before the failure that
    caused it. Both are whole (at most two), every later one folds under the root."""
    f = folds(0, 1, 2, 3)
    assert f.lines(0, victim(0), 0.0) == victim(0)
    assert f.lines(3, ROOT, 0.1) == ROOT
    assert f.lines(1, victim(1), 0.2) == b"".join(
        (victim(1).split(b"\n")[-1], b" (after rank 3's traceback; this one whole in node0-h1.log)")
    )
    later = f.lines(2, ROOT.replace(b"rank3", b"rank2"), 0.3)
    assert later is not None
    assert later.endswith(b"after rank 3's traceback; this one whole in node1-h2.log)")


def test_only_victims_the_first_is_whole_and_the_others_say_where_theirs_is() -> None:
    f = folds(0, 1)
    assert f.lines(0, victim(0), 0.0) == victim(0)
    assert f.lines(1, victim(1), 0.0).endswith(b":46127 (this one whole in node0-h1.log)")


def test_a_traceback_arriving_in_pieces_is_held_until_its_exception() -> None:
    f = folds(0, 3)
    pieces = ROOT.split(b"\n")
    assert [f.lines(3, p, 0.0) for p in pieces[:-1]] == [None] * (len(pieces) - 1)
    assert f.lines(3, pieces[-1], 0.0) == ROOT
    assert f.lines(3, b"next", 0.0) == b"next"


def test_a_chained_traceback_and_its_cpp_frames_fold_into_its_last_exception() -> None:
    f = folds(0, 3)
    f.lines(3, ROOT, 0.0)
    assert f.lines(0, CHAINED + b"\nlater", 0.0) == (
        b"RuntimeError: Lightning's worker died (after rank 3's traceback; this one whole in "
        b"node0-h1.log)\nlater"
    )


def test_the_first_failure_shows_its_cpp_frames() -> None:
    f = folds(0)
    own = CHAINED.replace(b"DistBackendError: Connection reset by peer", b"E: x")
    assert f.lines(0, own, 0) == own


def test_a_traceback_long_after_the_first_starts_afresh() -> None:
    f = folds(0, 3)
    f.lines(3, ROOT, 0.0)
    assert f.lines(0, victim(0), WINDOW - 1).endswith(b"node0-h1.log)")
    assert f.lines(0, ROOT, WINDOW + 1) == ROOT


def test_a_stream_that_ends_inside_a_traceback_gives_back_what_it_held() -> None:
    f = folds(0)
    assert f.lines(0, b"Traceback (most recent call last):\n  File x", 0.0) is None
    assert f.flush(0) == b"Traceback (most recent call last):\n  File x"
    assert f.flush(0) is None


def test_an_endless_traceback_is_shown_as_it_is() -> None:
    f = folds(0)
    body = b"\n".join([b"Traceback (most recent call last):"] + [b"  x"] * (MAX_LINES + 5))
    shown = f.lines(0, body, 0.0)
    assert shown is not None and shown.count(b"\n") >= MAX_LINES - 1


def test_output_without_a_traceback_is_passed_as_it_is() -> None:
    f = folds(0)
    chunk = b"step 1\n  indented\nTraceback is a word"
    assert f.lines(0, chunk, 0.0) is chunk


def test_the_console_folds_across_nodes_and_logs_see_it_whole() -> None:
    out = io.BytesIO()
    console = Console(out, color=False, fold=True)
    for node in (0, 1):
        for local in (0, 1):
            rank = 2 * node + local
            src = Writer(f"rank {rank}", f"node{node}-h{node + 1}.log")
            console.add_rank(node, local, f"{rank} h{node + 1}", 8, writer=src)
    console.write(1, ROOT + b"\n", source=1)
    console.write(0, victim(0) + b"\n", source=0)
    console.write(0, b"Traceback (most recent call last):\n  File x\n", source=1)
    console.flush_node(0)
    lines = out.getvalue().decode().splitlines()
    assert lines[:6] == ["[3 h2]   " + line for line in ROOT.decode().splitlines()]
    assert lines[6].startswith("[0 h1]   [rank0]: RuntimeError: [../third_party/gloo")
    assert lines[6].endswith("(after rank 3's traceback; this one whole in node0-h1.log)")
    assert lines[7:] == ["[1 h1]   Traceback (most recent call last):", "[1 h1]     File x"]
    whole = io.BytesIO()
    plain = Console(whole, color=False)  # logs, -v
    plain.add_rank(0, 0, "0 h1", 8)
    plain.write(0, victim(0) + b"\n" + victim(0) + b"\n", source=0)
    assert whole.getvalue().count(b"Traceback") == 2
