"""Running the sshddp CLI in-process with captured streams (no subprocess, no terminal)."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sshddp.cli import run
from sshddp.cli.terminal import Terminal


@dataclass(frozen=True)
class Result:
    """What one CLI invocation printed and returned."""

    code: int
    out: str
    err: str
    raw: bytes = b""  #: what went to the terminal's byte stream (ranks' lines, exec's output)

    @property
    def text(self) -> str:
        """stdout and stderr together, for assertions that do not care which."""
        return self.out + self.err

    def explain(self) -> str:
        """The whole outcome, for assertion messages."""
        return f"exit {self.code}\n--- stdout ---\n{self.out}--- stderr ---\n{self.err}"


def sshddp(args: Sequence[str], environ: Mapping[str, str] | None = None) -> Result:
    """``sshddp ARGS`` in this process; ``environ`` is what the command sees as its env."""
    out, err, raw = io.StringIO(), io.StringIO(), io.BytesIO()
    env = Terminal(
        stdout=out,
        stderr=err,
        stdout_bytes=raw,
        color=False,
        environ=dict(os.environ if environ is None else environ),
    )
    code = run([str(a) for a in args], env)
    return Result(int(code), out.getvalue(), err.getvalue(), raw.getvalue())


def assert_clean_failure(result: Result, code: int) -> None:
    """Exited with ``code`` and said why, without a Python traceback."""
    assert result.code == code, result.explain()
    assert "Traceback" not in result.text, result.explain()
    assert "internal error" not in result.text, result.explain()
    assert result.text.strip(), result.explain()
