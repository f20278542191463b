"""A host command's process for tests that run no host: its output is a buffer."""

from __future__ import annotations


class ScriptedOutput:
    """``RemoteProcess``'s reading side: ``read`` takes from ``out``, which a subclass
    fills; the process wrote nothing on stderr and exits 0."""

    out = b""

    def read(self, n: int = 65536) -> bytes:
        chunk, self.out = self.out[:n], self.out[n:]
        return chunk

    def read_stderr(self) -> bytes:
        return b""

    def wait(self) -> int:
        return 0

    def close(self) -> None:
        pass
