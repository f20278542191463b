"""The job ``sshddp.launch(fn, ...)`` ships and runs under torchrun on every rank.

It reads the call (``call.pkl``: the caller's Python version, the launch's limits, and the
function with its arguments pickled by value with cloudpickle, which ships beside it),
optionally joins the process group, calls the function, and writes one record into
``sshddp-result/rank<R>.pkl`` of its working directory (the run's own, ``--fresh-cwd``),
which the coordinator fetches back:

- ``{"ok": True, "value": <the return value, pickled>}``;
- ``{"ok": False, "type", "message", "traceback"}`` when the function raised: the rank then
  exits 1 and the run fails as a script's would (the traceback holds the function's frames
  only);
- ``{"ok": False, "result_error": ...}`` when the value cannot come back (too large, or not
  picklable): the rank exits 0, since the function itself succeeded.

Every record also carries ``rank``, ``attempt`` (``SSHDDP_ATTEMPT``) and ``time``. Standalone:
it imports nothing of sshddp but the host path gate (``remote/hostpath.py``, stdlib only),
shipped beside it as ``sshddp_hostpath.py``: the call is read back and the records written
through it (``sshddp-result`` a private directory of this user's, never a planted link; a
record made ``O_EXCL`` under an unguessable name, then renamed into place).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from types import ModuleType
from typing import Any, NoReturn

CALL_FILE = "call.pkl"
RESULT_DIR = "sshddp-result"
GATE = "sshddp_hostpath"  #: remote/hostpath.py, shipped beside this file under this name


def _gate() -> ModuleType:
    """The host path gate shipped beside this file (on sys.path: ``main`` put it there)."""
    import importlib

    return importlib.import_module(GATE)


def _record(rank: int, **fields: Any) -> dict[str, Any]:
    fields.update(rank=rank, attempt=int(os.environ.get("SSHDDP_ATTEMPT", "1")), time=time.time())
    return fields


def _write(rank: int, record: dict[str, Any]) -> None:
    """The record, whole or absent, in RESULT_DIR of the ranks' directory (the run's own)."""
    hostpath = _gate()
    directory = hostpath.private_dir(os.path.abspath(RESULT_DIR), "result directory")
    fd, tmp = hostpath.temp_file(directory, f".rank{rank}-")
    with os.fdopen(fd, "wb") as fh:
        pickle.dump(record, fh, protocol=pickle.HIGHEST_PROTOCOL)
    hostpath.rename(tmp, os.path.join(directory, f"rank{rank}.pkl"))


def _init_group() -> None:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def _own_frames(exc: BaseException) -> str:
    """The exception's traceback from the function's frame on: none of this job's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _call.__code__.co_filename:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _call(fn: Any, args: Any, kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _value_record(rank: int, value: Any, limit: int, cloudpickle: Any) -> dict[str, Any]:
    what = type(value).__module__ + "." + type(value).__qualname__
    try:
        data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # any pickling failure is the value's
        text = f"its return value ({what}) cannot be pickled: {type(exc).__name__}: {exc}"
        return _record(rank, ok=False, result_error=text, value_type=what)
    if len(data) > limit:
        text = f"its return value ({what}) is {len(data)} bytes pickled, over the limit of {limit}"
        return _record(rank, ok=False, result_error=text, value_type=what)
    return _record(rank, ok=True, value=data, value_type=what)


def _fail(rank: int, exc: BaseException, text: str) -> NoReturn:
    """Record the exception, print its traceback as the rank's last words, exit 1."""
    record = _record(rank, ok=False, type=type(exc).__name__, message=str(exc), traceback=text)
    _write(rank, record)
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    os._exit(1)  # no interpreter teardown: a failed collective may hang it


def _load(here: str) -> dict[str, Any]:
    with _gate().open_read(os.path.join(here, CALL_FILE), "call") as fh:
        call = pickle.load(fh)
    if tuple(sys.version_info[:2]) != tuple(call["python"]):
        mine, there = sys.version_info[:2], tuple(call["python"])
        raise RuntimeError(
            f"Python {mine[0]}.{mine[1]} on this host, {there[0]}.{there[1]} where launch() was "
            "called: a function travels by value only between the same Python minor versions"
        )
    call["fn"], call["args"], call["kwargs"] = pickle.loads(call["call"])
    return call


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)  # the cloudpickle shipped beside this file
    import cloudpickle

    try:
        call = _load(here)
    except Exception as exc:  # what could not travel, said by the rank
        _fail(
            rank,
            exc,
            f"the function could not be loaded on this host: {type(exc).__name__}: {exc}\n",
        )
    if call["init"]:
        _init_group()
    try:
        value = _call(call["fn"], call["args"], call["kwargs"])
    except BaseException as exc:
        _fail(rank, exc, _own_frames(exc))
    _write(rank, _value_record(rank, value, call["limit"], cloudpickle))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
