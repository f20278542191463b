"""The NCCL flight recorder on a GPU host: armed for every rank, dumped on demand when the
run hangs, and read into a short summary the report can compare across ranks.

torch keeps the last collectives of every NCCL process group in memory (its "flight
recorder") when ``TORCH_FR_BUFFER_SIZE`` is set, and writes them to
``TORCH_FR_DUMP_TEMP_FILE<rank>`` when a collective times out. A stall found by sshddp's
watchdog comes long before NCCL's own timeout (ten minutes by default), so the watchdog asks
for the dump itself: with ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` set, every rank's NCCL monitor
thread makes a named pipe ``<that><rank>.pipe`` and dumps when anything is written to it
(it looks once a second). A dump takes seconds (``WAIT``); the watchdog asks before it
reads the stacks and waits for the dumps after. Checked on an H100 with torch 2.11 and
NCCL 2.28 (``scripts/gpu_smoke.sh``).

A dump is a pickle of plain dicts, lists, strings and numbers; it is read here with an
unpickler that refuses every class, so a file in the run directory cannot run code.
"""

from __future__ import annotations

import io
import os
import stat
import time
from typing import Any, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import FlightEntry, FlightGroup, FlightRecord
from sshddp.remote.common import listdir

TRACE_BUFFER = "2000"  #: TORCH_FR_BUFFER_SIZE: collectives the recorder keeps per rank
TRACE = "trace_"  #: RUNDIR/nccl/trace_<rank>: a rank's dump
PIPE = "pipe_"  #: RUNDIR/nccl/pipe_<rank>.pipe: write to it and the rank dumps
#: Seconds the ranks have to dump once asked. Their monitors look at the pipe once a second;
#: then torch names the recorded Python frames, and the first time a rank does so it imports
#: torch._inductor and sympy (torch 2.11 on an H100 host: 7.3 s for an idle rank, 8.2 s for
#: one whose GPU is busy with a kernel that never ends; a rank spinning in Python code,
#: holding the GIL, had not dumped after 25 s).
WAIT = contract.FLIGHT_WAIT
POLL = 0.05  #: seconds between looks for the dumps, within WAIT, once a hang is being recorded
MAX_DUMP = 16 << 20  #: bytes read of one dump
LAST = 3  #: a rank's last collectives the summary keeps

#: The recorder's settings, each with the name older torch reads (torch 2.13 warns on every
#: rank's output for the old names, so only the new ones are set).
SETTINGS = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
}


def settings(rundir: str, env: dict[str, str]) -> dict[str, str]:
    """The recorder's settings for the ranks, each unless the user set it (by either name)."""
    directory = os.path.join(rundir, contract.NCCL)
    values = {
        "TORCH_FR_BUFFER_SIZE": TRACE_BUFFER,
        "TORCH_FR_DUMP_TEMP_FILE": os.path.join(directory, TRACE),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(directory, PIPE),
    }
    return {
        name: value
        for name, value in values.items()
        if name not in env and SETTINGS[name] not in env
    }


def dumps(rundir: str) -> list[str]:
    """The dump files in the run directory."""
    directory = os.path.join(rundir, contract.NCCL)
    return [os.path.join(directory, n) for n in sorted(listdir(directory)) if n.startswith(TRACE)]


def request(rundir: str) -> list[int]:
    """Ask every rank whose pipe is open for a dump; the ranks asked. A pipe no process
    reads any more (its rank is gone) is left alone."""
    directory = os.path.join(rundir, contract.NCCL)
    asked = []
    for name in sorted(listdir(directory)):
        rank = _rank(name, PIPE, ".pipe")
        if rank is None:
            continue
        path = os.path.join(directory, name)
        try:
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                continue
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it
            continue
        try:
            os.write(fd, b"1\n")
            asked.append(rank)
        except OSError:  # EPIPE: its rank just ended; EAGAIN: it was asked already
            pass
        finally:
            os.close(fd)
    return asked


def gather(rundir: str, asked: list[int], since: float, wait: float = WAIT) -> list[FlightRecord]:
    """Every rank's dump, read once whole: those ``asked`` get until ``wait`` seconds after
    ``since`` to write one newer than ``since``; a dump already there (a rank's own timeout)
    is read as it is."""
    directory = os.path.join(rundir, contract.NCCL)
    deadline = since + wait
    records: dict[int, FlightRecord] = {}
    unread: dict[int, tuple[float, int]] = {}  #: a file that was no whole dump, as it was then
    while True:
        for name in listdir(directory):
            rank = _rank(name, TRACE, "")
            if rank is None or rank in records:
                continue
            path = os.path.join(directory, name)
            stamp = _stamp(path)
            if stamp is None or unread.get(rank) == stamp:
                continue  # gone, or not changed since it was read
            if rank in asked and stamp[0] < since and time.time() < deadline:
                continue  # an old dump: wait for the one asked for
            record = read(path, rank)
            if record is None:
                unread[rank] = stamp
            else:
                records[rank] = record
        if all(r in records for r in asked) or time.time() >= deadline:
            return [records[r] for r in sorted(records)]
        time.sleep(POLL)


def read(path: str, rank: int) -> Optional[FlightRecord]:
    """One dump's summary, or None while the file is not yet a whole pickle."""
    import pickle  # not at the top: every supervisor imports this module, few read a dump

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_DUMP)
        dump = _load_plain(raw)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError):
        return None
    if not isinstance(dump, dict):
        return None
    return summarize(dump, path, rank)


def summarize(dump: dict[str, Any], path: str, rank: int) -> FlightRecord:
    """What the report needs of one rank's dump: each process group's progress, and the
    rank's last collectives with where its script called them."""
    status = dump.get("pg_status") or {}
    config = dump.get("pg_config") or {}
    groups: dict[str, FlightGroup] = {}
    for pg, s in status.items():
        if isinstance(s, dict):
            desc = config.get(pg, {}).get("desc", "") if isinstance(config.get(pg), dict) else ""
            groups[str(pg)] = {
                "desc": str(desc),
                "enqueued": _int(s.get("last_enqueued_collective")),
                "started": _int(s.get("last_started_collective")),
                "completed": _int(s.get("last_completed_collective")),
            }
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    return {
        "rank": rank,
        "path": path,
        "version": str(dump.get("version", "")),
        "groups": groups,
        "last": [_entry(e) for e in entries[-LAST:]],
    }


def _entry(e: dict[str, Any]) -> FlightEntry:
    group = e.get("process_group")
    pg = str(group[0]) if isinstance(group, (list, tuple)) and group else str(e.get("pg_id", ""))
    return {
        "pg": pg,
        "seq": _int(e.get("p2p_seq_id") if e.get("is_p2p") else e.get("collective_seq_id")),
        "op": str(e.get("profiling_name", "")),
        "state": str(e.get("state", "")),
        "sizes": str(e.get("input_sizes", "")),
        "where": _where(e.get("frames") or []),
    }


def _where(frames: list[Any]) -> str:
    """The innermost frame outside torch: the line of the user's code that called it."""
    for f in frames:
        if not isinstance(f, dict):
            continue
        name = str(f.get("filename", ""))
        if "/torch/" not in name and name:
            return f"{name}:{f.get('line')} in {f.get('name')}"
    return ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _rank(name: str, prefix: str, suffix: str) -> Optional[int]:
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    middle = name[len(prefix) : len(name) - len(suffix)]
    return int(middle) if middle.isdigit() else None


def _stamp(path: str) -> Optional[tuple[float, int]]:
    """A file's modification time and size, or None when it is gone."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime, info.st_size


def _load_plain(raw: bytes) -> Any:
    """Unpickle ``raw``, plain data only: every class is refused."""
    import pickle

    class Plain(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    return Plain(io.BytesIO(raw)).load()
