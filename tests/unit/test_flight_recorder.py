"""The NCCL flight recorder: asked for a dump through each rank's pipe, the dumps read
without running anything in them, and which rank never entered which collective.

``data/nccl_trace_h100_torch2.11`` is a real dump: ``scripts/gpu_smoke.sh`` on an H100
(torch 2.11, NCCL 2.28), one rank whose second all-reduce never completes, dumped when
sshddp's stall watchdog asked for it."""

from __future__ import annotations

import os
import pickle
import shutil
import threading
import time
from pathlib import Path

import pytest

from sshddp.model import hang
from sshddp.model.flight import RankFlight, findings
from sshddp.protocol import contract
from sshddp.protocol.contract import FlightEntry, FlightRecord, HangRecord
from sshddp.remote.node import host_flight

REAL = Path(__file__).parent / "data" / "nccl_trace_h100_torch2.11"


def nccl_dir(tmp_path: Path) -> Path:
    d = tmp_path / contract.NCCL
    d.mkdir(exist_ok=True)
    return d


def test_a_real_h100_dump_reads_as_the_collective_that_never_completed(tmp_path: Path) -> None:
    record = host_flight.read(str(REAL), 0)
    assert record is not None
    assert record["version"] == "2.10"
    assert record["groups"] == {
        "0": {"desc": "default_pg", "enqueued": 2, "started": -1, "completed": 1}
    }
    assert [(e["seq"], e["op"], e["state"], e["where"]) for e in record["last"]] == [
        (1, "nccl:all_reduce", "completed", "nccl_smoke.py:20 in <module>"),
        (2, "nccl:all_reduce", "scheduled", "nccl_smoke.py:29 in <module>"),
    ]
    assert findings([RankFlight("gpu1", record)]) == [
        "process group 0 (default_pg): rank 0 wait in collective #2 nccl:all_reduce [[1]]"
        " (scheduled) called at nccl_smoke.py:29 in <module>"
    ]


def test_a_dump_is_read_without_running_anything_in_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)  # what plain pickle.load would run

    (tmp_path / "trace_0").write_bytes(pickle.dumps({"entries": [Hostile()]}, protocol=2))
    assert host_flight.read(str(tmp_path / "trace_0"), 0) is None
    assert not marker.exists()
    (tmp_path / "trace_1").write_bytes(REAL.read_bytes()[:200])  # still being written
    assert host_flight.read(str(tmp_path / "trace_1"), 1) is None
    (tmp_path / "trace_2").write_bytes(pickle.dumps([1, 2]))  # not a dump
    assert host_flight.read(str(tmp_path / "trace_2"), 2) is None
    assert host_flight.read(str(tmp_path / "missing"), 3) is None


def test_the_ranks_with_a_reader_on_their_pipe_are_asked(tmp_path: Path) -> None:
    d = nccl_dir(tmp_path)
    os.mkfifo(d / "pipe_0.pipe")
    os.mkfifo(d / "pipe_3.pipe")  # its rank is gone: nobody reads it
    (d / "pipe_5.pipe").write_bytes(b"")  # not a pipe
    os.mkfifo(d / "pipe_x.pipe")
    reader = os.open(d / "pipe_0.pipe", os.O_RDONLY | os.O_NONBLOCK)  # as torch opens it
    try:
        assert host_flight.request(str(tmp_path)) == [0]
        assert os.read(reader, 100) == b"1\n"
    finally:
        os.close(reader)
    assert host_flight.request(str(tmp_path / "elsewhere")) == []  # no recorder armed there


def test_a_pipe_that_takes_no_more_is_not_an_error(tmp_path: Path) -> None:
    """A rank asked before and not yet reading: its pipe is full, and the watchdog's report
    must come all the same."""
    d = nccl_dir(tmp_path)
    os.mkfifo(d / "pipe_1.pipe")
    reader = os.open(d / "pipe_1.pipe", os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(d / "pipe_1.pipe", os.O_WRONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(BlockingIOError):
            while True:
                os.write(writer, b"x" * 4096)
        assert host_flight.request(str(tmp_path)) == []
    finally:
        os.close(writer)
        os.close(reader)


def test_gather_waits_for_the_ranks_asked_and_no_longer_than_it_may(tmp_path: Path) -> None:
    d = nccl_dir(tmp_path)
    shutil.copy(REAL, d / "trace_2")  # an old dump of rank 2 (its own timeout, earlier)
    old = time.time() - 60
    os.utime(d / "trace_2", (old, old))
    since = time.time()

    def dump_later() -> None:
        time.sleep(0.3)
        partial = d / "trace_0.tmp"
        partial.write_bytes(REAL.read_bytes())
        partial.rename(d / "trace_0")

    writer = threading.Thread(target=dump_later)
    writer.start()
    got = host_flight.gather(str(tmp_path), [0], since, wait=5.0)
    writer.join()
    assert [r["rank"] for r in got] == [0, 2]  # rank 2's old dump is read as it is
    assert time.time() - since < 4.0  # it did not wait for the deadline

    started = time.time()
    got = host_flight.gather(str(tmp_path), [0, 2, 7], time.time(), wait=0.5)  # 7 never dumps
    assert 0.5 <= time.time() - started < 3.0
    assert [r["rank"] for r in got] == [0, 2]  # the old ones, read at the deadline


def entry(seq: int, op: str, state: str, where: str = "train.py:9 in step") -> FlightEntry:
    return {"pg": "0", "seq": seq, "op": op, "state": state, "sizes": "[[4]]", "where": where}


def rank_dump(rank: int, enqueued: int, completed: int, *last: FlightEntry) -> FlightRecord:
    return {
        "rank": rank,
        "path": f"/r/nccl/trace_{rank}",
        "version": "2.10",
        "groups": {
            "0": {"desc": "default_pg", "enqueued": enqueued, "started": -1, "completed": completed}
        },
        "last": list(last),
    }


def test_the_rank_that_never_entered_the_collective_is_named() -> None:
    waiting = [
        entry(4, "nccl:broadcast", "completed"),
        entry(5, "nccl:all_reduce", "started", "train.py:31 in step"),
    ]
    ranks = [
        RankFlight("h1", rank_dump(0, 5, 4, *waiting)),
        RankFlight("h1", rank_dump(1, 5, 4, *waiting)),
        RankFlight("h2", rank_dump(2, 4, 4, entry(4, "nccl:broadcast", "completed"))),
        RankFlight("h2", rank_dump(3, 5, 4, *waiting)),
    ]
    assert findings(ranks) == [
        "process group 0 (default_pg): rank 2 (h2) never entered collective #5"
        " nccl:all_reduce [[4]] (started) called at train.py:31 in step;"
        " its last was #4 nccl:broadcast [[4]] (completed) called at train.py:9 in step",
        "process group 0 (default_pg): ranks 0-1,3 wait in collective #5 nccl:all_reduce"
        " [[4]] (started) called at train.py:31 in step",
    ]


def test_ranks_that_completed_everything_put_the_hang_outside_nccl() -> None:
    done = [
        RankFlight("h1", rank_dump(r, 7, 7, entry(7, "nccl:all_reduce", "completed")))
        for r in (0, 1)
    ]
    assert findings(done) == [
        "process group 0 (default_pg): ranks 0-1 completed every collective enqueued (up to"
        " #7): the hang is outside NCCL"
    ]
    assert findings([RankFlight("h1", rank_dump(0, -1, -1))]) == [
        "process group 0 (default_pg): no collective enqueued yet on rank 0"
    ]
    assert findings([]) == []


def test_the_hang_report_says_what_the_recorder_found_and_who_did_not_dump() -> None:
    record = host_flight.read(str(REAL), 0)
    assert record is not None
    stacks: contract.NodeStacks = {
        "schema": contract.SCHEMA,
        "node_rank": 0,
        "state": contract.RUNNING,
        "processes": [],
        "py_spy": None,
        "note": "",
        "elapsed": 0.0,
    }
    found: HangRecord = {
        "schema": contract.SCHEMA,
        "kind": contract.HANG_STALL,
        "reason": "no rank wrote output for 6 s (--stall-timeout 6)",
        "at": time.time(),
        "node_rank": 0,
        "action": contract.ON_STALL_STOP,
        "watch": {"entered": [0, 1], "joined": [0, 1], "quiet": 6.0},
        "stacks": stacks,
        "flight": [record],
        "flight_late": [1],
        "nccl": [record["path"]],
    }
    text = hang.render("r", [hang.NodeHang(0, "gpu1", found)])
    assert (
        "NCCL flight recorder: process group 0 (default_pg): rank 0 wait in collective #2" in text
    )
    assert (
        "NCCL flight recorder: rank(s) 1 on gpu1 were asked for a dump and wrote none in 12 s"
        in text
    )
    older = dict(found)
    del older["flight"], older["flight_late"]  # hang.json of an older sshddp
    assert "wait in collective" not in hang.render("r", [hang.NodeHang(0, "gpu1", older)])  # type: ignore[arg-type]
