"""Stream a node's log from a byte offset until the node has finished; or its status.

args: {"rundir", "offset": int, "index": int, "mode": "follow" | "fetch" | "status"}
fetch: send what the log holds now and stop; status: send no log bytes, only the status.
stdout: the raw bytes of RUNDIR/node.log from offset; stderr at the end: one JSON line with
the node's exit.json (or {"state": "lost"} when its supervisor vanished without one).

With "index" (an offset in node.idx), stdout starts with one byte: ``R``, then the raw bytes
as above, where the node has no node.idx; or ``I``, then for each record of node.idx from
that offset on, the record (``contract.INDEX_RECORD``) and the span of node.log it names.
Only spans that node.idx already names are sent, so what arrives is always a log and an
index that agree, whatever point the stream is cut at.
Exits when the coordinator goes away (stdin closes), so it never lingers.

A follower that has sent everything waits for the run directory to change (``Changes``:
inotify, on Linux) rather than polling the log: a quiet node's next line leaves at once,
not up to ``POLL_MAX`` later, and a quiet node costs its host nothing until it writes.
Where inotify is not there, it polls as before. Once it has caught up with a node that
writes a little at a time, it lets GATHER_WAIT pass before the next look: a rank printing
1,000 lines a second costs a few dozen wakeups a second, not thousands.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import sys
import time
from typing import IO, Any, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import ExitRecord
from sshddp.remote.common import emit, frozen, pid_alive, read_json, same_process
from sshddp.remote.node.host_attempts import read_summary
from sshddp.remote.node.joined import node_watch, progress, still

CHUNK = 1 << 20
#: seconds between looks at node.log while a laptop follows it: 10 ms right after output (a
#: line reaches the console within 10 ms of the last one), doubling to 0.1 s while it is idle
#: (ten looks a second, a stat each, for the hours a quiet run is attached)
POLL_MIN, POLL_MAX = 0.01, 0.1
GATHER_WAIT = 0.03  # seconds node.log grows, after a little of it was sent, before a look
GATHER_BELOW = 64 * 1024  # a send of less than this much: the follower had caught up
LIVENESS_EVERY = 0.5  # seconds between checks that the supervisor is still there
FROZEN_WAIT = 10.0  # seconds a follower waits on a frozen supervisor before it gives up
# inotify(7): a file in the directory written, closed after writing, created or renamed in
IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, getattr(os, "O_CLOEXEC", 0o2000000)


class Changes:
    """Tells when a directory changed (a file in it written, created or renamed), through
    inotify; ``fd`` is None where there is none (not Linux, no such call, no watches left),
    and the caller polls."""

    def __init__(self, directory: str) -> None:
        self.fd: Optional[int] = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
        if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            os.close(fd)
            return
        self.fd = fd

    def clear(self) -> None:
        """Forget the changes seen so far (read them all)."""
        try:
            while self.fd is not None and os.read(self.fd, 1 << 16):
                pass
        except OSError:  # EAGAIN: none left
            pass


def _coordinator_gone(wait: float = 0.02, changes: Optional[Changes] = None) -> bool:
    """Wait up to ``wait`` s for the coordinator to go away (stdin ends), or, with
    ``changes``, for the directory to change; True when it went."""
    fds = [0] if changes is None or changes.fd is None else [0, changes.fd]
    ready, _, _ = select.select(fds, [], [], wait)
    if changes is not None and changes.fd in ready:
        changes.clear()
    return 0 in ready and not os.read(0, 4096)


def _supervisor_gone(rundir: str) -> bool:
    """The node's supervisor is gone: its pid is free, or names another process now."""
    state = read_json(os.path.join(rundir, contract.STATE))
    if state is None:
        return False
    pid, started = state.get("supervisor_pid"), state.get("supervisor_start")
    if started is None:  # recorded before start times were
        return not pid_alive(pid)
    return not same_process(pid, started, state.get("boot_id"))


def _supervisor_frozen(rundir: str) -> Optional[ExitRecord]:
    """The node's status when its supervisor is frozen (SIGSTOP): it copies no output and
    acts on no signal until resumed; None when it is not."""
    state = read_json(os.path.join(rundir, contract.STATE)) or {}
    pid, started = state.get("supervisor_pid"), state.get("supervisor_start")
    if not same_process(pid, started, state.get("boot_id")) or not frozen(pid):
        return None
    if os.path.exists(os.path.join(rundir, contract.EXIT)):
        return None
    return {
        "state": contract.NOT_ANSWERING,
        "reason": (
            f"its supervisor (pid {pid}) is frozen (SIGSTOP) and does not answer: the node "
            "is not followed; `kill -CONT` resumes it, `sshddp stop` ends the node"
        ),
        "started": state.get("started"),
    }


def _open_log(path: str, offset: int) -> Optional[IO[bytes]]:
    while True:
        try:
            fh = open(path, "rb")
            fh.seek(offset)
            return fh
        except OSError:
            if _coordinator_gone():
                return None


def node_status(rundir: str) -> ExitRecord:
    """The node's state as its run directory tells it (exit.json, else liveness)."""
    done = read_json(os.path.join(rundir, contract.EXIT))
    if done is not None:
        record: ExitRecord = done
        return record
    state = read_json(os.path.join(rundir, contract.STATE))
    if state is None:
        known = os.path.exists(os.path.join(rundir, contract.SPEC))
        return {"state": contract.STARTING if known else contract.UNKNOWN}
    if _supervisor_gone(rundir) and not os.path.exists(os.path.join(rundir, contract.EXIT)):
        return {
            "state": contract.LOST,
            "reason": "the node's supervisor died",
            "started": state.get("started"),
        }
    stuck = _supervisor_frozen(rundir)
    if stuck is not None:
        return stuck
    started = state.get("started")
    watch = node_watch(rundir, float(started or 0))
    running: ExitRecord = {
        "state": contract.RUNNING,
        "started": started,
        "joined": len(watch["joined"]),
        "quiet": round(watch["quiet"], 1),
    }
    sampled = progress(rundir)  # only under --stall-timeout: node_progress
    if sampled is not None:
        running["still"] = round(still(time.time(), watch["quiet"], sampled["moved_at"]), 1)
    running.update(read_summary(rundir))
    return running


def main(args: dict[str, Any]) -> None:
    rundir = os.path.expanduser(args["rundir"])
    mode = args.get("mode", "follow")
    log_path = os.path.join(rundir, contract.LOG)
    if mode == "status" or (mode == "fetch" and not os.path.exists(log_path)):
        emit(node_status(rundir), sys.stderr)
        return
    fh = _open_log(log_path, int(args.get("offset", 0)))
    if fh is None:
        return
    if "index" not in args:
        _stream(fh, rundir, mode == "fetch")
        return
    try:
        index = open(os.path.join(rundir, contract.INDEX), "rb")
    except OSError:  # made before node.log: this node's lines have no known rank
        sys.stdout.buffer.write(b"R")
        _stream(fh, rundir, mode == "fetch")
        return
    with index:
        spans = Spans(index, fh, int(args["index"]))
        sys.stdout.buffer.write(b"I")
        spans.final = mode == "fetch" and os.path.exists(os.path.join(rundir, contract.EXIT))
        _stream(spans, rundir, mode == "fetch")


class Spans:
    """node.idx's records from ``start`` (a byte offset in it), each followed by its span
    of node.log: read like a file. A record not yet whole waits for its last bytes.

    Once the node has ended (``final``), log bytes no record names (the disk filled up
    between a span and its record, or someone appended to node.log) follow as the node's
    own, under records made here: the local copy still gets every byte."""

    def __init__(self, index: IO[bytes], log: IO[bytes], start: int) -> None:
        self.index = index
        self.log = log
        self.record = struct.Struct(contract.INDEX_RECORD)
        self.final = False
        width = self.record.size
        start -= start % width
        self.end = 0  #: where the last record's span ends
        if start:
            index.seek(start - width)
            offset, length, _source = self.record.unpack(index.read(width))
            self.end = offset + length
        index.seek(start)

    def read(self, size: int) -> bytes:
        """Records and their spans, about ``size`` bytes (at least one record's worth)."""
        width = self.record.size
        at = self.index.tell()
        records = self.index.read(1024 * width)
        parts: list[bytes] = []
        sent = 0
        for i in range(len(records) // width):
            offset, length, _source = self.record.unpack_from(records, i * width)
            if parts and sent + length > size:
                break
            if self.log.tell() != offset:
                self.log.seek(offset)
            parts.append(records[i * width : (i + 1) * width])
            parts.append(self.log.read(length))
            sent += width + length
            self.end = offset + length
        self.index.seek(at + len(parts) // 2 * width)
        return b"".join(parts) if parts or not self.final else self._rest(size)

    def _rest(self, size: int) -> bytes:
        self.log.seek(self.end)
        data = self.log.read(size)
        if not data:
            return b""
        record = self.record.pack(self.end, len(data), contract.SOURCE_NODE)
        self.end += len(data)
        return record + data


def _stream(fh: Any, rundir: str, once: bool) -> None:
    """Copy the log to stdout until the node ends (or, ``once``, until its current end)."""
    out = sys.stdout.buffer
    exit_path = os.path.join(rundir, contract.EXIT)
    last_check = 0.0
    changes = None if once else Changes(rundir)
    # Told of every change, it still looks now and then: a write from another machine (a
    # shared home directory) makes no event here.
    longest = POLL_MAX if changes is None or changes.fd is None else LIVENESS_EVERY
    wait = POLL_MIN
    frozen_since: Optional[float] = None  # when the supervisor was first seen frozen
    while True:
        data = fh.read(CHUNK)
        if data:
            out.write(data)
            out.flush()
            wait = POLL_MIN
            # caught up with a chatty node: let its next lines collect, one wakeup for many
            if not once and len(data) < GATHER_BELOW and _coordinator_gone(GATHER_WAIT):
                return
            continue
        if once:
            out.flush()
            emit(node_status(rundir), sys.stderr)
            return
        if os.path.exists(exit_path):
            _drain(fh, out)  # exit.json is written after the last byte: drain, then report
            emit(read_json(exit_path) or {"state": contract.UNKNOWN}, sys.stderr)
            return
        if time.time() - last_check > LIVENESS_EVERY:
            last_check = time.time()
            ended = _unanswered(rundir, frozen_since)
            if ended is not None:
                emit(ended, sys.stderr)
                return
            frozen_since = (frozen_since or time.time()) if _supervisor_frozen(rundir) else None
        if _coordinator_gone(wait, changes):
            return
        wait = min(longest, wait * 1.5)  # a quiet node costs its host ~2 wakeups a second


def _unanswered(rundir: str, frozen_since: Optional[float]) -> Optional[ExitRecord]:
    """Why following must end though the node has not: its supervisor died without an
    exit record, or has been frozen for FROZEN_WAIT s (from ``frozen_since``); else None."""
    if _supervisor_gone(rundir) and not os.path.exists(os.path.join(rundir, contract.EXIT)):
        why = "the node's supervisor died (its host rebooted or its processes were killed)"
        return {"state": contract.LOST, "reason": why}
    if frozen_since is None or time.time() - frozen_since < FROZEN_WAIT:
        return None
    return _supervisor_frozen(rundir)


def _drain(fh: Any, out: IO[bytes]) -> None:
    if isinstance(fh, Spans):
        fh.final = True  # the node has ended: nothing will name the bytes no record names
    while True:
        data = fh.read(CHUNK)
        if not data:
            break
        out.write(data)
    out.flush()
