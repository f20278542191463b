"""A node bound to its launch session: the node ends when its session does. Over srun, as
below; under the Python API (``sshddp.launch``, boot args "bound": "caller"), so that a
caller that dies (a notebook's kernel killed) leaves no run behind: its SSH connections
close, each session's stdin ends, and the session stops its node as it would over srun.

Over srun (``transport: srun``) a node's launch session is a Slurm job step, and its
supervisor, torchrun and the ranks are processes of that step. When a step ends, Slurm
ends its processes: with ``proctrack/cgroup`` it SIGKILLs everything in the step's cgroup,
whatever session or process group a process made for itself; with ``proctrack/linuxproc``
or ``pgid`` it loses track of what left the session's process tree (the supervisor, once
the session has exited) and that runs on outside the job. Neither ends a run in order,
so a bound node ends with its session, in this order:

* the session never exits before its supervisor: after the node's log is streamed to its
  end, it waits for the supervisor (which may still relay its peers' reports);
* when the coordinator goes away (the session's stdin closes: it exited, or its srun was
  killed), the session stops the node as ``sshddp stop`` would, then waits;
* a SIGTERM to the session (``scancel``, a time limit: Slurm signals every process of the
  step) is ignored by the session: its supervisor, signalled too, stops the node, and the
  session streams that to the end;
* the supervisor stops its node when the session is gone without it (SIGKILLed), which it
  sees within a second: its parent changes.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

from sshddp.protocol import contract
from sshddp.remote.common import create, pid_alive
from sshddp.remote.node.stop import stop

COORDINATOR_GONE = (
    "the coordinator went away: a run over srun lives in the job steps of its coordinator's "
    "launch sessions, so it stops with them"
)
CALLER_GONE = (
    "the caller went away: a run of sshddp.launch (or sshddp.start without detach=True) ends "
    "with the Python process that started it"
)
SESSION_GONE = (
    "stopped: its launch session (a Slurm job step, or the SSH session of sshddp.launch's "
    "caller) ended before the node"
)
#: boot args "bound": why the node stops when its session sees the coordinator go
REASONS = {"srun": COORDINATOR_GONE, "caller": CALLER_GONE}


def hold_signals() -> None:
    """Keep the session through a SIGTERM or SIGHUP that Slurm sends the whole step: the
    supervisor gets it too and stops the node, and the session streams that."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def end_with_session(rundir: str, state: dict[str, Any], kind: object = "srun") -> None:
    """The session is about to exit: stop the node if it still runs; over srun, wait until
    its supervisor has exited, so the step ends only after the node (a caller's session
    holds no step: it leaves once the stop is under way). ``kind``: boot args "bound"
    ("srun", or "caller" under the Python API; True counts as "srun")."""
    kind = kind if kind in REASONS else "srun"
    if not os.path.exists(os.path.join(rundir, contract.EXIT)):
        stop({"rundir": rundir, "force": False, "reason": REASONS[str(kind)]})
    if kind == "srun":
        _reap(state.get("supervisor_pid"))


def _reap(pid: Optional[int]) -> None:
    """Wait for the supervisor to exit (it is this process's child)."""
    if not isinstance(pid, int):
        return
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # not ours after all: wait for it to vanish
        while pid_alive(pid):
            time.sleep(0.05)  # once, at the session's end: a supervisor not our child


def session_gone(rundir: str, parent: Optional[int]) -> bool:
    """Whether a bound supervisor's launch session (its parent, ``parent``) is gone; if so,
    the node's stop reason says it (unless someone gave one first)."""
    if parent is None or os.getppid() == parent:
        return False
    try:  # unless someone gave one first
        with os.fdopen(create(os.path.join(rundir, contract.STOP_REASON)), "w") as fh:
            fh.write(SESSION_GONE)
    except FileExistsError:
        pass
    return True
