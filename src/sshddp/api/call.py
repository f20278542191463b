"""A call as the hosts receive it, and the ranks' records as they come back.

The function travels by value: ``bundle`` writes a directory that the launch ships as its
``--workdir`` (the one staging a launch has): the job ``jobs/rankcall.py``, the call pickled
with cloudpickle, cloudpickle itself, so the hosts need nothing installed for it, and the
host path gate (``remote/hostpath.py``) the job reads and writes its files through.
``outcome`` turns the ranks' records into values in global-rank order, or the error they say.
"""

from __future__ import annotations

import pickle
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import cloudpickle

from sshddp.api.errors import ResultError
from sshddp.errors import UsageError

JOB = Path(__file__).resolve().parent.parent / "jobs" / "rankcall.py"
SCRIPT = "rankcall.py"
GATE = Path(__file__).resolve().parent.parent / "remote" / "hostpath.py"
GATE_FILE = "sshddp_hostpath.py"  #: the name jobs/rankcall.py imports the gate by
CALL_FILE = "call.pkl"  #: what jobs/rankcall.py reads
RESULT_DIR = "sshddp-result"  #: where jobs/rankcall.py writes, in the ranks' directory
MAX_CALL_BYTES = 64 << 20  #: the pickled function and arguments, at most
MAX_RESULT_BYTES = 64 << 20  #: a rank's pickled return value, at most


def bundle(
    where: Path,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    init: bool,
) -> Path:
    """Write the call's directory under ``where``; its path. A function (or argument) that
    cannot travel is a UsageError, before anything starts."""
    data = pickled_call(fn, args, kwargs)
    call = {
        "python": tuple(sys.version_info[:2]),
        "init": init,
        "limit": MAX_RESULT_BYTES,
        "call": data,
    }
    root = where / "call"
    root.mkdir()
    (root / CALL_FILE).write_bytes(pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))
    shutil.copyfile(JOB, root / SCRIPT)
    shutil.copyfile(GATE, root / GATE_FILE)
    package = Path(cloudpickle.__file__).parent
    (root / "cloudpickle").mkdir()
    for source in package.glob("*.py"):
        shutil.copyfile(source, root / "cloudpickle" / source.name)
    return root


def pickled_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    """``(fn, args, kwargs)`` by value, or a UsageError naming what cannot travel."""
    if not callable(fn):
        raise UsageError(f"launch(): fn is {type(fn).__name__}, not a function")
    try:
        data: bytes = cloudpickle.dumps(
            (fn, tuple(args), dict(kwargs)), protocol=pickle.HIGHEST_PROTOCOL
        )
    except Exception as exc:  # cloudpickle raises what the object's reduction raises
        raise UsageError(
            f"launch(): {_name(fn)} (with its arguments and what it refers to) cannot travel "
            f"to the hosts: {type(exc).__name__}: {exc}"
        ) from None
    if len(data) > MAX_CALL_BYTES:
        raise UsageError(
            f"launch(): {_name(fn)} with its arguments is {len(data)} bytes pickled, over "
            f"{MAX_CALL_BYTES}; put large data in files the ranks read"
        )
    return data


def _name(fn: object) -> str:
    return f"function {getattr(fn, '__qualname__', type(fn).__name__)!r}"


@dataclass(frozen=True)
class Raised:
    """A rank's function raised."""

    rank: int
    type: str  #: the exception's class name
    message: str
    traceback: str  #: its frames only
    time: float


def read_records(found: Sequence[Path]) -> dict[int, dict[str, Any]]:
    """The records of the newest attempt, by global rank (an older attempt's are stale)."""
    records: list[dict[str, Any]] = []
    for path in found:
        try:
            record = pickle.loads(path.read_bytes())
        except Exception:  # a cut copy counts as no record: the run's report says why
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            records.append(record)
    newest = max((int(r.get("attempt", 1)) for r in records), default=1)
    return {r["rank"]: r for r in records if int(r.get("attempt", 1)) == newest}


def first_raised(records: Mapping[int, Mapping[str, Any]]) -> Optional[Raised]:
    """The rank whose function raised first, if one did."""
    raised = [
        Raised(rank, str(r["type"]), str(r["message"]), str(r["traceback"]), float(r["time"]))
        for rank, r in records.items()
        if not r.get("ok") and "traceback" in r
    ]
    raised.sort(key=lambda r: (r.time, r.rank))
    return raised[0] if raised else None


def values(records: Mapping[int, Mapping[str, Any]], run_id: str) -> dict[int, Any]:
    """Every value that came back, by global rank; a value that cannot is a ResultError."""
    got = {}
    for rank in sorted(records):
        record = records[rank]
        if record.get("ok"):
            got[rank] = _value(record, rank, run_id)
        elif "result_error" in record:
            raise ResultError(f"rank {rank}: {record['result_error']}", run_id, rank)
    return got


def _value(record: Mapping[str, Any], rank: int, run_id: str) -> Any:
    try:
        return pickle.loads(record["value"])
    except Exception as exc:  # the value's class may not exist here
        raise ResultError(
            f"rank {rank}: its return value ({record.get('value_type', 'unknown type')}) cannot "
            f"be unpickled here: {type(exc).__name__}: {exc}",
            run_id,
            rank,
        ) from None


def in_rank_order(got: Mapping[int, Any], world_size: int, run_id: str) -> list[Any]:
    """The values of ranks 0..world_size-1; a rank without one is a ResultError."""
    missing = [r for r in range(world_size) if r not in got]
    if missing:
        raise ResultError(
            f"run {run_id} succeeded but rank(s) {', '.join(map(str, missing))} left no "
            "return value behind",
            run_id,
            missing[0],
        )
    return [got[r] for r in range(world_size)]
