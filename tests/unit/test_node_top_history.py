"""The ``top`` call's history: each rank's latest span of output at one sample every
TREND_EVERY seconds of the last minute, read back from node.log (``remote/calls/node_top.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from sshddp.remote.calls import node_top


def _rundir(tmp_path: Path, seconds: int) -> Path:
    log = b""
    samples = []
    for t in range(seconds):
        bar = f"\r {t:3d}/999 [{t}.00it/s]".encode()
        span = [len(log), len(bar)]
        log += b"x" * 500 + bar  # another rank's bytes in between
        ranks = [
            {
                "rank": 0,
                "local_rank": 0,
                "pid": 1,
                "cpu": 1.0,
                "rss": 1,
                "out_bytes": 0,
                "last_output": None,
                "last_span": [span[0] + 500, span[1]],
            }
        ]
        samples.append({"schema": 8, "at": 1000.0 + t, "node_rank": 0, "ranks": ranks})
    (tmp_path / "node.log").write_bytes(log)
    lines = [json.dumps(s) for s in samples]
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_history_is_one_span_every_five_seconds_of_the_last_minute(tmp_path: Path) -> None:
    rundir = _rundir(tmp_path, 90)
    samples = node_top.recent(str(rundir / "samples.jsonl"))
    got = node_top.history(str(rundir / "node.log"), samples)["0"]
    assert [at for at, _ in got] == [1029.0 + 5 * i for i in range(13)]
    assert got[-1][1] == "\r  89/999 [89.00it/s]"


def test_no_samples_no_history(tmp_path: Path) -> None:
    assert node_top.history(str(tmp_path / "node.log"), []) == {}
    assert node_top.recent(str(tmp_path / "samples.jsonl")) == []
