"""The next attempt's torchrun, started ahead (``--max-restarts``): a warm standby.

A restart's fresh torchrun spends about a second importing torch before it can rendezvous.
While an attempt runs and another may follow, the supervisor keeps one agent shim
(``agent.py``, standby mode) waiting with torchrun imported. On a restart it sends the go
(``Standby.go``): the attempt's environment, and the node's output as a descriptor; the
standby runs torchrun at once, as the attempt's torchrun.

Until its go, a standby is not part of the run: it carries no node mark, so stopping an
attempt (``common.kill_run``) leaves it waiting, and it writes nowhere. Its environment
does carry the run's id, so a standby that outlived its run would show as a leak. The
supervisor ends it (``discard``) before the node ends; a supervisor that dies ends it too,
since its socket then closes.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
from typing import Optional

from sshddp.remote import agent, contract

GO_TIMEOUT = 5.0  #: seconds the go may take to send before the standby is given up


class Standby:
    """An agent shim waiting for its go, for attempt ``attempt``."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, attempt: int):
        self.proc = proc
        self.sock = sock
        self.attempt = attempt

    @classmethod
    def start(
        cls, argv: list[str], env: dict[str, str], cwd: Optional[str], attempt: int
    ) -> Optional[Standby]:
        """The standby for ``attempt`` (torchrun's ``argv`` and ``env``), or None when it
        could not start (the restart then starts torchrun afresh)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting = {k: v for k, v in env.items() if k != contract.MARK_VAR}
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
        return cls(proc, ours, attempt)

    def go(self, env: dict[str, str], output: int) -> Optional[subprocess.Popen[bytes]]:
        """Start torchrun in the standby with ``env``, writing to ``output``; None when the
        standby is gone or did not take it (it is then ended)."""
        data = json.dumps({"env": env}).encode()
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
