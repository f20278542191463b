"""The host named ``localhost``: the same command lines, run with ``bash -c``, no SSH server.

The command gets the environment an SSH session would carry over, not the coordinator's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from typing import IO, Optional

from sshddp.hosts.transport import RemoteProcess
from sshddp.model.inventory import Host

# What an SSH session would carry over; the coordinator's other variables stay here.
_LOCAL_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV")


def _session_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in _LOCAL_ENV or k.startswith("LC_")}


class _LocalProcess:
    """A command line run here; ``argv`` and ``env`` say how (``bash -c`` by default)."""

    def __init__(
        self,
        command: str,
        argv: Optional[list[str]] = None,
        env: Optional[dict[str, str]] = None,
    ) -> None:
        self._popen = subprocess.Popen(
            argv or ["bash", "-c", command],
            env=_session_env() if env is None else env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._stderr = b""
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self._popen.stderr is not None
        self._stderr = self._popen.stderr.read()

    def write(self, data: bytes) -> None:
        stdin = self._popen.stdin
        assert stdin is not None
        try:
            stdin.write(data)
            stdin.flush()
        except BrokenPipeError:
            pass

    def close_stdin(self) -> None:
        stdin = self._popen.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()

    def read(self, n: int = 65536) -> bytes:
        stdout: IO[bytes] | None = self._popen.stdout
        assert stdout is not None
        return stdout.read1(n)  # type: ignore[attr-defined]

    def read_stderr(self) -> bytes:
        self._stderr_thread.join()
        return self._stderr

    def wait(self) -> int:
        return self._popen.wait()

    def close(self) -> None:
        if self._popen.poll() is None:
            # Like a dropped channel: the command loses its pipes, the helper scripts exit.
            self.close_stdin()
            self._popen.kill()
            self._popen.wait()
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                stream.close()


class LocalTransport:
    """Runs commands on this machine, for the inventory host ``localhost``."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.label = host.host

    def connect(self) -> None:
        pass  # nothing to connect to

    def start(self, command: str) -> RemoteProcess:
        return _LocalProcess(command)

    def identity(self) -> dict[str, Optional[str]]:
        """This machine, reached without SSH: no host key."""
        return {"host_key": None, "endpoint": "localhost"}

    def close(self) -> None:
        pass
