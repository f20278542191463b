"""py-spy on a host, for ``sshddp stacks --native``: find it, and read processes with it.

``py-spy dump --native --json --pid PID`` reads a Python process from outside (ptrace):
its Python frames and the C / C++ frames between them (a collective inside libtorch, a
``recv`` in libc). It pauses the process for the few milliseconds it reads, and needs the
right to trace it: the same user with kernel.yama.ptrace_scope 0, or root. It is looked for
next to the interpreter this runs on (where ``pip install py-spy`` puts it in that
environment), then on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from sshddp.protocol.contract import FrameRecord, ProcessStacks, ThreadRecord
from sshddp.remote.calls.frames import cwd_of, native_frame, python_frame
from sshddp.remote.common import which

TIMEOUT = 60.0  #: seconds one dump may take (reading libtorch's symbols takes seconds)
PARALLEL = 8  #: processes read at once


def beside_python() -> str:
    return os.path.join(os.path.dirname(sys.executable), "py-spy")


def find() -> Optional[str]:
    """The py-spy to use on this host, or None."""
    beside = beside_python()
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return which("py-spy")


def missing() -> str:
    """What to tell the user when this host has no py-spy."""
    return (
        f"py-spy is not installed (looked for {beside_python()} and on PATH "
        f"{os.environ.get('PATH', '')}): Python frames only; install it with "
        f"`{sys.executable} -m pip install py-spy`"
    )


def dump_all(py_spy: str, records: list[ProcessStacks]) -> None:
    """Fill in each record's stacks from py-spy, or its error (the caller falls back)."""
    if not records:
        return
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(records))) as pool:
        results = list(pool.map(lambda r: dump(py_spy, r["pid"]), records))
    for record, (threads, raw, error) in zip(records, results):
        record["threads"], record["raw"] = threads, raw
        if threads:
            record["source"] = "py-spy"
        else:
            record["error"] = f"py-spy could not read it: {error}"


def dump(py_spy: str, pid: int) -> tuple[list[ThreadRecord], str, str]:
    """(threads, py-spy's JSON, error) for one process."""
    argv = [py_spy, "dump", "--native", "--json", "--pid", str(pid)]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return [], "", f"no answer within {TIMEOUT:.0f} s"
    except OSError as exc:
        return [], "", str(exc)
    raw = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        return [], raw, _error(done.stderr.decode("utf-8", "replace"), done.returncode)
    try:
        return parse(json.loads(raw), pid, cwd_of(pid)), raw, ""
    except (ValueError, KeyError, TypeError) as exc:
        return [], raw, f"unreadable output ({exc})"


def _error(stderr: str, rc: int) -> str:
    """py-spy's own message, without the backtrace it prints after it."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("Error:")]
    return (said or lines or [f"exit {rc}"])[0]


def parse(threads: list[dict[str, Any]], pid: int, cwd: str = "") -> list[ThreadRecord]:
    """py-spy's JSON as threads, the main thread first, each stack outermost first (source
    lines of relative file names read from ``cwd``)."""
    out: list[ThreadRecord] = []
    ordered = sorted(threads, key=lambda t: (t.get("os_thread_id") != pid, t.get("os_thread_id")))
    for thread in ordered:
        status = "active" if thread.get("active") else "idle"
        if thread.get("owns_gil"):
            status += ", holds the GIL"
        out.append(
            {
                "id": str(thread.get("os_thread_id") or thread.get("thread_id") or ""),
                "name": thread.get("thread_name") or "",
                "status": status,
                "current": False,
                "frames": [_frame(f, cwd) for f in reversed(thread["frames"])],
            }
        )
    return out


def _frame(frame: dict[str, Any], cwd: str) -> FrameRecord:
    file, line = str(frame.get("filename") or ""), int(frame.get("line") or 0)
    if frame.get("module"):  # C / C++: the library, or the source file and line
        return native_frame(file, line, str(frame["name"]))
    # py-spy names a method by its qualified name; a traceback, by its code's name
    return python_frame(file, line, str(frame["name"]).rsplit(".", 1)[-1], cwd)
