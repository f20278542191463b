"""Give a node's ptys (``--tty``: torchrun's, and each rank's own) a new size: the user's
terminal was resized.

args: {"rundir", "columns": int, "rows": int}
The node's pty is where torchrun's stdout goes: its pid (checked by start time and boot, as
``stop`` checks it) names it in state.json, and /proc gives its stdout's terminal. Setting the
size there (TIOCSWINSZ) is what a terminal emulator does on a resize: what reads the size
again (tqdm with ``dynamic_ncols``, rich, ``shutil.get_terminal_size``) follows it. Each
rank's own pty is RUNDIR/out/<local rank>'s target (``rankout``).
Prints one JSON line: {"ok": true} or {"ok": false, "error": why}.
"""

from __future__ import annotations

import os
from typing import Any

from sshddp.protocol import contract
from sshddp.remote.common import emit, read_json, same_process
from sshddp.remote.rankside.rankout import rank_ptys, set_size


def resize(rundir: str, columns: int, rows: int) -> str:
    """Resize the node's pty and its ranks'; "" when done, else why not."""
    spec = read_json(os.path.join(rundir, contract.SPEC)) or {}
    if not spec.get("tty"):
        return "the node has no terminal (launched without --tty)"
    state = read_json(os.path.join(rundir, contract.STATE)) or {}
    pid = state.get("pid")
    if not same_process(pid, state.get("pid_start"), state.get("boot_id")):
        return "the node's torchrun is not running"
    try:
        path = os.readlink(f"/proc/{pid}/fd/1")
    except OSError as exc:
        return f"cannot open the node's pty: {exc.strerror}"
    if not path.startswith("/dev/pts/"):
        return f"torchrun's output is {path}, not a pty"
    for pts in [path, *rank_ptys(rundir)]:
        error = _resize(pts, [columns, rows])
        if error:
            return error
    return ""


def _resize(path: str, size: list[int]) -> str:
    """Set the size of the pty at ``path``; "" when done, else why not."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open the pty {path}: {exc.strerror}"
    try:
        set_size(fd, size)
    except OSError as exc:
        return f"cannot resize the pty {path}: {exc.strerror}"
    finally:
        os.close(fd)
    return ""


def main(args: dict[str, Any]) -> None:
    rundir = os.path.expanduser(args["rundir"])
    error = resize(rundir, int(args["columns"]), int(args["rows"]))
    emit({"ok": True} if not error else {"ok": False, "error": error})
