"""What ``sshddp top`` asks of one node: its latest sample (``node_sampler``) and the last
bytes of each local rank's output, where its progress bar is (node.idx says which rank
wrote each span of node.log).

args: {"rundir", "tail": int}
Prints one JSON line: the node's ``TopRecord`` (``contract``).
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import Any, Optional

from sshddp.remote import contract
from sshddp.remote.common import emit, read_json
from sshddp.remote.contract import SampleRecord, TopRecord
from sshddp.remote.host_follow import node_status

TAIL = 2048  #: bytes of each rank's output sent by default
INDEX_WINDOW = 4096  #: records of node.idx looked at, from its end
LAST_LINE = 64 * 1024  #: bytes read from the end of samples.jsonl


def main(args: dict[str, Any]) -> None:
    emit(collect(os.path.expanduser(args["rundir"]), int(args.get("tail", TAIL))))


def collect(rundir: str, tail: int) -> TopRecord:
    spec = read_json(os.path.join(rundir, contract.SPEC))
    return {
        "schema": contract.SCHEMA,
        "node_rank": spec["node_rank"] if spec else -1,
        "state": node_status(rundir)["state"],
        "sample": latest(os.path.join(rundir, contract.SAMPLES)),
        "tails": tails(rundir, tail),
        "now": time.time(),
    }


def latest(path: str) -> Optional[SampleRecord]:
    """The last whole line of samples.jsonl, or None."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - LAST_LINE))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record: SampleRecord = json.loads(line)
            return record
        except ValueError:
            continue
    return None


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
