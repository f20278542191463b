"""What every host-side module shares: state files, the process table, precise teardown."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable, Optional, TextIO

from sshddp.remote.contract import MARK_VAR

AGENT_GRACE = 0.2  # seconds torchrun may outlive its ranks at teardown


def atomic_write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """The file's JSON value, or None when it is missing or not (yet) whole."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def home_path(path: str) -> str:
    """A path on this host as torchrun will see it: ``~`` expanded, relative to $HOME (the
    run's cwd for a script that lives on the host), whatever this process's cwd is."""
    return os.path.join(os.path.expanduser("~"), os.path.expanduser(path))


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def emit(obj: Any, stream: Optional[TextIO] = None) -> None:
    """One JSON line: how host-side code answers the coordinator."""
    out = stream or sys.stdout
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, pgid, start time) of a process from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> Optional[int]:
    """When the process started (clock ticks since boot): with its pid this names one
    process for good, whatever process later reuses the pid. None when it is gone."""
    st = _stat(pid)
    return st[2] if st else None


def pgid_of(pid: int) -> Optional[int]:
    st = _stat(pid)
    return st[1] if st else None


def _is_zombie(pid: int) -> bool:
    st = _stat(pid)
    return st is None or st[0] in ("Z", "X")


def _has_env(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def run_pids(pgid: Optional[int], mark: str) -> list[int]:
    """Live pids of a node's run: its process group, and every process whose environment
    carries the node's run marker (so children that called setsid are found too)."""
    needle = (f"{MARK_VAR}={mark}").encode()
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        if (pgid and st[1] == pgid) or _has_env(pid, needle):
            found.append(pid)
    return found


def pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_run(
    pgid: Optional[int],
    mark: str,
    grace: float,
    reap: Optional[Callable[[], None]] = None,
    hurry: Optional[Callable[[], bool]] = None,
    agent: bool = True,
) -> float:
    """SIGTERM every process of the node's run, SIGKILL what is left after ``grace`` s.

    ``reap`` (optional) is called while waiting so a parent can collect its own child;
    ``hurry`` (optional) ends the grace early when it returns True. ``agent``: the process
    group ``pgid`` is torchrun's alone, its workers run in sessions of their own, so once
    they are gone the rest is cut short; a node launcher's workers share its group, and it
    gets the whole grace. Returns the seconds it took.
    """
    start = time.time()
    pids = run_pids(pgid, mark)
    if grace > 0 and pids:
        signal_all(pids, signal.SIGTERM)
        pids = _wait_gone(pids, pgid, mark, start + grace, reap, hurry, agent)
    for _ in range(500):
        if not pids:
            break
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.01)
        if reap:
            reap()
        pids = run_pids(pgid, mark)
    return time.time() - start


def _wait_gone(
    pids: list[int],
    pgid: Optional[int],
    mark: str,
    deadline: float,
    reap: Optional[Callable[[], None]],
    hurry: Optional[Callable[[], bool]],
    agent: bool = True,
) -> list[int]:
    """Wait for the node's processes to exit after SIGTERM; those still there."""
    workers_gone = None
    while pids and time.time() < deadline and not (hurry and hurry()):
        time.sleep(0.02)
        if reap:
            reap()
        pids = run_pids(pgid, mark)
        # Once the ranks are gone, torchrun's own cleanup (seconds of Python teardown)
        # protects nothing: give it AGENT_GRACE, then kill it.
        if agent and workers_gone is None and not [p for p in pids if pgid_of(p) != pgid]:
            workers_gone = time.time()
        if workers_gone is not None and time.time() - workers_gone > AGENT_GRACE:
            break
    return pids
