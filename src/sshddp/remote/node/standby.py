"""The next attempt's torchrun, started ahead (``--max-restarts``): a standby
(``standby_messages`` holds the vocabulary and the messages).

A restart's fresh torchrun spends about a second importing torch before it can rendezvous.
While an attempt runs and another may follow, the supervisor keeps one agent shim
(``agent.py``, standby mode) waiting with torchrun imported. On a restart it sends the go
(``Standby.go``): the attempt's environment, and the node's output as a descriptor; the
standby runs torchrun at once, as the attempt's torchrun. The go also carries torchrun's
command line and working directory, so the shim runs what the supervisor composed. A standby
started with an environment other than the attempt's (``fits``) is not used: what torch read
as it was imported must be what it reads.

Until its go, a standby is not part of the run: it carries no node mark, so stopping an
attempt (``common.kill_run``) leaves it waiting, and it writes nowhere. Its environment
does carry the run's id, so a standby that outlived its run would show as a leak. The
supervisor ends it (``discard``) before the node ends; a supervisor that dies ends it too,
since its socket then closes.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import subprocess
from typing import Callable, Optional

from sshddp.protocol import contract, standby_messages
from sshddp.remote.node.output import NodeOutput
from sshddp.remote.node.restarts import Restarts
from sshddp.remote.rankside import agent

#: starts torchrun afresh: the process (None if it could not) and why not
Fresh = Callable[[], "tuple[Optional[subprocess.Popen[bytes]], str]"]

GO_TIMEOUT = 5.0  #: seconds the go may take to send before the standby is given up


class Standby:
    """An agent shim waiting for its go, for attempt ``attempt``."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        sock: socket.socket,
        attempt: int,
        env: Optional[dict[str, str]] = None,
    ):
        self.proc = proc
        self.sock = sock
        self.attempt = attempt
        self.env = env or {}  #: what it was started with

    def fits(self, env: dict[str, str]) -> bool:
        """Started with ``env``, but for sshddp's own variables (the attempt, the output, the
        node's mark), which only the ranks and the supervisor read."""
        return _imported_with(self.env) == _imported_with(env)

    @classmethod
    def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        cwd: Optional[str],
        attempt: int,
    ) -> Optional[Standby]:
        """The standby for ``attempt`` (torchrun's ``argv``, and ``env`` but for the
        attempt's number, set here, and the node's mark: until its go it is no part of the
        run), or None when it could not start (the restart then starts torchrun afresh)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting = {k: v for k, v in env.items() if k != contract.MARK_VAR}
        waiting[contract.ATTEMPT_VAR] = str(attempt)  # (the go replaces the whole environment)
        waiting[agent.STANDBY_VAR] = "1"
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd or None,
                env=waiting,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own group: once it runs, torchrun's
            )
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        return cls(proc, ours, attempt, waiting)

    def go(
        self, env: dict[str, str], output: int, argv: list[str], cwd: Optional[str]
    ) -> Optional[subprocess.Popen[bytes]]:
        """Start torchrun in the standby with ``env`` and ``argv`` in ``cwd``, writing to
        ``output``; None when the standby is gone or did not take it (it is then ended)."""
        data = standby_messages.encode(standby_messages.go(env, argv, cwd))
        fds = array.array("i", [output])
        try:
            if self.proc.poll() is not None:
                raise OSError("the standby has exited")
            self.sock.settimeout(GO_TIMEOUT)
            sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            self.sock.sendall(data[sent:])
            self.sock.close()
        except OSError:
            self.discard()
            return None
        return self.proc

    def discard(self) -> None:
        """End the standby (it never ran torchrun) and reap it."""
        self.sock.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its session: all it started
            except OSError:
                pass
        try:
            self.proc.wait(GO_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass


def _imported_with(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(contract.OWN_VAR_PREFIX)}


class Spare:
    """A supervisor's standby, if any: one started for the next attempt while one may
    follow; taken by it, or ended with the node (``end``)."""

    def __init__(self, argv: list[str], cwd: Optional[str], ahead: bool = False) -> None:
        self.argv = argv  #: torchrun as the supervisor runs it (``compose.node_argv``)
        self.ahead = ahead  #: the node runs torchrun: the next attempt's may start ahead
        self.cwd = cwd
        self.standby: Optional[Standby] = None
        self.was_standby = False  #: the current attempt's torchrun was a standby

    def run(
        self, restarts: Restarts, env: dict[str, str], output: NodeOutput, fresh: Fresh
    ) -> tuple[Optional[subprocess.Popen[bytes]], str]:
        """torchrun for the current attempt: the standby's, else ``fresh()``; the process
        (None if it did not start) and why not. Then the next attempt's standby starts."""
        proc = self.take(restarts.attempt, env, output)
        self.was_standby, failed = proc is not None, ""
        if proc is None:
            proc, failed = fresh()
        restarts.started(self.was_standby)
        if proc is not None and restarts.more() and self.ahead:
            attempt = restarts.attempt + 1
            ahead = {**env, contract.ATTEMPT_VAR: str(attempt)}  # the go replaces it all
            self.standby = Standby.start(self.argv, ahead, self.cwd, attempt)
        return proc, failed

    def take(
        self, attempt: int, env: dict[str, str], output: NodeOutput
    ) -> Optional[subprocess.Popen[bytes]]:
        """The standby, running ``attempt``'s torchrun with ``env`` into ``output``; None
        when there is none for it."""
        standby, self.standby = self.standby, None
        if standby is None:
            return None
        if standby.attempt != attempt or not standby.fits(env):
            standby.discard()
            return None
        proc = standby.go(env, output.slave, self.argv, self.cwd)
        if proc is not None:
            output.close_writer()  # the standby holds the node's output now
        return proc

    def end(self) -> None:
        if self.standby is not None:
            self.standby.discard()
            self.standby = None
