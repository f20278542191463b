"""What ``sshddp top`` asks of one node: its latest sample (``node_sampler``) and the last
bytes of each local rank's output, where its progress bar is (node.idx says which rank
wrote each span of node.log).

args: {"rundir", "tail": int, "every": seconds (a live view's stream; absent: once)}
Prints one JSON line: the node's ``TopRecord`` (``contract``). With ``every``, one such line
every that many seconds until the asker goes away (its stdin ends): a live view costs the
host one process for as long as it is open, not one Python start a second.
"""

from __future__ import annotations

import os
import select
import struct
import time
from typing import Any

from sshddp.protocol import contract
from sshddp.protocol.contract import SampleRecord, TopRecord
from sshddp.remote.common import emit, read_json, read_json_lines
from sshddp.remote.node.host_follow import node_status

TAIL = 2048  #: bytes of each rank's output sent by default
INDEX_WINDOW = 4096  #: records of node.idx looked at, from its end
LAST_LINES = 256 * 1024  #: bytes read from the end of samples.jsonl: a minute of samples
TREND = 60.0  #: seconds of history sent for the sparkline
TREND_EVERY = 5.0  #: seconds between two of its points
SPAN_BYTES = 256  #: bytes of a rank's span sent per point: one progress bar's state
WINDOW = 20.0  #: seconds of stack samples sent: the window a straggler is judged over


def main(args: dict[str, Any]) -> None:
    rundir, tail = os.path.expanduser(args["rundir"]), int(args.get("tail", TAIL))
    every = float(args.get("every") or 0)
    while True:
        emit(collect(rundir, tail))
        if every <= 0 or _asker_gone(every):
            return


def _asker_gone(wait: float) -> bool:
    """Wait ``wait`` s for the next record; True once the asker went away (stdin ends)."""
    ready, _, _ = select.select([0], [], [], wait)
    return bool(ready) and not os.read(0, 4096)


def collect(rundir: str, tail: int) -> TopRecord:
    spec = read_json(os.path.join(rundir, contract.SPEC))
    samples = recent(os.path.join(rundir, contract.SAMPLES))
    status = node_status(rundir)  # a seated spare's says the node rank it took
    seat = status.get("node_rank", spec["node_rank"] if spec else -1)
    return {
        "schema": contract.SCHEMA,
        "node_rank": seat,
        "state": status["state"],
        "attempt": status.get("attempt"),
        "sample": samples[-1] if samples else None,
        "tails": tails(rundir, tail),
        "history": history(os.path.join(rundir, contract.LOG), samples),
        "now": time.time(),
        "waits": waits(samples),
    }


def recent(path: str) -> list[SampleRecord]:
    """The whole lines of samples.jsonl's last LAST_LINES bytes, oldest first."""
    return read_json_lines(path, LAST_LINES)


def history(log: str, samples: list[SampleRecord]) -> dict[str, list[list[Any]]]:
    """Each rank's latest span at one sample every TREND_EVERY seconds of the last TREND."""
    if not samples:
        return {}
    points: list[SampleRecord] = []
    for s in reversed(samples):
        if s["at"] < samples[-1]["at"] - TREND:
            break
        if not points or points[-1]["at"] - s["at"] >= TREND_EVERY - 0.5:
            points.append(s)
    out: dict[str, list[list[Any]]] = {}
    try:
        fh = open(log, "rb")
    except OSError:
        return {}
    with fh:
        for s in reversed(points):
            for r in s["ranks"]:
                span = r.get("last_span")
                if span is None or r["local_rank"] is None:
                    continue
                take = min(span[1], SPAN_BYTES)
                fh.seek(span[0] + span[1] - take)
                text = fh.read(take).decode("utf-8", "replace")
                out.setdefault(str(r["local_rank"]), []).append([s["at"], text])
    return out


def waits(samples: list[SampleRecord]) -> dict[str, list[list[Any]]]:
    """Each local rank's stack samples (``node_sampler``) of the last WINDOW seconds:
    [[when, waiting in a collective, where], ...], oldest first."""
    out: dict[str, list[list[Any]]] = {}
    if not samples:
        return out
    since = samples[-1]["at"] - WINDOW
    for s in samples:
        if s["at"] < since:
            continue
        for r in s["ranks"]:
            stack = r.get("stack")
            if stack and r["local_rank"] is not None:
                point = [s["at"], bool(stack["wait"]), stack["where"]]
                out.setdefault(str(r["local_rank"]), []).append(point)
    return out


def tails(rundir: str, tail: int) -> dict[str, str]:
    """Each local rank's last ``tail`` bytes of output (as far as the index's last
    INDEX_WINDOW spans go), by local rank."""
    width = contract.INDEX_BYTES
    try:
        with open(os.path.join(rundir, contract.INDEX), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size // width * width
            start = max(0, size - INDEX_WINDOW * width)
            fh.seek(start)
            index = fh.read(size - start)
        log = open(os.path.join(rundir, contract.LOG), "rb")
    except OSError:
        return {}
    spans: dict[int, list[bytes]] = {}
    got: dict[int, int] = {}
    with log:
        for offset, length, source in reversed(
            list(struct.iter_unpack(contract.INDEX_RECORD, index))
        ):
            if source < 0 or got.get(source, 0) >= tail:
                continue
            take = min(length, tail - got.get(source, 0))
            log.seek(offset + length - take)
            spans.setdefault(source, []).append(log.read(take))
            got[source] = got.get(source, 0) + take
    return {str(k): b"".join(reversed(v)).decode("utf-8", "replace") for k, v in spans.items()}
