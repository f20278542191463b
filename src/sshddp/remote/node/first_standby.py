"""A launch session's first standby: the first attempt's torchrun, importing torch while the
preflight runs (``standby_messages`` holds the vocabulary and the messages).

A fresh torchrun spends about a second (1.4 s on a busy 2-core machine) importing torch
before it does anything, and the preflight, the code copy and the supervisor's start come
before it. So a launch session given standby args (``StandbyArgs``: a torchrun node) starts
that import first. Before its probe, it makes the node's run directory
(``workdir.make_rundir``, the same checks a stage makes), puts the agent shim, the standby
wire's module and the ranks' sitecustomize in it, and forks the node's *supervisor-to-be*.
That process starts the standby (``standby.Standby``) with the environment and command line
torchrun will get, then waits on a pipe for the session:

* at the start (``hand_over``: a ``supervise`` message) it becomes the node's supervisor,
  as the forked supervisor of a session without a first standby would, and the first
  attempt's torchrun is its standby (``Spare.take``), so torchrun has imported torch by the
  time the node starts;
* when the session ends without a start (a failed check, a node that failed to stage, the
  coordinator gone: the pipe closes) it ends the standby and removes the run directory.

Only on a core to spare: an early import competes with the preflight for the host's CPU, and
several nodes of a run on one machine (containers, a test lab, a localhost inventory) would
starve the coordinator's sessions with their imports. So a standby starts early only while
it holds one of ``cpu_count // 2`` (at least 1) per-user slots of the machine, a lock file
in the temporary directory, until the start; a node without a slot starts torchrun when its
supervisor starts, as before. One node per machine always gets one.

The standby is the supervisor's child, as every torchrun is. A standby whose environment
differs from the one the attempt gets (``Standby.fits``) is ended and torchrun starts afresh,
so what torch saw at import is always what torchrun would have seen.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from sshddp.protocol import contract, standby_messages
from sshddp.protocol.contract import Secrets
from sshddp.protocol.standby_messages import StandbyArgs
from sshddp.remote.common import temp_dir, try_lock
from sshddp.remote.workdir import Unsafe, make_rundir, resolve_rundir

SUPERVISOR_LOG_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


class FirstStandby:
    """The session's end of its first standby: the pipe to the supervisor-to-be that holds
    it (see the module's text)."""

    def __init__(self, rundir: str, pid: int, pipe: int) -> None:
        self.rundir = rundir
        self.pid = pid
        self._pipe: Optional[int] = pipe

    @classmethod
    def begin(cls, args: StandbyArgs) -> Optional[FirstStandby]:
        """Make the run directory and fork the supervisor-to-be; None when the node's
        torchrun starts without a standby: not torchrun, no slot free on this machine, or
        the run directory cannot be made (the stage says why)."""
        rundir = os.path.expanduser(args["rundir"])
        if args["spec"].get("launcher", contract.LAUNCH_TORCHRUN) != contract.LAUNCH_TORCHRUN:
            return None  # (the supervisor's code is imported by the waiter, off this session's way)
        slot = take_slot()
        if slot is None:
            return None
        try:
            return cls._begin(rundir, args, slot)
        finally:
            os.close(slot)  # the supervisor-to-be holds the slot from here, until the start

    @classmethod
    def _begin(cls, rundir: str, args: StandbyArgs, slot: int) -> Optional[FirstStandby]:
        os.umask(0o077)
        try:
            runs = os.path.dirname(os.path.dirname(resolve_rundir(rundir)))
            # what a launch that never starts removes again: the directories made here
            made = [d for d in (os.path.dirname(runs), runs) if not os.path.lexists(d)]
            rundir = make_rundir(rundir)  # its real path, the only one used from here on
        except (Unsafe, OSError):
            return None
        from sshddp.remote.node.host_boot import put_torchrun_shims

        try:
            put_torchrun_shims(rundir, args)
        except OSError:
            _remove(rundir, made)
            return None
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(write)
            _wait(rundir, made, args, read, slot)  # never returns
        os.close(read)
        return cls(rundir, pid, write)

    def hand_over(self, parent: Optional[int], secrets: Secrets) -> bool:
        """Make the supervisor-to-be the node's supervisor (bound to ``parent``, over srun),
        handing it ``secrets`` down the pipe, never through a file; False if it is gone (the
        caller forks one)."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return False
        order = standby_messages.encode(standby_messages.supervise(parent, secrets))
        try:
            while order:  # (more than a pipe's buffer of environment: the other end reads on)
                order = order[os.write(pipe, order) :]
            return True
        except OSError:
            return False
        finally:
            os.close(pipe)

    def cancel(self) -> None:
        """No start: the supervisor-to-be ends the standby and removes the run directory
        (unless it became the supervisor already); wait for it."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        os.close(pipe)
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass


def _wait(rundir: str, made: list[str], args: StandbyArgs, pipe: int, slot: int) -> None:
    """The forked supervisor-to-be: start the standby, then become the supervisor or clean
    up."""
    status = 1
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never hold the session's channel open
            os.dup2(null, fd)
        os.close(null)
        from sshddp.remote.node.standby import Standby
        from sshddp.remote.node.supervisor import node_env, torchrun_argv

        argv = torchrun_argv(rundir, args["spec"])
        env = node_env(rundir, args["spec"], args["env"])
        standby = Standby.start(argv, env, os.path.expanduser("~"), 1, marked=True)
        order = standby_messages.decode_supervise(_read_line(pipe))
        os.close(pipe)
        os.close(slot)  # the preflight is over: the core is torchrun's now
        if order is not None:
            log = os.open(os.path.join(rundir, contract.SUPERVISOR_LOG), SUPERVISOR_LOG_FLAGS)
            from sshddp.remote.node.host_boot import supervise

            supervise(rundir, log, order["parent"], standby, order["secrets"])  # never returns
        if standby is not None:
            standby.discard()
        _remove(rundir, made)
        status = 0
    finally:
        os._exit(status)


def slot_count() -> int:
    """Early imports this machine takes at once: one per two cores, at least one."""
    return max(1, (os.cpu_count() or 1) // 2)


def take_slot() -> Optional[int]:
    """A lock on one of this machine's ``cpu_count // 2`` slots for an early import (see
    above), as an open descriptor; None when every slot is held."""
    base = os.path.join(temp_dir(), f"sshddp-standby-{os.getuid()}-")
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    for slot in range(slot_count()):
        try:
            fd = try_lock(f"{base}{slot}", flags, 0o600)
        except OSError:  # another user's file there: no early import, nothing worse
            continue
        if fd is not None:
            return fd
    return None


def _read_line(pipe: int) -> bytes:
    """The session's line, or b"" when it closed the pipe without one."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(pipe, 4096)
        except OSError:
            return b""
        if not chunk:
            return b""
        data += chunk
    return data


def _remove(rundir: str, made: list[str]) -> None:
    """Remove the run directory, and the directories above it that it was made with, each
    if empty (another run may use them by now)."""
    from sshddp.remote.node.host_boot import discard

    discard(rundir)
    for directory in reversed(made):
        try:
            os.rmdir(directory)
        except OSError:
            pass
